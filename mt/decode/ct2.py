"""Decoding with a CTranslate2 export (`python -m mt.export ctranslate2 ...`), behind the interface translate.py
and the server use for this project's own search: source ids in, `Hypothesis` lists out.

What is the same: the tokenizer (the export's tokenizer.json), beam size, n-best, <unk> suppression, and the
length limit `max_len_a * src_len + max_len_b` (sentences are grouped by their limit, as CTranslate2 takes one per
call). What differs: CTranslate2's length penalty is `score / length^alpha` (this project's
`decode.length_penalty_type=average`); with the default GNMT penalty the two searches rank finished hypotheses
differently, so set `length_penalty_type=average` (or alpha 0) for identical beams. A hypothesis that reaches the
limit ends there in CTranslate2 without the </s> log-probability this project's search adds.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import torch

from mt.config import ConfigError, DecodeConfig, ModelConfig
from mt.data.hub_vocab import vocabs_from_json
from mt.data.tokenizer import Framing, Vocabs
from mt.decode.search import Hypothesis, output_cap
from mt.model import saved


def require_ctranslate2():
    """The ctranslate2 module, or a one-line error naming the extra that installs it."""
    try:
        import ctranslate2
    except ImportError:
        raise ConfigError(
            "CTranslate2 is not installed; pip install -e '.[ctranslate2]' (or pip install ctranslate2)"
        ) from None
    return ctranslate2


class CTranslate2Model:
    """A CTranslate2 Translator over an export directory, with the export's model config (for `max_positions`)."""

    def __init__(self, path: str | Path, device: torch.device, threads: int | None = None):
        ctranslate2 = require_ctranslate2()
        path = Path(path)
        meta = json.loads((path / "mt.json").read_text())
        self.cfg = ModelConfig(**meta["model_args"]["model"])
        self.run_config = meta["config"]
        self.quantization = meta["quantization"]
        self.translator = ctranslate2.Translator(
            str(path),
            device="cuda" if device.type == "cuda" else "cpu",
            device_index=device.index or 0,  # cuda:1 decodes on the second GPU
            intra_threads=threads or torch.get_num_threads(),
        )
        self.vocabs: Vocabs = vocabs_from_json(saved.tokenizer_files(path, self.run_config))

    def framed(self, src_ids: list[list[int]], prefixes, framing: Framing | None):
        """Source tokens and target prefixes as CTranslate2 reads them: an imported model's (converted by
        CTranslate2's own converter) end with </s> and carry its language tokens; ours add </s> themselves."""
        src = [self.vocabs.src.tokens(s) for s in src_ids]
        if self.vocabs.family == "bpe":
            return src, [self.vocabs.tgt.tokens(p) for p in prefixes] if prefixes else None, 0
        framing = framing or self.vocabs.framing(None, None)
        eos = self.vocabs.src.tokens([framing.specials.eos])
        src_lead, tgt_lead = (
            self.vocabs.src.tokens(list(framing.src_lead)),
            self.vocabs.tgt.tokens(list(framing.tgt_lead)),
        )
        src = [src_lead + s + eos for s in src]
        if tgt_lead or prefixes:
            prefixes = [tgt_lead + (self.vocabs.tgt.tokens(prefixes[i]) if prefixes else []) for i in range(len(src))]
        return src, prefixes, len(tgt_lead)

    def translate_ids(
        self,
        src_ids: list[list[int]],
        cfg: DecodeConfig,
        prefixes: list[list[int]] | None = None,
        framing: Framing | None = None,
    ) -> list[list[Hypothesis]]:
        """Hypotheses for each source (ids without </s>), in input order; `prefixes`: target ids each line's
        hypotheses start with (CTranslate2's target_prefix). Sampling draws from CTranslate2's own generator: its
        `set_random_seed` (called with `cfg.seed`) does not reach the translator's worker threads (CTranslate2
        issue 1757), so samples are not reproducible as this project's are."""
        out: list[list[Hypothesis]] = [[Hypothesis([], 0.0, 0.0)] * cfg.nbest for _ in src_ids]  # empty in, empty out
        limits = {i: max(1, min(math.floor((len(ids) + 1) * cfg.max_len_a + cfg.max_len_b), output_cap(self, cfg)))
                  for i, ids in enumerate(src_ids) if ids}  # fmt: skip
        if cfg.sampling:
            require_ctranslate2().set_random_seed(cfg.seed)
        sources, targets, lead = self.framed(src_ids, prefixes, framing)
        # One call over every line, as CTranslate2's users call it (its own batching, one length limit: the
        # largest); a line whose output reaches its own limit is decoded again under it, with the others of that
        # limit: only there does the limit change the search, so every line gets what it would alone.
        rows = list(limits)
        done = self._decode(rows, sources, targets, lead, max(limits.values(), default=1), cfg)
        again: dict[int, list[int]] = defaultdict(list)
        for i, hyps in zip(rows, done):
            out[i] = hyps
            if any(len(h.tokens) >= limits[i] - 1 for h in hyps):
                again[limits[i]].append(i)
        for limit, group in again.items():
            for i, hyps in zip(group, self._decode(group, sources, targets, lead, limit, cfg)):
                out[i] = hyps
        return out

    def _decode(self, rows: list[int], sources, targets, lead: int, limit: int, cfg: DecodeConfig):
        """The hypotheses of the lines `rows` under one length limit (</s> counted), by one translate_batch."""
        if not rows:
            return []
        alpha = cfg.length_penalty
        sampling = {}
        if cfg.sampling:
            sampling = dict(sampling_topk=cfg.topk, sampling_topp=cfg.topp, sampling_temperature=cfg.temperature)
        results = self.translator.translate_batch(
            [sources[i] for i in rows],
            target_prefix=[targets[i] for i in rows] if targets else None,
            max_batch_size=cfg.max_tokens,
            batch_type="tokens",
            beam_size=cfg.beam_size,
            num_hypotheses=cfg.nbest,
            length_penalty=alpha,
            max_decoding_length=max(1, limit - 1 + lead),  # tokens before </s>, as the limit counts </s>
            min_decoding_length=cfg.min_len,
            disable_unk=cfg.no_unk,
            max_input_length=0,
            return_scores=True,
            **sampling,
        )
        tgt_vocab = self.vocabs.tgt
        return [[Hypothesis([tgt_vocab.token_to_id(t) for t in tokens[lead:]], score, score if not alpha else math.nan)
                 for tokens, score in zip(r.hypotheses, r.scores)] for r in results]  # fmt: skip

    def score_ids(self, src_ids: list[list[int]], tgt_ids: list[list[int]]) -> list[float]:
        """The log-probability of each target given its source (</s> included, a forced language token not), by
        CTranslate2's score_batch."""
        sources, _, _ = self.framed(src_ids, None, None)
        framing = None if self.vocabs.family == "bpe" else self.vocabs.framing(None, None)
        lead = self.vocabs.tgt.tokens(list(framing.tgt_lead)) if framing else []
        results = self.translator.score_batch(sources, [lead + self.vocabs.tgt.tokens(t) for t in tgt_ids],
                                              max_input_length=0)  # fmt: skip
        return [sum(r.log_probs[len(lead) :]) for r in results]  # the forced language token is not counted
