"""Measurements of lexically constrained decoding (mt/decode/constraints.py), in one process per mode.

    python benchmarks/quality/terminology.py constraints RUN            # Multi30k test_2016_flickr, En->De
    python benchmarks/quality/terminology.py glossary RUN --data ../shared/data/opus_emea_de_en

constraints: the protocol of the constrained-decoding papers (Post & Vilar 2018, Hu et al. 2019): per test line,
1 or 2 words of its reference that the unconstrained beam output lacks (drawn with a fixed seed; lines whose output
lacks none get none). Prints BLEU (cased, lowercased) and chrF without and with them, the paired-bootstrap p-value
(mt.compare), the share of constraints met, and sentences/s of plain beam search and of the constrained search
with one constraint on every line that has one, measured one after the other in this process on the same lines.

glossary: a glossary built from the domain's training split: source terms (1-2 words) whose most associated target
word (Dice coefficient over training pairs) appears in at least 70% of the target sides of their pairs (each target
word kept for its most associated source term only), kept where
the model's translation of those training lines usually lacks it (the model gets the term wrong), the `--terms`
most frequent in the test source. Applied to the test split: term accuracy (of the test lines whose source has a
glossary term and whose reference has its target term, the share whose output has it), BLEU and chrF without and
with, and the p-value.
"""

from __future__ import annotations

import argparse
import collections
import random
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mt.data.files import read_lines  # noqa: E402
from mt.decode.terminology import Glossary  # noqa: E402
from mt.decode.translator import Translator  # noqa: E402
from mt.evaluate.compare import System, compare, markdown  # noqa: E402

WORD = re.compile(r"\w[\w'-]*\w|\w")


def read(path: Path) -> list[str]:
    return [line.strip() for line in read_lines(path)]


def split_file(folder: Path, split: str, lang: str) -> Path:
    for name in (f"{split}.{lang}.gz", f"{split}.{lang}"):
        if (folder / name).is_file():
            return folder / name
    raise SystemExit(f"error: {folder}/{split}.{lang}[.gz]: no such file")


def contains(text: str, phrase: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(phrase)}(?!\w)", text) is not None


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def pick_constraints(refs: list[str], outputs: list[str], seed: int) -> list[list[str]]:
    """Per line, 1 or 2 reference words (3+ letters) that its output lacks."""
    rng, out = random.Random(seed), []
    for ref, hyp in zip(refs, outputs):
        missing = list(dict.fromkeys(w for w in WORD.findall(ref) if len(w) >= 3 and not contains(hyp, w)))
        out.append(rng.sample(missing, min(len(missing), rng.choice((1, 2)))))
    return out


def report(name: str, systems: dict[str, list[str]], refs: list[str]) -> None:
    result = compare([System(n, n, h) for n, h in systems.items()], refs)
    print(f"\n### {name}\n")
    print(markdown(result))


def run_constraints(args) -> None:
    t = Translator.load(args.run, device="cpu")
    src = read(split_file(args.data, args.split, args.src))
    refs = read(split_file(args.data, args.split, args.tgt))
    t.translate(src[:50])  # warm-up
    plain, plain_s = timed(lambda: t.translate(src))
    cons = pick_constraints(refs, plain, args.seed)
    constrained, cons_s = timed(lambda: t.translate(src, constraints=cons))
    asked = sum(len(c) for c in cons)
    met = sum(contains(o, p) for o, c in zip(constrained, cons) for p in c)
    lines = [i for i, c in enumerate(cons) if c]
    one = [[c[0]] for c in cons if c]
    sub = [src[i] for i in lines]
    _, sub_plain_s = timed(lambda: t.translate(sub))
    _, sub_one_s = timed(lambda: t.translate(sub, constraints=one))
    two = sum(len(c) == 2 for c in cons)
    print(f"{args.split}: {len(src)} lines, {len(lines)} with constraints, {asked} constraints ({two} lines with 2); "
          f"met {met} of {asked} ({100 * met / max(asked, 1):.1f}%)")  # fmt: skip
    print(f"whole test set, 1-2 constraints per line: plain {len(src) / plain_s:.1f} sent/s, constrained "
          f"{len(src) / cons_s:.1f} sent/s ({cons_s / plain_s:.2f}x the time)")  # fmt: skip
    print(f"the {len(sub)} lines with constraints, one each: plain {len(sub) / sub_plain_s:.1f} sent/s, constrained "
          f"{len(sub) / sub_one_s:.1f} sent/s ({sub_one_s / sub_plain_s:.2f}x the time)")  # fmt: skip
    report("BLEU and chrF", {"plain beam": plain, "constrained": constrained}, refs)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "constraints.txt").write_text("".join("\t".join(c) + "\n" for c in cons))
        (args.out / "plain.hyp").write_text("".join(h + "\n" for h in plain))
        (args.out / "constrained.hyp").write_text("".join(h + "\n" for h in constrained))


STOP = set("""about above after again against all also among and another any are because been before being below between
both but can could does doing down during each either every from further have having here into its itself more most
much must not now off once only other others our out over own same should some such than that the their them then
there these they this those through too under until upon very was were what when where which while who whom why will
with within without would you your""".split())  # fmt: skip


