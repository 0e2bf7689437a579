"""`train.init_from`: a run that starts from a trained model, with everything but the weights, tokenizer and
architecture fresh; exact resume; frozen parts bitwise unchanged; conflicts refused in one line."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import datasets
import pytest
import torch

from mt.config import ConfigError, TokenizerConfig
from mt.data.corpus import build_vocabs, prepare_data
from mt.data.read import TextPairs
from mt.model import saved as saved_model
from mt.train import finetune
from mt.train.trainer import Trainer
from tests.conftest import write_toy_corpus
from tests.test_training import make_config


def finetuning(parent_run, corpus, run_dir, overrides=(), model=None, **train):
    """What train.py does with train.init_from: load and adopt the parent, prepare the data with its tokenizer,
    build the trainer, then resume or start from the parent."""
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = make_config(corpus, run_dir, model, init_from=str(parent_run), **train)
    parent = finetune.load_parent(cfg, run_dir)
    cfg = finetune.adopt(cfg, parent, list(overrides))
    trainer = Trainer(cfg, prepare_data(cfg, run_dir, cfg.model.max_positions, parent.vocabs), run_dir)
    if not trainer.resume():
        finetune.start(trainer, parent)
    return trainer, parent


def same(a: torch.nn.Module, b: torch.nn.Module, prefix: str = "") -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return all(torch.equal(sa[k], sb[k]) for k in sa if k.startswith(prefix))


@pytest.fixture
def domain(tmp_path):
    """The "new data": a corpus of its own (the toy languages)."""
    return write_toy_corpus(tmp_path / "domain")


def test_a_finetuning_run_starts_from_the_weights_with_everything_else_fresh(toy_run, domain, tmp_path):
    """The parent's weights, tokenizer and shapes; update/epoch counters at 0, schedule at its first warm-up step,
    no optimizer moments, no best score, data order from the start, the weight average seeded from the parent.
    (Before: the only route was a resume, which carried all of the old run's state into the new one.)"""
    trainer, parent = finetuning(toy_run, domain, tmp_path / "ft", model={"d_model": 16, "n_heads": 2},
                                 ema_decay=0.99, warmup=7)  # fmt: skip
    old = saved_model.load(toy_run / "checkpoint_last.pt")
    assert old["update"] == 60 and old["optimizer"]["state"]  # the parent's run had all of these
    assert trainer.model.cfg == parent.model.cfg and same(trainer.model, parent.model)
    assert same(trainer.ema.model, parent.model)
    assert trainer.corpus.vocabs.src.digest() == parent.vocabs.src.digest()
    assert trainer.update == 0 and trainer.epochs_done == 0 and trainer.best == -math.inf
    assert trainer.bad_validations == 0 and not trainer.optimizer.state_dict()["state"]
    assert trainer.scheduler.last_epoch == 0 and trainer.sampler.epoch == 0 and trainer.sampler.position == 0
    first_lr = trainer.optimizer.param_groups[0]["lr"]
    assert first_lr < trainer.tc.lr / 5  # warming up again from the start (7 updates), not at the old step 60
    record = json.loads((tmp_path / "ft" / "parent.json").read_text())
    assert record["path"].endswith("checkpoint_best.pt") and record["weights_digest"] == parent.digest
    assert trainer.fit(job_start=0) in ("max_epochs", "max_updates")
    lines = [json.loads(x) for x in (tmp_path / "ft" / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["kind"] == "parent" and lines[0]["weights_digest"] == parent.digest
    assert not same(trainer.model, parent.model)  # it trained


def test_init_optimizer_carries_the_moments_over(toy_run, domain, tmp_path):
    cfg_parent = saved_model.load(toy_run / "checkpoint_last.pt")
    trainer, _ = finetuning(toy_run / "checkpoint_last.pt", domain, tmp_path / "ft", init_optimizer=True)
    state = trainer.optimizer.state_dict()["state"]
    saved = cfg_parent["optimizer"]["state"]
    assert state and all(torch.equal(state[k]["exp_avg"], saved[k]["exp_avg"]) for k in state)
    assert trainer.update == 0  # the counters stay fresh
    # A run dir gives the pair the moments belong to: its last weights (not the best or averaged ones) and state.
    from_dir, parent = finetuning(toy_run, domain, tmp_path / "ft1", init_optimizer=True)
    assert parent.ckpt["path"].endswith("checkpoint_last.pt") and from_dir.optimizer.state_dict()["state"]
    with pytest.raises(ConfigError, match="holds no optimizer state"):
        finetuning(toy_run / "checkpoint_best.pt", domain, tmp_path / "ft2", init_optimizer=True)


def test_init_optimizer_keeps_this_runs_hyperparameters_and_schedule(toy_run, domain, tmp_path):
    """Only the moments come over. Before: load_state_dict put the parent's betas (0.9, 0.98), eps 1e-9, weight
    decay 0 and its last learning rate into the new run, which took update 1 at the parent's lr, not warm-up's."""
    trainer, _ = finetuning(toy_run, domain, tmp_path / "ft", init_optimizer=True, betas=[0.8, 0.9], adam_eps=1e-6,
                            weight_decay=0.01, warmup=50, warmup_init_lr=1e-6, lr=2e-3, max_updates=1)  # fmt: skip
    parent = saved_model.load(toy_run / "checkpoint_last.pt")["optimizer"]
    assert parent["param_groups"][0]["betas"] == (0.9, 0.98) and parent["param_groups"][0]["lr"] > 1e-4
    for group in trainer.optimizer.param_groups:
        assert group["betas"] == (0.8, 0.9) and group["eps"] == 1e-6 and group["weight_decay"] == 0.01
        assert group["lr"] < 5e-5  # warm-up's first step (4.1e-5 on the way to 2e-3)
    state = trainer.optimizer.state_dict()["state"]
    assert state and all(torch.equal(state[k]["exp_avg"], parent["state"][k]["exp_avg"]) for k in state)
    assert trainer.fit(job_start=0) == "max_updates"
    assert trainer.optimizer.param_groups[0]["lr"] < 1e-4  # the schedule's second step, still warming up


def test_init_optimizer_starts_from_the_trained_weights_under_a_weight_average(domain, tmp_path):
    """A parent trained with train.ema_decay saves the average as "model" and the trained weights as "raw_model";
    the moments belong to the latter. Before: the fine-tuning run started from the average with the moments of the
    trained weights."""
    from tests.test_training import make_trainer

    parent_dir = tmp_path / "parent"
    make_trainer(write_toy_corpus(tmp_path / "corpus"), parent_dir, max_updates=12, max_epochs=3, lr=5e-3,
                 ema_decay=0.9).fit(job_start=0)  # fmt: skip
    saved = saved_model.load(parent_dir / "checkpoint_last.pt")
    assert any(not torch.equal(saved["model"][k], saved["raw_model"][k]) for k in saved["raw_model"])
    trainer, parent = finetuning(parent_dir, domain, tmp_path / "ft", init_optimizer=True)
    weights = trainer.model.state_dict()
    assert all(torch.equal(weights[k], saved["raw_model"][k]) for k in saved["raw_model"])
    plain, _ = finetuning(parent_dir, domain, tmp_path / "ft2")  # without the moments: the average, as before
    assert not all(torch.equal(plain.model.state_dict()[k], saved["raw_model"][k]) for k in saved["raw_model"])


def test_the_tokenization_report_reads_no_hub_dataset_of_the_parent(toy_run, monkeypatch, caplog):
    """Before: a parent trained on a hub dataset had its whole training split loaded (downloaded, where it was not
    cached) to compare 2,000 pairs. Now the comparison is skipped with a line."""
    import logging

    from mt.data import read as data

    parent = finetune.load_parent(make_config(toy_run, toy_run.parent / "x", init_from=str(toy_run)), toy_run.parent)
    hub = {**parent.ckpt["config"]["data"], "format": "hub", "hub_name": "bentrevett/multi30k"}
    parent.ckpt = {**parent.ckpt, "config": {**parent.ckpt["config"], "data": hub}}
    loaded = []
    monkeypatch.setattr(data, "_load_hub", lambda *a, **k: loaded.append(a) or datasets.Dataset.from_dict({}))
    with caplog.at_level(logging.INFO, logger="mt.train.finetune"):
        finetune.report_tokenization(parent, [("the cat", "cat the")])
    assert loaded == [] and "bentrevett/multi30k, not read for a comparison" in caplog.text


def test_the_same_command_resumes_a_finetuning_run_exactly(toy_run, domain, tmp_path):
    straight, _ = finetuning(toy_run, domain, tmp_path / "a", max_updates=16)
    straight.fit(job_start=0)
    first, _ = finetuning(toy_run, domain, tmp_path / "b", max_updates=7)
    assert first.fit(job_start=0) == "max_updates"
    second, _ = finetuning(toy_run, domain, tmp_path / "b", max_updates=16)
    assert second.update == 7  # resumed, not started again from the parent
    second.fit(job_start=0)
    assert second.update == 16 and same(straight.model, second.model)


def test_frozen_parts_are_bitwise_unchanged_and_have_no_optimizer_state(toy_run, domain, tmp_path):
    trainer, parent = finetuning(toy_run, domain, tmp_path / "ft", max_updates=12, freeze=["embeddings", "encoder"])
    trainer.fit(job_start=0)
    for prefix in ("src_embed.", "tgt_embed.", "output.", "encoder."):
        assert same(trainer.model, parent.model, prefix), prefix
    assert not same(trainer.model, parent.model, "decoder.")
    frozen = [p for p in trainer.model.parameters() if not p.requires_grad]
    assert frozen and all(p.grad is None and p not in trainer.optimizer.state for p in frozen)
    with pytest.raises(ConfigError, match=r"train.freeze: 'attention' is not a part of the model; give any of"):
        finetuning(toy_run, domain, tmp_path / "ft2", freeze=["attention"])


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(overrides=["model.d_ff=96"], model={"d_ff": 96}), "model.d_ff=96: the parent .train.init_from. has"),
        (dict(overrides=["model=transformer_small"], model={"d_model": 64}), "model.d_model=64: the parent"),
        (dict(resume="{tmp}/x.pt"), "train.init_from=.* and train.resume=.*: one run starts from one model"),
    ],
)
def test_conflicts_are_one_line_errors(toy_run, domain, tmp_path, change, message):
    change = {k: (v.format(tmp=tmp_path) if isinstance(v, str) else v) for k, v in change.items()}
    with pytest.raises(ConfigError, match=message):
        finetuning(toy_run, domain, tmp_path / "ft", **change)


