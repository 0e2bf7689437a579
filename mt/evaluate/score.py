"""`python -m mt.score`: the model's score of given translations, to rank or filter a parallel corpus.

    python -m mt.score checkpoint=RUN_DIR src=train.de tgt=train.en > scores.txt
    python -m mt.score checkpoint=RUN_DIR reverse=REVERSE_RUN src=train.de tgt=train.en     # + dual score
    python -m mt.score checkpoint=RUN_DIR src=train.de tgt=train.en keep=0.9 output=clean/  # the best 90%

One line per pair: the model's mean token log-probability of the target given the source (forced decoding, its
tokens and </s>), the same number translate.py's `output_format=jsonl` gives as `score` when the target is the
model's own translation. With `reverse=` (a model of the other direction) a second column: the dual conditional
cross-entropy of Junczys-Dowmunt (2018), -(|H_fwd - H_rev| + (H_fwd + H_rev) / 2) with H the negative mean
log-probability of each direction (higher is better: both directions find the pair likely, and equally so), the
score corpus filtering ranks by. With `keep=F output=DIR`: DIR/scores.txt, and the pairs ranked in the best
fraction F written to DIR under the input files' names. The files are read `batch_lines` lines at a time, so any
corpus size streams; both are checked first (UTF-8, the same line count).
"""

from __future__ import annotations

import difflib
import logging
import math
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from mt.config import ConfigError
from mt.data.files import read_lines
from mt.decode.flags import expected_scripts
from mt.decode.teacher import count_text_lines
from mt.errors import USER_ERRORS, DataError

log = logging.getLogger("mt.score")


@dataclass
class ScoreConfig:
    checkpoint: str = ""  # anything translate.py's checkpoint= takes (a run dir, release, transformers folder, ...)
    src: str = ""  # the source side, one sentence a line (plain or .gz)
    tgt: str = ""  # the target side, line for line
    reverse: str | None = None  # a model of the other direction: adds the dual conditional cross-entropy
    keep: float | None = None  # with output: the fraction of pairs to keep, the best by the last column
    output: str | None = None  # a folder for scores.txt and the kept pairs
    src_lang: str | None = None  # a model that reads its source language (NLLB)
    tgt_lang: str | None = None  # a multilingual model's target language
    device: str = "auto"
    batch_lines: int = 10000


def parse_args(argv: list[str]) -> ScoreConfig:
    """key=value arguments as ScoreConfig; an unknown key or a bad value is a one-line ConfigError."""
    names = {f.name: f for f in fields(ScoreConfig)}
    cfg = ScoreConfig()
    for arg in argv:
        key, eq, value = arg.partition("=")
        if not eq or key not in names:
            near = difflib.get_close_matches(key, names, 1)
            hint = f"; did you mean {near[0]}=?" if near else f"; give key=value with a key of {', '.join(names)}"
            raise ConfigError(f"{arg!r}: not a setting of mt.score{hint}")
        kind = names[key].type
        try:
            parsed = float(value) if "float" in str(kind) else int(value) if str(kind) == "int" else value
        except ValueError:
            raise ConfigError(f"{key}={value}: give a number") from None
        setattr(cfg, key, parsed)
    for key in ("checkpoint", "src", "tgt"):
        if not getattr(cfg, key):
            raise ConfigError(f"{key}= is needed: python -m mt.score checkpoint=RUN_DIR src=FILE tgt=FILE")
    if (cfg.keep is None) != (cfg.output is None):
        raise ConfigError("keep= and output= go together: keep=0.9 output=DIR writes the best 90% of the pairs")
    if cfg.keep is not None and not 0 < cfg.keep <= 1:
        raise ConfigError(f"keep={cfg.keep}: give the fraction of pairs to keep, above 0 and at most 1")
    if cfg.batch_lines < 1:
        raise ConfigError(f"batch_lines={cfg.batch_lines} is below its minimum 1")
    return cfg


def file_lang(path: str) -> str | None:
    """The language a corpus file's suffix names (train.de, EMEA.de-en.en, test.de.gz), where it is a language
    code mt/decode/flags.py knows (not .txt, .src, ...)."""
    name = Path(path).name.removesuffix(".gz")
    suffix = name.rsplit(".", 1)[-1].lower() if "." in name else ""
    return suffix if expected_scripts(suffix) is not None else None


def check_direction(translator, key: str, src: str, tgt: str) -> None:
    """Refuse a model whose direction is not the files' (by their suffixes), where both are known."""
    direction = translator.direction()
    if "," in direction or "?" in direction:
        return
    model_src, model_tgt = (x.split("_")[0][:2] for x in direction.split("->"))
    langs = file_lang(src), file_lang(tgt)
    if None not in langs and (langs[0][:2], langs[1][:2]) != (model_src, model_tgt):
        raise ConfigError(f"{key}: the model translates {direction} but src/tgt are {langs[0]}->{langs[1]} "
                          f"({Path(src).name}, {Path(tgt).name}); give the model of that direction")  # fmt: skip


