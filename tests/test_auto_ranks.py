"""`+experiment=auto` under torchrun: rank 0 chooses for every rank, each update keeps the recipe's tokens shared
among the ranks, the plan counts every rank's speed, and a refusal on rank 0 stops them all."""

import json
import os
import random
import subprocess
import sys

import pytest
import torch

from mt.train import auto_setup, probe
from mt.train.auto import PLAN, Budget, CorpusStats, Speed, choose
from mt.train.auto_ranks import MIN_RANK_TOKENS, over_ranks, scaled
from tests.conftest import ROOT
from tests.test_cli import free_port

MULTI30K = CorpusStats(29_000, 348_000, 330_000)
SPEED = {"compact": 9_000.0, "small": 3_000.0, "base": 600.0}


def batch(choices) -> tuple[int, int, int]:
    got = {c.key: c.value for c in choices}
    return got["train.max_tokens"], got["train.accumulate"], got[PLAN]["updates"]


@pytest.mark.parametrize(
    "minutes, ranks, per_rank, steps",
    [(56, 2, 4_096, 1), (56, 3, 2_731, 1), (56, 4, 2_048, 1), (5, 2, 1_250, 1), (5, 1, 2_500, 1), (56, 1, 4_096, 2)],
)
def test_each_update_keeps_the_recipes_tokens_shared_among_the_ranks(minutes, ranks, per_rank, steps):
    choices = choose(MULTI30K, Budget(minutes=minutes), SPEED)
    tokens, accumulate, updates = batch(choices)
    shared = over_ranks(choices, ranks)
    assert batch(shared) == (per_rank, steps, updates)  # the same updates, each of the recipe's tokens
    assert abs(per_rank * steps * ranks - tokens * accumulate) < ranks
    assert [c.key for c in shared] == [c.key for c in choices]
    if ranks > 1:
        reason = next(c.reason for c in shared if c.key == "train.max_tokens")
        assert reason.startswith(f"{tokens * accumulate:,} tokens an update (the recipe's) over {ranks} ranks")


def test_a_ranks_batch_has_a_floor_and_the_plan_then_counts_larger_updates():
    choices = choose(MULTI30K, Budget(minutes=5), SPEED)  # 2,500 tokens an update
    _, _, updates = batch(choices)
    shared = over_ranks(choices, 8)  # 313 a rank: under the floor
    assert batch(shared) == (MIN_RANK_TOKENS, 1, round(updates * 2_500 / (8 * MIN_RANK_TOKENS)))
    reason = next(c.reason for c in shared if c.key == "train.max_tokens")
    assert f"under {MIN_RANK_TOKENS:,}" in reason and "8,192 tokens an update" in reason


def test_the_plan_counts_every_ranks_speed():
    one = Speed({("compact", 4_000, False): 5_000.0}, {"compact": 4_000.0})
    assert scaled(one, 2)("compact", 4_000) == 10_000.0 and scaled(one, 2).flat == {"compact": 8_000.0}
    alone = batch(choose(MULTI30K, Budget(minutes=20), SPEED))[2]
    together = batch(over_ranks(choose(MULTI30K, Budget(minutes=20), scaled(Speed(flat=SPEED), 2)), 2))[2]
    assert together > 1.9 * alone  # twice the tokens a second: about twice the updates (the validations cost less)


def test_a_run_of_several_ranks_off_its_plan_warns_and_leaves_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MT_CACHE", str(tmp_path / "cache"))
    cpu = torch.device("cpu")
    key = probe.cache_key(("compact", 4_000, False), auto_setup.SHAPES["compact"], cpu, "fp32")
    probe._write(probe.cache_path(), {key: 5_000.0})
    plan = {"key": "plan", "value": {"updates": 1_000, "epochs": 9.5}, "reason": "1,000 updates"}
    (tmp_path / "auto.json").write_text(json.dumps({"choices": [plan], "device": "cpu", "ranks": 2,
                                                    "speed": [["compact", 4_000, False, 5_000.0]]}))  # fmt: skip
    assert auto_setup.check_plan(tmp_path, 900, probed=True) is None  # one process would rescale here
    warning = auto_setup.check_plan(tmp_path, 600, probed=True)  # one process would drop the figures here
    assert "1,000 updates of 2 ranks" in warning and "are left as they are" in warning
    assert json.loads(probe.cache_path().read_text()) == {key: 5_000.0}


