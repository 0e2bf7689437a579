"""Measurement: translating paragraphs, without and with sentence splitting (mt/decode/segment.py), against
translating their sentences one per line.

    python benchmarks/quality/paragraphs.py RUN                 # Multi30k test_2016_flickr and IWSLT TED test, En->De

Paragraphs are runs of 3 to 8 consecutive test lines (sizes drawn with a fixed seed; IWSLT's test is in talk order,
so a paragraph is a stretch of one talk, or at a talk's end of two), `--paragraphs` of them per corpus; a
paragraph's reference is its lines' references joined with spaces. Three systems per corpus, scored on the
paragraphs: "sentences" (each sentence on its own line, the translations joined), "paragraph" (the paragraph as one
line, as translate.py does by default) and "paragraph, split" (`split=True`). Also the share of source sentences
with no counterpart in the output: a sentence whose own translation's words (3+ letters, any case) are less than
half in the paragraph's output. Then the speed cost of splitting on the whole test set, one sentence per line:
sentences/s without and with `split`, one after the other in this process.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mt.data.files import read_lines  # noqa: E402
from mt.decode.translator import Translator  # noqa: E402
from mt.evaluate.compare import System, compare, markdown  # noqa: E402

DATA = ROOT.parent / "shared/data"
CORPORA = {"multi30k": ("multi30k", "test_2016_flickr"), "iwslt": ("iwslt_ted_de_en", "test")}


def read(folder: str, split: str, lang: str) -> list[str]:
    return [line.strip() for line in read_lines(DATA / folder / f"{split}.{lang}.gz")]


def paragraphs(n_lines: int, count: int, seed: int) -> list[range]:
    rng, out, at = random.Random(seed), [], 0
    while len(out) < count and at < n_lines:
        size = rng.randint(3, 8)
        out.append(range(at, min(at + size, n_lines)))
        at += size
    return out


def content(text: str) -> set[str]:
    return {w.lower() for w in re.findall(r"\w{3,}", text)}


def dropped(sentence_translations: list[str], output: str) -> tuple[int, int]:
    """(source sentences without a counterpart in `output`, sentences judged)."""
    have, lost, judged = content(output), 0, 0
    for t in sentence_translations:
        words = content(t)
        if words:
            judged += 1
            lost += len(words & have) < 0.5 * len(words)
    return lost, judged


def measure(t: Translator, name: str, folder: str, split: str, args) -> None:
    src, ref = read(folder, split, args.src), read(folder, split, args.tgt)
    paras = paragraphs(len(src), args.paragraphs, args.seed)
    lines = [i for p in paras for i in p]
    alone = dict(zip(lines, t.translate([src[i] for i in lines])))
    para_src = [" ".join(src[i] for i in p) for p in paras]
    refs = [" ".join(ref[i] for i in p) for p in paras]
    systems = {
        "sentences": [" ".join(alone[i] for i in p) for p in paras],
        "paragraph": t.translate(para_src),
        "paragraph, split": t.translate(para_src, split=True),
    }
    print(f"\n## {name} {split}: {len(paras)} paragraphs of {len(lines)} lines ({len(lines) / len(paras):.1f} each)\n")
    print(markdown(compare([System(k, k, v) for k, v in systems.items()], refs)))
    print("\n| system | source sentences with no counterpart | output words / reference words |\n|---|---|---|")
    for k, outs in systems.items():
        lost = [dropped([alone[i] for i in p], o) for p, o in zip(paras, outs)]
        words = sum(len(o.split()) for o in outs) / sum(len(r.split()) for r in refs)
        print(f"| {k} | {100 * sum(a for a, _ in lost) / sum(b for _, b in lost):.1f}% | {words:.2f} |")


def speed(t: Translator, folder: str, split: str, args) -> None:
    src = read(folder, split, args.src)
    t.translate(src[:50])  # warm-up
    seconds = {}
    for on in (False, True, False, True):  # twice each, interleaved: the machine's drift shows
        start = time.perf_counter()
        t.translate(src, split=on)
        seconds.setdefault(on, []).append(time.perf_counter() - start)
    plain, split_s = min(seconds[False]), min(seconds[True])
    print(f"\n## speed, {folder} {split} ({len(src)} lines, one sentence each; best of 2)\n")
    print(f"without split: {len(src) / plain:.1f} sentences/s; with split: {len(src) / split_s:.1f} sentences/s "
          f"({split_s / plain:.3f}x the time)")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a run dir or release of an En->De model")
    p.add_argument("--src", default="en")
    p.add_argument("--tgt", default="de")
    p.add_argument("--paragraphs", type=int, default=150)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    t = Translator.load(args.run, device="cpu")
    for name, (folder, split) in CORPORA.items():
        measure(t, name, folder, split, args)
    speed(t, *CORPORA["multi30k"], args)


if __name__ == "__main__":
    main()
