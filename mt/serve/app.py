"""An HTTP translation server: a FastAPI app (run by uvicorn from serve.py) over this project's decoder or a
CTranslate2 export.

    POST /translate {"src": ["...", ...], "beam_size"?: int, "nbest"?: int, "prefix"?: ["...", ...],
                     "sampling"?: bool, "topk"?: int, "topp"?: float, "temperature"?: float, "seed"?: int,
                     "constraints"?: [["phrase", ...], ...], "glossary"?: {"source term": "target term", ...},
                     "constraint_order"?: "unordered" | "ordered", "split"?: bool}
         -> {"translations": ["...", ...]}  (nbest > 1: [[{"text": .., "score": ..}, ...], ...]), order kept
    GET  /health -> {"status": "ok", "worker_restarts": n} (503 "down" if the decoding worker is not running)
    GET  /info -> model, languages, test scores, decode settings, limits, counters
    GET  /       -> a page to try the model in a browser (mt/page.html: no external scripts, fonts or styles)

Requests that arrive together are decoded together: a single worker takes the first waiting request, collects the
others that arrive within `batch_wait_ms` (or that arrived while the previous batch was decoding) up to
`batch_tokens` source tokens, decodes them as one length-sorted batch per decode setting, and answers each request
with its own lines. Bad requests get a 4xx with a one-line JSON error ({"error": "..."}) and the server goes on.
What one request may cost is bounded: its body (`max_body_bytes`, refused while it arrives), its source tokens
(`max_request_tokens`, counted before lines are cut to the model), its sentences, beam and output length
(`max_output_tokens`), so that no client holds the one decoding worker for long; and what all of them may queue
(`max_queue_tokens`: beyond it a 503 with Retry-After), how long a request may wait for its answer
(`request_timeout_s`), and a request whose client has gone is dropped before it is decoded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import json
import logging
import math
import socket
import time
from collections import defaultdict
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException

from mt.config import ConfigError, DecodeConfig, ServeConfig
from mt.constraints import Constraints
from mt.inference import decode_ids
from mt.search import Hypothesis
from mt.segment import Document, refuse_with_split
from mt.terminology import Glossary, line_constraints

log = logging.getLogger(__name__)
PAGE = (Path(__file__).parent / "page.html").read_text(encoding="utf-8")


class TranslateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    src: list[str]
    beam_size: int | None = None
    nbest: int | None = None
    prefix: list[str] | None = None  # one per line ("" = none): each translation starts with its prefix
    tgt_lang: str | None = None  # a multilingual model's target language
    sampling: bool | None = None  # and its settings (mt.config.DecodeConfig); a request's samples depend on its own
    topk: int | None = None  #     lines and seed only, not on the requests decoded with it
    topp: float | None = None
    temperature: float | None = None
    seed: int | None = None
    constraints: list[list[str]] | None = None  # per line: target phrases its translation must contain
    glossary: dict[str, str] | None = None  # source term -> target term, on top of the server's glossary=FILE
    constraint_order: str | None = None  # unordered (default) | ordered
    split: bool = False  # each line a paragraph: translated sentence by sentence, joined back (mt/segment.py)


class BadRequest(Exception):
    def __init__(self, status: int, message: str, headers: dict | None = None):
        self.status, self.message, self.headers = status, message, headers


class BodyLimit:
    """ASGI middleware: a request body over `limit` bytes gets a 413 (by its Content-Length at once, else as soon
    as the bytes received pass the limit, for a chunked body), before anything parses it. The app then sees the
    client as gone, and what it would answer is dropped."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            return await self.refuse(send)
        seen, refused = 0, False

        async def counted():
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:  # answered here: an exception would reach FastAPI's body parser, which says 400
                refused = True
                await self.refuse(send)
                return {"type": "http.disconnect"}
            return message

        async def unless_refused(message):
            if not refused:
                await send(message)

        await self.app(scope, counted, unless_refused)

    async def refuse(self, send) -> None:
        body = json.dumps({"error": f"request body over max_body_bytes={self.limit}; split the request"}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


@dataclass
class Job:
    src_ids: list[list[int]]
    prefixes: list[list[int]] | None
    decode: DecodeConfig
    constraints: list[Constraints] | None
    done: asyncio.Future  # cancelled when its client is gone or its time is up: then it is not decoded
    tokens: int = field(init=False)

    def __post_init__(self):
        self.tokens = sum(len(s) + 1 for s in self.src_ids)


class Batcher:
    """One worker that decodes the waiting requests' sentences together (see the module docstring), supervised:
    an exception that escapes it fails the requests it held (503) and starts it again."""

    def __init__(self, decode, wait_s: float, batch_tokens: int, max_queue_tokens: int, timeout_s: float):
        self.decode, self.wait_s, self.batch_tokens = decode, wait_s, batch_tokens
        self.max_queue_tokens, self.timeout_s = max_queue_tokens, timeout_s
        self.queue: asyncio.Queue[Job] = asyncio.Queue()
        self.queued_tokens = 0  # source tokens of the jobs waiting in the queue
        self.taken: list[Job] = []  # the jobs the worker holds now
        self.tokens_per_s = 0.0  # decoding speed, for Retry-After
        self.worker: asyncio.Task | None = None
        # counted for /info and /health (and the tests)
        self.batches = self.requests = self.dropped = self.refused = self.restarts = 0

    async def translate(
        self,
        src_ids: list[list[int]],
        prefixes: list[list[int]] | None,
        decode: DecodeConfig,
        gone=None,
        constraints: list[Constraints] | None = None,
    ) -> list[list[Hypothesis]]:
        """The request's hypotheses; a 503 (with Retry-After) when the queue holds `max_queue_tokens` already or the
        answer takes over `timeout_s`. `gone`: an async callable telling whether the client has disconnected, in
        which case its job is dropped before it is decoded."""
        job = Job(src_ids, prefixes, decode, constraints, asyncio.get_running_loop().create_future())
        if self.queued_tokens and self.queued_tokens + job.tokens > self.max_queue_tokens:
            self.refused += 1
            wait = math.ceil(self.queued_tokens / self.tokens_per_s) if self.tokens_per_s else 1
            raise BadRequest(503, f"busy: {self.queued_tokens} source tokens are queued (max_queue_tokens="
                                  f"{self.max_queue_tokens}); retry in {max(wait, 1)} s",
                             {"Retry-After": str(max(wait, 1))})  # fmt: skip
        self.queued_tokens += job.tokens
        await self.queue.put(job)
        deadline = time.monotonic() + self.timeout_s
        try:
            while not job.done.done():
                await asyncio.wait([job.done], timeout=min(0.1, max(0.0, deadline - time.monotonic())))
                if job.done.done():
                    break
                if time.monotonic() >= deadline:
                    raise BadRequest(503, f"not answered within request_timeout_s={self.timeout_s:g}; retry, or "
                                          "send fewer or shorter lines", {"Retry-After": "1"})  # fmt: skip
                if gone is not None and await gone():
                    raise BadRequest(499, "the client closed the request")
            return job.done.result()
        finally:
            job.done.cancel()  # a no-op once answered; otherwise the worker skips the job

    def _take(self, job: Job) -> bool:
        """Count `job` out of the queue; True if it is still wanted."""
        self.queued_tokens -= job.tokens
        if job.done.done():
            self.dropped += 1
            return False
        self.taken.append(job)
        return True

    async def _collect(self) -> list[Job]:
        self.taken = []
        while not self._take(await self.queue.get()):
            pass
        tokens, deadline = self.taken[0].tokens, time.monotonic() + self.wait_s
        while tokens < self.batch_tokens:
            try:
                if self.queue.empty():
                    job = await asyncio.wait_for(self.queue.get(), max(0.0, deadline - time.monotonic()))
                else:  # arrived while the last batch was decoding: take it now
                    job = self.queue.get_nowait()
            except asyncio.TimeoutError:  # noqa: UP041 (Python 3.10's wait_for raises this, not TimeoutError)
                break
            if self._take(job):
                tokens += job.tokens
        return self.taken

    async def run(self) -> None:
        while True:
            jobs = await self._collect()
            groups: dict[tuple, list[Job]] = defaultdict(list)  # one decode per setting
            for job in jobs:
                groups[dataclasses.astuple(job.decode)].append(job)
            for group in groups.values():
                group = [job for job in group if not job.done.done()]  # clients gone while the batch formed
                if not group:
                    continue
                src_ids = [s for job in group for s in job.src_ids]
                prefixes = [p for job in group for p in (job.prefixes or [[]] * len(job.src_ids))]
                numbers = [i for job in group for i in range(len(job.src_ids))]  # each request's own line numbers
                rules = [c for job in group for c in (job.constraints or [Constraints([])] * len(job.src_ids))]
                start = time.perf_counter()
                try:
                    hyps = await asyncio.to_thread(self.decode, src_ids, group[0].decode, prefixes, numbers, rules)
                except Exception as e:  # a decoding failure answers its requests, the server goes on
                    log.exception("decoding failed")
                    for job in group:
                        if not job.done.done():
                            job.done.set_exception(e)
                    continue
                tokens = sum(job.tokens for job in group)
                self.tokens_per_s = tokens / max(time.perf_counter() - start, 1e-6)
                self.batches, self.requests = self.batches + 1, self.requests + len(group)
                start = 0
                for job in group:
                    if not job.done.done():  # (its client may have left during the decode)
                        job.done.set_result(hyps[start : start + len(job.src_ids)])
                    start += len(job.src_ids)

    async def supervise(self) -> None:
        """`run`, started again whenever an exception escapes it; the requests it held get a 503."""
        while True:
            try:
                await self.run()
            except Exception:
                self.restarts += 1
                log.exception("the decoding worker failed; restarting it (restart %d)", self.restarts)
                for job in self.taken:
                    if not job.done.done():
                        job.done.set_exception(BadRequest(503, "the decoding worker failed; retry the request"))

    def start(self) -> None:
        self.worker = asyncio.get_running_loop().create_task(self.supervise())

    @property
    def alive(self) -> bool:
        return self.worker is not None and not self.worker.done()


def create_app(translator, cfg: ServeConfig, info: dict) -> FastAPI:
    """The app over a loaded mt.translator.Translator (this project's model, an ensemble or a CTranslate2 export)."""
    model, vocabs = translator.model, translator.vocabs

    def decode(src_ids, settings, prefixes, numbers, constraints):
        prefixes = prefixes if any(prefixes) else None
        constraints = constraints if any(constraints) else None
        return decode_ids(model, src_ids, settings, translator.device, translator.amp, prefixes, numbers, constraints)

    batcher = Batcher(decode, cfg.batch_wait_ms / 1000, cfg.batch_tokens, cfg.max_queue_tokens,
                      cfg.request_timeout_s)  # fmt: skip

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        batcher.start()
        yield
        batcher.worker.cancel()

    app = FastAPI(title="mt translation server", lifespan=lifespan)
    app.state.batcher, app.state.translator = batcher, translator
    app.add_middleware(BodyLimit, limit=cfg.max_body_bytes)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        # FastAPI's own: an unknown path, a wrong method, a body it cannot parse (not UTF-8, nested too deep)
        detail = e.detail if isinstance(e.detail, str) else "invalid request"
        return JSONResponse({"error": detail}, status_code=e.status_code)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0]
        if first.get("type") == "json_invalid":
            return JSONResponse({"error": f"malformed JSON: {first.get('msg', '')}"}, status_code=400)
        where = ".".join(str(p) for p in first.get("loc", ())[1:]) or "body"
        return JSONResponse({"error": f"{where}: {first.get('msg', 'invalid')}"}, status_code=422)

    @app.exception_handler(BadRequest)
    async def bad(request: Request, e: BadRequest) -> JSONResponse:
        return JSONResponse({"error": e.message}, status_code=e.status, headers=e.headers)

    @app.get("/health")
    async def health() -> JSONResponse:
        if not batcher.alive:
            return JSONResponse({"status": "down", "worker_restarts": batcher.restarts}, status_code=503)
        return JSONResponse({"status": "ok", "worker_restarts": batcher.restarts})

    @app.get("/", response_class=HTMLResponse)
    async def page() -> str:
        return PAGE

    @app.get("/info")
    async def about() -> dict:
        limits = {k: getattr(cfg, k) for k in ("max_sentences", "max_request_tokens", "max_beam", "max_body_bytes",
                                               "max_output_tokens", "max_queue_tokens",
                                               "request_timeout_s")}  # fmt: skip
        served = {k: getattr(batcher, k) for k in ("batches", "requests", "dropped", "refused", "restarts",
                                                   "queued_tokens")}  # fmt: skip
        return {**info, "decode": dataclasses.asdict(cfg.decode), "limits": limits, "served": served}

    @app.post("/translate")
    async def translate(req: TranslateRequest, request: Request) -> dict:
        decode = _request_decode(req, cfg, translator)
        doc = _request_split(req, translator, decode)
        lines = doc.sentences if doc is not None else req.src
        src_ids, prefixes, warnings = _request_sources(req, lines, cfg, translator, decode)
        rules = _request_constraints(req, lines, translator, decode)
        hyps = await batcher.translate(src_ids, prefixes, decode, gone=request.is_disconnected, constraints=rules)
        for i, (rule, hs) in enumerate(zip(rules or [], hyps)):
            if rule and rule.count_met(hs[0].tokens) < len(rule.phrases):
                warnings.append(f"src[{i}]: {len(rule.phrases) - rule.count_met(hs[0].tokens)} of "
                                f"{len(rule.phrases)} constraints not met within the length limit; translated "
                                "without them")  # fmt: skip
        if doc is not None:
            out: dict = {"translations": doc.join(vocabs.tgt.decode_batch([h[0].tokens for h in hyps]))}
        elif decode.nbest == 1:
            out = {"translations": vocabs.tgt.decode_batch([h[0].tokens for h in hyps])}
        else:
            out = {"translations": [[{"text": vocabs.tgt.decode(h.tokens), "score": h.score} for h in hs]
                                    for hs in hyps]}  # fmt: skip
        return out | ({"warnings": warnings} if warnings else {})

    return app


