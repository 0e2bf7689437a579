"""translate.py's parts: reading input lines, writing translations, references for a report, the run's decoding
settings, and the attention plot of a line."""

from __future__ import annotations

import dataclasses
import logging
import os
import select
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import torch

from mt import checkpoint, data, runtime
from mt.config import ConfigError, DataConfig, DecodeConfig, TranslateConfig, validate_decode
from mt.constraints import Constraints
from mt.ct2 import EXPORT_FORMAT as CT2_FORMAT
from mt.ct2 import CTranslate2Model
from mt.ensemble import Ensemble
from mt.evaluation import translate_ids, write_report
from mt.plots import cross_attention, plot_attention
from mt.quantize import quantize_int8
from mt.runtime import pick_autocast, use_tf32
from mt.search import Hypothesis
from mt.segment import refuse_with_split
from mt.terminology import Glossary, Tally
from mt.tokenizer import Vocabs

log = logging.getLogger(__name__)


def read_input(path: str, errors: str = "strict") -> list[str]:
    """Input lines from stdin or a file (plain or .gz); see `split_lines`."""
    if path == "-":
        return split_lines(sys.stdin.buffer.read(), "stdin", errors)
    if not Path(path).is_file():
        raise data.DataError(f"input={path}: no such file; give an existing file or - for stdin")
    return split_lines(data.read_bytes(Path(path)), path, errors)


def input_chunks(path: str, errors: str, size: int, indent: bool = False) -> Iterator[list[str]]:
    """The input's lines (as `split_lines` cuts and decodes them) `size` at a time, read as they are needed, so that
    memory stays bounded whatever the input's length. From stdin a chunk also ends when no more input is waiting:
    a person at a terminal, or a program that writes a line and waits for its translation, gets it at once, while
    a file or a fast pipe is still read in large chunks. The file is opened now: a missing one fails before any
    work. Lines are stripped, or with `indent` (documents: `split=true`) only at their end."""
    if path == "-":
        raw_lines, name = waiting_lines(sys.stdin.buffer.fileno()), "stdin"
    elif Path(path).is_file():
        raw_lines, name = (data.open_binary(Path(path)), None), path
    else:
        raise data.DataError(f"input={path}: no such file; give an existing file or - for stdin")

    def chunks() -> Iterator[list[str]]:
        chunk, replaced, lineno = [], 0, 0
        lines, flushes = raw_lines
        try:
            for lineno, raw in enumerate(lines, start=1):  # binary lines end at b"\n" only
                line = decode_line(raw.rstrip(b"\n"), name, lineno, errors, indent)
                replaced += "\ufffd" in line and errors == "replace"
                chunk.append(line)
                if len(chunk) == size or (flushes is not None and flushes.nothing_waiting()):
                    yield chunk
                    chunk = []
        except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
            raise data.DataError(f"{name}:{lineno + 1}: cannot be read ({e}); check or re-create the file") from None
        if chunk:
            yield chunk
        if replaced:
            log.warning("%s: %d lines had bytes that are not UTF-8, replaced by U+FFFD", name, replaced)

    return chunks()


class WaitingLines:
    """The lines of a file descriptor, read with os.read as they arrive; `nothing_waiting()` tells whether the lines
    read so far are all there is for now (no complete line buffered, and select says none is waiting)."""

    def __init__(self, fd: int):
        self.fd, self.buffered, self.rest = fd, [], b""

    def __iter__(self) -> Iterator[bytes]:
        while True:
            if not self.buffered:
                block = os.read(self.fd, 1 << 16)  # what is there, up to 64 KiB; blocks only when nothing is
                if not block:
                    break
                *self.buffered, self.rest = (self.rest + block).split(b"\n")
                self.buffered.reverse()
                continue
            yield self.buffered.pop()
        if self.rest:
            yield self.rest

    def nothing_waiting(self) -> bool:
        return not self.buffered and not select.select([self.fd], [], [], 0)[0]


def waiting_lines(fd: int) -> tuple[WaitingLines, WaitingLines]:
    lines = WaitingLines(fd)
    return lines, lines