def corpus(tmp_path, pairs: int):
    rng = random.Random(0)
    words = "the a cat dog sees runs big small red house tree and".split()
    out = tmp_path / "corpus"
    out.mkdir()
    for split, n in (("train", pairs), ("valid", 30), ("test", 20)):
        src = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 9))) for _ in range(n)]
        (out / f"{split}.xx").write_text("\n".join(src) + "\n")
        (out / f"{split}.yy").write_text("\n".join(" ".join(s.split()[::-1]) for s in src) + "\n")
    return out


def torchrun_auto(data, run, *extra) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
           "train.py", "+experiment=auto", "data=local", f"data.dir={data}", "data.src_lang=xx", "data.tgt_lang=yy",
           "auto.probe=false", "train.device=cpu", "train.progress=false", "train.tensorboard=false",
           f"run_dir={run}", *extra]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


def test_torchrun_with_auto_trains_one_recipe_on_every_rank(tmp_path):
    run = tmp_path / "run"
    p = torchrun_auto(corpus(tmp_path, 1_200), run, "train.max_updates=4")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "2,500 tokens an update (the recipe's) over 2 ranks: 1,250 a rank x 1" in p.stderr
    record = json.loads((run / "auto.json").read_text())
    assert record["ranks"] == 2 and {"key": "train.max_tokens", "value": 1_250} in [
        {k: c[k] for k in ("key", "value")} for c in record["choices"]
    ]
    assert "max_tokens: 1250" in (run / "config.resolved.yaml").read_text()
    assert (run / "test.report.md").is_file()


def test_a_refusal_on_rank_0_stops_every_rank_with_its_line(tmp_path):
    p = torchrun_auto(corpus(tmp_path, 900), tmp_path / "run", "train.max_updates=4")
    assert p.returncode != 0
    line = "error: +experiment=auto: 900 training pairs, fewer than 1,000"
    assert p.stderr.count(line) == 2, p.stderr[-3000:]  # rank 0's, and rank 1's (not left waiting for a config)


def test_a_fine_tuning_update_is_shared_among_the_ranks_too():
    from mt.train.auto_finetune import FineTuneStats
    from mt.train.auto_finetune import choose as choose_finetuning

    one = choose_finetuning(FineTuneStats(4_500, 30.0, 512, 2_000.0), Budget(minutes=30))
    two = over_ranks(choose_finetuning(FineTuneStats(4_500, 30.0, 512, 4_000.0), Budget(minutes=30)), 2)
    got = {c.key: c.value for c in two}
    assert {c.key: c.value for c in one}["train.max_tokens"] == 4_096  # one process: 4,096 an update
    assert got["train.max_tokens"] == 2_048 and "train.accumulate" not in got  # two: 2,048 a rank, one batch each
    assert got[PLAN]["updates"] > 1.9 * {c.key: c.value for c in one}[PLAN]["updates"]


def test_rank_0_plans_the_run_with_every_ranks_speed(tmp_path, monkeypatch):
    import dataclasses

    from mt.config import Config, DataConfig
    from tests.test_auto import KDE4, KDE4_Z4

    monkeypatch.setattr(auto_setup, "corpus_stats", lambda cfg: dataclasses.replace(KDE4, epochs={}))
    monkeypatch.setattr(auto_setup, "measure_epochs", lambda cfg, run_dir: (KDE4.epochs, KDE4.pairs))
    monkeypatch.setattr(auto_setup.probe, "throughput", lambda points, *args: dict(KDE4_Z4.points))
    monkeypatch.setattr(auto_setup.probe, "batch_factor", lambda *args: 1.0)
    tokens = {}
    for ranks in (1, 2):
        run = tmp_path / str(ranks)
        cfg = Config(data=DataConfig(name="toy"), run_dir=str(run))
        cfg.train.max_time = 20
        auto_setup._configure(cfg, run, [], None, ranks)
        record = json.loads((run / "auto.json").read_text())
        updates = next(c["value"]["updates"] for c in record["choices"] if c["key"] == PLAN)
        assert record["ranks"] == ranks
        tokens[ranks] = updates * cfg.train.max_tokens * cfg.train.accumulate * ranks  # the run's tokens in all
    assert tokens[2] > 1.8 * tokens[1]  # two ranks at the probed speed each: about twice the tokens in the budget
