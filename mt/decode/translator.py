"""The translator behind translate.py, serve.py and Python programs: a model (anything translate.py loads), its
tokenizers and its decoding settings; text in, translations out.

    from mt import Translator

    t = Translator.load("runs/en_de")                     # a run dir, .pt, release, CTranslate2 export, or a list
    t.translate(["A dog runs."])                          # ["Ein Hund rennt."]
    t.translate(["A dog runs."], nbest=3)                 # [[("Ein Hund rennt.", -0.38), ...]]
    t.translate(["A dog runs."], sampling=True, topk=10)  # a sample per line (reproducible: `seed`)
    t.translate(["A dog runs."], prefix=["Ein Hund"])     # translations that start with the prefix
    t.translate(["A dog runs."], constraints=[["Hündchen"]])   # translations that contain the phrases
    t.translate(["A dog runs."], glossary={"dog": "Hündchen"})  # or a glossary's terms (also Glossary.from_file)
    t.translate(["A dog runs. It is fast."], split=True)  # paragraphs: sentence by sentence, layout kept
    t.translate(["A dog runs."], scores=True)             # [{"text": ..., "score": -0.2, "flags": []}]
    t.score(["A dog runs."], ["Ein Hund rennt."])         # the model's log-probability of each pair
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

import torch

from mt.config import ConfigError, DecodeConfig, checkpoint_list, validate_decode
from mt.data.tokenizer import Framing
from mt.decode.batched import decode_ids, encode_within_positions
from mt.decode.confidence import forced_logprobs, scored_lines
from mt.decode.ct2 import CTranslate2Model
from mt.decode.lines import input_chunks, output_lines, write_output
from mt.decode.loading import load_ensemble, load_translator
from mt.decode.search import Hypothesis, output_cap
from mt.decode.segment import Document, refuse_with_split, split_document, split_sentences, whole_line
from mt.decode.terminology import Glossary, Tally, check, check_search, line_constraints
from mt.errors import TokenizerError
from mt.model import saved
from mt.runtime import pick_device

log = logging.getLogger(__name__)
DECODE_KEYS = {f.name for f in dataclasses.fields(DecodeConfig)}


def target_tokens(vocabs) -> dict[str, int]:
    """{language: id} of the target-language tokens (<2de>, ...) a multilingual model's vocabulary holds."""
    added = vocabs.src.added_tokens()
    return {t[2:-1]: i for i, t in added.items() if re.fullmatch(r"<2[^<>\s]+>", t)}


def decode_settings(saved: dict | None, overrides: dict) -> DecodeConfig:
    """The decoding settings a checkpoint's run saved (its recipe's beam and length penalty), with `overrides` on
    top (sampling without a beam size given: beam 1, not the saved beam); an unknown name or a bad value is a
    one-line ConfigError."""
    unknown = sorted(set(overrides) - DECODE_KEYS)
    if unknown:
        raise ConfigError(f"decode setting {unknown[0]!r} is unknown; known: {', '.join(sorted(DECODE_KEYS))}")
    settings = {**{k: v for k, v in (saved or {}).items() if k in DECODE_KEYS}, **overrides}
    if settings.get("sampling") and "beam_size" not in overrides:  # sampling draws one token at a time
        settings["beam_size"] = 1
    cfg = DecodeConfig(**settings)
    validate_decode(cfg)
    return cfg


