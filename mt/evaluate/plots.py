"""Pictures of a run: training curves from metrics.jsonl, and a sentence's cross-attention as a heatmap."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from mt.data.tokenizer import BOS, EOS


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def plot_curves(metrics_path: Path, png_path: Path) -> None:
    """Training loss, validation loss and validation BLEU (a multilingual run's per direction too) against updates,
    from metrics.jsonl."""
    plt = _pyplot()
    records = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    train = [r for r in records if r["kind"] == "train"]
    valid = [r for r in records if r["kind"] == "valid"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.plot([r["update"] for r in train], [r["loss"] for r in train], label="train loss (label-smoothed)")
    raw = any("raw_valid_loss" in r for r in valid)  # a weight average (train.ema_decay) and the raw weights
    kept = "valid loss (weight average)" if raw else "valid loss"
    ax1.plot([r["update"] for r in valid], [r["valid_loss"] for r in valid], "o-", label=kept)
    if raw:
        ax1.plot([r["update"] for r in valid], [r.get("raw_valid_loss", float("nan")) for r in valid], "o--",
                 label="valid loss (raw weights)")  # fmt: skip
    ax1.set_xlabel("update")
    ax1.set_ylabel("loss per target token")
    ax1.legend()
    if any("valid_bleu" in r for r in valid):
        for key, style, label in (("valid_bleu", "o-", "weight average"), ("raw_valid_bleu", "o--", "raw weights")):
            if any(key in r for r in valid):
                ax2.plot([r["update"] for r in valid], [r.get(key, float("nan")) for r in valid], style, label=label)
        directions = sorted({k[len("valid_bleu_") :] for r in valid for k in r if k.startswith("valid_bleu_")})
        for name in directions:  # a multilingual run: each direction beside their mean
            ax2.plot([r["update"] for r in valid], [r.get(f"valid_bleu_{name}", float("nan")) for r in valid], ".:",
                     label=name)  # fmt: skip
        if raw or directions:
            ax2.legend()
        ax2.set_ylabel("valid BLEU")
    ax2.set_xlabel("update")
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)


def cross_attention(model, src_ids: list[int], out_ids: list[int], layer: int) -> torch.Tensor:
    """Cross-attention of the output tokens (with </s>) over the source tokens (with </s>), mean over heads:
    a (T, S) matrix, teacher-forced through the chosen decoder layer."""
    device = next(model.parameters()).device
    attn = model.decoder[layer].cross_attn
    src = torch.tensor([src_ids + [EOS]], device=device)
    tgt_in = torch.tensor([[BOS] + out_ids], device=device)
    attn.keep_weights = True
    try:
        with torch.no_grad():
            model.eval()
            model(src, src.eq(-1), tgt_in)
        return attn.weights[0].float().mean(0).cpu()  # (T, S)
    finally:
        attn.keep_weights, attn.weights = False, None


def plot_attention(matrix: torch.Tensor, src_tokens: list[str], out_tokens: list[str], path: Path) -> None:
    plt = _pyplot()
    T, S = matrix.shape
    fig, ax = plt.subplots(figsize=(max(4, 0.4 * S + 2), max(3, 0.4 * T + 1.5)))
    ax.imshow(matrix.numpy(), cmap="viridis", aspect="auto")
    ax.set_xticks(range(S), src_tokens, rotation=90)
    ax.set_yticks(range(T), out_tokens)
    ax.set_xlabel("source")
    ax.set_ylabel("output")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
