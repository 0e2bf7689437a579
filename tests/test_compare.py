"""python -m mt.compare: sacreBLEU's paired tests between systems on the same references."""

from __future__ import annotations

import json
import random

import pytest

from mt.evaluate.compare import compare, load_systems, main
from tests.conftest import MULTI30K, read_gz


def _noisy(line: str, rng: random.Random) -> str:
    """A worse translation: two words dropped, two swapped."""
    words = line.split()
    if len(words) > 3:
        del words[rng.randrange(len(words))], words[rng.randrange(len(words) - 1)]
        i = rng.randrange(len(words) - 1)
        words[i], words[i + 1] = words[i + 1], words[i]
    return " ".join(words)


@pytest.fixture(scope="module")
def systems():
    if not (MULTI30K / "test_2016_flickr.de.gz").is_file():  # (a marker does nothing inside a fixture)
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    refs = read_gz(MULTI30K / "test_2016_flickr.de.gz")
    rng = random.Random(0)
    base = [_noisy(r, rng) for r in refs]
    better = [r if i % 3 == 0 else b for i, (r, b) in enumerate(zip(refs, base))]  # a third are the references
    rng = random.Random(1)
    alike = [_noisy(r, rng) if i % 50 == 0 else b for i, (r, b) in enumerate(zip(refs, base))]  # 20 lines redrawn
    return refs, {"base": base, "better": better, "alike": alike}


def test_identical_systems_are_not_different_and_a_better_one_is(systems, tmp_path, capsys):
    refs, hyps = systems
    paths = []
    for name in ("base", "base", "better", "alike"):
        paths.append(tmp_path / f"{name}.de")
        paths[-1].write_text("".join(h + "\n" for h in hyps[name]))
    (tmp_path / "refs.de").write_text("".join(r + "\n" for r in refs))
    main([*map(str, paths), "--refs", str(tmp_path / "refs.de"), "--names", "base,same,better,alike",
          "--json", str(tmp_path / "out.json")])  # fmt: skip
    table = capsys.readouterr().out
    result = json.loads((tmp_path / "out.json").read_text())
    same, better, alike = (s["metrics"] for s in result["systems"][1:])
    for key in ("BLEU", "BLEU lc", "chrF"):
        assert same[key]["delta"] == 0 and same[key]["p_bs"] == 1.0
        assert better[key]["delta"] > 2 * better[key]["delta_ci"] > 0 and better[key]["p_bs"] < 0.01
        assert alike[key]["p_bs"] > 0.05, alike[key]  # 20 of 1,000 lines redrawn from the same noise
    assert result["signatures"]["BLEU lc"].split("|")[3] == "case:lc" and "bs:1000" in result["signatures"]["BLEU"]
    assert "| better |" in table and "(baseline)" in table.splitlines()[2]


def test_approximate_randomization_agrees(systems):
    refs, hyps = systems
    from mt.evaluate.compare import System

    result = compare([System(n, n, hyps[n]) for n in ("base", "better", "alike")], refs, ar=True, samples=200)
    better, alike = (s["metrics"]["BLEU"] for s in result["systems"][1:])
    assert better["p_ar"] < 0.01 and alike["p_ar"] > 0.05


def test_run_dirs_give_their_split_and_references(tmp_path, capsys):
    """A run dir stands for its `{split}.hyp`; the references are the split's target side from its config (a
    multilingual run's `test.xx-zz`: test.zz)."""
    import yaml

    from tests.conftest import write_toy_corpus

    corpus = write_toy_corpus(tmp_path / "corpus", multiway=True)
    data = {"name": "toy", "format": "parallel", "dir": str(corpus), "src_lang": "xx", "tgt_lang": "yy",
            "directions": ["xx-yy", "xx-zz"]}  # fmt: skip
    refs = (corpus / "test.zz").read_text().splitlines()
    runs = [tmp_path / "a", tmp_path / "b"]
    for run, hyps in zip(runs, ([" ".join(r.split()[:-1]) for r in refs], refs)):
        run.mkdir()
        (run / "config.resolved.yaml").write_text(yaml.safe_dump({"data": data}))
        (run / "test.xx-zz.hyp").write_text("".join(h + "\n" for h in hyps))
        (run / "test.xx-yy.hyp").write_text("x\n")
    main([str(runs[0]), str(runs[1]), "--split", "test.xx-zz"])
    assert f"| {runs[1]} | 100.00" in capsys.readouterr().out
    with pytest.raises(Exception, match="a run dir with test splits test.xx-yy, test.xx-zz; name one with --split"):
        load_systems([str(runs[0])], None, None)


@pytest.mark.parametrize(
    "args, message",
    [
        (["{a}"], "give at least two systems"),
        (["{a}", "{short}", "--refs", "{refs}"], "short.de has 2 lines but the references have 3"),
        (["{a}", "{a}", "--refs", "{tmp}/none.de"], "none.de: no such file"),
        (["{a}", "{a}", "--refs", "{refs}", "--names", "x"], "--names: 1 names for 2 systems"),
        (["{a}", "{a}"], "--refs FILE is needed"),
    ],
)
def test_bad_calls_are_one_line_errors(tmp_path, capsys, args, message):
    (tmp_path / "a.de").write_text("x\ny\nz\n")
    (tmp_path / "short.de").write_text("x\ny\n")
    (tmp_path / "refs.de").write_text("x\ny\nz\n")
    paths = {"a": tmp_path / "a.de", "short": tmp_path / "short.de", "refs": tmp_path / "refs.de", "tmp": tmp_path}
    with pytest.raises(SystemExit) as e:
        main([a.format(**paths) for a in args])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("error: ") and message in err, err
