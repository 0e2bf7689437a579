"""The Transformer: reference equivalence with torch.nn.Transformer, masking, KV cache, tying, sizes, learning."""

import math

import pytest
import torch
from torch import nn

from mt.config import ModelConfig
from mt.data.tokenizer import BOS, PAD
from mt.model.transformer import Transformer, causal_mask, sinusoidal_positions
from tests.conftest import tiny_model_config

V = 50


def random_batch(B=4, S=7, T=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (B, S), generator=g)
    src_lens = torch.tensor([S, S - 2, 3, S - 1][:B])
    pad_mask = torch.arange(S)[None, :] >= src_lens[:, None]
    src = src.masked_fill(pad_mask, PAD)
    tgt = torch.randint(4, V, (B, T), generator=g)
    return src, pad_mask, tgt


def copy_into_reference(model: Transformer, norm: str) -> nn.Transformer:
    """A torch.nn.Transformer holding the same weights (ours are the same layout, Q/K/V stacked)."""
    c = model.cfg
    ref = nn.Transformer(
        c.d_model,
        c.n_heads,
        c.encoder_layers,
        c.decoder_layers,
        c.d_ff,
        dropout=0.0,
        batch_first=True,
        norm_first=norm == "pre",
    )
    if norm == "post":  # nn.Transformer always adds final norms; the paper's post-norm stack has none
        ref.encoder.norm, ref.decoder.norm = None, None
    with torch.no_grad():
        for ours, theirs in zip(model.encoder, ref.encoder.layers):
            theirs.self_attn.in_proj_weight.copy_(ours.self_attn.qkv_proj.weight)
            theirs.self_attn.in_proj_bias.copy_(ours.self_attn.qkv_proj.bias)
            theirs.self_attn.out_proj.load_state_dict(ours.self_attn.out_proj.state_dict())
            theirs.linear1.load_state_dict(ours.ffn.linear1.state_dict())
            theirs.linear2.load_state_dict(ours.ffn.linear2.state_dict())
            theirs.norm1.load_state_dict(ours.sub_attn.norm.state_dict())
            theirs.norm2.load_state_dict(ours.sub_ffn.norm.state_dict())
        for ours, theirs in zip(model.decoder, ref.decoder.layers):
            theirs.self_attn.in_proj_weight.copy_(ours.self_attn.qkv_proj.weight)
            theirs.self_attn.in_proj_bias.copy_(ours.self_attn.qkv_proj.bias)
            theirs.self_attn.out_proj.load_state_dict(ours.self_attn.out_proj.state_dict())
            cross = ours.cross_attn
            theirs.multihead_attn.in_proj_weight.copy_(torch.cat([cross.q_proj.weight, cross.kv_proj.weight]))
            theirs.multihead_attn.in_proj_bias.copy_(torch.cat([cross.q_proj.bias, cross.kv_proj.bias]))
            theirs.multihead_attn.out_proj.load_state_dict(cross.out_proj.state_dict())
            theirs.linear1.load_state_dict(ours.ffn.linear1.state_dict())
            theirs.linear2.load_state_dict(ours.ffn.linear2.state_dict())
            theirs.norm1.load_state_dict(ours.sub_self.norm.state_dict())
            theirs.norm2.load_state_dict(ours.sub_cross.norm.state_dict())
            theirs.norm3.load_state_dict(ours.sub_ffn.norm.state_dict())
        if norm == "pre":
            ref.encoder.norm.load_state_dict(model.encoder_norm.state_dict())
            ref.decoder.norm.load_state_dict(model.decoder_norm.state_dict())
    return ref.eval()


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_matches_torch_nn_transformer(norm):
    torch.manual_seed(0)
    model = Transformer(tiny_model_config(norm=norm), V, V).eval()
    for p in model.parameters():  # non-trivial LayerNorm and bias values too
        with torch.no_grad():
            p.add_(0.05 * torch.randn_like(p))
    ref = copy_into_reference(model, norm)
    src, pad_mask, tgt = random_batch()
    with torch.no_grad():
        memory = model.encode(src, pad_mask)
        ref_memory = ref.encoder(model.src_embed(src), src_key_padding_mask=pad_mask)
        logits = model.decode(tgt, memory, pad_mask)
        ref_hidden = ref.decoder(
            model.tgt_embed(tgt),
            ref_memory,
            tgt_mask=~causal_mask(tgt.size(1), tgt.size(1)),
            memory_key_padding_mask=pad_mask,
        )
        ref_logits = model.output(ref_hidden)
    real = ~pad_mask
    torch.testing.assert_close(memory[real], ref_memory[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_no_look_ahead(norm):
    torch.manual_seed(0)
    model = Transformer(tiny_model_config(norm=norm), V, V).eval()
    src, pad_mask, tgt = random_batch()
    t = 2
    changed = tgt.clone()
    changed[:, t + 1 :] = torch.randint(4, V, changed[:, t + 1 :].shape)
    with torch.no_grad():
        a, b = model(src, pad_mask, tgt), model(src, pad_mask, changed)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], atol=1e-6, rtol=0)
    assert not torch.allclose(a[:, t + 1 :], b[:, t + 1 :])