def decode_line(raw: bytes, name: str, lineno: int, errors: str, indent: bool = False) -> str:
    try:
        return raw.decode("utf-8").rstrip() if indent else raw.decode("utf-8").strip()
    except UnicodeDecodeError as e:
        if errors != "replace":
            raise data.DataError(
                f"{name}:{lineno}: bytes that are not UTF-8 ({e.reason}); re-encode the input as UTF-8 "
                "or set input_errors=replace"
            ) from None
        line = raw.decode("utf-8", errors="replace")
        return line.rstrip() if indent else line.strip()


def split_lines(raw: bytes, name: str, errors: str = "strict") -> list[str]:
    """Lines of `raw`, each stripped. Lines end at "\n" only (a "\r", U+2028 or U+0085 inside a line stays in it,
    so there is one output line per input line). Bytes that are not UTF-8 stop with an error naming the line, or
    with `errors="replace"` become U+FFFD with a warning."""
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    out, replaced = [], []
    for i, line in enumerate(lines, start=1):
        out.append(decode_line(line, name, i, errors))
        if errors == "replace" and "\ufffd" in out[-1]:
            replaced.append(i)
    if replaced:
        log.warning("%s: %d lines had bytes that are not UTF-8, replaced by U+FFFD (first: line %d)", name,
                    len(replaced), replaced[0])  # fmt: skip
    return out


def open_output(path: str):
    """The output stream, opened before decoding so that an unwritable path fails at once, not after the work."""
    if path == "-":
        return sys.stdout
    try:
        return open(path, "w", encoding="utf-8", newline="\n")
    except OSError as e:
        raise ConfigError(f"output={path}: cannot be written ({e.strerror}); give a writable path") from None


def encode_within_positions(vocabs: Vocabs, lines: list[str], limit: int, first_line: int = 0) -> list[list[int]]:
    """Source ids of each line, cut to `limit` tokens (the model's positions, less one for </s>) with a warning
    naming the line's number in its input (`first_line`: the 0-based number of `lines[0]`)."""
    src_ids = vocabs.src.encode_batch(lines)
    for i, ids in enumerate(src_ids):
        if len(ids) > limit:
            log.warning("line %d: %d tokens, truncated to the model's %d", first_line + i + 1, len(ids), limit)
            src_ids[i] = ids[:limit]
    return src_ids


class Stopped(Exception):
    """A decode stopped because no one waits for its answer any more (the server's clients went or timed out)."""


class Stoppable:
    """`model`, but its `decode` first asks `stop()` and raises `Stopped` when told to: a search over it ends at its
    next step (the constrained search's plain second pass too), whatever the search."""

    def __init__(self, model, stop):
        self._model, self._stop = model, stop

    def __getattr__(self, name: str):
        return getattr(self._model, name)

    def decode(self, *args, **kwargs):
        if self._stop():
            raise Stopped
        return self._model.decode(*args, **kwargs)


def decode_ids(
    model,
    src_ids: list[list[int]],
    cfg: DecodeConfig,
    device,
    amp,
    prefixes: list[list[int]] | None = None,
    line_numbers: list[int] | None = None,
    constraints: list[Constraints] | None = None,
    stop=None,
) -> list[list[Hypothesis]]:
    """Hypotheses for token-id sources with this project's search, or CTranslate2's for an export (see
    `mt.evaluation.translate_ids` for `prefixes`, `line_numbers` and `constraints`). `stop()`: asked before each
    decoder step (CTranslate2: before the batch), `Stopped` raised when it says so."""
    if isinstance(model, CTranslate2Model):
        if constraints is not None:
            raise ConfigError("constraints and glossaries need this project's search: CTranslate2 has no constrained "
                              "beam search; give the run dir or release instead of the CTranslate2 export")  # fmt: skip
        if stop is not None and stop():
            raise Stopped
        return model.translate_ids(src_ids, cfg, prefixes)
    if stop is not None:
        model = Stoppable(model, stop)
    return translate_ids(model, src_ids, cfg, device, amp, prefixes, line_numbers, constraints)


