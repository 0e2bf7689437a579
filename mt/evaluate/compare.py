"""Is one system better than another? Paired significance tests over the same references, with sacreBLEU's own
implementation (paired bootstrap resampling, Koehn 2004, and optionally approximate randomization, Riezler and
Maxwell 2005):

    python -m mt.compare BASELINE SYSTEM [SYSTEM ...] --refs test.de [--names a,b,c] [--ar] [--json out.json]
    python -m mt.compare runs/base runs/new --split test_2016_flickr          # run dirs: their {split}.hyp

Each system is a file of hypotheses (one line per reference) or a run dir, whose `{split}.hyp` train.py wrote (the
references are then that split's target side, from the run's config, unless `--refs` names a file). For each
system: cased BLEU, lowercased BLEU and chrF, each with its bootstrap 95% confidence interval; and for every system
after the first, its difference to the first with the interval of the paired differences and the p-value of the
null hypothesis that the two are equally good (1 for outputs identical to the baseline's). The resamples are drawn
from sacreBLEU's fixed seed (SACREBLEU_SEED, 12345), the same for every system, so runs and systems compare.
Markdown on stdout; `--json` also writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest, _bootstrap_resample, estimate_ci

from mt.config import ConfigError, DataConfig
from mt.data import files
from mt.errors import DataError

METRICS = {"BLEU": lambda: BLEU(), "BLEU lc": lambda: BLEU(lowercase=True), "chrF": lambda: CHRF()}


@dataclass
class System:
    name: str
    where: str  # the file its hypotheses came from
    hyps: list[str]


def _lines(path: Path, what: str) -> list[str]:
    if not path.is_file():
        raise ConfigError(f"{path}: no such file; give {what}")
    return [line.strip() for line in files.read_lines(path)]


def _run_split(run: Path, split: str | None) -> Path:
    """The hypotheses train.py wrote for a test split of the run in `run`."""
    if split is None:
        found = sorted(run.glob("*.hyp"))
        if len(found) != 1:
            names = ", ".join(p.stem for p in found) or "none"
            raise ConfigError(f"{run}: a run dir with test splits {names}; name one with --split")
        return found[0]
    path = run / f"{split}.hyp"
    if not path.is_file():
        raise ConfigError(f"{path}: no such file; --split names a test split the run translated ({run}/*.hyp)")
    return path


def split_references(run: Path, split: str) -> Path:
    """The reference file of a run's test split, from its config (a multilingual run's `test.en-fr`: test.fr)."""
    config = run / "config.resolved.yaml"
    if not config.is_file():
        raise ConfigError(f"{run}: no config.resolved.yaml to find the references of {split} in; give --refs FILE")
    dc = yaml.safe_load(config.read_text())["data"]
    base, lang = split, dc["tgt_lang"]
    for direction in dc.get("directions") or []:
        if split.endswith(f".{direction}"):
            base, lang = split.removesuffix(f".{direction}"), direction.split("-")[1]
    fields = {k: v for k, v in dc.items() if k in DataConfig.__dataclass_fields__ and k not in ("corpora",)}
    path = files.split_path(DataConfig(**fields), base, lang)
    if path is None:
        raise ConfigError(f"{run}: no local file for the references of {split} ({dc.get('dir')}/{base}.{lang}); "
                          "give --refs FILE")  # fmt: skip
    return path


def load_systems(paths: list[str], names: list[str] | None, split: str | None) -> list[System]:
    if names is not None and len(names) != len(paths):
        raise ConfigError(f"--names: {len(names)} names for {len(paths)} systems; give one per system")
    systems = []
    for i, p in enumerate(paths):
        path = _run_split(Path(p), split) if Path(p).is_dir() else Path(p)
        name = names[i] if names else (p.rstrip("/") if Path(p).is_dir() else path.name)
        systems.append(System(name, str(path), _lines(path, "a file of hypotheses or a run dir")))
    return systems


def compare(systems: list[System], refs: list[str], ar: bool = False, samples: int = 1000) -> dict:
    """Scores, intervals, differences to the first system and p-values (see the module docstring)."""
    for s in systems:
        if len(s.hyps) != len(refs):
            raise ConfigError(f"{s.where} has {len(s.hyps)} lines but the references have {len(refs)}; compare "
                              "translations of the same source")  # fmt: skip
    named = [(s.name, s.hyps) for s in systems]
    out = {"sentences": len(refs), "samples": samples, "signatures": {}}
    out["systems"] = [{"name": s.name, "file": s.where, "metrics": {}} for s in systems]
    for key, make in METRICS.items():  # one test per metric: sacreBLEU keys results by the score's name
        signatures, results = PairedTest(named, {key: make()}, [refs], "bs", samples)()
        (name,) = signatures  # ("BLEU" for both BLEUs: their signatures differ by the case flag)
        out["signatures"][key] = str(signatures[name])
        p_ar = PairedTest(named, {key: make()}, [refs], "ar")()[1][name] if ar else None
        metric = make()
        resampled = []  # the same resamples for every system (one seed): their differences are paired
        for s in systems:
            stats = metric._extract_corpus_statistics(s.hyps, [refs])
            resampled.append(np.array([x.score for x in _bootstrap_resample(stats, metric, samples)[1]]))
        for i, system in enumerate(out["systems"]):
            r = results[name][i]
            row = {"score": float(r.score), "mean": float(r.mean), "ci": float(r.ci)}
            if i:
                # Outputs identical to the baseline's differ by exactly 0 in every resample: no evidence of a
                # difference, p = 1 (sacreBLEU's strict count gives 1/(N+1) there, which would read as significant).
                same = systems[i].hyps == systems[0].hyps
                _, half = estimate_ci(resampled[i] - resampled[0])
                row |= {"delta": float(r.score - results[name][0].score), "delta_ci": float(half),
                        "p_bs": 1.0 if same else float(r.p_value)}  # fmt: skip
                if p_ar is not None:
                    row["p_ar"] = 1.0 if same else float(p_ar[i].p_value)
            system["metrics"][key] = row
    return out


def markdown(result: dict) -> str:
    """One row per system: each metric's score ± its 95% interval, and after the first, the difference ± the
    interval of the paired differences with its p-value(s)."""
    head = ["system"] + [h for key in METRICS for h in (key, f"Δ {key}", "p")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, s in enumerate(result["systems"]):
        cells = [s["name"]]
        for key in METRICS:
            m = s["metrics"][key]
            cells.append(f"{m['score']:.2f} ± {m['ci']:.2f}")
            if i == 0:
                cells += ["(baseline)", ""]
                continue
            cells.append(f"{m['delta']:+.2f} ± {m['delta_ci']:.2f}")
            cells.append(f"{m['p_bs']:.4f}" + (f" (AR {m['p_ar']:.4f})" if "p_ar" in m else ""))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"{result['sentences']} sentences; paired bootstrap, {result['samples']} resamples (sacreBLEU, seed "
              "SACREBLEU_SEED or 12345); ± is the 95% interval. Signatures:"]  # fmt: skip
    lines += [f"- {k}: `{v}`" for k, v in result["signatures"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m mt.compare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("systems", nargs="+", help="hypothesis files or run dirs; the first is the baseline")
    ap.add_argument("--refs", help="the reference file (default: the split's, from the first run dir's config)")
    ap.add_argument("--split", help="the test split of run dirs (their {split}.hyp)")
    ap.add_argument("--names", help="comma-separated names for the systems, in order")
    ap.add_argument("--ar", action="store_true", help="also approximate randomization (10,000 trials)")
    ap.add_argument("--samples", type=int, default=1000, help="bootstrap resamples (default 1,000)")
    ap.add_argument("--json", type=Path, help="also write the numbers to this file")
    args = ap.parse_args(argv)
    try:
        if len(args.systems) < 2:
            raise ConfigError("give at least two systems: the baseline first, then the systems to compare with it")
        if args.samples < 10:
            raise ConfigError(f"--samples={args.samples}: give at least 10 resamples (1,000 is the usual)")
        systems = load_systems(args.systems, args.names.split(",") if args.names else None, args.split)
        if args.refs:
            refs_path = Path(args.refs)
        else:
            runs = [Path(p) for p in args.systems if Path(p).is_dir()]
            if not runs or args.split is None:
                raise ConfigError("--refs FILE is needed (or run dirs with --split, whose references their config "
                                  "names)")  # fmt: skip
            refs_path = split_references(runs[0], args.split)
        result = compare(systems, _lines(refs_path, "the references (--refs)"), args.ar, args.samples)
    except (ConfigError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    result["references"] = str(refs_path)
    print(markdown(result), end="")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
