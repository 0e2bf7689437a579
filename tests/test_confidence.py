"""A confidence for every translation (mt/decode/confidence.py): the score is the mean token log-probability the
search computed, equal to forced decoding's and to CTranslate2's on an export; translate.py's jsonl output, the
report's flag counts, the length-limit flag and MC dropout."""

import json
import subprocess
import sys

import pytest
import torch

from mt.config import ConfigError
from mt.decode.batched import translate_ids
from mt.decode.flags import FLAGS
from tests.conftest import ROOT
from tests.test_translator import LINES, translate


def mean_logprobs(t, lines: list[str]) -> list[float]:
    hyps = translate_ids(t.model, t.vocabs.src.encode_batch(lines), t.decode, torch.device("cpu"), None)
    return [h[0].logprob / (len(h[0].tokens) + 1) for h in hyps]


@pytest.mark.parametrize("beam", [1, 4])
def test_the_score_is_the_searchs_mean_log_probability_whatever_the_length_penalty(toy_run, beam):
    from mt import Translator

    t = Translator.load(toy_run, device="cpu", beam_size=beam, length_penalty=1.0)
    src = [line for line in LINES if line]
    found = t.translate(src, scores=True)
    assert [r["text"] for r in found] == t.translate(src)
    assert [r["score"] for r in found] == pytest.approx(mean_logprobs(t, src), abs=1e-5)
    forced = t.score(src, [r["text"] for r in found])
    n = [len(ids) + 1 for ids in t.vocabs.tgt.encode_batch([r["text"] for r in found])]
    assert [r["score"] for r in found] == pytest.approx([f / k for f, k in zip(forced, n)], abs=1e-4)
    assert all(r["score"] < 0 and isinstance(r["flags"], list) for r in found)


def test_the_length_limit_is_flagged_and_the_run_keeps_its_length_range(toy_run):
    from mt import Translator
    from mt.model import saved

    low, high = saved.load(toy_run)["length_ratio"]
    assert 0 < low <= 1 <= high  # the toy target is its source's words reversed
    t = Translator.load(toy_run, device="cpu", beam_size=1, max_len_a=0.0, max_len_b=3)
    found = t.translate(["the big red house and the tree", ""], scores=True)
    assert "length_limit" in found[0]["flags"] and found[1] == {"text": "", "score": 0.0, "flags": []}
    free = Translator.load(toy_run, device="cpu", beam_size=1).translate(["the cat"], scores=True)
    assert "length_limit" not in free[0]["flags"]
    with pytest.raises(ConfigError, match="scores=True scores one translation a line"):
        t.translate(["the cat"], scores=True, beam_size=2, nbest=2)


def test_translate_py_writes_a_json_object_a_line_and_counts_flags_in_the_report(toy_run, tmp_path):
    src = "".join(line + "\n" for line in LINES)
    plain = translate(toy_run, input=src)
    p = translate(toy_run, "output_format=jsonl", "flag_below=-0.0001", input=src)
    assert p.returncode == 0, p.stderr[-2000:]
    found = [json.loads(line) for line in p.stdout.splitlines()]
    assert [r["text"] for r in found] == plain.stdout.splitlines() and len(found) == len(LINES)
    assert all(set(r) == {"text", "score", "flags"} for r in found)
    assert all("low_score" in r["flags"] for r, line in zip(found, LINES) if line)
    (tmp_path / "ref.txt").write_text("".join(r["text"] + "\n" for r in found))
    p = translate(toy_run, "output_format=jsonl", "flag_below=-0.0001", f"references={tmp_path / 'ref.txt'}",
                  f"output={tmp_path / 'out.jsonl'}", input=src)  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    counts = {name: sum(name in r["flags"] for r in found) for name in FLAGS}
    assert report["flags"] == counts and counts["low_score"] == sum(1 for line in LINES if line)


def test_mc_dropout_gives_the_mean_and_variance_of_its_passes(toy_run, tmp_path):
    from mt import Translator
    from mt.decode.confidence import mc_dropout, records

    t = Translator.load(toy_run, device="cpu", beam_size=1)
    assert t.model.cfg.dropout > 0
    src = [line for line in LINES if line]
    src_ids, hyps = t.hypotheses(src)
    best = [h[0] for h in hyps]
    texts = t.vocabs.tgt.decode_batch([h.tokens for h in best])
    a = records(t, src, src_ids, best, texts, t.decode, mc_passes=4)
    b = records(t, src, src_ids, best, texts, t.decode, mc_passes=4)
    assert a == b  # seeded by decode.seed
    assert all(0 < r["mc_mean"] < 1 and r["mc_var"] > 0 for r in a)
    passes = mc_dropout(t, src_ids, [h.tokens for h in best], t.framing(), 3, 0)
    assert all(len(set(p)) == 3 for p in passes)  # each pass another subnetwork
    assert not t.model.training  # dropout off again
    assert [r["score"] for r in a] == [r["score"] for r in records(t, src, src_ids, best, texts, t.decode)]


