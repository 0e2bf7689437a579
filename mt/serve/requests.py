"""A translation request: its JSON body, and what the server makes of it (decode settings within the limits,
sources, prefixes, constraints, sentences), each problem a one-line 4xx."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from mt.config import ConfigError, DecodeConfig, ServeConfig
from mt.decode.segment import Document, refuse_with_split
from mt.decode.terminology import Glossary, line_constraints
from mt.decode.translator import in_pieces
from mt.serve.batching import BadRequest


class TranslateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    src: list[str]
    beam_size: int | None = None
    nbest: int | None = None
    prefix: list[str] | None = None  # one per line ("" = none): each translation starts with its prefix
    model: str | None = None  # which of the served models (by name); else the one for tgt_lang, else the first
    tgt_lang: str | None = None  # the target language: picks a model, and a multilingual model's target
    sampling: bool | None = None  # and its settings (mt.config.DecodeConfig); a request's samples depend on its own
    topk: int | None = None  #     lines and seed only, not on the requests decoded with it
    topp: float | None = None
    temperature: float | None = None
    seed: int | None = None
    constraints: list[list[str]] | None = None  # per line: target phrases its translation must contain
    glossary: dict[str, str] | None = None  # source term -> target term, on top of the server's glossary=FILE
    constraint_order: str | None = None  # unordered (default) | ordered
    split: bool = False  # each line a paragraph: translated sentence by sentence, joined back (mt/decode/segment.py)


def request_split(req: TranslateRequest, translator, decode: DecodeConfig, cfg: ServeConfig) -> Document | None:
    """First the request's size: its source tokens, counted before anything is split or cut (a 100,000-character
    line counts in full), over `max_request_tokens` is a 413. Then, with "split": the request's lines as sentences
    (what a split line cannot have is a 422). Without it, where a line is over the model's positions: the lines as
    they are, that one in pieces (not cut short), unless the request has what belongs to a whole line (n-best,
    prefixes, constraints; then it is truncated with a warning). The sentences (or pieces) to decode are held to
    `max_sentences`: a 413 beyond it."""
    n_tokens = sum(len(ids) + 1 for ids in translator.vocabs.src.encode_batch(req.src))
    if n_tokens > cfg.max_request_tokens:
        raise BadRequest(413, f"src: {n_tokens} tokens, more than max_request_tokens={cfg.max_request_tokens}; "
                              "split the request")  # fmt: skip
    try:
        if req.split:
            refuse_with_split(decode, req.prefix, req.constraints)
            doc = translator.split(req.src, req.tgt_lang)
        elif in_pieces(decode, req.prefix, req.constraints) and translator.too_long(req.src, req.tgt_lang):
            doc = translator.split(req.src, req.tgt_lang, whole_lines=True)
        else:
            return None
    except ConfigError as e:
        raise BadRequest(422, str(e)) from None
    if len(doc.sentences) > cfg.max_sentences:  # the limit holds for what is decoded, not for what was sent
        raise BadRequest(413, f"src: {len(doc.sentences)} sentences once split, more than max_sentences="
                              f"{cfg.max_sentences}; send fewer")  # fmt: skip
    return doc


def request_sources(req: TranslateRequest, lines: list[str], cfg: ServeConfig, translator, decode: DecodeConfig):
    """(source ids, prefix ids, warnings) of a request's `lines` (its sentences, or its lines as they are), a
    multilingual model's target-language token first; a line still over the model's positions is truncated."""
    try:
        target = translator.target_id(req.tgt_lang)
    except ConfigError as e:
        raise BadRequest(422, str(e)) from None
    src_ids = translator.vocabs.src.encode_batch(lines)
    warnings, room = [], translator.limit - (target is not None)  # (</s> takes the last position)
    for i, ids in enumerate(src_ids):
        if len(ids) > room:
            warnings.append(f"src[{i}]: {len(ids)} tokens, truncated to the model's {room}")
            src_ids[i] = ids[:room]
    if target is not None:
        src_ids = [[target, *ids] if ids else ids for ids in src_ids]
    try:
        return src_ids, translator.encode_prefixes(req.prefix, src_ids, decode), warnings
    except ConfigError as e:
        raise BadRequest(422, str(e)) from None


def request_terms(req: TranslateRequest, cfg: ServeConfig, translator, decode: DecodeConfig) -> None:
    """What the request's constraints and glossary need, checked before any text is read (whatever the lines
    hold): at most `max_glossary_terms` terms (413), a model and settings that can meet them (422)."""
    if req.glossary and len(req.glossary) > cfg.max_glossary_terms:
        raise BadRequest(413, f"glossary: {len(req.glossary)} terms, more than max_glossary_terms="
                              f"{cfg.max_glossary_terms}; send the terms that the lines need")  # fmt: skip
    if req.constraints is not None or req.glossary or translator.glossary is not None:
        try:
            translator.check_terms(decode, "constraints" if req.constraints is not None else "glossary")
        except ConfigError as e:
            raise BadRequest(422, str(e)) from None


def request_constraints(req: TranslateRequest, lines: list[str], translator, decode: DecodeConfig):
    """Each line's constraints: the request's phrases and the glossary terms (the server's, with the request's on
    top) found in it. Linear in the terms; run off the event loop (a glossary's pattern is compiled here)."""
    glossary = translator.glossary
    try:
        if req.glossary:
            own = Glossary.from_pairs([(s, t, f"glossary[{s!r}]") for s, t in req.glossary.items()])
            glossary = glossary.merged(own) if glossary is not None else own
        return line_constraints(translator.vocabs.tgt, lines, req.constraints, glossary, decode, "constraints")
    except ConfigError as e:
        raise BadRequest(422, str(e)) from None


def request_decode(req: TranslateRequest, cfg: ServeConfig, translator) -> DecodeConfig:
    """The server's decode settings with the request's; limits checked."""
    if not req.src:
        raise BadRequest(422, "src: an empty list; send at least one sentence")
    if len(req.src) > cfg.max_sentences:
        raise BadRequest(413, f"src: {len(req.src)} sentences, more than max_sentences={cfg.max_sentences}")
    sampling = cfg.decode.sampling if req.sampling is None else req.sampling
    beam = 1 if sampling else cfg.decode.beam_size if req.beam_size is None else req.beam_size
    nbest = 1 if req.nbest is None else req.nbest
    if not 1 <= beam <= cfg.max_beam:
        raise BadRequest(422, f"beam_size: {beam} is outside 1..{cfg.max_beam}")
    if not 1 <= nbest <= (cfg.max_beam if sampling else beam):
        raise BadRequest(422, f"nbest: {nbest} is outside 1..{'max_beam' if sampling else 'beam_size'} "
                              f"({cfg.max_beam if sampling else beam})")  # fmt: skip
    cap = min(cfg.max_output_tokens, cfg.decode.max_len or cfg.max_output_tokens)
    try:
        return translator.settings(beam_size=beam, nbest=nbest, sampling=sampling, topk=req.topk, topp=req.topp,
                                   temperature=req.temperature, seed=req.seed, max_len=cap,
                                   constraint_order=req.constraint_order)  # fmt: skip
    except ConfigError as e:
        raise BadRequest(422, str(e).replace("decode.", "")) from None
