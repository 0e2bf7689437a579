"""Code-path check: this project's replica model and fairseq 0.12's `transformer` with the same weights
on the same batch: the same logits, label-smoothed loss, gradients, and loss under dropout?

    python benchmarks/quality/fairseq_same_step.py                         # a random model and batch
    python benchmarks/quality/fairseq_same_step.py --run RUN_DIR           # a trained replica on 64 val pairs

Needs run.sh's venv (benchmarks/peers/fairseq/.venv). Our half runs here: the replica's shape
(conf/experiment/multi30k_en_de_fairseq.yaml: post-norm, d 128, FFN 256, 4 heads, 4+4 layers, all embeddings
shared), random or a run's trained weights, a batch padded on both sides; in eval mode its logits, its loss
(`Transformer.loss`: the fused projection and label-smoothed loss) and gradients, and in train mode the NLL over
48 dropout draws; saved to a file. fairseq's half runs in the venv (its own fairseq, the same torch):
`TransformerModel.build_model` with run.sh's flags, our weights copied in by name (Q, K, V split out of the fused
projections, the four special tokens moved to fairseq's ids, our sinusoid table put into its position table, whose
order of dimensions differs), its criterion's `label_smoothed_nll_loss`, the same quantities, and the comparison;
exit status 0 when they agree. It also prints each parameter's init scale (std of the values, averaged over layers):
fairseq's `build_model` against `model.init=xavier` and `model.init=fairseq`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
VENV_PY = ROOT / "benchmarks" / "peers" / "fairseq" / ".venv" / "bin" / "python"
SHAPE = {"d_model": 128, "n_heads": 4, "d_ff": 256, "encoder_layers": 4, "decoder_layers": 4}
EPS, DRAWS = 0.1, 48
OURS_TO_FAIRSEQ = {0: 1, 1: 3, 2: 0, 3: 2}  # <pad> <unk> <s> </s> -> fairseq's ids; other ids stay


def fairseq_names(n_enc: int, n_dec: int) -> dict[str, tuple[str, int, int]]:
    """fairseq parameter name -> (our name, chunk index, number of chunks) along dim 0 of our tensor."""
    m = {"encoder.embed_tokens.weight": ("src_embed.tokens.weight", 0, 1)}
    attn = ("weight", "bias")
    for i in range(n_enc):
        f, o = f"encoder.layers.{i}", f"encoder.{i}"
        for j, qkv in enumerate("qkv"):
            for p in attn:
                m[f"{f}.self_attn.{qkv}_proj.{p}"] = (f"{o}.self_attn.qkv_proj.{p}", j, 3)
        pairs = {"self_attn.out_proj": "self_attn.out_proj", "self_attn_layer_norm": "sub_attn.norm",
                 "fc1": "ffn.linear1", "fc2": "ffn.linear2", "final_layer_norm": "sub_ffn.norm"}  # fmt: skip
        for fk, ok in pairs.items():
            for p in attn:
                m[f"{f}.{fk}.{p}"] = (f"{o}.{ok}.{p}", 0, 1)
    for i in range(n_dec):
        f, o = f"decoder.layers.{i}", f"decoder.{i}"
        for j, qkv in enumerate("qkv"):
            for p in attn:
                m[f"{f}.self_attn.{qkv}_proj.{p}"] = (f"{o}.self_attn.qkv_proj.{p}", j, 3)
        for p in attn:
            m[f"{f}.encoder_attn.q_proj.{p}"] = (f"{o}.cross_attn.q_proj.{p}", 0, 1)
            m[f"{f}.encoder_attn.k_proj.{p}"] = (f"{o}.cross_attn.kv_proj.{p}", 0, 2)
            m[f"{f}.encoder_attn.v_proj.{p}"] = (f"{o}.cross_attn.kv_proj.{p}", 1, 2)
        pairs = {"self_attn.out_proj": "self_attn.out_proj", "self_attn_layer_norm": "sub_self.norm",
                 "encoder_attn.out_proj": "cross_attn.out_proj", "encoder_attn_layer_norm": "sub_cross.norm",
                 "fc1": "ffn.linear1", "fc2": "ffn.linear2", "final_layer_norm": "sub_ffn.norm"}  # fmt: skip
        for fk, ok in pairs.items():
            for p in attn:
                m[f"{f}.{fk}.{p}"] = (f"{o}.{ok}.{p}", 0, 1)
    return m


def vocab_order(V: int) -> torch.Tensor:
    """perm[fairseq id] = our id."""
    perm = torch.arange(V)
    for ours, theirs in OURS_TO_FAIRSEQ.items():
        perm[theirs] = ours
    return perm


def batch(src_ids: list[list[int]], tgt_ids: list[list[int]]) -> tuple[torch.Tensor, ...]:
    """Padded (src, tgt_in, tgt_out) as this project's batches are: source + </s>, <s> + target, target + </s>."""
    from mt.data.tokenizer import BOS, EOS, PAD

    S, T = max(map(len, src_ids)) + 1, max(map(len, tgt_ids)) + 1
    src = torch.full((len(src_ids), S), PAD)
    tgt_in, tgt_out = torch.full((len(tgt_ids), T), PAD), torch.full((len(tgt_ids), T), PAD)
    for i, (s, t) in enumerate(zip(src_ids, tgt_ids)):
        src[i, : len(s) + 1] = torch.tensor([*s, EOS])
        tgt_in[i, : len(t) + 1] = torch.tensor([BOS, *t])
        tgt_out[i, : len(t) + 1] = torch.tensor([*t, EOS])
    return src, tgt_in, tgt_out


