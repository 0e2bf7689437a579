"""R-Drop and target-side word dropout (mt/train/regularize.py): what they add to the loss, that they stay out of
evaluation, and that a run with both resumes exactly."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.speed.reference_loss import rdrop_loss_from_logits
from mt.data.tokenizer import BOS, EOS, PAD, UNK
from mt.train.regularize import drop_target_words, rdrop_loss
from mt.train.trainer import TrainingLoss
from tests.conftest import tiny_model_config
from tests.test_training import make_trainer, params


def _batch(seed=0, vocab=40):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (3, 7), generator=g)
    tgt = torch.randint(4, vocab, (3, 6), generator=g)
    src[2, 5:] = PAD
    tgt[1, 4:] = PAD
    tgt_in = torch.cat([torch.full((3, 1), BOS), tgt[:, :-1]], 1)
    return src, src.eq(PAD), tgt_in, tgt


def _model(dropout):
    from mt.model.transformer import Transformer

    torch.manual_seed(0)
    model = Transformer(tiny_model_config(dropout=dropout), 40, 40)
    model.train()
    return model


def test_without_dropout_rdrop_is_the_plain_loss():
    """Two passes without dropout agree: the KL is 0, and the loss and its gradients are the fused plain loss's."""
    model, batch = _model(0.0), _batch()
    plain, plain_nll = model.loss(*batch, 0.1)
    grads = torch.autograd.grad(plain, list(model.parameters()))
    loss, nll = rdrop_loss(model, *batch, 0.1, alpha=5.0)
    torch.testing.assert_close(loss, plain, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(nll, plain_nll.detach(), atol=1e-4, rtol=1e-5)
    for a, b in zip(grads, torch.autograd.grad(loss, list(model.parameters()))):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_with_dropout_rdrop_adds_alpha_times_a_positive_kl():
    """The same dropout masks (same seed) with alpha 0, 2 and 4: the loss grows linearly in alpha by a KL > 0."""
    model, batch = _model(0.3), _batch()
    losses = []
    for alpha in (0.0, 2.0, 4.0):
        torch.manual_seed(7)
        losses.append(rdrop_loss(model, *batch, 0.1, alpha)[0].item())
    kl = (losses[1] - losses[0]) / 2
    assert kl > 0.01
    assert abs((losses[2] - losses[0]) / 4 - kl) < 1e-3 * max(1.0, kl)


def test_alpha_weighs_the_kl_as_the_paper_and_fairseq_do():
    """fairseq's R-Drop criterion is CE_1 + CE_2 + alpha * (KL(p_1 || p_2) + KL(p_2 || p_1)) / 2 (the paper's eq. 3);
    ours is that halved, so the KL term it adds is half of fairseq's, computed here with `F.kl_div` as fairseq does,
    from the same two dropout passes (the same seed, one forward of the batch stacked twice)."""
    model, (src, src_mask, tgt_in, tgt_out) = _model(0.3), _batch()
    alpha = 3.0
    added = []
    for a in (0.0, alpha):
        torch.manual_seed(7)
        added.append(rdrop_loss(model, src, src_mask, tgt_in, tgt_out, 0.1, a)[0])

    def twice(t):
        return torch.cat([t, t])

    torch.manual_seed(7)
    states = model.decoder_states(twice(tgt_in), model.encode(twice(src), twice(src_mask)), twice(src_mask))
    p, q = (states @ model.output.weight.t()).log_softmax(-1).chunk(2)
    pad = tgt_out.eq(PAD).unsqueeze(-1)
    p_loss = F.kl_div(p, q.exp(), reduction="none").masked_fill(pad, 0.0).sum()
    q_loss = F.kl_div(q, p.exp(), reduction="none").masked_fill(pad, 0.0).sum()
    fairseq_term = alpha * (p_loss + q_loss) / 2
    torch.testing.assert_close(added[1] - added[0], fairseq_term / 2, atol=1e-4, rtol=1e-4)


def test_fused_rdrop_gives_the_loss_and_gradients_of_the_full_logits():
    """`rdrop_loss` (fused with the output projection, padding rows skipped) against the same loss from both passes'
    full logits left to autograd (the trainer's before; `benchmarks/speed/rdrop_step.py` times one against the other),
    with the same dropout masks."""
    model, batch = _model(0.3), _batch()
    results = []
    for fn in (rdrop_loss, rdrop_loss_from_logits):
        torch.manual_seed(7)
        loss, nll = fn(model, *batch, 0.1, 3.0)
        results.append((loss, nll, torch.autograd.grad(loss, list(model.parameters()))))
    (loss, nll, grads), (ref_loss, ref_nll, ref_grads) = results
    torch.testing.assert_close(loss, ref_loss, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(nll, ref_nll, atol=1e-4, rtol=1e-5)
    for (name, _), a, b in zip(model.named_parameters(), grads, ref_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=name)


def test_rdrop_on_cuda_masks_padding_in_the_loss_and_gives_the_cpus_loss_and_gradients(cuda_branches, monkeypatch):
    """CUDA's way (padding kept and masked inside the fused loss, 8,192-row chunks) against the CPU's (padding rows
    dropped before the output layer), with the same dropout masks."""
    model, batch = _model(0.3), _batch()
    torch.manual_seed(7)
    cuda_loss, cuda_nll = rdrop_loss(model, *batch, 0.1, 3.0)
    cuda_grads = torch.autograd.grad(cuda_loss, list(model.parameters()))
    monkeypatch.setattr("mt.train.regularize.skips_padding_rows", lambda device: True)  # the CPU's way, all else CUDA's
    torch.manual_seed(7)
    loss, nll = rdrop_loss(model, *batch, 0.1, 3.0)
    torch.testing.assert_close(cuda_loss, loss, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(cuda_nll, nll, atol=1e-4, rtol=1e-5)
    for a, b in zip(cuda_grads, torch.autograd.grad(loss, list(model.parameters()))):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_the_training_loss_is_rdrops_while_training_and_the_plain_one_in_evaluation():
    model, batch = _model(0.3), _batch()
    wrapped = TrainingLoss(model, 0.1, rdrop_alpha=2.0)
    torch.manual_seed(3)
    ours = wrapped(*batch)[0]
    torch.manual_seed(3)
    assert torch.equal(ours, rdrop_loss(model, *batch, 0.1, 2.0)[0])
    model.eval()
    assert torch.equal(wrapped(*batch)[0], model.loss(*batch, 0.1)[0])


def test_word_dropout_replaces_real_tokens_only_and_only_while_training():
    tgt_in = torch.randint(4, 40, (50, 40))
    tgt_in[:, 0], tgt_in[:, -5:] = BOS, PAD
    tgt_in[0, 3] = EOS
    dropped = drop_target_words(tgt_in, 0.1)
    changed = dropped.ne(tgt_in)
    assert dropped[changed].eq(UNK).all() and not changed[:, 0].any() and not changed[:, -5:].any()
    assert dropped[0, 3] == EOS
    assert 0.07 < changed.sum().item() / (50 * 34) < 0.13
    model, batch = _model(0.0), _batch()
    wrapped = TrainingLoss(model, 0.1, tgt_word_dropout=0.5)
    model.eval()
    torch.testing.assert_close(wrapped(*batch)[0], model.loss(*batch, 0.1)[0])  # evaluation: untouched
    model.train()
    assert not torch.allclose(wrapped(*batch)[0], model.loss(*batch, 0.1)[0])


def test_a_run_with_rdrop_and_word_dropout_resumes_exactly(toy_corpus, tmp_path):
    """Both draw from the global RNG, which a checkpoint keeps: 10 updates == 4, stop, resume, 10."""
    extra = dict(rdrop_alpha=1.0, tgt_word_dropout=0.1)
    straight = make_trainer(toy_corpus, tmp_path / "a", model={"dropout": 0.1}, max_updates=10, **extra)
    straight.fit(job_start=0)
    first = make_trainer(toy_corpus, tmp_path / "b", model={"dropout": 0.1}, max_updates=4, **extra)
    assert first.fit(job_start=0) == "max_updates"
    second = make_trainer(toy_corpus, tmp_path / "b", model={"dropout": 0.1}, max_updates=10, **extra)
    second.fit(job_start=0)
    a, b = params(straight), params(second)
    assert second.update == 10 and all(torch.equal(a[k], b[k]) for k in a)
    plain = make_trainer(toy_corpus, tmp_path / "c", model={"dropout": 0.1}, max_updates=10)
    plain.fit(job_start=0)
    assert not all(torch.equal(a[k], v) for k, v in params(plain).items())  # the regularizers did something