def output_lines(
    hyps: list[list[Hypothesis]], texts: list[str], vocabs: Vocabs, nbest: int, first: int = 0
) -> list[str]:
    """One line per input, or with nbest > 1 Moses-style "i ||| hypothesis ||| score" lines (i from `first`)."""
    if nbest == 1:
        return texts
    return [f"{first + i} ||| {vocabs.tgt.decode(h.tokens)} ||| {h.score:.4f}" for i, hs in enumerate(hyps) for h in hs]


def write_output(stream, lines: list[str]) -> None:
    stream.write("".join(line + "\n" for line in lines))
    stream.flush()


def read_references(spec: str, ckpt: dict, n: int, tgt_lang: str | None = None) -> list[str]:
    """References from a file, or from a split of the checkpoint's data config in `tgt_lang` (a multilingual model's
    target language; default: the run's target language); must have `n` lines."""
    if Path(spec).is_file():
        refs, where = [line.strip() for line in data.read_lines(Path(spec))], spec
    else:
        dc = DataConfig(**ckpt["config"]["data"])
        lang = tgt_lang or dc.tgt_lang
        path = data.split_path(dc, spec, lang)
        if path is None:
            raise ConfigError(f"references={spec}: neither a file nor a split of the local corpus {dc.dir} in "
                              f"{lang} ({spec}.{lang}[.gz])")  # fmt: skip
        refs, where = [line.strip() for line in data.read_lines(path)], str(path)
    if len(refs) != n:
        raise data.DataError(f"{where} has {len(refs)} lines but the input has {n}; give references for every line")
    return refs


def run_decode_settings(cli: DecodeConfig, ckpt: dict, overrides: list[str]) -> DecodeConfig:
    """The decoding settings the run was evaluated with (a recipe's beam and tuned length penalty), with the
    command line's `decode.*` keys on top. A decode group named on the command line (`decode=greedy`) replaces them,
    as does a checkpoint without a saved config."""
    keys = [o.split("=", 1)[0].lstrip("+~") for o in overrides]
    saved = (ckpt.get("config") or {}).get("decode")
    if not saved or "decode" in keys:
        return cli
    fields = {f.name for f in dataclasses.fields(DecodeConfig)}
    merged = {k: v for k, v in saved.items() if k in fields}
    given = {k for k in (k.removeprefix("decode.") for k in keys) if k in fields}
    merged.update({k: getattr(cli, k) for k in given})
    if cli.sampling and "beam_size" not in given:  # sampling draws one token at a time: not the run's beam
        merged["beam_size"] = 1
    cfg = DecodeConfig(**merged)
    validate_decode(cfg)
    return cfg


def plot_first_line(
    model, vocabs: Vocabs, src_ids: list[list[int]], hyps: list[list[Hypothesis]], cfg: TranslateConfig
) -> None:
    """`plot_attention=PNG`: the cross-attention of the first non-empty line's translation, as a heatmap (and the
    matrix as PNG's stem + .attn.pt)."""
    first = next((i for i, s in enumerate(src_ids) if s), None)
    if first is None:
        raise ConfigError("plot_attention: every input line is empty; nothing to plot")
    n_layers = len(model.decoder)
    if not -n_layers <= cfg.attention_layer < n_layers:
        raise ConfigError(f"attention_layer={cfg.attention_layer}: the model has {n_layers} decoder layers")
    out_ids = hyps[first][0].tokens
    matrix = cross_attention(model, src_ids[first], out_ids, cfg.attention_layer)
    src_tok, out_tok = vocabs.src.tokens(src_ids[first]) + ["</s>"], vocabs.tgt.tokens(out_ids) + ["</s>"]
    plot_attention(matrix, src_tok, out_tok, Path(cfg.plot_attention))
    torch.save(matrix, Path(cfg.plot_attention).with_suffix(".attn.pt"))
    log.info("cross-attention of line %d (%dx%d) plotted to %s", first + 1, *matrix.shape, cfg.plot_attention)


