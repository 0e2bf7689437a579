"""Shared fixtures: tiny corpora written to tmp dirs, the real Multi30k location, tiny model configs."""

from __future__ import annotations

import gzip
import logging
import random
import threading
from pathlib import Path

import datasets
import pytest
import torch

from mt.config import ModelConfig, TokenizerConfig
from mt.data.tokenizer import BOS, EOS, PAD
from mt.model.transformer import Transformer

ROOT = Path(__file__).resolve().parent.parent
MULTI30K = (ROOT / ".." / "shared" / "data" / "multi30k").resolve()

datasets.disable_progress_bars()
logging.getLogger("mt").setLevel(logging.INFO)


def needs_multi30k():
    return pytest.mark.skipif(not (MULTI30K / "train.en.gz").is_file(), reason=f"Multi30k not found at {MULTI30K}")


def read_gz(path: Path, n: int | None = None) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()
    return lines[:n] if n else lines


def tiny_multi30k_run(tmp_path_factory, **tokenizer) -> Path:
    """The run dir of a tiny En->De run (40 updates) on the first 3,000 Multi30k pairs, BPE 500 with the
    `tokenizer` settings (pretokenize="moses", case_markup=True, ...)."""
    from dataclasses import replace

    from mt.data.corpus import prepare_data
    from mt.train.trainer import Trainer
    from tests.test_training import make_config

    if not (MULTI30K / "train.en.gz").is_file():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    corpus = tmp_path_factory.mktemp("m30k")
    for split, n in (("train", 3000), ("val", 40), ("test", 20)):
        for lang in ("en", "de"):
            (corpus / f"{split}.{lang}").write_text("\n".join(read_gz(MULTI30K / f"train.{lang}.gz", n)) + "\n")
    run = tmp_path_factory.mktemp("run")
    cfg = make_config(corpus, run, max_updates=40, max_epochs=1, max_tokens=2000, lr=5e-3)
    cfg = replace(cfg, data=replace(cfg.data, src_lang="en", tgt_lang="de", valid_split="val"),
                  tokenizer=replace(cfg.tokenizer, vocab_size=500, **tokenizer))  # fmt: skip
    Trainer(cfg, prepare_data(cfg, run, cfg.model.max_positions), run).fit(job_start=0)
    return run


@pytest.fixture(scope="session")
def multi30k_subset(tmp_path_factory) -> Path:
    """The first lines of real Multi30k en/de, as plain files in the Multi30k layout."""
    out = tmp_path_factory.mktemp("m30k")
    for split, n in (("train", 3000), ("val", 60), ("test_2016_flickr", 40)):
        for lang in ("en", "de"):
            (out / f"{split}.{lang}").write_text("\n".join(read_gz(MULTI30K / f"{split}.{lang}.gz", n)) + "\n")
    return out


def write_toy_corpus(out: Path, multiway: bool = False) -> Path:
    """A made-up parallel corpus: 'xx' sentences and their reversed-word 'yy' translations (`multiway`: and 'zz',
    the words doubled)."""
    rng = random.Random(0)
    words = "the a cat dog sees runs big small red house tree and".split()
    out.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 200), ("valid", 20), ("test", 20)):
        src = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 9))) for _ in range(n)]
        (out / f"{split}.xx").write_text("\n".join(src) + "\n")
        (out / f"{split}.yy").write_text("\n".join(" ".join(s.split()[::-1]) for s in src) + "\n")
        if multiway:
            (out / f"{split}.zz").write_text("\n".join(" ".join(w + w for w in s.split()) for s in src) + "\n")
    return out


@pytest.fixture
def toy_corpus(tmp_path) -> Path:
    return write_toy_corpus(tmp_path)


def tiny_model_config(**overrides) -> ModelConfig:
    cfg = dict(
        name="tiny", d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0, max_positions=128
    )
    cfg.update(overrides)
    return ModelConfig(**cfg)


@pytest.fixture(scope="session")
def trained_model():
    """A tiny model trained for a few seconds to reverse random sequences, so its outputs are not trivial."""
    torch.manual_seed(0)
    model = Transformer(tiny_model_config(d_model=32, n_heads=4, d_ff=64), 20, 20)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(150):
        src = torch.randint(4, 20, (32, 6))
        tgt = src.flip(1)
        tgt_in = torch.cat([torch.full((32, 1), BOS), tgt], 1)
        tgt_out = torch.cat([tgt, torch.full((32, 1), EOS)], 1)
        logits = model(src, src.eq(PAD), tgt_in)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 20), tgt_out.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def toy_pairs(corpus) -> list[tuple[str, str]]:
    src = (corpus / "train.xx").read_text().splitlines()
    return list(zip(src, (corpus / "train.yy").read_text().splitlines()))