def _request_split(req: TranslateRequest, translator, decode: DecodeConfig) -> Document | None:
    """With "split": the request's lines as sentences (what a split line cannot have is a 422)."""
    if not req.split:
        return None
    try:
        refuse_with_split(decode, req.prefix, req.constraints)
        return translator.split(req.src, req.tgt_lang)
    except ConfigError as e:
        raise BadRequest(422, str(e)) from None


def _request_sources(req: TranslateRequest, lines: list[str], cfg: ServeConfig, translator, decode: DecodeConfig):
    """(source ids, prefix ids, warnings) of a request's `lines`: its tokens counted before lines are cut to the
    model (a 100,000-character line counts in full), a multilingual model's target-language token first."""
    try:
        target = translator.target_id(req.tgt_lang)
    except ConfigError as e:
        raise BadRequest(422, str(e)) from None
    src_ids = translator.vocabs.src.encode_batch(lines)
    n_tokens = sum(len(s) + 1 for s in src_ids)
    if n_tokens > cfg.max_request_tokens:
        raise BadRequest(413, f"src: {n_tokens} tokens, more than max_request_tokens={cfg.max_request_tokens}; "
                              "split the request")  # fmt: skip
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


def _request_constraints(req: TranslateRequest, lines: list[str], translator, decode: DecodeConfig):
    """Each line's constraints: the request's phrases and the glossary terms (the server's, with the request's on
    top) found in it."""
    glossary = translator.glossary
    try:
        if req.glossary:
            own = Glossary.from_pairs([(s, t, f"glossary[{s!r}]") for s, t in req.glossary.items()])
            glossary = glossary.merged(own) if glossary is not None else own
        return line_constraints(translator.vocabs.tgt, lines, req.constraints, glossary, decode, "constraints")
    except ConfigError as e:
        raise BadRequest(422, str(e)) from None


def _request_decode(req: TranslateRequest, cfg: ServeConfig, translator) -> DecodeConfig:
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


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port), or a one-line ConfigError: an unknown host, a port in use. Bound before the
    server announces itself, so that a taken port fails at once instead of after "serving on ..."."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise ConfigError(f"host={host}: unknown host ({e.strerror}); give an address of this machine, e.g. "
                          "127.0.0.1 or 0.0.0.0") from None  # fmt: skip
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ConfigError(f"port={port}: already in use on {host}; stop what listens there or give another "
                              "port=") from None  # fmt: skip
        raise ConfigError(f"host={host} port={port}: cannot listen there ({e.strerror})") from None
    sock.listen(2048)
    return sock


def test_scores(ckpt: dict) -> list[dict]:
    """The scores of the served weights' test reports (mt.model_card.test_reports): [{split, bleu, bleu_lowercase,
    chrf}]."""
    from mt.model_card import test_reports

    return [{"split": r["name"], **{k: r[k] for k in ("bleu", "bleu_lowercase", "chrf") if k in r}}
            for r in test_reports(ckpt)]  # fmt: skip