def test_source_padding_is_ignored():
    torch.manual_seed(0)
    model = Transformer(tiny_model_config(), V, V).eval()
    src, pad_mask, tgt = random_batch()
    other = src.masked_fill(pad_mask, 17)  # different tokens at masked positions
    with torch.no_grad():
        a, b = model(src, pad_mask, tgt), model(other, pad_mask, tgt)
    torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_cached_decoding_equals_full_recomputation(norm):
    torch.manual_seed(0)
    model = Transformer(tiny_model_config(norm=norm), V, V).eval()
    src, pad_mask, tgt = random_batch(T=8)
    with torch.no_grad():
        memory = model.encode(src, pad_mask)
        full = model.decode(tgt, memory, pad_mask)
        cache = model.new_cache()
        steps = [model.decode(tgt[:, t : t + 1], memory, pad_mask, cache) for t in range(4)]
        # Reorder the batch mid-way, as beam search does, then continue (two positions in one call).
        order = torch.tensor([2, 0, 3, 1])
        cache.reorder(order, order)
        rest = model.decode(tgt[order, 4:6], memory[order], pad_mask[order], cache)
        steps += [model.decode(tgt[order, t : t + 1], memory[order], pad_mask[order], cache) for t in (6, 7)]
    torch.testing.assert_close(torch.cat(steps[:4], 1), full[:, :4], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rest, full[order, 4:6], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat(steps[4:], 1), full[order, 6:], atol=1e-5, rtol=1e-5)


def test_cache_buffers_grow_and_reorder_over_long_outputs():
    """40 steps, one at a time: the self-attention buffers are reallocated twice (capacity 16, then 34, then 70),
    with beam-style reorders before and after a reallocation; every step equals the full recomputation."""
    torch.manual_seed(0)
    model = Transformer(tiny_model_config(), V, V).eval()
    src, pad_mask, tgt = random_batch(T=40)
    with torch.no_grad():
        memory = model.encode(src, pad_mask)
        cache, order, steps = model.new_cache(), torch.arange(4), []
        for t in range(40):
            if t in (10, 20, 36):
                perm = torch.tensor([3, 3, 0, 1]) if t == 20 else torch.tensor([1, 2, 3, 0])
                cache.reorder(perm, perm)
                order = order[perm]
            steps.append(model.decode(tgt[order, t : t + 1], memory[order], pad_mask[order], cache))
            full = model.decode(tgt[order, : t + 1], memory[order], pad_mask[order])[:, t:]
            torch.testing.assert_close(steps[-1], full, atol=1e-5, rtol=1e-5)
    assert cache.layers[0]["k"].size(2) == 70 and cache.layers[0]["n"] == 40