def test_dropout_may_change_and_a_foreign_tokenizer_may_not(toy_run, domain, tmp_path):
    trainer, parent = finetuning(toy_run, domain, tmp_path / "ft", overrides=["model.dropout=0.3"],
                                 model={"dropout": 0.3})  # fmt: skip
    assert trainer.model.cfg.dropout == 0.3 and trainer.model.cfg.d_ff == parent.model.cfg.d_ff
    cfg = make_config(domain, tmp_path / "ft3", init_from=str(toy_run))
    words = ["".join(reversed(w)) for w in "the cat sees a dog and big red house".split()] * 5
    from mt.config import TokenizerConfig
    from mt.data.tokenizer import train_vocab

    other = train_vocab(TokenizerConfig(vocab_size=40, min_frequency=1), [(" ".join(words), "x")], (0, 1))
    other.tokenizer.save(str(tmp_path / "other.json"))
    cfg = replace(cfg, tokenizer=replace(cfg.tokenizer, path=str(tmp_path / "other.json")))
    with pytest.raises(ConfigError, match="other.json: not the tokenizer of the parent"):
        finetune.adopt(cfg, finetune.load_parent(cfg, tmp_path / "ft3"), ["tokenizer.path=x"])
    with pytest.raises(ConfigError, match="is this run's own dir"):
        finetune.load_parent(cfg, toy_run)


