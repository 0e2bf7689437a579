"""A translation request: its JSON body, and what the server makes of it (decode settings within the limits,
sources, prefixes, constraints, sentences), each problem a one-line 4xx."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

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


def count_sources(vocab, lines: list[str], cap: int) -> list[list[int]]:
    """The source ids of `lines`, counted (a line's tokens and its </s>) against `cap`, the request's token limit:
    a 413 as soon as the count passes it, with the least work that can tell. First two bounds that encode nothing:
    every whitespace-separated word is at least one token, and a token covers at most `span` characters (the
    longest in the vocabulary, with room for normalization), so a body far over the cap is refused in
    microseconds; then the lines are encoded a few at a time (Moses is pure Python: ~8 s for a 960 KB line) and
    counting stops at the cap. The refused work goes with the error (`BadRequest.cost`: the caller is charged it)."""
    words = sum(len(line.split()) for line in lines) + len(lines)
    letters = sum(len(line) for line in lines) - sum(line.count(" ") for line in lines)
    if words > cap or letters > cap * token_span(vocab):
        raise too_many(max(words, letters // token_span(vocab)), cap, lower_bound=True)
    ids, count = [], 0
    for at in range(0, len(lines), 16):
        chunk = vocab.encode_batch(lines[at : at + 16])
        count += sum(len(i) + 1 for i in chunk)
        if count > cap:
            raise too_many(count, cap, lower_bound=at + 16 < len(lines))
        ids += chunk
    return ids


def too_many(tokens: int, cap: int, lower_bound: bool) -> BadRequest:
    at_least = "at least " if lower_bound else ""
    e = BadRequest(413, f"src: {at_least}{tokens} tokens, more than max_request_tokens={cap}; split the request")
    e.cost = tokens
    return e


@cache
def token_span(vocab) -> int:
    """The most characters of a request's text one token of `vocab` can stand for: its longest token (without the
    word-start mark), times 3 for what NFC composition can fold into one character."""
    return 3 * max(len(token.lstrip("\u2581")) for token in vocab.get_vocab())


class Memo:
    """An encoder that encodes each text once (a request's sentences are counted when split, then decoded)."""

    def __init__(self, encode, known: dict[str, list[int]]):
        self.encode, self.known = encode, known

    def __call__(self, texts: list[str]) -> list[list[int]]:
        missing = list(dict.fromkeys(t for t in texts if t not in self.known))
        self.known.update(zip(missing, self.encode(missing) if missing else []))
        return [self.known[t] for t in texts]


@dataclass
class Prepared:
    """What a request's text becomes before decoding (`prepare`)."""

    doc: Document | None  # its sentences, when they are not its lines
    lines: list[str]  # what is decoded: the sentences, or the lines
    src_ids: list[list[int]]
    prefixes: list[list[int]] | None
    warnings: list[str]
    tokens: int
    lead: int = 0  # target-language tokens forced first (NLLB's), to leave out of the hypotheses


def prepare(req: TranslateRequest, translator, decode: DecodeConfig, cfg: ServeConfig) -> Prepared:
    """A request's text, counted, split and encoded, in the thread it is called in (never the event loop: Moses
    and sentence splitting are Python). First its size (`count_sources`: over `max_request_tokens` a 413, counted
    before anything is split or cut: a 100,000-character line counts in full). Then, with "split": the request's
    lines as sentences (what a split line cannot have is a 422). Without it, where a line is over the model's
    positions: the lines as they are, that one in pieces (not cut short), unless the request has what belongs to
    a whole line (n-best, prefixes, constraints; then it is truncated with a warning). The sentences (or pieces)
    to decode are held to `max_sentences`: a 413 beyond it. The lines are encoded once when they are decoded as
    they are."""
    ids = count_sources(translator.vocabs.src, req.src, cfg.max_request_tokens)
    encode = Memo(translator.vocabs.src.encode_batch, dict(zip(req.src, ids)))  # each text encoded once
    try:
        target = translator.target_id(req.tgt_lang)
        framing = translator.framing(req.tgt_lang)  # an imported model's language tokens
        doc = None
        if req.split:
            refuse_with_split(decode, req.prefix, req.constraints)
            doc = translator.split(req.src, req.tgt_lang, encode=encode)
        elif in_pieces(decode, req.prefix, req.constraints) and any(len(i) > translator.limit - (target is not None)
                                                                    for i in ids):  # fmt: skip
            doc = translator.split(req.src, req.tgt_lang, whole_lines=True, encode=encode)
    except ConfigError as e:
        raise BadRequest(422, str(e)) from None
    if doc is not None and len(doc.sentences) > cfg.max_sentences:  # the limit holds for what is decoded
        raise BadRequest(413, f"src: {len(doc.sentences)} sentences once split, more than max_sentences="
                              f"{cfg.max_sentences}; send fewer")  # fmt: skip
    lines = doc.sentences if doc is not None else req.src
    src_ids = [list(i) for i in encode(lines)]
    warnings, room = [], translator.limit - (target is not None)  # (</s> takes the last position)
    for i, line_ids in enumerate(src_ids):
        if len(line_ids) > room:
            warnings.append(f"src[{i}]: {len(line_ids)} tokens, truncated to the model's {room}")
            src_ids[i] = line_ids[:room]
    if target is not None:
        src_ids = [[target, *line_ids] if line_ids else line_ids for line_ids in src_ids]
    src_lead, tgt_lead = list(framing.src_lead), list(framing.tgt_lead)
    if src_lead:  # in each line, so that lines of requests into other languages share a batch
        src_ids = [src_lead + line_ids if line_ids else line_ids for line_ids in src_ids]
    try:
        prefixes = translator.encode_prefixes(req.prefix, src_ids, decode)
    except ConfigError as e:
        raise BadRequest(422, str(e)) from None
    if tgt_lead:
        prefixes = [tgt_lead + (prefixes[i] if prefixes else []) for i in range(len(src_ids))]
    return Prepared(doc, lines, src_ids, prefixes, warnings, sum(len(s) + 1 for s in src_ids), len(tgt_lead))


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


def request_constraints(req: TranslateRequest, lines: list[str], translator, decode: DecodeConfig,
                        ignore_case: bool = False):  # fmt: skip
    """Each line's constraints: the request's phrases and the glossary terms (the server's, with the request's on
    top, each matched on its own: the server's pattern is never compiled again) found in it. Linear in the
    terms; run off the event loop (the request's own pattern is compiled here). `ignore_case`: the server's
    `glossary_ignore_case`, for the request's terms too."""
    glossary = translator.glossary
    try:
        if req.glossary:
            own = Glossary.from_pairs([(s, t, f"glossary[{s!r}]") for s, t in req.glossary.items()], ignore_case)
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
