"""One toolkit's training steps on the peer benchmark's batches, run inside that toolkit's own environment.

    benchmarks/peers/fairseq/.venv/bin/python benchmarks/peers/peer_steps.py --system fairseq --shape small --steps 8

`benchmarks/peers/train_peers.py --peers joeynmt,eole,fairseq` runs this once per system and round, alternating the
systems, and compares the rates; run alone it prints one JSON line: the system, its parameter count and the target
tokens/s of each timed step. Only torch and the toolkit are imported (the toolkits live in separate virtual
environments, `benchmarks/peers/<peer>/.venv`, made by their run.sh), except for "this project", which runs in
this project's environment.

A step is what each toolkit's trainer does per batch: its own model's forward, its own loss (the function its
criterion calls, label smoothing 0.1, summed over non-padding targets, divided by their number), backward, and
torch's Adam (foreach, as this project's trainer on a CPU; each toolkit's own optimizer wrapper is left out, so
the comparison is of model and loss). Every system gets the same shape (benchmarks/speed/shapes.py: d_model, heads,
d_ff, layers), the vocabulary of 8,000 tied three ways, dropout 0.1, ReLU, and the same random batches: the
token ids of `random_batches` with each toolkit's own padding and start-of-target ids. Layer norms are post-norm
where the toolkit offers it (this project, JoeyNMT, fairseq); Eole's Transformer layers are pre-norm only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.speed.shapes import SHAPES, VOCAB  # noqa: E402  (torch-free, importable from any environment)

V, PAD, BOS = VOCAB, 0, 2  # the batches' ids: 0 padding, 2 start of target, 4.. the vocabulary's tokens


def random_batches(n: int, tokens: int, seed: int = 0) -> list[tuple]:
    """n batches of ~`tokens` target tokens, source and target lengths 10-30: (src, src_pad, tgt_in, tgt_out,
    target tokens). Ids 4..V-1 are tokens, PAD pads, BOS starts tgt_in."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        B = tokens // 20
        src_len = torch.randint(10, 31, (B,), generator=g)
        tgt_len = torch.randint(10, 31, (B,), generator=g)
        S, T = int(src_len.max()), int(tgt_len.max())
        src = torch.randint(4, V, (B, S), generator=g)
        src_pad = torch.arange(S)[None] >= src_len[:, None]
        src = src.masked_fill(src_pad, PAD)
        tgt = torch.randint(4, V, (B, T + 1), generator=g)
        tgt_pad = torch.arange(T + 1)[None] >= (tgt_len + 1)[:, None]
        tgt = tgt.masked_fill(tgt_pad, PAD)
        tgt[:, 0] = BOS
        out.append((src, src_pad, tgt[:, :-1].contiguous(), tgt[:, 1:].contiguous(), int(tgt[:, 1:].ne(PAD).sum())))
    return out


def relabel(ids: torch.Tensor, pad: int, start: int) -> torch.Tensor:
    """The batch's ids with a toolkit's own padding and start ids (all four toolkits keep 4 specials at 0-3)."""
    table = torch.arange(V)
    table[PAD], table[BOS] = pad, start
    return table[ids]


def this_project_model(d_model: int, n_heads: int, d_ff: int, layers: int):
    from mt.config import ModelConfig
    from mt.model.transformer import Transformer

    cfg = ModelConfig(
        name="bench",
        d_model=d_model,
        n_heads=n_heads,
        d_ff=d_ff,
        encoder_layers=layers,
        decoder_layers=layers,
        dropout=0.1,
        norm="post",
        max_positions=512,
    )
    return Transformer(cfg, V, V)


def this_project(shape: dict):
    from mt.train.trainer import TrainingLoss

    objective = TrainingLoss(this_project_model(**shape), 0.1)  # as the trainer runs: non-padding targets only

    def loss(src, src_pad, tgt_in, tgt_out):
        return objective(src, src_pad, tgt_in, tgt_out)[0]

    return objective, loss


def joeynmt(shape: dict):
    from joeynmt.model import build_model
    from joeynmt.vocabulary import Vocabulary

    specials = SimpleNamespace(
        unk_token="<unk>", pad_token="<pad>", bos_token="<s>", eos_token="</s>", sep_token=None, lang_tags=[],
        unk_id=0, pad_id=1, bos_id=2, eos_id=3,
    )  # fmt: skip
    vocab = Vocabulary([f"t{i}" for i in range(4, V)], specials)
    side = dict(
        type="transformer",
        num_layers=shape["layers"],
        num_heads=shape["n_heads"],
        hidden_size=shape["d_model"],
        ff_size=shape["d_ff"],
        dropout=0.1,
        layer_norm="post",
        activation="relu",
        embeddings=dict(embedding_dim=shape["d_model"], scale=True, dropout=0.1),
    )
    model = build_model(dict(encoder=side, decoder=dict(side), tied_embeddings=True, tied_softmax=True), vocab, vocab)
    model.loss_function = ("crossentropy", 0.1)  # JoeyNMT's XentLoss, summed over non-padding targets
    pad, bos = vocab.pad_index, vocab.bos_index

    def loss(src, src_pad, tgt_in, tgt_out):
        src, tgt_in, tgt_out = relabel(src, pad, bos), relabel(tgt_in, pad, bos), relabel(tgt_out, pad, bos)
        return model(
            return_type="loss",
            src=src,
            trg=tgt_out,
            trg_input=tgt_in,
            src_mask=(src != pad).unsqueeze(1),
            src_length=(~src_pad).sum(1),
            trg_mask=(tgt_in != pad).unsqueeze(1),
        )[0]

    return model, loss