def test_a_ctranslate2_export_gives_the_same_score(toy_run, tmp_path):
    pytest.importorskip("ctranslate2")
    from mt import Translator
    from mt.export.formats import export_ctranslate2

    ours = Translator.load(toy_run, device="cpu", beam_size=2, length_penalty=1.0, length_penalty_type="average")
    ct2 = Translator.load(export_ctranslate2(str(toy_run), tmp_path / "ct2"), device="cpu", beam_size=2,
                          length_penalty=1.0, length_penalty_type="average")  # fmt: skip
    src = [line for line in LINES if line]
    a, b = ours.translate(src, scores=True), ct2.translate(src, scores=True)
    assert [r["text"] for r in a] == [r["text"] for r in b]
    assert [r["score"] for r in a] == pytest.approx([r["score"] for r in b], abs=1e-4)
    with pytest.raises(ConfigError, match="mc_dropout needs this project's model"):
        from mt.decode.confidence import mc_dropout

        mc_dropout(ct2, [[5]], [[6]], ct2.framing(), 2, 0)


# ------------------------------------------------------------------ python -m mt.score


def mt_score(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mt.score", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def test_mt_score_is_the_teacher_forced_loss_and_translate_pys_score(toy_run, tmp_path):
    from mt import Translator
    from mt.data.batching import collate

    t = Translator.load(toy_run, device="cpu", beam_size=2)
    src = ["the cat sees a dog", "a big red house", "", "the tree runs"]
    found = t.translate(src, scores=True)
    tgt = [r["text"] for r in found[:3]] + ["a small house sees the cat"]  # the last: not the model's translation
    (tmp_path / "c.src").write_text("".join(s + "\n" for s in src))
    (tmp_path / "c.tgt").write_text("".join(s + "\n" for s in tgt))
    p = mt_score(f"checkpoint={toy_run}", f"src={tmp_path / 'c.src'}", f"tgt={tmp_path / 'c.tgt'}", "batch_lines=3")
    assert p.returncode == 0, p.stderr[-2000:]
    scores = [float(line) for line in p.stdout.splitlines()]
    assert scores[:3] == pytest.approx([r["score"] for r in found[:3]], abs=1e-5)  # translate.py's score
    ids = [0, 1, 3]
    b = collate(t.vocabs.src.encode_batch([src[i] for i in ids]), t.vocabs.tgt.encode_batch([tgt[i] for i in ids]),
                ids)  # fmt: skip
    with torch.no_grad():
        _, nll = t.model.loss(b.src, b.src_pad_mask, b.tgt_in, b.tgt_out, 0.0)
    assert -(sum(scores[i] * (len(t.vocabs.tgt.encode(tgt[i])) + 1) for i in ids)) == pytest.approx(
        float(nll), rel=1e-4
    )  # the training loss's summed NLL, label smoothing off
    pair = f"src={tmp_path / 'c.src'}", f"tgt={tmp_path / 'c.tgt'}"
    p = mt_score(f"checkpoint={toy_run}", f"reverse={toy_run}", *pair, "keep=0.5", f"output={tmp_path / 'kept'}")
    assert p.returncode == 0, p.stderr[-2000:]
    rows = [line.split("\t") for line in (tmp_path / "kept" / "scores.txt").read_text().splitlines()]
    assert len(rows) == 4 and all(len(r) == 2 for r in rows)
    best = sorted(range(4), key=lambda i: -float(rows[i][1]))[:2]
    kept = (tmp_path / "kept" / "c.src").read_text().splitlines()
    assert kept == [src[i] for i in sorted(best)] and len((tmp_path / "kept" / "c.tgt").read_text().splitlines()) == 2


def test_an_ensemble_is_scored_by_its_mean_probabilities(toy_run):
    from mt import Translator

    src = [line for line in LINES if line]
    single = Translator.load(toy_run, device="cpu", beam_size=2).translate(src, scores=True)
    twice = Translator.load([toy_run, toy_run], device="cpu", beam_size=2).translate(src, scores=True)
    assert [r["text"] for r in twice] == [r["text"] for r in single]
    assert [r["score"] for r in twice] == pytest.approx([r["score"] for r in single], abs=1e-5)