def ours_half(path: Path, run: Path | None) -> None:
    """Our model (random, or `run`'s trained one), a batch (random ids, or `run`'s tokenizer on the first 64 val
    pairs), its logits, loss and gradients in eval mode, and the loss under dropout over `DRAWS` draws."""
    sys.path.insert(0, str(ROOT))
    from mt.config import ModelConfig
    from mt.model.transformer import Transformer

    torch.manual_seed(0)
    if run is None:
        V = 1000
        model = Transformer(ModelConfig(name="replica", **SHAPE, norm="post", dropout=0.3), V, V)
        lengths = [(10, 9), (10, 8), (8, 8), (6, 6), (4, 4), (2, 2)]
        src, tgt_in, tgt_out = batch(*zip(*[(torch.randint(4, V, (a,)).tolist(), torch.randint(4, V, (b,)).tolist())
                                            for a, b in lengths]))  # fmt: skip
    else:
        import gzip

        from mt.model import saved

        model, vocabs = saved.build_model(saved.load(run))
        V = model.tgt_vocab
        cfg = model.cfg
        assert (cfg.norm, cfg.tie_embeddings, cfg.d_model, cfg.d_ff) == ("post", "all", 128, 256), "not a replica run"
        data = ROOT.parent / "shared" / "data" / "multi30k"
        en, de = ([line.strip() for line, _ in zip(gzip.open(data / f"val.{lang}.gz", "rt"), range(64))]
                  for lang in ("en", "de"))  # fmt: skip
        src, tgt_in, tgt_out = batch(vocabs.src.encode_batch(en), vocabs.tgt.encode_batch(de))
    from mt.data.tokenizer import PAD

    src_pad = src.eq(PAD)
    model.train()
    with torch.no_grad():
        dropped = [model.loss(src, src_pad, tgt_in, tgt_out, EPS)[1].item() for _ in range(DRAWS)]
    model.eval()
    logits = model(src, src_pad, tgt_in)
    loss, nll = model.loss(src, src_pad, tgt_in, tgt_out, EPS)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    inits = {}
    for init in ("xavier", "fairseq"):
        torch.manual_seed(1)
        fresh = Transformer(ModelConfig(name="replica", **SHAPE, norm="post", init=init), V, V)
        inits[init] = {n: p.detach().clone() for n, p in fresh.named_parameters()}
    torch.save({"V": V, "state": model.state_dict(), "src": src, "tgt_in": tgt_in, "tgt_out": tgt_out,
                "logits": logits, "loss": loss.detach(), "nll": nll, "grads": grads, "inits": inits,
                "positions": model.src_embed.positions.clone(), "dropped": torch.tensor(dropped),
                "dropout": model.cfg.dropout}, path)  # fmt: skip