def test_beams_share_one_copy_of_the_encoder_output():
    """K decoder rows per sentence against B encoder rows (beam search) == the encoder output repeated K times,
    with and without the cache, including a reorder among beams and a sentence leaving the batch."""
    torch.manual_seed(0)
    model = Transformer(tiny_model_config(), V, V).eval()
    src, pad_mask, tgt = random_batch(T=6)
    K = 3
    tgt = tgt.repeat_interleave(K, 0)
    tgt[1::K, 2:] = tgt.flip(0)[1::K, 2:]  # beams of a sentence differ after two tokens
    with torch.no_grad():
        memory = model.encode(src, pad_mask)
        rep_mem, rep_mask = memory.repeat_interleave(K, 0), pad_mask.repeat_interleave(K, 0)
        expected = model.decode(tgt, rep_mem, rep_mask)
        torch.testing.assert_close(model.decode(tgt, memory, pad_mask), expected, atol=1e-5, rtol=1e-5)
        cache = model.new_cache()
        steps = [model.decode(tgt[:, t : t + 1], memory, pad_mask, cache) for t in range(3)]
        torch.testing.assert_close(torch.cat(steps, 1), expected[:, :3], atol=1e-5, rtol=1e-5)
        # Sentence 1 leaves; the others' beams are reordered among themselves.
        keep = torch.tensor([0, 2, 3])
        rows = torch.tensor([1, 0, 2, 6, 6, 8, 9, 11, 10])
        cache.reorder(rows, keep)
        step = model.decode(tgt[rows, 3:4], memory[keep], pad_mask[keep], cache)
        reference = model.decode(tgt[rows, :4], rep_mem[rows], rep_mask[rows])[:, 3:]
        torch.testing.assert_close(step, reference, atol=1e-5, rtol=1e-5)


def test_three_way_tying_is_one_parameter_and_survives_save_load(tmp_path):
    model = Transformer(tiny_model_config(tie_embeddings="all"), V, V)
    w = model.output.weight
    assert model.src_embed.tokens.weight is w and model.tgt_embed.tokens.weight is w
    torch.save(model.state_dict(), tmp_path / "m.pt")
    loaded = Transformer(tiny_model_config(tie_embeddings="all"), V, V)
    loaded.load_state_dict(torch.load(tmp_path / "m.pt"))
    assert loaded.src_embed.tokens.weight is loaded.output.weight
    with torch.no_grad():
        loaded.output.weight[5, 0] = 123.0
    assert loaded.src_embed.tokens.weight[5, 0] == 123.0 and loaded.tgt_embed.tokens.weight[5, 0] == 123.0


def test_decoder_only_and_no_tying():
    m = Transformer(tiny_model_config(tie_embeddings="decoder"), 40, V)
    assert m.tgt_embed.tokens.weight is m.output.weight and m.src_embed.tokens.weight is not m.output.weight
    m = Transformer(tiny_model_config(tie_embeddings="none"), V, V)
    assert len({id(m.src_embed.tokens.weight), id(m.tgt_embed.tokens.weight), id(m.output.weight)}) == 3
    with pytest.raises(ValueError, match="joint vocabulary"):
        Transformer(tiny_model_config(tie_embeddings="all"), 40, V)


def closed_form_params(V: int, N: int, d: int, f: int) -> int:
    """Tied V x d embedding; per encoder layer 4 (d x d + d) attention, FFN (d f + f + f d + d), 2 LayerNorms;
    per decoder layer twice the attention and 3 LayerNorms. Post-norm: no final norms, no output bias."""
    attn, ffn, ln = 4 * (d * d + d), d * f + f + f * d + d, 2 * d
    return V * d + N * (attn + ffn + 2 * ln) + N * (2 * attn + ffn + 3 * ln)


@pytest.mark.parametrize(
    "name,d,f,h,expected", [("base", 512, 2048, 8, 63_082_496), ("big", 1024, 4096, 16, 214_245_376)]
)
def test_paper_parameter_counts(name, d, f, h, expected):
    cfg = ModelConfig(name=name, d_model=d, n_heads=h, d_ff=f, encoder_layers=6, decoder_layers=6)
    with torch.device("meta"):
        model = Transformer(cfg, 37000, 37000)
    n = sum(p.numel() for p in model.parameters())
    assert n == closed_form_params(37000, 6, d, f) == expected


def test_sinusoidal_positions_closed_form():
    pe = sinusoidal_positions(3, 4)
    assert pe[0].tolist() == [0.0, 1.0, 0.0, 1.0]
    assert round(pe[1, 0].item(), 4) == 0.8415 and round(pe[1, 1].item(), 4) == 0.5403
    # dims 2, 3 use frequency 1 / 10000^(2/4) = 0.01
    assert pe[1, 2].item() == pytest.approx(math.sin(0.01)) and pe[1, 3].item() == pytest.approx(math.cos(0.01))