def for_decoding(model, decode: DecodeConfig, device: torch.device):
    """The model to decode with: with `decode.quantize=int8` its int8 copy, made once at load, not per batch. int8
    runs on the CPU only: on CUDA a warning, and `decode.quantize` is set to none (the settings a run saved say int8,
    the GPU serves it in its own precision instead of failing every request)."""
    if decode.quantize != "int8":
        return model
    if runtime.on_cuda(device):
        log.warning("decode.quantize=int8 runs on the CPU only; decoding on %s without it", device)
        decode.quantize = "none"
        return model
    return quantize_int8(model)


def load_translator(ckpt: dict, decode: DecodeConfig, precision: str, device: torch.device, plot: bool = False):
    """(model, vocabs, autocast dtype) for a loaded checkpoint: this project's Transformer on `device` (int8 per
    `for_decoding`, which may set `decode.quantize`), or for a CTranslate2 export its CTranslate2 translator.
    `plot`: attention plots are wanted (this project's model only)."""
    if ckpt["format"] == CT2_FORMAT:
        if plot:
            raise ConfigError("plot_attention needs this project's model: a CTranslate2 export has no attention")
        if decode.length_penalty and decode.length_penalty_type != "average":
            log.warning(
                "CTranslate2 divides scores by length^%g (length_penalty_type=average), not by GNMT's penalty: "
                "beams may rank otherwise than this project's search",
                decode.length_penalty,
            )
        model = CTranslate2Model(ckpt["path"], device)
        return model, model.vocabs, None
    model, vocabs = checkpoint.build_model(ckpt)
    model.to(device).eval()
    use_tf32(device)
    return for_decoding(model, decode, device), vocabs, pick_autocast(precision, device, model.cfg.d_model)


def load_ensemble(ckpts: list[dict], decode: DecodeConfig, precision: str, device: torch.device, plot: bool = False):
    """(ensemble, vocabs, autocast dtype) for several checkpoints of this project's models (mt/ensemble.py); they
    must share the tokenizers, which turn text into ids and back for all of them."""
    if plot:
        raise ConfigError("plot_attention shows one model's attention; give one checkpoint, not a list")
    models, vocabs = [], None
    for ckpt in ckpts:
        if ckpt["format"] == CT2_FORMAT:
            raise ConfigError(f"{ckpt['path']}: a CTranslate2 export cannot be ensembled; give run dirs, .pt files "
                              "or releases")  # fmt: skip
        model, v = checkpoint.build_model(ckpt)
        if vocabs is None:
            vocabs = v
        for side, name in (("tgt", "target"), ("src", "source")):
            if getattr(v, side).digest() != getattr(vocabs, side).digest():
                raise ConfigError(
                    f"{ckpt['path']}: its {name} vocabulary differs from {ckpts[0]['path']}'s; an ensemble's models "
                    "must share the tokenizers (train them on the same data and tokenizer settings)"
                )
        models.append(model)
    ensemble = Ensemble(models).to(device).eval()
    use_tf32(device)
    amp = pick_autocast(precision, device, min(ensemble.widths))
    return for_decoding(ensemble, decode, device), vocabs, amp


class AlignedFile:
    """translate.py's `prefix=FILE` and `constraints=FILE`: one line per input line (an empty line = none), read
    alongside the input's chunks; `key` names the option in errors."""

    def __init__(self, path: str, key: str = "prefix", what: str = "one prefix per input line"):
        self.path, self.key, self.what, self.read = path, key, what, 0
        if not Path(path).is_file():
            raise data.DataError(f"{key}={path}: no such file; give {what}")
        self.lines = input_chunks(path, "strict", 1)

    def take(self, n: int) -> list[str]:
        out = [line for _, [line] in zip(range(n), self.lines)]
        if len(out) < n:
            raise data.DataError(f"{self.key}={self.path}: has {self.read + len(out)} lines but the input has more "
                                 f"(line {self.read + len(out) + 1}); give {self.what}")  # fmt: skip
        self.read += n
        return out

    def finish(self) -> None:
        if next(self.lines, None) is not None:
            raise data.DataError(f"{self.key}={self.path}: line {self.read + 1} has no input line (the input has "
                                 f"{self.read}); give {self.what}")  # fmt: skip


def constraint_file(cfg: TranslateConfig) -> AlignedFile | None:
    if not cfg.constraints:
        return None
    return AlignedFile(cfg.constraints, "constraints", "one line of tab-separated target phrases per input line")