def test_a_validation_set_held_out_of_training_and_the_parents_test_reported(toy_run, domain, tmp_path):
    """data.valid_from_train=N: N training pairs drawn by the seed, not trained on; the end of the run scores the
    new data's test split and the parent's (forgetting)."""
    from mt.train.finish import finish

    (domain / "valid.xx").unlink()  # no validation split: the OPUS samples' case
    (domain / "valid.yy").unlink()
    run = tmp_path / "ft"
    run.mkdir()
    cfg = make_config(domain, run, init_from=str(toy_run), max_updates=10)
    cfg = replace(cfg, data=replace(cfg.data, valid_from_train=30))
    parent = finetune.load_parent(cfg, run)
    cfg = finetune.adopt(cfg, parent, [])
    corpus = prepare_data(cfg, run, cfg.model.max_positions, parent.vocabs)
    held = json.loads((run / "valid_from_train.json").read_text())["rows"]
    assert len(corpus.valid) == 30 and len(held) == 30 and not set(held) & set(corpus.train_rows.tolist())
    assert len(corpus.train) == 200 - 30
    again = prepare_data(cfg, run, cfg.model.max_positions, parent.vocabs)
    assert again.valid["src"] == corpus.valid["src"]  # drawn from the seed
    trainer = Trainer(cfg, corpus, run)
    finetune.start(trainer, parent)
    trainer.fit(job_start=0)
    names = [r["name"] for r in finish(trainer)["reports"]]
    assert names == ["test", "test.before", "parent.test"] and (run / "parent.test.report.json").is_file()


