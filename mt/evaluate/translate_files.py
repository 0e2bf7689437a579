"""translate.py's two ways through the input: a stream (bounded memory, each chunk written as it is
translated), or the whole input at once for a report against references and for the attention plot."""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import torch

from mt.config import ConfigError, DataConfig, TranslateConfig
from mt.data import files
from mt.data.tokenizer import Vocabs
from mt.decode.confidence import records
from mt.decode.flags import FLAGS
from mt.decode.lines import (
    AlignedFile,
    constraint_file,
    input_chunks,
    open_output,
    output_lines,
    read_input,
    write_output,
)
from mt.decode.search import Hypothesis
from mt.decode.segment import refuse_with_split
from mt.decode.terminology import Tally
from mt.errors import DataError
from mt.evaluate.plots import cross_attention, plot_attention
from mt.evaluate.report import write_report

log = logging.getLogger(__name__)


def read_references(spec: str, ckpt: dict, n: int, tgt_lang: str | None = None) -> list[str]:
    """References from a file, or from a split of the checkpoint's data config in `tgt_lang` (a multilingual model's
    target language; default: the run's target language); must have `n` lines."""
    if Path(spec).is_file():
        refs, where = [line.strip() for line in files.read_lines(Path(spec))], spec
    else:
        dc = DataConfig(**ckpt["config"]["data"])
        lang = tgt_lang or dc.tgt_lang
        path = files.split_path(dc, spec, lang)
        if path is None:
            raise ConfigError(f"references={spec}: neither a file nor a split of the local corpus {dc.dir} in "
                              f"{lang} ({spec}.{lang}[.gz])")  # fmt: skip
        refs, where = [line.strip() for line in files.read_lines(path)], str(path)
    if len(refs) != n:
        raise DataError(f"{where} has {len(refs)} lines but the input has {n}; give references for every line")
    return refs


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


def mc_passes(cfg: TranslateConfig) -> int:
    """The MC-dropout passes `confidence=mc_dropout` asks for (0: the score alone)."""
    return cfg.mc_passes if cfg.confidence == "mc_dropout" else 0


def translate_stream(cfg: TranslateConfig, translator) -> None:
    """`stream_lines` lines at a time (fewer when no more input is waiting): read, translated, written (bounded
    memory, output as soon as it is ready). `translator`: an mt.decode.translator.Translator."""
    chunks = input_chunks(cfg.input, cfg.input_errors, cfg.stream_lines, indent=cfg.split)
    prefixes = AlignedFile(cfg.prefix) if cfg.prefix else None
    constraints, tally = constraint_file(cfg), Tally()
    out, start = open_output(cfg.output), time.perf_counter()
    done, n_tokens = translator.translate_stream(chunks, out, cfg.decode, prefixes, f"prefix={cfg.prefix}",
                                                 constraints=constraints, tally=tally, split=cfg.split,
                                                 output_format=cfg.output_format, flag_below=cfg.flag_below,
                                                 mc_passes=mc_passes(cfg))  # fmt: skip
    seconds = max(time.perf_counter() - start, 1e-9)
    log.info("%d lines in %.2fs: %.1f sentences/s, %.0f tokens/s", done, seconds, done / seconds, n_tokens / seconds)
    tally.log()


def translate_whole(cfg: TranslateConfig, translator) -> None:
    """The whole input at once, for a report against references and for the attention plot."""
    lines, ckpt, vocabs = read_input(cfg.input, cfg.input_errors), translator.checkpoint, translator.vocabs
    target = translator.target_id() and translator.tgt_lang  # a multilingual model's language, checked first
    refs = read_references(cfg.references, ckpt, len(lines), target) if cfg.references else None
    prefix, phrases, tally = None, None, Tally()
    if cfg.prefix:
        prefixes = AlignedFile(cfg.prefix)
        prefix = prefixes.take(len(lines))
        prefixes.finish()
    if cfg.constraints:
        constraints = constraint_file(cfg)
        phrases = [c.split("\t") for c in constraints.take(len(lines))]
        constraints.finish()
    if cfg.split:
        if cfg.plot_attention:
            raise ConfigError("plot_attention shows one sentence's attention; unset split")
        refuse_with_split(cfg.decode, prefix, phrases, "split=true")
    out, start = open_output(cfg.output), time.perf_counter()
    if cfg.split:  # each line sentence by sentence
        texts, n_tokens = translator.texts(lines, cfg.decode, True, tally=tally)
        write_output(out, texts)
    else:
        src_ids, hyps = translator.hypotheses(lines, cfg.decode, prefix, where=f"prefix={cfg.prefix}",
                                              constraints=phrases, tally=tally,
                                              constraints_where=f"constraints={cfg.constraints}")  # fmt: skip
        texts = vocabs.tgt.decode_batch([h[0].tokens for h in hyps])
        if cfg.output_format == "jsonl":
            found = records(translator, lines, src_ids, [h[0] for h in hyps], texts, cfg.decode,
                            flag_below=cfg.flag_below, mc_passes=mc_passes(cfg))  # fmt: skip
            write_output(out, [json.dumps(r, ensure_ascii=False) for r in found])
            flag_counts = dict(Counter(f for r in found for f in r["flags"]))
        else:
            write_output(out, output_lines(hyps, texts, vocabs, cfg.decode.nbest))
        n_tokens = sum(len(h[0].tokens) for h in hyps)
    seconds = max(time.perf_counter() - start, 1e-9)
    speed = {"sentences_per_s": len(lines) / seconds, "tokens_per_s": n_tokens / seconds}
    log.info("%d lines in %.2fs: %.1f sentences/s, %.0f tokens/s", len(lines), seconds, *speed.values())
    tally.log()
    if refs is not None:
        report_dir = Path(cfg.report_dir or (Path(cfg.output).parent if cfg.output != "-" else "."))
        extra = {**speed, "decode": asdict(cfg.decode), "precision": cfg.precision, "checkpoint": ckpt["path"]}
        if cfg.output_format == "jsonl":  # how many lines raised each flag (mt/decode/flags.py)
            extra["flags"] = {name: flag_counts.get(name, 0) for name in FLAGS}
        r = write_report(report_dir, "", lines, texts, refs, extra, vocabs.tgt.lowercases)
        log.info("%s", r["bleu_detail"])
        log.info("BLEU %.2f (lowercased %.2f), chrF %.2f; report in %s", r["bleu"], r["bleu_lowercase"], r["chrf"],
                 report_dir / "report.md")  # fmt: skip
    if cfg.plot_attention:
        plot_first_line(translator.model, vocabs, src_ids, hyps, cfg)
