"""The rule's choices as a table, corpus sizes against budgets (docs/auto.md's), with the rule's reason beside each
choice that differs between neighbouring cells: `python -m mt.train.auto_grid`."""

from __future__ import annotations

from collections.abc import Mapping

from mt.train.auto import SHAPES, Budget, CorpusStats, Speed, choose

# The grid's columns: the choices it shows, each read from the key whose reason says why it changed
GRID_KEYS = {"vocabulary": "tokenizer.vocab_size", "shape": "model.d_model", "schedule": "model.norm",
             "dropout": "model.dropout", "FLoRes' extras": "train.label_smoothing"}  # fmt: skip


def _cell(corpus: CorpusStats, budget: Budget, speed) -> dict[str, tuple[str, str]]:
    """A grid cell: each of GRID_KEYS's choices as shown, with the reason the rule gives for it."""
    got = {c.key: c for c in choose(corpus, budget, speed)}
    shape = next(name for name, s in SHAPES.items() if s["d_model"] == got["model.d_model"].value)
    shown = {"vocabulary": f"{got['tokenizer.vocab_size'].value // 1000}k", "shape": shape,
             "schedule": "long" if got["model.norm"].value == "post" else "short",
             "dropout": f"{got['model.dropout'].value:g}",
             "FLoRes' extras": "FLoRes" if got["train.label_smoothing"].value == 0.2 else ""}  # fmt: skip
    return {name: (shown[name], got[key].reason) for name, key in GRID_KEYS.items()}


def grid(
    pairs: list[int], minutes: list[float], speed: Speed | Mapping[str, float], words_per_pair: float = 13.0
) -> str:
    """A Markdown table of the main choices for each corpus size (rows) and budget (columns), docs/auto.md's: the
    BPE vocabulary, the shape, the schedule (short: the quick start's; long: fairseq's), dropout, and FLoRes'
    extras where they apply; then, for each choice that differs between neighbouring cells, the reason the rule
    gives for it in the larger one. Both sides of a pair are taken to have `words_per_pair` words."""
    cells = {(n, m): _cell(CorpusStats(n, int(n * words_per_pair), int(n * words_per_pair)), Budget(minutes=m), speed)
             for n in pairs for m in minutes}  # fmt: skip
    rows = ["| pairs | " + " | ".join(f"{m:g} min" for m in minutes) + " |", "|---" * (len(minutes) + 1) + "|"]
    for n in pairs:
        shown = [", ".join(v for v, _ in cells[(n, m)].values() if v) for m in minutes]
        rows.append(f"| {n:,} | " + " | ".join(shown) + " |")
    changes = []
    neighbours = [
        ((n, a), (n, b), f"{n:,} pairs, {a:g} -> {b:g} min") for n in pairs for a, b in zip(minutes, minutes[1:])
    ]
    neighbours += [
        ((a, m), (b, m), f"{a:,} -> {b:,} pairs, {m:g} min") for m in minutes for a, b in zip(pairs, pairs[1:])
    ]
    for here, there, where in neighbours:
        for name in GRID_KEYS:
            (was, _), (now, why) = cells[here][name], cells[there][name]
            if was != now:
                changes.append(f"- {where}: {name} {was or 'none'} -> {now or 'none'}: {why}")
    return "\n".join(rows + ["", "Where neighbouring cells differ, the rule's reason in the second:", *changes])


if __name__ == "__main__":  # the grid at the probe's table speed (a 2-vCPU EPYC)
    from mt.train.speeds import TABLE

    print(grid([2_000, 5_000, 10_000, 29_000, 100_000, 500_000, 2_000_000], [5, 10, 30, 60, 240], Speed(TABLE)))
