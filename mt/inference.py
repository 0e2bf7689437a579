"""translate.py's parts: reading input lines, writing translations, references for a report, the run's decoding
settings, and the attention plot of a line."""

from __future__ import annotations

import dataclasses
import logging
import sys
from pathlib import Path

import torch

from mt import data
from mt.config import ConfigError, DataConfig, DecodeConfig, TranslateConfig
from mt.evaluation import translate_ids
from mt.plots import cross_attention, plot_attention
from mt.search import Hypothesis
from mt.tokenizer import Vocabs

log = logging.getLogger(__name__)


def read_input(path: str, errors: str = "strict") -> list[str]:
    """Input lines from stdin or a file (plain or .gz); see `split_lines`."""
    if path == "-":
        return split_lines(sys.stdin.buffer.read(), "stdin", errors)
    if not Path(path).is_file():
        raise data.DataError(f"input={path}: no such file; give an existing file or - for stdin")
    return split_lines(data.read_bytes(Path(path)), path, errors)


def split_lines(raw: bytes, name: str, errors: str = "strict") -> list[str]:
    """Lines of `raw`, each stripped. Lines end at "\n" only (a "\r", U+2028 or U+0085 inside a line stays in it,
    so there is one output line per input line). Bytes that are not UTF-8 stop with an error naming the line, or
    with `errors="replace"` become U+FFFD with a warning."""
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    out, replaced = [], []
    for i, line in enumerate(lines, start=1):
        try:
            out.append(line.decode("utf-8").strip())
        except UnicodeDecodeError as e:
            if errors != "replace":
                raise data.DataError(
                    f"{name}:{i}: bytes that are not UTF-8 ({e.reason}); re-encode the input as UTF-8 "
                    "or set input_errors=replace"
                ) from None
            out.append(line.decode("utf-8", errors="replace").strip())
            replaced.append(i)
    if replaced:
        log.warning("%s: %d lines had bytes that are not UTF-8, replaced by U+FFFD (first: line %d)", name,
                    len(replaced), replaced[0])  # fmt: skip
    return out


def open_output(path: str):
    """The output stream, opened before decoding so that an unwritable path fails at once, not after the work."""
    if path == "-":
        return sys.stdout
    try:
        return open(path, "w", encoding="utf-8", newline="\n")
    except OSError as e:
        raise ConfigError(f"output={path}: cannot be written ({e.strerror}); give a writable path") from None


def encode_within_positions(vocabs: Vocabs, lines: list[str], limit: int) -> list[list[int]]:
    """Source ids of each line, cut to `limit` tokens (the model's positions, less one for </s>) with a warning."""
    src_ids = vocabs.src.encode_batch(lines)
    for i, ids in enumerate(src_ids):
        if len(ids) > limit:
            log.warning("line %d: %d tokens, truncated to the model's %d", i + 1, len(ids), limit)
            src_ids[i] = ids[:limit]
    return src_ids


def translate_lines(model, vocabs: Vocabs, lines: list[str], cfg: DecodeConfig, device, amp):
    """Raw lines -> (source ids, hypotheses, detokenized best translations), in input order, one per line."""
    src_ids = encode_within_positions(vocabs, lines, model.cfg.max_positions - 1)
    hyps = translate_ids(model, src_ids, cfg, device, amp)
    return src_ids, hyps, vocabs.tgt.decode_batch([h[0].tokens for h in hyps])


def output_lines(hyps: list[list[Hypothesis]], texts: list[str], vocabs: Vocabs, nbest: int) -> list[str]:
    """One line per input, or with nbest > 1 Moses-style "i ||| hypothesis ||| score" lines."""
    if nbest == 1:
        return texts
    return [f"{i} ||| {vocabs.tgt.decode(h.tokens)} ||| {h.score:.4f}" for i, hs in enumerate(hyps) for h in hs]


def write_output(stream, lines: list[str]) -> None:
    stream.write("".join(line + "\n" for line in lines))
    stream.flush()
    if stream is not sys.stdout:
        stream.close()


def read_references(spec: str, ckpt: dict, n: int) -> list[str]:
    """References from a file, or from a split of the checkpoint's data config; must have `n` lines."""
    if Path(spec).is_file():
        refs, where = [line.strip() for line in data.read_lines(Path(spec))], spec
    else:
        dc = DataConfig(**ckpt["config"]["data"])
        path = data.split_path(dc, spec, dc.tgt_lang)
        if path is None:
            raise ConfigError(f"references={spec}: neither a file nor a split of the local corpus {dc.dir}")
        refs, where = [line.strip() for line in data.read_lines(path)], str(path)
    if len(refs) != n:
        raise data.DataError(f"{where} has {len(refs)} lines but the input has {n}; give references for every line")
    return refs


def run_decode_settings(cli: DecodeConfig, ckpt: dict, overrides: list[str]) -> DecodeConfig:
    """The decoding settings the run was evaluated with (a recipe's beam and tuned length penalty), with the
    command line's `decode.*` keys on top. A decode group named on the command line (`decode=greedy`) replaces them,
    as does a checkpoint without a saved config."""
    keys = [o.split("=", 1)[0].lstrip("+~") for o in overrides]
    saved = (ckpt.get("config") or {}).get("decode")
    if not saved or "decode" in keys:
        return cli
    fields = {f.name for f in dataclasses.fields(DecodeConfig)}
    merged = {k: v for k, v in saved.items() if k in fields}
    merged.update({k: getattr(cli, k) for k in (k.removeprefix("decode.") for k in keys) if k in fields})
    return DecodeConfig(**merged)


def plot_first_line(
    model, vocabs: Vocabs, src_ids: list[list[int]], hyps: list[list[Hypothesis]], cfg: TranslateConfig
) -> None:
    """`plot_attention=PNG`: the cross-attention of the first non-empty line's translation, as a heatmap (and the
    matrix as PNG's stem + .attn.pt)."""
    first = next((i for i, s in enumerate(src_ids) if s), None)
    if first is None:
        raise ConfigError("plot_attention: every input line is empty; nothing to plot")
    n_layers = len(model.decoder)
    if not -n_layers <= cfg.attention_layer < n_layers:
        raise ConfigError(f"attention_layer={cfg.attention_layer}: the model has {n_layers} decoder layers")
    out_ids = hyps[first][0].tokens
    matrix = cross_attention(model, src_ids[first], out_ids, cfg.attention_layer)
    src_tok, out_tok = vocabs.src.tokens(src_ids[first]) + ["</s>"], vocabs.tgt.tokens(out_ids) + ["</s>"]
    plot_attention(matrix, src_tok, out_tok, Path(cfg.plot_attention))
    torch.save(matrix, Path(cfg.plot_attention).with_suffix(".attn.pt"))
    log.info("cross-attention of line %d (%dx%d) plotted to %s", first + 1, *matrix.shape, cfg.plot_attention)