class Translator:
    """A loaded model with its tokenizers, device, precision and default decoding settings (`decode`)."""

    def __init__(self, model, vocabs, decode: DecodeConfig, device: torch.device, amp, ckpt: dict):
        self.model, self.vocabs, self.decode, self.device, self.amp = model, vocabs, decode, device, amp
        self.checkpoint = ckpt  # the (first) checkpoint's dict: "path", "config", "model_args"
        self.targets = target_tokens(vocabs)  # a multilingual model's {language: its <2xx> token's id}
        self.tgt_lang: str | None = None  # the default target language of a multilingual model
        run_data = (ckpt.get("config") or {}).get("data") or {}
        # The default source language of a model that reads one (NLLB): the run's data.src_lang.
        self.source_lang: str | None = run_data.get("src_lang")
        self.glossary: Glossary | None = None  # applied to every input unless a call gives its own (server-wide)

    @classmethod
    def load(
        cls,
        path: str | Path | list,
        device: str = "auto",
        precision: str = "fp32",
        tgt_lang: str | None = None,
        src_lang: str | None = None,
        **decode,
    ) -> Translator:
        """Load `path`: a run dir (its final checkpoint), a .pt file, a release dir, a CTranslate2 export, a
        transformers checkpoint (a directory or a Hub id such as Helsinki-NLP/opus-mt-de-en), or a list of this
        project's (an ensemble). `device`: auto | cpu | cuda[:N]; `precision`: fp32 | bf16 | fp16 | auto;
        `tgt_lang`: the language a multilingual model translates into unless `translate` says otherwise (a
        bilingual model ignores it); `src_lang`: the source language of a model that reads one (NLLB); `decode`:
        any decode.* setting (beam_size=5, length_penalty=1.0, max_tokens=8000, sampling=True, ...), on top of
        the settings the run saved."""
        ckpts = [saved.load(p) for p in checkpoint_list(path)]
        settings = decode_settings((ckpts[0].get("config") or {}).get("decode"), decode)
        return cls.open(ckpts, settings, pick_device(device), precision, tgt_lang=tgt_lang, src_lang=src_lang)

    @classmethod
    def open(
        cls,
        ckpts: list[dict],
        decode: DecodeConfig,
        device: torch.device,
        precision: str,
        plot: bool = False,
        tgt_lang: str | None = None,
        src_lang: str | None = None,
    ) -> Translator:
        """From loaded checkpoints (translate.py and serve.py, which take their settings from Hydra)."""
        if len(ckpts) == 1:
            model, vocabs, amp = load_translator(ckpts[0], decode, precision, device, plot)
        else:
            model, vocabs, amp = load_ensemble(ckpts, decode, precision, device, plot)
            log.info("ensemble of %d models", len(ckpts))
        translator = cls(model, vocabs, decode, device, amp, ckpts[0])
        translator.source_lang = src_lang or translator.source_lang
        if tgt_lang is not None:
            translator.target_id(tgt_lang)  # an unknown language fails now, before any input is read
        translator.tgt_lang = tgt_lang or translator.run_target()
        return translator

    def direction(self) -> str:
        """The pair this translator translates by default, as translate.py's first line names it: `de->en`, or a
        multilingual run's directions."""
        data = (self.checkpoint.get("config") or {}).get("data") or {}
        if data.get("directions") and not self.tgt_lang:
            return ", ".join(d.replace("-", "->") for d in data["directions"])
        return f"{self.source_lang or data.get('src_lang') or '?'}->{self.tgt_lang or data.get('tgt_lang') or '?'}"

    def run_target(self) -> str | None:
        """The target language of a multilingual model that a run fine-tuned in one direction (its `data.tgt_lang`,
        as `data.src_lang` is its source), where the model needs one and knows it; else None."""
        run_data = (self.checkpoint.get("config") or {}).get("data") or {}
        lang = run_data.get("tgt_lang")
        if not lang or run_data.get("directions"):
            return None
        try:
            self.target_id()
            return None  # the model needs no target language (a bilingual one)
        except ConfigError:
            pass
        try:
            self.target_id(lang)
        except ConfigError:
            return None
        return lang

    def framing(self, tgt_lang: str | None = None) -> Framing:
        """The model's special ids and language tokens for a translation into `tgt_lang` (default: the
        translator's): an imported multilingual model's >>xxx<< or NLLB codes; a one-line ConfigError for a
        language it has no token for, or one it needs and was not given."""
        try:
            return self.vocabs.framing(self.source_lang, tgt_lang or self.tgt_lang)
        except TokenizerError as e:
            raise ConfigError(str(e)) from None

    def check_terms(self, decode: DecodeConfig, where: str) -> None:
        """What constraints and glossaries need, checked once before any text is read (never only when a line
        happens to hold a term): this project's search, not a CTranslate2 export, and a beam; else a one-line
        ConfigError naming `where`."""
        if isinstance(self.model, CTranslate2Model):
            raise ConfigError(f"{where}: constraints and glossaries need this project's search: CTranslate2 has no "
                              "constrained beam search; give the run dir or release instead of the CTranslate2 "
                              "export")  # fmt: skip
        check_search(decode, where)

    def target_id(self, tgt_lang: str | None = None) -> int | None:
        """The <2xx> token to put before the sources: None for a bilingual model; for a multilingual one,
        `tgt_lang`'s (or the default's), a one-line error when it is missing or unknown. (An imported model's
        language tokens are its `framing`'s, checked here too.)"""
        if self.vocabs.family != "bpe":
            self.framing(tgt_lang)
            return None
        if not self.targets:
            return None
        lang = tgt_lang or self.tgt_lang
        if lang not in self.targets:
            known = ", ".join(sorted(self.targets))
            what = f"tgt_lang={lang}: not a language of" if lang else "tgt_lang is needed by"
            raise ConfigError(f"{what} this multilingual model; give one of {known}")
        return self.targets[lang]

    @property
    def limit(self) -> int:
        """Source tokens a line may have (the model's positions, less one for </s> and any language token)."""
        return self.model.cfg.max_positions - 1 - len(self.framing().src_lead)

    @property
    def src_lang(self) -> str:
        """The source language (the sentence splitter's rules): the run's `data.src_lang`, else English's."""
        return ((self.checkpoint.get("config") or {}).get("data") or {}).get("src_lang") or "en"

    def split(self, lines: list[str], tgt_lang: str | None = None, first_line: int = 0,
              whole_lines: bool = False, encode=None) -> Document:  # fmt: skip
        """`lines` as sentences to translate (mt/decode/segment.py), each within the model's positions; `whole_lines`:
        each line one sentence, cut into pieces only where it is over the positions. `encode`: the source encoder to
        count with (default: the source vocabulary's; a caller that encodes the sentences next passes a memo)."""
        room = self.limit - (self.target_id(tgt_lang) is not None)
        encode = encode or self.vocabs.src.encode_batch
        count = lambda texts: [len(ids) for ids in encode(texts)]  # noqa: E731
        splitter = whole_line if whole_lines else split_sentences
        return split_document(lines, self.src_lang, count, room, first_line, splitter)

    def too_long(self, lines: list[str], tgt_lang: str | None = None) -> bool:
        """Whether a line is over the model's positions (then it is translated in pieces, see `split`)."""
        room = self.limit - (self.target_id(tgt_lang) is not None)
        return any(len(ids) > room for ids in self.vocabs.src.encode_batch(lines))

    def texts(
        self,
        lines: list[str],
        decode: DecodeConfig,
        split: bool = False,
        first_line: int = 0,
        tgt_lang: str | None = None,
        glossary: Glossary | None = None,
        tally: Tally | None = None,
    ) -> tuple[list[str], int]:
        """(1-best translations, output tokens) of `lines`; with `split`, of each line's sentences, joined back
        into the line's layout (no prefixes or per-line constraints: a glossary applies per sentence). A line (or
        sentence) over the model's positions is translated in pieces cut at clause boundaries, with a warning."""
        doc = self.split(lines, tgt_lang, first_line) if split else None
        if doc is None and self.too_long(lines, tgt_lang):  # an over-long line: in pieces, not cut short
            doc = self.split(lines, tgt_lang, first_line, whole_lines=True)
        inputs = doc.sentences if doc is not None else lines
        _, hyps = self.hypotheses(inputs, decode, first_line=first_line, tgt_lang=tgt_lang, glossary=glossary,
                                  tally=tally)  # fmt: skip
        texts = self.vocabs.tgt.decode_batch([h[0].tokens for h in hyps])
        return (doc.join(texts) if doc is not None else texts), sum(len(h[0].tokens) for h in hyps)

    def settings(self, **overrides) -> DecodeConfig:
        """The default decoding settings with `overrides` (None = keep the default), validated."""
        return decode_settings(dataclasses.asdict(self.decode), {k: v for k, v in overrides.items() if v is not None})

    def encode_prefixes(self, prefixes: list[str] | None, src_ids: list[list[int]], decode: DecodeConfig,
                        where: str = "prefix", first_line: int = 0) -> list[list[int]] | None:  # fmt: skip
        """Target ids of each line's prefix ("" = none); a prefix that leaves no room in the line's length limit is
        a one-line error naming `where` and the line."""
        if prefixes is None:
            return None
        if len(prefixes) != len(src_ids):
            raise ConfigError(f"{where}: {len(prefixes)} prefixes for {len(src_ids)} lines; give one per line")
        for i, p in enumerate(prefixes):
            if p.strip() and (back := self.vocabs.tgt.unchanged(p)) is not None:
                raise ConfigError(f"{where}:{first_line + i + 1}: the prefix {p.strip()!r} would come back as "
                                  f"{back!r}: {self.vocabs.tgt.why_changed(p)}")  # fmt: skip
        ids = self.vocabs.tgt.encode_batch([p.strip() for p in prefixes])
        for i, (p, s) in enumerate(zip(ids, src_ids)):
            limit = min(int((len(s) + 1) * decode.max_len_a + decode.max_len_b), output_cap(self.model, decode))
            if s and len(p) >= limit:
                raise ConfigError(
                    f"{where}:{first_line + i + 1}: the prefix has {len(p)} tokens but the line's translation may "
                    f"have {limit - 1} before </s> (decode.max_len_a/max_len_b); shorten it or raise max_len_b"
                )
        return ids if any(ids) else None

    def hypotheses(
        self,
        lines: list[str],
        decode: DecodeConfig | None = None,
        prefixes: list[str] | None = None,
        first_line: int = 0,
        where: str = "prefix",
        tgt_lang: str | None = None,
        constraints: list[list[str]] | None = None,
        glossary: Glossary | None = None,
        tally: Tally | None = None,
        constraints_where: str = "constraints",
    ) -> tuple[list[list[int]], list[list[Hypothesis]]]:
        """(source ids, hypotheses best first) of raw lines, in input order; `first_line`: the number of
        `lines[0]` in its input (0-based), which with `decode.seed` decides its samples; `tgt_lang`: a
        multilingual model's target language (default: the translator's); `constraints`: target phrases per line
        each translation must contain, and those of `glossary` (default: the translator's) found in the line
        (mt/decode/terminology.py), counted in `tally`."""
        decode, tally = decode or self.decode, tally or Tally()
        if constraints is not None or glossary is not None or self.glossary is not None:
            self.check_terms(decode, constraints_where)
        src_ids = self.encode_sources(lines, tgt_lang, first_line)
        prefix_ids = self.encode_prefixes(prefixes, src_ids, decode, where, first_line)
        rules = line_constraints(self.vocabs.tgt, lines, constraints, glossary or self.glossary, decode,
                                 constraints_where, first_line, tally)  # fmt: skip
        numbers = list(range(first_line, first_line + len(lines)))
        hyps = decode_ids(self.model, src_ids, decode, self.device, self.amp, prefix_ids, numbers, rules,
                          framing=self.framing(tgt_lang))  # fmt: skip
        check(rules, hyps, first_line, tally)
        return src_ids, hyps

    def encode_sources(self, lines: list[str], tgt_lang: str | None = None, first_line: int = 0) -> list[list[int]]:
        """Source ids within the model's positions, a multilingual model's target-language token first (empty
        lines stay empty: empty in, empty out); `first_line` numbers the lines in truncation warnings."""
        target = self.target_id(tgt_lang)
        if target is None:
            return encode_within_positions(self.vocabs, lines, self.limit, first_line)
        cut = encode_within_positions(self.vocabs, lines, self.limit - 1, first_line)
        return [[target, *s] if s else s for s in cut]

    def translate(
        self,
        lines: list[str],
        *,
        beam_size: int | None = None,
        nbest: int | None = None,
        sampling: bool | None = None,
        topk: int | None = None,
        topp: float | None = None,
        temperature: float | None = None,
        seed: int | None = None,
        prefix: list[str] | None = None,
        tgt_lang: str | None = None,
        constraints: list[list[str]] | None = None,
        glossary: Glossary | dict[str, str] | None = None,
        constraint_order: str | None = None,
        split: bool = False,
        scores: bool = False,
        flag_below: float | None = None,
    ) -> list[str] | list[list[tuple[str, float]]] | list[dict]:
        """Translations of `lines` (a list of strings), one per line: a string, or with `nbest` > 1 a list of
        (translation, score) best first. Unset arguments keep the loaded settings: `beam_size`, `nbest` (beams
        kept, or samples drawn), `sampling` with `topk` (0 = all tokens), `topp` (1.0 = all), `temperature` and
        `seed`; `prefix`: one target prefix per line ("" = none) each translation starts with; `tgt_lang`: a
        multilingual model's target language (default: the one given at load); `constraints`: one list of target
        phrases per line that its translation must contain (unordered, or in order with
        `constraint_order="ordered"`); `glossary`: {source term: target term} (or a Glossary), whose terms found
        in a line become its constraints, on top of the translator's own glossary; `split`: each line is a paragraph
        or a document's line, translated sentence by sentence and joined back with its own spacing; `scores`: a
        {"text", "score", "flags"} per line instead (mt/decode/confidence.py), `flag_below` its low-score threshold."""
        if isinstance(lines, str) or not all(isinstance(line, str) for line in lines):
            raise ConfigError("translate: give a list of strings (one sentence each), e.g. translate(['A dog.'])")
        decode = self.settings(beam_size=beam_size, nbest=nbest, sampling=sampling, topk=topk, topp=topp,
                               temperature=temperature, seed=seed, constraint_order=constraint_order)  # fmt: skip
        if isinstance(glossary, dict):
            glossary = Glossary.from_pairs([(s, t, "glossary") for s, t in glossary.items()])
        if glossary is not None and self.glossary is not None:
            glossary = self.glossary.merged(glossary)
        if scores:
            if split or decode.nbest > 1:
                raise ConfigError("translate: scores=True scores one translation a line; leave out split and nbest")
            return scored_lines(self, list(lines), decode, prefixes=prefix, constraints=constraints,
                                tgt_lang=tgt_lang, flag_below=flag_below, glossary=glossary)[0]  # fmt: skip
        if split or (in_pieces(decode, prefix, constraints) and self.too_long(list(lines), tgt_lang)):
            refuse_with_split(decode, prefix, constraints)
            return self.texts(list(lines), decode, split, tgt_lang=tgt_lang, glossary=glossary)[0]
        _, hyps = self.hypotheses(list(lines), decode, prefix, tgt_lang=tgt_lang, constraints=constraints,
                                  glossary=glossary)  # fmt: skip
        if decode.nbest == 1:
            return self.vocabs.tgt.decode_batch([h[0].tokens for h in hyps])
        return [[(self.vocabs.tgt.decode(h.tokens), h.score) for h in hs] for hs in hyps]

    def translate_stream(
        self,
        chunks: Iterable[list[str]],
        out: TextIO,
        decode: DecodeConfig | None = None,
        prefixes=None,
        where: str = "prefix",
        tgt_lang: str | None = None,
        constraints=None,
        tally: Tally | None = None,
        split: bool = False,
        output_format: str = "text",
        flag_below: float | None = None,
        mc_passes: int = 0,
    ) -> tuple[int, int]:
        """Translate each chunk of lines as it comes and write its output lines at once (n-best: "i ||| text |||
        score", numbered across chunks), so that a program that writes a line and waits gets its translation;
        `prefixes.take(n)` gives the next n lines' prefixes (mt.decode.lines.AlignedFile), whose surplus lines are
        an error at the end of the input; `constraints.take(n)` likewise their constraints (tab-separated phrases),
        counted in `tally`; `split`: lines translated sentence by sentence (`texts`); `output_format="jsonl"`: a
        JSON object a line, {"text", "score", "flags"} (mt/decode/confidence.py), `flag_below` its low-score
        threshold, `mc_passes` its MC-dropout passes. Returns (lines, output tokens)."""
        decode, done, n_tokens = decode or self.decode, 0, 0
        if split:
            refuse_with_split(decode, prefixes, constraints, "split=true")
            if output_format == "jsonl":
                raise ConfigError("output_format=jsonl scores lines translated whole; unset split")
        for lines in chunks:
            if split or (output_format != "jsonl" and in_pieces(decode, prefixes, constraints)
                         and self.too_long(lines, tgt_lang)):  # fmt: skip
                texts, n = self.texts(lines, decode, split, done, tgt_lang, tally=tally)
                write_output(out, texts)
                done, n_tokens = done + len(lines), n_tokens + n
                continue
            prefix = prefixes.take(len(lines)) if prefixes is not None else None
            phrases, key = None, "glossary"
            if constraints is not None:
                phrases, key = [c.split("\t") for c in constraints.take(len(lines))], f"constraints={constraints.path}"
            if output_format == "jsonl":
                found, n = scored_lines(self, lines, decode, prefixes=prefix, constraints=phrases, first_line=done,
                                        tgt_lang=tgt_lang, flag_below=flag_below, where=where, tally=tally,
                                        constraints_where=key, mc_passes=mc_passes)  # fmt: skip
                write_output(out, [json.dumps(r, ensure_ascii=False) for r in found])
                done, n_tokens = done + len(lines), n_tokens + n
                continue
            _, hyps = self.hypotheses(lines, decode, prefix, first_line=done, where=where, tgt_lang=tgt_lang,
                                      constraints=phrases, tally=tally, constraints_where=key)  # fmt: skip
            texts = self.vocabs.tgt.decode_batch([h[0].tokens for h in hyps])
            write_output(out, output_lines(hyps, texts, self.vocabs, decode.nbest, first=done))
            done, n_tokens = done + len(lines), n_tokens + sum(len(h[0].tokens) for h in hyps)
        for aligned in (prefixes, constraints):
            if aligned is not None:
                aligned.finish()
        return done, n_tokens

    def translate_file(
        self, src: str | Path, out: str | Path, chunk_lines: int = 10_000, tgt_lang: str | None = None, **decode
    ) -> int:
        """Translate the file `src` (plain or .gz, "-" = stdin) into `out` ("-" = stdout), `chunk_lines` lines at a
        time (bounded memory for any input); `tgt_lang` and `decode`: as `translate`'s. Returns the lines
        translated."""
        settings = self.settings(**decode)
        self.target_id(tgt_lang)  # a missing or unknown language fails before the output file is opened
        chunks = input_chunks(str(src), "strict", chunk_lines)
        if str(out) == "-":
            return self.translate_stream(chunks, sys.stdout, settings, tgt_lang=tgt_lang)[0]
        with open(out, "w", encoding="utf-8", newline="\n") as f:
            return self.translate_stream(chunks, f, settings, tgt_lang=tgt_lang)[0]

    @torch.no_grad()
    def score(self, src_lines: list[str], tgt_lines: list[str], tgt_lang: str | None = None) -> list[float]:
        """The model's log-probability of each target line given its source (forced decoding, </s> included; a
        target-language token the model forces first is not part of the line), as
        corpus filtering and reranking use it; lines longer than the model are cut as in translation; `tgt_lang`:
        a multilingual model's target language (default: the one given at load)."""
        if len(src_lines) != len(tgt_lines):
            raise ConfigError(f"score: {len(src_lines)} source lines but {len(tgt_lines)} target lines; give pairs")
        src = self.encode_sources(list(src_lines), tgt_lang)
        framing = self.framing(tgt_lang)
        tgt = [t[: self.limit - len(framing.tgt_lead)] for t in self.vocabs.tgt.encode_batch(list(tgt_lines))]
        if not isinstance(self.model, CTranslate2Model):
            self.model.eval()
        return forced_logprobs(self, src, tgt, framing)


def in_pieces(decode: DecodeConfig, prefixes, constraints) -> bool:
    """Whether a line over the model's positions can be translated in pieces: not with n-best lists, prefixes or
    per-line constraints, which belong to the whole line (then it is truncated, with a warning)."""
    return decode.nbest == 1 and prefixes is None and constraints is None