@pytest.fixture(scope="session")
def toy_vocab(tmp_path_factory):
    """The toy corpus (yy = xx's words reversed) and its BPE."""
    import datasets

    from mt.data.corpus import build_vocabs
    from mt.data.read import TextPairs

    corpus = write_toy_corpus(tmp_path_factory.mktemp("corpus"))
    pairs = toy_pairs(corpus)
    table = datasets.Dataset.from_dict({"src": [s for s, _ in pairs], "tgt": [t for _, t in pairs]})
    vocabs = build_vocabs(TokenizerConfig(vocab_size=60, min_frequency=1), TextPairs.of_table(table),
                          tmp_path_factory.mktemp("tok"))  # fmt: skip
    return pairs, vocabs


def train_tiny(vocabs, pairs, **model) -> Transformer:
    """A few hundred updates on the toy task: outputs that mostly end with </s> well before the length limit."""
    torch.manual_seed(0)
    from mt.data.batching import collate

    m = Transformer(tiny_model_config(**model), len(vocabs.src), len(vocabs.tgt))
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    src_ids = vocabs.src.encode_batch([s for s, _ in pairs])
    tgt_ids = vocabs.tgt.encode_batch([t for _, t in pairs])
    for step in range(200):
        idx = [(step * 32 + i) % len(pairs) for i in range(32)]
        b = collate([src_ids[i] for i in idx], [tgt_ids[i] for i in idx], idx)
        loss, _ = m.loss(b.src, b.src_pad_mask, b.tgt_in, b.tgt_out, 0.0)
        opt.zero_grad()
        (loss / b.n_tgt_tokens).backward()
        opt.step()
    return m.eval()


@pytest.fixture
def cuda_branches(monkeypatch):
    """The CUDA code paths, run on the CPU: every `mt.runtime.on_cuda` branch is taken (fused Adam, the GradScaler
    under fp16, padding masked inside the loss instead of dropped, 8,192-row loss chunks, batches prefetched by a
    thread into "pinned" memory, torch's own dropout and topk) with pinning stubbed. Yields the list of batches
    pinned. What this cannot reach: NCCL, the CUDA kernels (SDPA, fused Adam's CUDA kernel) and real device
    synchronisation (docs/gpu.md)."""
    from mt import runtime
    from mt.data.batching import Batch

    pinned: list[Batch] = []

    def pin(batch: Batch) -> Batch:
        pinned.append(batch)
        return batch

    monkeypatch.setattr(runtime, "on_cuda", lambda device: True)
    monkeypatch.setattr(Batch, "pin_memory", pin)
    precision = torch.get_float32_matmul_precision()  # use_tf32's setting, CUDA's only
    yield pinned
    torch.set_float32_matmul_precision(precision)


class HostReads:
    """Counts the calls that make the host wait for a device's result: Tensor.item / tolist / cpu / bool / int /
    float, made by the thread that entered the counter (a prefetch thread's reads are of host tensors it collates).
    On the CPU they cost nothing, but on CUDA each one waits for every kernel queued before it."""

    NAMES = ("item", "tolist", "cpu", "__bool__", "__int__", "__float__", "__index__")  # numpy() follows a cpu()

    def __init__(self, monkeypatch):
        self.count, self.on = 0, False
        for name in self.NAMES:
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._counted(original))

    def _counted(self, original):
        def read(tensor, *args, **kwargs):
            if self.on and threading.get_ident() == self.thread:
                self.count += 1
            return original(tensor, *args, **kwargs)

        return read

    def __enter__(self):
        self.count, self.on, self.thread = 0, True, threading.get_ident()
        return self

    def __exit__(self, *exc):
        self.on = False


@pytest.fixture(scope="session")
def toy_run(tmp_path_factory):
    """A run dir of a toy model trained for 60 updates (its checkpoints hold the model and tokenizers)."""
    from tests.test_training import make_trainer

    corpus = write_toy_corpus(tmp_path_factory.mktemp("corpus"))
    run = tmp_path_factory.mktemp("run")
    make_trainer(corpus, run, max_updates=60, max_epochs=10, lr=5e-3).fit(job_start=0)
    return run


def multilingual_config(corpus: Path, run_dir: Path, **train):
    """A toy config for one model of xx->yy and xx->zz (a multi-way toy corpus)."""
    from dataclasses import replace

    from tests.test_training import make_config

    cfg = make_config(corpus, run_dir, **train)
    return replace(cfg, data=replace(cfg.data, directions=["xx-yy", "xx-zz"]),
                   tokenizer=replace(cfg.tokenizer, vocab_size=90))  # fmt: skip


@pytest.fixture(scope="session")
def multilingual_run(tmp_path_factory):
    """A multilingual toy run (xx->yy, xx->zz), trained, validated and tested: (run dir, trainer, finish's result)."""
    from mt.data.corpus import prepare_data
    from mt.train.finish import finish
    from mt.train.trainer import Trainer

    corpus = write_toy_corpus(tmp_path_factory.mktemp("multiway"), multiway=True)
    run = tmp_path_factory.mktemp("multilingual")
    cfg = multilingual_config(corpus, run, max_updates=300, max_epochs=30, lr=5e-3, valid_bleu=True)
    trainer = Trainer(cfg, prepare_data(cfg, run, 128), run)
    trainer.fit(job_start=0)
    return run, trainer, finish(trainer)