def glossary_of(cfg) -> Glossary | None:
    """translate.py's and serve.py's `glossary=FILE` (with `glossary_ignore_case`)."""
    return Glossary.from_file(cfg.glossary, cfg.glossary_ignore_case) if cfg.glossary else None


def translate_stream(cfg: TranslateConfig, translator) -> None:
    """`stream_lines` lines at a time (fewer when no more input is waiting): read, translated, written (bounded
    memory, output as soon as it is ready). `translator`: an mt.translator.Translator."""
    chunks = input_chunks(cfg.input, cfg.input_errors, cfg.stream_lines, indent=cfg.split)
    prefixes = AlignedFile(cfg.prefix) if cfg.prefix else None
    constraints, tally = constraint_file(cfg), Tally()
    out, start = open_output(cfg.output), time.perf_counter()
    done, n_tokens = translator.translate_stream(chunks, out, cfg.decode, prefixes, f"prefix={cfg.prefix}",
                                                 constraints=constraints, tally=tally, split=cfg.split)  # fmt: skip
    seconds = max(time.perf_counter() - start, 1e-9)
    log.info("%d lines in %.2fs: %.1f sentences/s, %.0f tokens/s", done, seconds, done / seconds, n_tokens / seconds)
    tally.log()


def translate_whole(cfg: TranslateConfig, translator) -> None:
    """The whole input at once, for a report against references and for the attention plot."""
    lines, ckpt, vocabs = read_input(cfg.input, cfg.input_errors), translator.checkpoint, translator.vocabs
    target = translator.target_id() and translator.tgt_lang  # a multilingual model's language, checked first
    refs = read_references(cfg.references, ckpt, len(lines), target) if cfg.references else None
    prefix, phrases, tally = None, None, Tally()
    if cfg.prefix:
        prefixes = AlignedFile(cfg.prefix)
        prefix = prefixes.take(len(lines))
        prefixes.finish()
    if cfg.constraints:
        constraints = constraint_file(cfg)
        phrases = [c.split("\t") for c in constraints.take(len(lines))]
        constraints.finish()
    if cfg.split:
        if cfg.plot_attention:
            raise ConfigError("plot_attention shows one sentence's attention; unset split")
        refuse_with_split(cfg.decode, prefix, phrases, "split=true")
    out, start = open_output(cfg.output), time.perf_counter()
    if cfg.split:  # each line sentence by sentence
        texts, n_tokens = translator.texts(lines, cfg.decode, True, tally=tally)
        write_output(out, texts)
    else:
        src_ids, hyps = translator.hypotheses(lines, cfg.decode, prefix, where=f"prefix={cfg.prefix}",
                                              constraints=phrases, tally=tally,
                                              constraints_where=f"constraints={cfg.constraints}")  # fmt: skip
        texts = vocabs.tgt.decode_batch([h[0].tokens for h in hyps])
        write_output(out, output_lines(hyps, texts, vocabs, cfg.decode.nbest))
        n_tokens = sum(len(h[0].tokens) for h in hyps)
    seconds = max(time.perf_counter() - start, 1e-9)
    speed = {"sentences_per_s": len(lines) / seconds, "tokens_per_s": n_tokens / seconds}
    log.info("%d lines in %.2fs: %.1f sentences/s, %.0f tokens/s", len(lines), seconds, *speed.values())
    tally.log()
    if refs is not None:
        report_dir = Path(cfg.report_dir or (Path(cfg.output).parent if cfg.output != "-" else "."))
        extra = {**speed, "decode": asdict(cfg.decode), "precision": cfg.precision, "checkpoint": ckpt["path"]}
        r = write_report(report_dir, "", lines, texts, refs, extra, vocabs.tgt.lowercases)
        log.info("%s", r["bleu_detail"])
        log.info("BLEU %.2f (lowercased %.2f), chrF %.2f; report in %s", r["bleu"], r["bleu_lowercase"], r["chrf"],
                 report_dir / "report.md")  # fmt: skip
    if cfg.plot_attention:
        plot_first_line(translator.model, vocabs, src_ids, hyps, cfg)