def chunks(path: Path, size: int):
    batch = []
    for line in read_lines(path):
        batch.append(line.strip())
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def mean_scores(translator, src: list[str], tgt: list[str]) -> list[float]:
    """Each pair's mean token log-probability (forced decoding; 0.0 for an empty source, as translate.py's)."""
    sums = translator.score(src, tgt)
    room = translator.limit - len(translator.framing().tgt_lead)  # targets are cut as Translator.score cuts them
    counts = [min(len(t), room) + 1 for t in translator.vocabs.tgt.encode_batch(tgt)]
    return [s / n if line else 0.0 for s, n, line in zip(sums, counts, src)]


def dual(fwd: float, rev: float) -> float:
    """-(|H_fwd - H_rev| + (H_fwd + H_rev) / 2), H the negative mean log-probability of each direction."""
    h_fwd, h_rev = -fwd, -rev
    return -(abs(h_fwd - h_rev) + (h_fwd + h_rev) / 2)


def run(cfg: ScoreConfig) -> None:
    from mt import Translator

    src, tgt = Path(cfg.src).expanduser(), Path(cfg.tgt).expanduser()
    n_src, n_tgt = count_text_lines(src, "src"), count_text_lines(tgt, "tgt")
    if n_src != n_tgt:
        raise DataError(f"src={src} has {n_src} lines but tgt={tgt} has {n_tgt}; give the two sides of one corpus")
    fwd = Translator.load(cfg.checkpoint, device=cfg.device, tgt_lang=cfg.tgt_lang, src_lang=cfg.src_lang)
    check_direction(fwd, f"checkpoint={cfg.checkpoint}", cfg.src, cfg.tgt)
    rev = None
    if cfg.reverse:
        rev = Translator.load(cfg.reverse, device=cfg.device, tgt_lang=cfg.src_lang, src_lang=cfg.tgt_lang)
        check_direction(rev, f"reverse={cfg.reverse}", cfg.tgt, cfg.src)
    out_dir = Path(cfg.output).expanduser() if cfg.output else None
    if out_dir is not None:
        check_output(out_dir, src, tgt)
        out_dir.mkdir(parents=True, exist_ok=True)
    out = open(out_dir / "scores.txt", "w", encoding="utf-8") if out_dir else sys.stdout  # noqa: SIM115
    ranked = np.empty(n_src, dtype=np.float64)
    done, start = 0, time.perf_counter()
    for s, t in zip(chunks(src, cfg.batch_lines), chunks(tgt, cfg.batch_lines)):
        columns = [mean_scores(fwd, s, t)]
        if rev is not None:
            back = mean_scores(rev, t, s)
            columns.append([dual(a, b) for a, b in zip(columns[0], back)])
        out.write("".join("\t".join(f"{x:.6f}" for x in row) + "\n" for row in zip(*columns)))
        out.flush()
        ranked[done : done + len(s)] = columns[-1]
        done += len(s)
        log.info("%d / %d pairs scored (%.0f pairs/s)", done, n_src, done / (time.perf_counter() - start))
    if out_dir is not None:
        out.close()
        write_kept(src, tgt, ranked, cfg.keep, out_dir)


def check_output(out_dir: Path, src: Path, tgt: Path) -> None:
    """Refuse an output folder where the kept pairs or scores.txt would overwrite the input files."""
    written = [out_dir / p.name.removesuffix(".gz") for p in (src, tgt)] + [out_dir / "scores.txt"]
    for path in written:
        if path.exists() and path.resolve() in (src.resolve(), tgt.resolve()):
            raise ConfigError(f"output={out_dir}: writing {path.name} there would overwrite the input it is read "
                              "from; give another folder")  # fmt: skip


def write_kept(src: Path, tgt: Path, ranked: np.ndarray, keep: float, out_dir: Path) -> None:
    """The best `keep` of the pairs by `ranked` (ties broken by line order), in their order, into `out_dir`."""
    n_keep = max(1, math.ceil(keep * len(ranked)))
    kept = np.zeros(len(ranked), dtype=bool)
    kept[np.argsort(-ranked, kind="stable")[:n_keep]] = True
    for path in (src, tgt):
        name = path.name.removesuffix(".gz")
        with open(out_dir / name, "w", encoding="utf-8") as f:
            f.writelines(line.strip() + "\n" for line, k in zip(read_lines(path), kept) if k)
    log.info("kept %d of %d pairs (score >= %.4f) in %s", n_keep, len(ranked), ranked[kept].min(), out_dir)


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return
    try:
        run(parse_args(argv))
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