def eole(shape: dict):
    from eole.config.models import TransformerModelConfig
    from eole.config.training import TrainingConfig
    from eole.inputters.inputter import dict_to_vocabs
    from eole.models.model import get_model_class

    tokens = ["<unk>", "<blank>", "<s>", "</s>"] + [f"t{i}" for i in range(4, V)]
    vocabs = dict_to_vocabs(
        dict(src=tokens, tgt=tokens, specials=dict(pad_token="<blank>", bos_token="<s>", eos_token="</s>"))
    )
    model_config = TransformerModelConfig(
        hidden_size=shape["d_model"],
        heads=shape["n_heads"],
        transformer_ff=shape["d_ff"],
        layers=shape["layers"],
        share_embeddings=True,
        share_decoder_embeddings=True,
        embeddings=dict(word_vec_size=shape["d_model"], position_encoding_type="SinusoidalInterleaved"),
    )
    running = TrainingConfig(
        dropout=[0.1], attention_dropout=[0.0], compute_dtype="fp32", param_init_method="xavier_uniform"
    )  # the recipe's initialisation
    model = get_model_class(model_config).build(model_config, vocabs, running)
    model.init_weights(running)  # build() leaves the weights uninitialised; Eole's trainer calls this
    pad, bos = 1, 2
    criterion = torch.nn.CrossEntropyLoss(ignore_index=pad, reduction="sum", label_smoothing=0.1)  # Eole's

    def loss(src, src_pad, tgt_in, tgt_out):
        src = relabel(src, pad, bos)
        tgt = relabel(torch.cat([tgt_in, tgt_out[:, -1:]], 1), pad, bos)  # Eole's model takes tgt and shifts it
        out = model(src, tgt, (~src_pad).sum(1))
        logits = model.generator(out.dec_out)
        return criterion(logits.reshape(-1, logits.size(-1)), tgt[:, 1:].reshape(-1))

    return model, loss


def fairseq(shape: dict):
    from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
    from fairseq.data import Dictionary
    from fairseq.models.transformer import TransformerModel, base_architecture

    vocab = Dictionary()  # <s> 0, <pad> 1, </s> 2, <unk> 3
    for i in range(4, V):
        vocab.add_symbol(f"t{i}")
    args = argparse.Namespace(
        encoder_embed_dim=shape["d_model"],
        encoder_ffn_embed_dim=shape["d_ff"],
        encoder_layers=shape["layers"],
        encoder_attention_heads=shape["n_heads"],
        decoder_embed_dim=shape["d_model"],
        decoder_ffn_embed_dim=shape["d_ff"],
        decoder_layers=shape["layers"],
        decoder_attention_heads=shape["n_heads"],
        dropout=0.1,
        share_all_embeddings=True,
        max_source_positions=512,
        max_target_positions=512,
    )
    base_architecture(args)
    model = TransformerModel.build_model(args, SimpleNamespace(source_dictionary=vocab, target_dictionary=vocab))
    pad, start = vocab.pad(), vocab.eos()  # fairseq starts the target with </s>

    def loss(src, src_pad, tgt_in, tgt_out):
        src, tgt_in, tgt_out = relabel(src, pad, start), relabel(tgt_in, pad, start), relabel(tgt_out, pad, start)
        net_output = model(src, (~src_pad).sum(1), tgt_in)
        lprobs = model.get_normalized_probs(net_output, log_probs=True)  # as its criterion
        return label_smoothed_nll_loss(lprobs.view(-1, V), tgt_out.reshape(-1), 0.1, ignore_index=pad)[0]

    return model, loss


SYSTEMS = {"this project": this_project, "joeynmt": joeynmt, "eole": eole, "fairseq": fairseq}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--system", choices=SYSTEMS, required=True)
    ap.add_argument("--shape", choices=SHAPES, default="small")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, loss = SYSTEMS[args.system](SHAPES[args.shape])
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, foreach=True)
    rates, first_loss = [], None
    for i, batch in enumerate(random_batches(args.steps + args.warmup, args.tokens)):
        t = time.perf_counter()
        per_token = loss(*batch[:4]) / batch[4]
        per_token.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= args.warmup:
            rates.append(batch[4] / (time.perf_counter() - t))
        first_loss = per_token.item() if first_loss is None else first_loss
    params = sum(p.numel() for p in model.parameters())  # shared (tied) parameters once
    # first_loss: the per-token loss of the first batch, ~ln(8000) = 9.0 at initialisation for a right loss
    print(json.dumps(dict(system=args.system, params=params, first_loss=first_loss, rates=rates)))


if __name__ == "__main__":
    main()
