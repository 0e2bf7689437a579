"""An HTTP translation server: a FastAPI app (run by uvicorn from serve.py) over this project's decoder or a
CTranslate2 export.

    POST /translate {"src": ["...", ...], "beam_size"?: int, "nbest"?: int, "prefix"?: ["...", ...],
                     "sampling"?: bool, "topk"?: int, "topp"?: float, "temperature"?: float, "seed"?: int}
         -> {"translations": ["...", ...]}  (nbest > 1: [[{"text": .., "score": ..}, ...], ...]), order kept
    GET  /health -> {"status": "ok"};  GET /info -> model, languages, test scores, decode settings, limits
    GET  /       -> a page to try the model in a browser (mt/page.html: no external scripts, fonts or styles)

Requests that arrive together are decoded together: a single worker takes the first waiting request, collects the
others that arrive within `batch_wait_ms` (or that arrived while the previous batch was decoding) up to
`batch_tokens` source tokens, decodes them as one length-sorted batch per decode setting, and answers each request
with its own lines. Bad requests get a 4xx with a one-line JSON error ({"error": "..."}) and the server goes on.
What one request may cost is bounded: its body (`max_body_bytes`, refused while it arrives), its source tokens
(`max_request_tokens`, counted before lines are cut to the model), its sentences, beam and output length
(`max_output_tokens`), so that no client holds the one decoding worker for long.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import json
import logging
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
from mt.inference import decode_ids
from mt.search import Hypothesis

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


class BadRequest(Exception):
    def __init__(self, status: int, message: str):
        self.status, self.message = status, message


class BodyLimit:
    """ASGI middleware: a request body over `limit` bytes gets a 413 (by its Content-Length at once, else as soon
    as the bytes received pass the limit), before anything parses it."""

    class TooLarge(Exception):
        pass

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if not declared.isdigit() or int(declared) > self.limit:
            return await self.refuse(send)
        seen, started = 0, False

        async def counted():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise BodyLimit.TooLarge
            return message

        async def tracked(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except BodyLimit.TooLarge:
            if not started:
                await self.refuse(send)

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
    done: asyncio.Future
    tokens: int = field(init=False)

    def __post_init__(self):
        self.tokens = sum(len(s) + 1 for s in self.src_ids)


class Batcher:
    """One worker that decodes the waiting requests' sentences together (see the module docstring)."""

    def __init__(self, decode, wait_s: float, batch_tokens: int):
        self.decode, self.wait_s, self.batch_tokens = decode, wait_s, batch_tokens
        self.queue: asyncio.Queue[Job] = asyncio.Queue()
        self.batches = self.requests = 0  # counted for /info (and the tests)

    async def translate(
        self, src_ids: list[list[int]], prefixes: list[list[int]] | None, decode: DecodeConfig
    ) -> list[list[Hypothesis]]:
        job = Job(src_ids, prefixes, decode, asyncio.get_running_loop().create_future())
        await self.queue.put(job)
        return await job.done

    async def _collect(self) -> list[Job]:
        jobs = [await self.queue.get()]
        tokens, deadline = jobs[0].tokens, time.monotonic() + self.wait_s
        while tokens < self.batch_tokens:
            try:
                if self.queue.empty():
                    job = await asyncio.wait_for(self.queue.get(), max(0.0, deadline - time.monotonic()))
                else:  # arrived while the last batch was decoding: take it now
                    job = self.queue.get_nowait()
            except TimeoutError:
                break
            jobs.append(job)
            tokens += job.tokens
        return jobs

    async def run(self) -> None:
        while True:
            jobs = await self._collect()
            groups: dict[tuple, list[Job]] = defaultdict(list)  # one decode per setting
            for job in jobs:
                groups[dataclasses.astuple(job.decode)].append(job)
            for group in groups.values():
                src_ids = [s for job in group for s in job.src_ids]
                prefixes = [p for job in group for p in (job.prefixes or [[]] * len(job.src_ids))]
                numbers = [i for job in group for i in range(len(job.src_ids))]  # each request's own line numbers
                try:
                    hyps = await asyncio.to_thread(self.decode, src_ids, group[0].decode, prefixes, numbers)
                except Exception as e:  # a decoding failure answers its requests, the server goes on
                    log.exception("decoding failed")
                    for job in group:
                        job.done.set_exception(e)
                    continue
                self.batches, self.requests = self.batches + 1, self.requests + len(group)
                start = 0
                for job in group:
                    job.done.set_result(hyps[start : start + len(job.src_ids)])
                    start += len(job.src_ids)


def create_app(translator, cfg: ServeConfig, info: dict) -> FastAPI:
    """The app over a loaded mt.translator.Translator (this project's model, an ensemble or a CTranslate2 export)."""
    model, vocabs = translator.model, translator.vocabs

    def decode(src_ids, settings, prefixes, numbers):
        prefixes = prefixes if any(prefixes) else None
        return decode_ids(model, src_ids, settings, translator.device, translator.amp, prefixes, numbers)

    batcher = Batcher(decode, cfg.batch_wait_ms / 1000, cfg.batch_tokens)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        worker = asyncio.create_task(batcher.run())
        yield
        worker.cancel()

    app = FastAPI(title="mt translation server", lifespan=lifespan)
    app.state.batcher = batcher
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
        return JSONResponse({"error": e.message}, status_code=e.status)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/", response_class=HTMLResponse)
    async def page() -> str:
        return PAGE

    @app.get("/info")
    async def about() -> dict:
        limits = {k: getattr(cfg, k) for k in ("max_sentences", "max_request_tokens", "max_beam", "max_body_bytes",
                                               "max_output_tokens")}  # fmt: skip
        served = {"batches": batcher.batches, "requests": batcher.requests}
        return {**info, "decode": dataclasses.asdict(cfg.decode), "limits": limits, "served": served}

    @app.post("/translate")
    async def translate(req: TranslateRequest) -> dict:
        decode = _request_decode(req, cfg, translator)
        src_ids, prefixes, warnings = _request_sources(req, cfg, translator, decode)
        hyps = await batcher.translate(src_ids, prefixes, decode)
        if decode.nbest == 1:
            out: dict = {"translations": vocabs.tgt.decode_batch([h[0].tokens for h in hyps])}
        else:
            out = {"translations": [[{"text": vocabs.tgt.decode(h.tokens), "score": h.score} for h in hs]
                                    for hs in hyps]}  # fmt: skip
        return out | ({"warnings": warnings} if warnings else {})

    return app


def _request_sources(req: TranslateRequest, cfg: ServeConfig, translator, decode: DecodeConfig):
    """(source ids, prefix ids, warnings) of a request: its tokens counted before lines are cut to the model (a
    100,000-character line counts in full), a multilingual model's target-language token first."""
    try:
        target = translator.target_id(req.tgt_lang)
    except ConfigError as e:
        raise BadRequest(422, str(e)) from None
    src_ids = translator.vocabs.src.encode_batch(req.src)
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
                                   temperature=req.temperature, seed=req.seed, max_len=cap)  # fmt: skip
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


def test_scores(path: str) -> list[dict]:
    """The test reports a run wrote beside the checkpoint: [{split, bleu, bleu_lowercase, chrf}]."""
    where = Path(path) if Path(path).is_dir() else Path(path).parent
    scores = []
    for report in sorted(where.glob("*.report.json")):
        try:
            r = json.loads(report.read_text())
            scores.append({"split": r["name"], **{k: r[k] for k in ("bleu", "bleu_lowercase", "chrf")}})
        except (OSError, ValueError, KeyError):
            continue
    return scores