def test_the_held_out_pairs_are_the_same_with_any_tokenizer_and_unseen_by_the_bpe(toy_run, domain, tmp_path,
                                                                                  monkeypatch):  # fmt: skip
    """A from-scratch run's BPE learns from the training pairs without the held-out ones, and it holds out the
    same pairs as a fine-tuning run with the same seed (before: the pairs were drawn after tokenizing, so the BPE
    had learnt from the validation text, and the draw depended on the tokenizer's length filtering)."""
    import mt.data.corpus

    (domain / "valid.xx").unlink()
    (domain / "valid.yy").unlink()
    learnt = []

    def build_vocabs(cfg, pairs, *args, **kwargs):
        learnt.extend(src for src, _ in pairs)
        return real(cfg, pairs, *args, **kwargs)

    real = mt.data.corpus.build_vocabs
    monkeypatch.setattr(mt.data.corpus, "build_vocabs", build_vocabs)
    scratch_run, ft_run = tmp_path / "scratch", tmp_path / "ft"
    scratch_run.mkdir()
    ft_run.mkdir()
    scratch = make_config(domain, scratch_run, max_updates=10)
    scratch = replace(scratch, data=replace(scratch.data, valid_from_train=30))
    corpus = prepare_data(scratch, scratch_run, scratch.model.max_positions)
    held = set(json.loads((scratch_run / "valid_from_train.json").read_text())["rows"])
    lines = (domain / "train.xx").read_text().splitlines()
    assert len(corpus.valid) == 30 and learnt == [s for i, s in enumerate(lines) if i not in held]
    cfg = make_config(domain, ft_run, init_from=str(toy_run), max_updates=10)
    cfg = replace(cfg, data=replace(cfg.data, valid_from_train=30))
    parent = finetune.load_parent(cfg, ft_run)
    tuned = prepare_data(finetune.adopt(cfg, parent, []), ft_run, cfg.model.max_positions, parent.vocabs)
    assert tuned.valid["src"] == corpus.valid["src"]


def test_the_characters_that_become_unk_are_named(tmp_path):
    """The warning names what the parent's tokenizer cannot spell. (Before: each character was encoded alone,
    which the Metaspace pre-tokenizer turns into "▁" + it, never [<unk>], so the list was always empty.)"""
    texts = ["the cat sat on the mat", "a dog ran", "the dog sat"] * 20
    ds = datasets.Dataset.from_dict({"src": texts, "tgt": texts})
    vocabs = build_vocabs(TokenizerConfig(vocab_size=60, min_frequency=1), TextPairs.of_table(ds), tmp_path)
    new = [("the cat • sat", "the µ dog"), ("a dog • ran", "a mat")]
    seen = finetune.tokenization(vocabs, new)
    assert seen["source"]["unk_share"] > 0 and seen["target"]["unk_share"] > 0
    assert seen["unknown_characters"] == "•µ"  # most frequent first


def fake_parent(kind: str, d_model: int) -> finetune.Parent:
    """A parent as learning_rate reads it: its format and width."""
    from types import SimpleNamespace

    from mt.model import hub

    fmt = hub.HUB_FORMAT if kind == "transformers" else "run"
    return finetune.Parent({"format": fmt}, SimpleNamespace(cfg=SimpleNamespace(d_model=d_model)), None)


@pytest.mark.parametrize("schedule, lr, warmup", [("noam", 5e-4, 4000), ("constant", 4e-3, 100)])
def test_a_transformers_parent_fine_tunes_at_a_fine_tuning_rate(schedule, lr, warmup, caplog):
    """Without train.lr, a transformers parent gets 5e-5 x sqrt(512 / d_model) (not the finetune preset's 4e-3, not
    noam's from-scratch peak), said in the log; train.lr on the command line wins."""
    from mt.config import TrainConfig

    tc = TrainConfig(schedule=schedule, lr=lr, warmup=warmup)
    with caplog.at_level("INFO", logger="mt.train.finetune"):
        out = finetune.learning_rate(tc, fake_parent("transformers", 1024), set())
    assert out.lr == pytest.approx(5e-5 * math.sqrt(0.5)) and out.schedule == "constant" and out.warmup == 100
    assert "a fine-tuning rate for a transformers parent of d_model 1024" in caplog.text
    mine = finetune.learning_rate(replace(tc, lr=1e-4), fake_parent("transformers", 1024), {"train.lr"})
    assert mine.lr == 1e-4 and mine.schedule == schedule


def test_noam_says_it_does_not_read_train_lr(caplog):
    """A fine-tuning run under noam (the default schedule) trains at noam's rate whatever train.lr says: the log
    says so and how to fine-tune at a rate of one's own."""
    from mt.config import TrainConfig

    with caplog.at_level("INFO", logger="mt.train.finetune"):
        out = finetune.learning_rate(TrainConfig(lr=1e-5), fake_parent("run", 512), {"train.lr"})
    assert out.schedule == "noam"
    assert "train.lr=1e-05 is not used" in caplog.text and "train.schedule=constant train.lr=" in caplog.text