def candidate_terms(src: list[str], tgt: list[str], min_count: int = 5) -> dict[str, tuple[str, float]]:
    """Source term (1-2 words) -> (its most associated target word, share of its pairs whose target has it)."""
    src_words = [WORD.findall(s) for s in src]
    tgt_sets = [set(w for w in WORD.findall(t) if len(w) >= 5) for t in tgt]
    tgt_count = collections.Counter(w for s in tgt_sets for w in s)
    occurs = collections.defaultdict(list)
    for i, words in enumerate(src_words):
        grams = {w for w in words if len(w) >= 5 and w.lower() not in STOP}
        grams |= {f"{a} {b}" for a, b in zip(words, words[1:]) if a.lower() not in STOP and b.lower() not in STOP
                  and len(a) >= 3 and len(b) >= 5}  # fmt: skip
        for g in grams:
            occurs[g].append(i)
    out = {}
    for term, rows in occurs.items():
        if len(rows) < min_count:
            continue
        co = collections.Counter(w for i in rows for w in tgt_sets[i])
        if not co:
            continue
        word, n = max(co.items(), key=lambda kv: (2 * kv[1] / (len(rows) + tgt_count[kv[0]]), kv[0]))
        dice = 2 * n / (len(rows) + tgt_count[word])
        if n / len(rows) >= 0.7 and dice >= 0.5:
            out[term] = (word, dice)
    best: dict[str, str] = {}  # one source term per target word: the most associated ("mediastinal", not "thoracic")
    for term, (word, dice) in out.items():
        if word not in best or dice > out[best[word]][1]:
            best[word] = term
    return {term: out[term] for term in best.values()}


def run_glossary(args) -> None:
    t = Translator.load(args.run, device="cpu")
    train_src, train_tgt = (
        read(split_file(args.data, "train", args.src)),
        read(split_file(args.data, "train", args.tgt)),
    )
    src, refs = read(split_file(args.data, args.split, args.src)), read(split_file(args.data, args.split, args.tgt))
    terms = candidate_terms(train_src, train_tgt)
    test_freq = {term: sum(contains(s, term) for s in src) for term in terms}
    ranked = sorted((t_ for t_ in terms if test_freq[t_]), key=lambda t_: -test_freq[t_])
    wrong, checked = {}, 0
    for term in ranked:  # the model's translations of (up to 8 of) the term's training lines
        rows = [i for i, s in enumerate(train_src) if contains(s, term) and contains(train_tgt[i], terms[term][0])][:8]
        outs = t.translate([train_src[i] for i in rows])
        checked += len(rows)
        if sum(contains(o, terms[term][0]) for o in outs) < 0.5 * len(rows):
            wrong[term] = terms[term][0]
        if len(wrong) == args.terms:
            break
    glossary = Glossary(wrong)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "glossary.tsv").write_text("".join(f"{s}\t{g}\n" for s, g in wrong.items()))
    print(f"{len(terms)} candidate terms from train, {len(ranked)} in the test source; {checked} training lines "
          f"translated to find the {len(wrong)} the model gets wrong")  # fmt: skip
    plain, plain_s = timed(lambda: t.translate(src))
    glossed, gloss_s = timed(lambda: t.translate(src, glossary=glossary))
    pairs = [(i, g) for i, s in enumerate(src) for g in glossary.find(s) if contains(refs[i], g)]
    acc_plain = sum(contains(plain[i], g) for i, g in pairs) / max(len(pairs), 1)
    acc_gloss = sum(contains(glossed[i], g) for i, g in pairs) / max(len(pairs), 1)
    hit_lines = sum(bool(glossary.find(s)) for s in src)
    print(f"{args.split}: {len(src)} lines, {hit_lines} with glossary terms; {len(pairs)} term occurrences whose "
          f"reference has the target term: term accuracy {100 * acc_plain:.1f}% plain, {100 * acc_gloss:.1f}% with "
          f"the glossary")  # fmt: skip
    print(f"speed: plain {len(src) / plain_s:.1f} sent/s, glossary {len(src) / gloss_s:.1f} sent/s")
    report("BLEU and chrF", {"plain beam": plain, "glossary": glossed}, refs)
    if args.out:
        (args.out / "plain.hyp").write_text("".join(h + "\n" for h in plain))
        (args.out / "glossary.hyp").write_text("".join(h + "\n" for h in glossed))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=("constraints", "glossary"))
    p.add_argument("run", help="a run dir or release of an En->De model")
    p.add_argument("--data", type=Path, default=ROOT.parent / "shared/data/multi30k")
    p.add_argument("--split", default=None, help="default: test_2016_flickr (constraints), test (glossary)")
    p.add_argument("--src", default="en")
    p.add_argument("--tgt", default="de")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--terms", type=int, default=50)
    p.add_argument("--out", type=Path, default=None, help="write the constraints/glossary and outputs here")
    args = p.parse_args()
    args.split = args.split or ("test_2016_flickr" if args.mode == "constraints" else "test")
    (run_constraints if args.mode == "constraints" else run_glossary)(args)


if __name__ == "__main__":
    main()
