"""Translate with a trained checkpoint: stdin -> stdout by default, one output line per input line.

    python translate.py checkpoint=runs/NAME < in.txt > out.txt
    python translate.py checkpoint=runs/NAME input=in.txt output=out.txt references=ref.txt decode.beam_size=5
    python translate.py checkpoint=runs/NAME decode.nbest=3          # "i ||| hypothesis ||| score" lines
    python translate.py checkpoint=runs/NAME references=test_2016_flickr   # a split of the training data config

Only translations go to stdout; logs and the score go to stderr (and report.json/md with `references`).
"""

import dataclasses
import logging
import sys
import time
from dataclasses import asdict
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from mt import checkpoint, data
from mt.config import ConfigError, DataConfig, DecodeConfig, TranslateConfig, register_configs, to_dataclass
from mt.errors import USER_ERRORS
from mt.evaluation import cross_attention, plot_attention, translate_ids, write_report
from mt.training import keep_freed_memory_in_the_heap, pick_autocast, pick_device

log = logging.getLogger("translate")
register_configs()


def read_input(path: str) -> list[str]:
    """Input lines from stdin or a file (plain or .gz; strict UTF-8, each stripped); errors name the bad line."""
    if path != "-":
        if not Path(path).is_file():
            raise data.DataError(f"input={path}: no such file")
        return [line.strip() for line in data.read_lines(Path(path))]  # plain or .gz, strict UTF-8
    raw, name = sys.stdin.buffer.read(), "stdin"
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    out = []
    for i, line in enumerate(lines, start=1):
        try:
            out.append(line.decode("utf-8").strip())
        except UnicodeDecodeError as e:
            raise data.DataError(
                f"{name}:{i}: bytes that are not UTF-8 ({e.reason}); re-encode the input as UTF-8"
            ) from None
    return out


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


def write_output(path: str, lines: list[str]) -> None:
    text = "".join(line + "\n" for line in lines)
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        Path(path).write_text(text)


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


@hydra.main(version_base="1.3", config_path="conf", config_name="translate")
def main(dcfg: DictConfig) -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(message)s", force=True)
    keep_freed_memory_in_the_heap()  # beam search's cache buffers and logits would otherwise page-fault anew
    try:
        cfg: TranslateConfig = to_dataclass(dcfg)
        ckpt = checkpoint.load(cfg.checkpoint)
        cfg.decode = run_decode_settings(cfg.decode, ckpt, list(HydraConfig.get().overrides.task))
        d = cfg.decode
        log.info("decoding: beam %d, length penalty %s %g (the run's settings unless given as decode.*)",
                 d.beam_size, d.length_penalty_type, d.length_penalty)  # fmt: skip
        model, vocabs = checkpoint.build_model(ckpt)
        device = pick_device(cfg.device)
        model.to(device).eval()
        lines = read_input(cfg.input)
        src_ids = vocabs.src.encode_batch(lines)
        limit = model.cfg.max_positions - 1  # room for </s>
        for i, ids in enumerate(src_ids):
            if len(ids) > limit:
                log.warning("line %d: %d tokens, truncated to the model's %d", i + 1, len(ids), limit)
                src_ids[i] = ids[:limit]
        start = time.perf_counter()
        hyps = translate_ids(model, src_ids, cfg.decode, device, pick_autocast(cfg.precision, device))
        seconds = time.perf_counter() - start
        texts = vocabs.tgt.decode_batch([h[0].tokens for h in hyps])
        if cfg.decode.nbest > 1:
            out = [f"{i} ||| {vocabs.tgt.decode(h.tokens)} ||| {h.score:.4f}" for i, hs in enumerate(hyps) for h in hs]
        else:
            out = texts
        write_output(cfg.output, out)
        n_tok = sum(len(h[0].tokens) for h in hyps)
        speed = {"sentences_per_s": len(lines) / max(seconds, 1e-9), "tokens_per_s": n_tok / max(seconds, 1e-9)}
        log.info("%d lines in %.2fs: %.1f sentences/s, %.0f tokens/s", len(lines), seconds, *speed.values())
        if cfg.references:
            refs = read_references(cfg.references, ckpt, len(lines))
            report_dir = Path(cfg.report_dir or (Path(cfg.output).parent if cfg.output != "-" else "."))
            extra = {**speed, "decode": asdict(cfg.decode), "checkpoint": ckpt["path"]}
            r = write_report(report_dir, "", lines, texts, refs, extra)
            log.info("%s", r["bleu_detail"])
            log.info("BLEU %.2f (lowercased %.2f), chrF %.2f; report in %s", r["bleu"], r["bleu_lowercase"],
                     r["chrf"], report_dir / "report.md")  # fmt: skip
        if cfg.plot_attention:
            first = next((i for i, s in enumerate(src_ids) if s), None)
            if first is None:
                raise ConfigError("plot_attention: every input line is empty; nothing to plot")
            n_layers = len(model.decoder)
            if not -n_layers <= cfg.attention_layer < n_layers:
                raise ConfigError(f"attention_layer={cfg.attention_layer}: the model has {n_layers} decoder layers")
            out_ids = hyps[first][0].tokens
            matrix = cross_attention(model, vocabs, src_ids[first], out_ids, cfg.attention_layer)
            src_tok = vocabs.src.tokens(src_ids[first]) + ["</s>"]
            out_tok = vocabs.tgt.tokens(out_ids) + ["</s>"]
            plot_attention(matrix, src_tok, out_tok, Path(cfg.plot_attention))
            torch.save(matrix, Path(cfg.plot_attention).with_suffix(".attn.pt"))
            log.info("cross-attention of line %d (%dx%d) plotted to %s", first + 1, *matrix.shape, cfg.plot_attention)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
