"""`+experiment=auto` against the fixed recipes, corpus by corpus and budget by budget: the plan, the runs and the
scored table (docs/auto.md).

    python benchmarks/quality/auto_trials.py cut                       # Multi30k En->De cut: 3,600 / 7,250 / 14,500
    python benchmarks/quality/auto_trials.py command kde4_20 auto      # the train.py line of one trial (seed 1)
    python benchmarks/quality/auto_trials.py run kde4_20 auto fairseq --seed 1 2    # train them, one at a time
    python benchmarks/quality/auto_trials.py table [--plot docs/auto_trials.png] \
        [--minutes-plot docs/auto_minutes.png]                        # score what has run, draw it
    python benchmarks/quality/auto_trials.py plans                     # each auto run's plan against its updates

A point is a corpus and a budget in minutes of training on this machine (`train.max_time`); a recipe is `auto`
(`+experiment=auto`), `fairseq` (`multi30k_en_de_fairseq`, fairseq's Multi30k recipe, level with fairseq in the CPU
hour), `recipe` (`multi30k_en_de`, this project's) or `defaults` (no experiment); `table` also scores the runs of
the first rule (`first`, before the GPU trials of docs/auto.md changed it), the rule before case markup
(`nocase`) and before FLoRes' regime moved to 45 epochs (`fifth`). Runs go to
`runs/trials/POINT.RECIPE.sSEED` (`--runs` moves them); the cuts to `multi30k_N` beside that folder (runs/data/).
Run each with the machine alone: the budget is wall-clock. `table` scores every seed of a point where two recipes
ran: each recipe's test BLEU (lowercased, cased) and chrF, its updates and target tokens/s, and
its difference to fairseq's recipe with the paired bootstrap's p (mt.compare, 1,000 resamples; lowercased BLEU,
since fairseq's recipe writes lowercase); the summary pools the seeds fairseq's recipe ran, and gives `auto` against
`recipe` over the seeds both ran, at points where fairseq's recipe did not run too.
Several seeds: the table gives each. `--plot` draws BLEU against
training pairs, a panel per budget; `--minutes-plot` BLEU against minutes on the whole of Multi30k En->De (the
points m30k_29000_5 to m30k_29000_56), a line per recipe through the mean of its seeds.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's mt, not whichever one pip installed
DATA = Path("../shared/data")  # relative to the checkout, where train.py runs
CUTS = (3600, 7250, 14500)
CUT_SEED = 1  # the cut is drawn with this seed, the same pairs for every recipe

RECIPES = {"auto": ["+experiment=auto"], "fairseq": ["+experiment=multi30k_en_de_fairseq"],
           "recipe": ["+experiment=multi30k_en_de"], "defaults": [],
           # this project's recipe with the low-resource literature's settings (Sennrich & Zhang 2019: a small BPE,
           # more dropout and label smoothing), the variant that led `auto` on 4,500 subtitle pairs
           "literature": ["+experiment=multi30k_en_de", "tokenizer.vocab_size=2000", "model.dropout=0.3",
                          "train.label_smoothing=0.2"]}  # fmt: skip
# Runs of the first rule, before the GPU trials of docs/auto.md changed it (the compact shape's FFN 512, fairseq's
# schedule from 2,000 updates, a 2k BPE under 5,000 pairs): run dirs POINT.first.sSEED, scored beside the others.
FIRST = "first"
# Runs of the rule before case markup (tokenizer.case_markup under 20,000 pairs, docs/auto.md): POINT.nocase.sSEED.
NOCASE = "nocase"
# Runs of the rule before its sixth change (FLoRes' regime from 30 epochs under 10,000 pairs, docs/experiments/auto.md):
# POINT.fifth.sSEED.
FIFTH = "fifth"
SCORED = [*RECIPES, FIRST, NOCASE, FIFTH]
RIVALS = ("recipe", "literature")  # auto is set against each over the seeds both ran, fairseq's run or not
# What a plot's legend calls each recipe: the names a user of this project knows them by, not the run dirs'.
LEGEND = {
    "auto": "+experiment=auto",
    "fairseq": "fairseq's Multi30k recipe",
    "recipe": "multi30k_en_de",
    "defaults": "the library defaults",
    "literature": "the literature's low-resource variant",
    FIRST: "auto's first rule",
    NOCASE: "auto before case markup",
    FIFTH: "auto before its sixth change",
}
MARKERS = "os^vDPXh"  # one a recipe of SCORED, in its order


@dataclass(frozen=True)
class Corpus:
    label: str
    pairs: int  # training pairs (after any hold-out)
    data: tuple[str, ...]  # train.py overrides that select it
    split: str  # the test split the run translates

    def overrides(self, cuts: Path) -> list[str]:
        return [a.replace("{cuts}", str(cuts)) for a in self.data]


def multi30k(pairs: int) -> Corpus:
    cut = [] if pairs == 29000 else [f"data.dir={{cuts}}/multi30k_{pairs}"]
    return Corpus(f"Multi30k En->De {pairs:,}", pairs, ("data=multi30k", *cut), "test_2016_flickr")


def local(label: str, name: str, pairs: int, *extra: str, langs: tuple[str, str] = ("de", "en")) -> Corpus:
    data = ("data=local", f"data.dir={DATA / name}", f"data.src_lang={langs[0]}", f"data.tgt_lang={langs[1]}", *extra)
    return Corpus(label, pairs, data, "test")


CORPORA = {
    **{f"m30k_{n}": multi30k(n) for n in (*CUTS, 29000)},
    "iwslt": local("IWSLT TED De->En", "iwslt_ted_de_en", 9527, "data.valid_split=val"),
    "en_fr": Corpus("Multi30k En->Fr", 29000, ("data=multi30k", "data.tgt_lang=fr"), "test_2016_flickr"),
    "emea": local("EMEA De->En", "opus_emea_de_en", 4500, "data.valid_from_train=500"),
    "kde4": local("KDE4 De->En", "opus_kde4_de_en", 4500, "data.valid_from_train=500"),
    # corpora the rule was never fitted on (its check)
    "jrc": local("JRC-Acquis De->En", "opus_jrc_acquis_de_en", 4500, "data.valid_from_train=500"),
    "ted2020": local("TED2020 De->En", "opus_ted2020_de_en", 4500, "data.valid_from_train=500"),
    "emea_fr": local("EMEA En->Fr", "opus_emea_en_fr", 4500, "data.valid_from_train=500", langs=("en", "fr")),
    "kde4_fr": local("KDE4 En->Fr", "opus_kde4_en_fr", 4500, "data.valid_from_train=500", langs=("en", "fr")),
}
# Derive on the Multi30k cuts and IWSLT at 10 and 30 minutes; check, without refitting, on the rest.
POINTS = {
    **{f"{c}_{m}": (c, m) for c in ("m30k_3600", "m30k_7250", "m30k_14500", "m30k_29000", "iwslt") for m in (10, 30)},
    "en_fr_20": ("en_fr", 20), "emea_20": ("emea", 20), "kde4_20": ("kde4", 20), "m30k_29000_56": ("m30k_29000", 56),
    "m30k_29000_5": ("m30k_29000", 5),  # with _10, _30 and _56: BLEU against minutes on one corpus
    **{f"{c}_20": (c, 20) for c in ("jrc", "ted2020", "emea_fr", "kde4_fr")},
}  # fmt: skip
MINUTES_CORPUS = "m30k_29000"


def run_dir(runs: Path, point: str, recipe: str, seed: int) -> Path:
    return runs / f"{point}.{recipe}.s{seed}"


def command(point: str, recipe: str, seed: int, runs: Path) -> list[str]:
    corpus, minutes = POINTS[point]
    data = CORPORA[corpus].overrides(runs.parent / "data")
    run = run_dir(runs, point, recipe, seed)
    return [sys.executable, "train.py", *RECIPES[recipe], *data, f"train.max_time={minutes}", f"train.seed={seed}",
            f"run_dir={run}"]  # fmt: skip


def cut(out: Path) -> None:
    """Multi30k En->De train cut to each of CUTS pairs (drawn with CUT_SEED), val and test as they are."""
    src = (ROOT / DATA / "multi30k").resolve()
    lines = {}
    for lang in ("en", "de"):
        with gzip.open(src / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            lines[lang] = f.read().splitlines()
    for n in CUTS:
        keep = sorted(random.Random(CUT_SEED).sample(range(len(lines["en"])), n))
        d = out / f"multi30k_{n}"
        d.mkdir(parents=True, exist_ok=True)
        for lang, text in lines.items():
            with gzip.open(d / f"train.{lang}.gz", "wt", encoding="utf-8") as f:
                f.write("".join(text[i] + "\n" for i in keep))
            for split in ("val", "test_2016_flickr"):
                link = d / f"{split}.{lang}.gz"
                if not link.is_symlink():
                    link.symlink_to(src / f"{split}.{lang}.gz")
        print(f"{d}: {n:,} pairs")


def speed(run: Path) -> tuple[int, float]:
    """The updates the run made and the median target tokens/s it logged. The updates are the count its log's
    "training stopped" line gives (metrics.jsonl logs every few updates, so its last row can be short of the end)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rates = sorted(r["tgt_tokens_per_s"] for r in rows if r.get("kind") == "train")
    log = run / "train.log"
    stopped = re.search(r"training stopped \(.*\) after (\d+) updates", log.read_text()) if log.is_file() else None
    logged = max((r.get("update", 0) for r in rows), default=0)  # a run from before the line
    return int(stopped.group(1)) if stopped else logged, rates[len(rates) // 2] if rates else float("nan")


def chosen(record: dict, key: str, default=None):
    return next((c["value"] for c in record["choices"] if c["key"] == key), default)


def measured(run: Path, record: dict) -> tuple[float, float, list[float]]:
    """(the probe's padded tokens/s for the point the rule chose, the padded tokens/s the run trained at between
    validations, each validation's seconds) of an `auto` run, from its auto.json and metrics.jsonl: the two halves of
    the plan's error (the probe's speed, and what it charges for the validations: VALIDATION_TOKENS)."""
    from mt.train.auto import SHAPES

    vocab, tokens = chosen(record, "tokenizer.vocab_size"), chosen(record, "train.max_tokens")
    extras = bool(chosen(record, "model.attention_dropout", 0.0))
    shape = next(name for name, dims in SHAPES.items() if dims["d_model"] == chosen(record, "model.d_model"))
    probe = next((r for point in record.get("speed", []) if point[:3] == [shape, vocab, extras] for r in point[3:]),
                 float("nan"))  # fmt: skip
    epoch = record["corpus"]["epochs"][str(tokens)]
    per_update = epoch["padded_tokens"] / epoch["batches"] * chosen(record, "train.accumulate", 1)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    valid = [r for r in rows if r.get("kind") == "valid"]
    if not all("valid_s" in r for r in valid):  # a run from before validations recorded their seconds
        return probe, float("nan"), []
    valid_s, last = [], None  # the last train record, and the validations' seconds before it
    for r in rows:
        if r.get("kind") == "valid":
            valid_s.append(r["valid_s"])
        elif r.get("kind") == "train" and "elapsed" in r:
            last = (r["update"], r["elapsed"], sum(valid_s))
    if last is None:
        return probe, float("nan"), valid_s
    update, elapsed, validating = last
    training = elapsed - record["budget"].get("spent", 0.0) - validating
    return probe, update * per_update / training if training > 0 else float("nan"), valid_s


def plans(runs: Path) -> None:
    """Each `auto` run's plan (the updates and epochs its auto.json expected the budget to hold) against the updates
    it made, and the two things the plan rests on, as the run found them: the speed of its updates against the
    probe's, and a validation's seconds as padded tokens of training at the run's speed against VALIDATION_TOKENS
    (runs from before validations recorded `valid_s` leave those columns empty)."""
    from mt.train.auto import VALIDATION_TOKENS

    print("| run | planned updates | made | made / planned | planned epochs | made epochs | time before training, s "
          "| padded tok/s: planned at (the probe x its batch factor), run | validations, mean s "
          "| a validation in padded tokens "
          f"(charged {VALIDATION_TOKENS:,}) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for run in sorted(runs.glob("*.auto.s*")):
        record = run / "auto.json"
        if not record.is_file() or not (run / "metrics.jsonl").is_file():
            continue
        choices = json.loads(record.read_text())
        plan = chosen(choices, "plan")
        if plan is None:  # a run of the rule before it recorded its plan
            continue
        made = speed(run)[0]
        made_epochs = made * plan["epochs"] / plan["updates"] if plan["updates"] else 0.0
        probe, rate, valid_s = measured(run, choices)
        mean = sum(valid_s) / len(valid_s) if valid_s else float("nan")
        validation = f"{len(valid_s)}, {mean:.1f} | {mean * rate:,.0f}" if valid_s and rate == rate else " | "
        print(f"| {run.name} | {plan['updates']:,} | {made:,} | {made / max(plan['updates'], 1):.2f} | "
              f"{plan['epochs']:.1f} | {made_epochs:.1f} | {choices['budget'].get('spent', 0):.0f} | "
              f"{probe:,.0f}, {rate:,.0f} | {validation} |")  # fmt: skip


def table(runs: Path, plot: Path | None, minutes_plot: Path | None = None) -> None:
    from mt.data.files import read_lines
    from mt.evaluate.compare import System, compare, split_references

    def read_hyps(path: Path) -> list[str]:
        return [line.strip() for line in read_lines(path)]

    print(
        "| corpus | minutes | recipe | seed | updates | target tok/s | test BLEU lc / cased / chrF "
        "| Δ lc against fairseq's, p |"
    )
    print("|---|---|---|---|---|---|---|---|")
    points, summary = [], []
    for point, (corpus, minutes) in POINTS.items():
        c = CORPORA[corpus]
        seeds = {}  # seed -> the run dirs that translated the test split, fairseq's first where it ran
        for seed in range(1, 4):
            base = run_dir(runs, point, "fairseq", seed)
            others = [run_dir(runs, point, r, seed) for r in SCORED if r != "fairseq"]
            done = [r for r in [base, *others] if (r / f"{c.split}.hyp").is_file()]
            if len(done) < 2:
                continue
            seeds[seed] = done
            refs = read_hyps(split_references(done[-1], c.split))
            systems = [System(r.name.split(".")[1], str(r), read_hyps(r / f"{c.split}.hyp")) for r in done]
            result = compare(systems, refs)
            for r, s in zip(done, result["systems"]):
                m = s["metrics"]
                updates, rate = speed(r)
                measured = base in done and r != base  # the column is against fairseq's recipe
                versus = f"{m['BLEU lc']['delta']:+.2f}, {m['BLEU lc']['p_bs']:.3f}" if measured else ""
                scores = f"{m['BLEU lc']['score']:.2f} / {m['BLEU']['score']:.2f} / {m['chrF']['score']:.2f}"
                cells = [c.label, minutes, s["name"], seed, f"{updates:,}", f"{rate:,.0f}", scores, versus]
                print("| " + " | ".join(map(str, cells)) + " |")
                points.append((c.pairs, minutes, s["name"], m["BLEU lc"]["score"], c.label))
        # Over the seeds fairseq's recipe ran: the recipes each of them ran, translations and references end to end.
        ran = {seed: {r.name.split(".")[1] for r in done} for seed, done in seeds.items()}
        against = {seed: seeds[seed] for seed in seeds if "fairseq" in ran[seed]}
        lc = {}
        if against:
            names = ["fairseq", *(n for n in SCORED if n != "fairseq" and all(n in ran[s] for s in against))]
            lc = pooled_lc(runs, point, c.split, against, names)
            if len(against) > 1:
                for n in names[1:]:
                    print(f"| {c.label} | {minutes} | {n} | {'+'.join(map(str, against))} pooled | | | "
                          f"{lc[n]['score']:.2f} | {lc[n]['delta']:+.2f}, {lc[n]['p_bs']:.3f} |")  # fmt: skip
        # auto against this project's recipe and its literature variant, over the seeds both ran (pooled as above),
        # fairseq's run or not.
        paired = 0
        for rival in RIVALS:
            both = {seed: seeds[seed] for seed in seeds if {"auto", rival} <= ran[seed]}
            if both:
                mine = pooled_lc(runs, point, c.split, both, [rival, "auto"])
                lc[f"auto vs {rival}"] = mine["auto"] | {"seeds": len(both)}
                if not against:  # the scores alone: the fairseq column's difference stays empty; auto's over the
                    lc[rival] = {"score": mine[rival]["score"]}  # most seeds it shares with a rival
                    if len(both) > lc.get("auto", {}).get("seeds", 0):
                        lc["auto"] = {"score": mine["auto"]["score"], "seeds": len(both)}
                paired = max(paired, len(both))
        if lc:
            summary.append((c.label, minutes, len(against) or paired, lc))
    print("\nLowercased test BLEU (seeds pooled); auto's difference to fairseq's recipe and to the others, p:\n")
    print("| corpus | minutes | seeds | " + " | ".join(SCORED) + " | Δ auto, p | "
          + " | ".join(f"Δ auto against {r}, p (seeds)" for r in RIVALS) + " |")  # fmt: skip
    print("|---" * (len(SCORED) + 4 + len(RIVALS)) + "|")
    for label, minutes, n, lc in summary:
        cells = [f"{lc[r]['score']:.2f}" if r in lc else "" for r in SCORED]
        versus = f"{lc['auto']['delta']:+.2f}, {lc['auto']['p_bs']:.3f}" if "delta" in lc.get("auto", {}) else ""
        rivals = [f"{m['delta']:+.2f}, {m['p_bs']:.3f} ({m['seeds']})" if (m := lc.get(f"auto vs {r}")) else ""
                  for r in RIVALS]  # fmt: skip
        print(f"| {label} | {minutes} | {n} | " + " | ".join(cells) + f" | {versus} | " + " | ".join(rivals) + " |")
    if plot is not None and points:
        draw(points, plot)
    curve = [(m, r, b) for p, m, r, b, label in points if label == CORPORA[MINUTES_CORPUS].label]
    if minutes_plot is not None and curve:
        draw_minutes(curve, minutes_plot)


def pooled_lc(runs: Path, point: str, split: str, seeds: dict[int, list[Path]], names: list[str]) -> dict:
    """Lowercased BLEU of each named recipe over the given seeds, translations and references end to end; the
    first name is the baseline of the paired bootstrap."""
    from mt.data.files import read_lines
    from mt.evaluate.compare import System, compare, split_references

    hyps, refs = {n: [] for n in names}, []
    for seed, done in seeds.items():
        refs += [line.strip() for line in read_lines(split_references(done[-1], split))]
        for n in names:
            hyps[n] += [line.strip() for line in read_lines(run_dir(runs, point, n, seed) / f"{split}.hyp")]
    result = compare([System(n, point, hyps[n]) for n in names], refs)
    return {s["name"]: s["metrics"]["BLEU lc"] for s in result["systems"]}


def seed_means(scores: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """(budget, score) of every seed -> (budget, mean score) per budget, by budget."""
    budgets = sorted({m for m, _ in scores})
    return [(x, sum(b for m, b in scores if m == x) / sum(1 for m, _ in scores if m == x)) for x in budgets]


def draw_minutes(points: list[tuple[int, str, float]], out: Path) -> None:
    """Lowercased test BLEU against minutes of training on one corpus: a line per recipe through the mean of its
    seeds at each budget, each seed a dot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    for marker, recipe in zip(MARKERS, SCORED):
        mine = [(m, b) for m, r, b in points if r == recipe]
        if not mine:
            continue
        (line,) = ax.plot(
            *zip(*seed_means(mine)), marker=marker, label=LEGEND[recipe], zorder=3, color=f"C{SCORED.index(recipe)}"
        )
        ax.scatter(*zip(*mine), marker=marker, s=14, color=line.get_color(), alpha=0.5, zorder=2)
    ax.set_xlabel("minutes of training (train.max_time)")
    ax.set_ylabel("test BLEU, lowercased")
    ax.set_title(CORPORA[MINUTES_CORPUS].label, fontsize=10)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"plot: {out}")


def draw(points: list[tuple[int, int, str, float, str]], out: Path) -> None:
    """Lowercased test BLEU against training pairs, one panel per budget, one marker per recipe, each corpus
    named (points of different corpora are not joined: they are not one curve)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    corpora = {m: {p[4] for p in points if p[1] == m} for _, m, *_ in points}
    budgets = sorted(m for m, names in corpora.items() if len(names) > 1)  # one corpus alone: the minutes plot
    if not budgets:
        return
    fig, axes = plt.subplots(1, len(budgets), figsize=(4.2 * len(budgets), 3.6), squeeze=False)
    for ax, minutes in zip(axes[0], budgets):
        for marker, recipe in zip(MARKERS, SCORED):
            xy = [(p, b) for p, m, r, b, _ in points if m == minutes and r == recipe]
            if xy:
                color = f"C{SCORED.index(recipe)}"
                ax.scatter(*zip(*xy), marker=marker, s=45, label=LEGEND[recipe], zorder=3, color=color)
        for label in {(p, c) for p, m, _, _, c in points if m == minutes}:
            mine = [b for p, m, _, b, c in points if m == minutes and (p, c) == label]
            higher = [
                b for p, m, _, b, c in points if m == minutes and p == label[0] and c != label[1] and b > max(mine)
            ]
            # two corpora of the same size: the lower one's name goes beside its lowest point
            at, dx, dy, ha = (min(mine), 9, -3, "left") if higher else (max(mine), 0, 8, "center")
            ax.annotate(label[1], (label[0], at), textcoords="offset points", xytext=(dx, dy), ha=ha, fontsize=8)
        ax.margins(x=0.25)
        sizes = [p for p, m, *_ in points if m == minutes]
        ticks = [t for t in (1e3, 2e3, 3e3, 5e3, 1e4, 2e4, 3e4, 5e4, 1e5) if min(sizes) / 2 < t < max(sizes) * 2]
        ax.set_xscale("log")
        ax.set_xticks(ticks, [f"{t / 1000:g}k" for t in ticks])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_ylim(0, max(p[3] for p in points) * 1.15)
        ax.set_title(f"{minutes} minutes of training", fontsize=10)
        ax.set_xlabel("training pairs")
        ax.set_ylabel("test BLEU, lowercased")
        ax.grid(alpha=0.3)
        ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"plot: {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("action", choices=["cut", "command", "run", "table", "plans"])
    ap.add_argument("point", nargs="?", choices=list(POINTS))
    ap.add_argument("recipes", nargs="*", help=f"one or more of {', '.join(RECIPES)}")
    ap.add_argument("--seed", type=int, nargs="+", default=[1])
    ap.add_argument("--runs", type=Path, default=Path("runs/trials"), help="relative to the checkout, or absolute")
    ap.add_argument("--plot", type=Path, help="table: also draw BLEU against training pairs (PNG)")
    ap.add_argument("--minutes-plot", type=Path, help="table: also draw BLEU against minutes on Multi30k (PNG)")
    args = ap.parse_intermixed_args()  # options before or after the point and recipes
    runs = args.runs if args.runs.is_absolute() else ROOT / args.runs
    if args.action == "cut":
        return cut(runs.parent / "data")
    if args.action == "table":
        return table(runs, args.plot, args.minutes_plot)
    if args.action == "plans":
        return plans(runs)
    if args.point is None or not args.recipes or set(args.recipes) - set(RECIPES):
        ap.error(f"{args.action}: name a point ({', '.join(POINTS)}) and one or more recipes ({', '.join(RECIPES)})")
    for seed in args.seed:
        for recipe in args.recipes:
            cmd = command(args.point, recipe, seed, args.runs)
            print(shlex.join(cmd[1:] if args.action == "command" else cmd), flush=True)
            if args.action == "run":
                subprocess.run(cmd, cwd=ROOT, check=False)


if __name__ == "__main__":
    main()