def fairseq_half(path: Path) -> None:
    from argparse import Namespace

    from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
    from fairseq.data import Dictionary
    from fairseq.models.transformer import TransformerModel, base_architecture

    d = torch.load(path)
    V = d["V"]
    dictionary = Dictionary()
    for i in range(V - len(dictionary)):
        dictionary.add_symbol(f"w{i}")
    assert len(dictionary) == V and (dictionary.pad(), dictionary.eos()) == (1, 2)
    args = Namespace(arch="transformer", share_all_embeddings=True, encoder_layers=4, decoder_layers=4,
                     encoder_embed_dim=128, decoder_embed_dim=128, encoder_ffn_embed_dim=256,
                     decoder_ffn_embed_dim=256, encoder_attention_heads=4, decoder_attention_heads=4,
                     dropout=d["dropout"], max_source_positions=1024, max_target_positions=1024)  # fmt: skip
    base_architecture(args)
    task = Namespace(source_dictionary=dictionary, target_dictionary=dictionary)
    torch.manual_seed(1)
    model = TransformerModel.build_model(args, task)
    names = fairseq_names(4, 4)
    perm = vocab_order(V)

    def ours(name, grads_or_state):
        our, j, n = names[name]
        t = grads_or_state[our]
        t = t.chunk(n, 0)[j]
        return t[perm] if name == "encoder.embed_tokens.weight" else t

    params = dict(model.named_parameters())
    print("init scale (std of the values; layers averaged): fairseq build_model | ours xavier | ours fairseq")
    seen = {}
    for name, p in params.items():
        if name not in names:
            continue
        key = name.split(".", 3)[-1] if ".layers." in name else name
        key = f"{name.split('.')[0]}.{key}"
        if p.dim() < 1 or name.endswith("norm.weight") or name.endswith("norm.bias"):
            continue
        row = [p.detach().std().item(), *(ours(name, d["inits"][k]).std().item() for k in ("xavier", "fairseq"))]
        seen.setdefault(key, []).append(row)
    worst = 0.0
    for key, rows in seen.items():
        f, x, fs = (sum(r[i] for r in rows) / len(rows) for i in range(3))
        worst = max(worst, abs(fs - f) / max(f, 1e-12))
        print(f"  {key:42s} {f:8.4f} | {x:8.4f} ({x / max(f, 1e-12):4.2f}x) | {fs:8.4f}")
    print(f"model.init=fairseq against fairseq's build_model: largest relative std difference {worst:.3f}")

    missing = [n for n in params if n not in names and "embed_positions" not in n]
    assert not missing, f"fairseq parameters not mapped: {missing}"
    with torch.no_grad():
        for name, p in params.items():
            if name in names:
                p.copy_(ours(name, d["state"]))
        P = d["positions"].size(0)
        for side in (model.encoder, model.decoder):
            table = side.embed_positions.weights
            table[2 : 2 + P] = d["positions"][: table.size(0) - 2]  # fairseq's positions start at pad + 1 = 2
    model.eval()
    to_fs = torch.arange(V)
    for ours_id, theirs in OURS_TO_FAIRSEQ.items():
        to_fs[ours_id] = theirs
    src, tgt_in, tgt_out = (to_fs[d[k]] for k in ("src", "tgt_in", "tgt_out"))
    src_lengths = src.ne(1).sum(1)
    logits, _ = model(src, src_lengths, tgt_in)
    ours_logits = d["logits"][..., perm]
    keep = tgt_out.ne(1)
    diff = (logits - ours_logits)[keep].abs().max().item()
    print(f"logits at the {int(keep.sum())} target tokens: largest difference {diff:.2e} "
          f"(scale {ours_logits[keep].abs().max().item():.2f})")  # fmt: skip
    lprobs = model.get_normalized_probs((logits, None), log_probs=True)
    loss, nll = label_smoothed_nll_loss(lprobs.view(-1, V), tgt_out.view(-1), EPS, ignore_index=1, reduce=True)
    print(f"loss sum: fairseq {loss.item():.5f}, ours {d['loss'].item():.5f} (fairseq 0.12 puts eps/(V-1), not "
          f"eps/V, on the other tokens); NLL: {nll.item():.5f} against {d['nll'].item():.5f}")  # fmt: skip
    loss.backward()
    worst_name, worst = "", 0.0
    for name, p in params.items():
        if name not in names or name.endswith("k_proj.bias"):
            continue  # a key bias adds the same score to every key of a query: its gradient is 0 up to rounding
        g = ours(name, d["grads"])
        rel = ((p.grad - g).norm() / g.norm().clamp_min(1e-12)).item()
        if rel > worst:
            worst_name, worst = name, rel
    k_bias = max(p.grad.abs().max().item() for n, p in params.items() if n.endswith("k_proj.bias"))
    print(f"gradients of {len(names)} parameters: largest relative difference {worst:.2e} ({worst_name}); "
          f"the key biases' gradients, 0 in exact arithmetic, are at most {k_bias:.1e} in fairseq")  # fmt: skip
    ok = diff < 1e-4 and worst < 5e-3 and abs(nll.item() - d["nll"].item()) < 1e-3 * d["nll"].item()
    model.train()
    with torch.no_grad():
        dropped = []
        for _ in range(DRAWS):
            lp = model.get_normalized_probs(model(src, src_lengths, tgt_in), log_probs=True)
            dropped.append(label_smoothed_nll_loss(lp.view(-1, V), tgt_out.view(-1), EPS, ignore_index=1)[1].item())
    dropped = torch.tensor(dropped)
    ours_dropped = d["dropped"]
    se = (dropped.var() / DRAWS + ours_dropped.var() / DRAWS).sqrt().item()
    gap = ours_dropped.mean().item() - dropped.mean().item()
    print(
        f"NLL under dropout {d['dropout']} (train mode, {DRAWS} draws each): fairseq {dropped.mean().item():.3f}, "
        f"ours {ours_dropped.mean().item():.3f} (eval mode {nll.item():.3f}); difference {gap:+.3f} +- {se:.3f}"
    )
    ok = ok and abs(gap) < 4 * se + 1e-3 * nll.item()
    print("same forward and backward" if ok else "DIFFERENT")
    sys.exit(0 if ok else 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, help="a replica run dir: its trained model on 64 val pairs (else random)")
    ap.add_argument("--fairseq-half", type=Path, help=argparse.SUPPRESS)  # run in fairseq's venv by this script
    args = ap.parse_args()
    if args.fairseq_half:
        return fairseq_half(args.fairseq_half)
    if not VENV_PY.is_file():
        sys.exit(f"error: {VENV_PY} missing: run benchmarks/peers/fairseq/run.sh once (it builds the venv)")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ours.pt"
        ours_half(path, args.run)
        sys.exit(subprocess.run([str(VENV_PY), __file__, "--fairseq-half", str(path)]).returncode)


if __name__ == "__main__":
    main()