def test_embedding_scale_and_init():
    torch.manual_seed(0)
    model = Transformer(
        ModelConfig(name="m", d_model=256, n_heads=4, d_ff=512, encoder_layers=1, decoder_layers=1), 4000, 4000
    )
    w = model.output.weight[4:]
    assert abs(w.std().item() - 256**-0.5) < 0.002 and model.src_embed.scale == 16.0
    assert model.output.weight[PAD].abs().sum() == 0


def test_model_init_fairseq_draws_each_parameter_as_fairseq_does():
    """Issue 62's replica: fairseq 0.12's `transformer` initializes Q, K and V as three D x D matrices
    (xavier_uniform, gain 1/sqrt(2)) with nn.Linear's default biases, and its FFN as plain nn.Linear layers
    (bound 1/sqrt(fan_in), biases too); this project's default is xavier_uniform everywhere with zero biases."""
    torch.manual_seed(0)
    shape = dict(name="m", d_model=128, n_heads=4, d_ff=256, encoder_layers=1, decoder_layers=1)
    fairseq = Transformer(ModelConfig(**shape, init="fairseq"), 1000, 1000)
    torch.manual_seed(0)
    ours = Transformer(ModelConfig(**shape), 1000, 1000)
    d, f = 128, 256
    qkv_bound = math.sqrt(6 / (2 * d)) / math.sqrt(2)

    def uniform(t: torch.Tensor, bound: float) -> bool:  # drawn from U(-bound, bound): its max and its std
        return t.abs().max() <= bound and abs(t.std().item() - bound / math.sqrt(3)) < 0.06 * bound

    layer, mine = fairseq.decoder[0], ours.decoder[0]
    for attn in (layer.self_attn, fairseq.encoder[0].self_attn):
        assert all(uniform(block, qkv_bound) for block in attn.qkv_proj.weight.split(d))
        assert uniform(attn.qkv_proj.bias, 1 / math.sqrt(d)) and not attn.out_proj.bias.any()
    for block in (layer.cross_attn.q_proj.weight, *layer.cross_attn.kv_proj.weight.split(d)):
        assert uniform(block, qkv_bound)  # (this project's: sqrt(6 / 2D) for Q, sqrt(6 / 3D) for K/V fused)
    assert uniform(mine.cross_attn.q_proj.weight, math.sqrt(6 / (2 * d))) and not mine.cross_attn.q_proj.bias.any()
    assert uniform(layer.ffn.linear1.weight, 1 / math.sqrt(d)) and uniform(layer.ffn.linear1.bias, 1 / math.sqrt(d))
    assert uniform(layer.ffn.linear2.weight, 1 / math.sqrt(f)) and uniform(layer.ffn.linear2.bias, 1 / math.sqrt(f))
    assert uniform(mine.ffn.linear2.weight, math.sqrt(6 / (d + f))) and not mine.ffn.linear2.bias.any()
    assert torch.equal(fairseq.output.weight, ours.output.weight)  # embeddings drawn first, alike
    assert torch.equal(layer.sub_ffn.norm.weight, torch.ones(d)) and not layer.sub_ffn.norm.bias.any()


def test_tiny_model_memorizes_64_pairs():
    torch.manual_seed(0)
    model = Transformer(tiny_model_config(d_model=64, d_ff=128, n_heads=4), V, V)
    src = torch.randint(4, V, (64, 8))
    tgt_out = torch.randint(4, V, (64, 7))
    tgt_in = torch.cat([torch.full((64, 1), BOS), tgt_out[:, :-1]], 1)
    pad_mask = torch.zeros_like(src, dtype=torch.bool)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(300):
        loss = nn.functional.cross_entropy(model(src, pad_mask, tgt_in).reshape(-1, V), tgt_out.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.05:
            break
    assert loss.item() < 0.05


def test_logits_of_wanted_positions_only():
    """Training asks for the logits of non-padding targets only: the same rows as the full (B, T, V) output."""
    torch.manual_seed(0)
    model = Transformer(tiny_model_config(), V, V).eval()
    src, pad_mask, tgt = random_batch(T=7)
    wanted = torch.rand(tgt.shape) > 0.3
    with torch.no_grad():
        torch.testing.assert_close(model(src, pad_mask, tgt, wanted), model(src, pad_mask, tgt)[wanted])
