"""The FastAPI app: its routes over the served models (mt/serve/models.py), each with its decoding worker
(mt/serve/batching.py), behind the keys and limits (mt/serve/access.py), the metrics and the access log
(mt/serve/http.py). The API is described in mt/serve/__init__.py."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import signal
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from mt.config import ServeConfig
from mt.decode.batched import decode_ids
from mt.decode.confidence import records
from mt.decode.search import Hypothesis
from mt.serve.access import ApiKeys, Gate
from mt.serve.batching import BadRequest, Batcher
from mt.serve.http import BodyLimit, Guarded, Observed
from mt.serve.metrics import Metrics
from mt.serve.models import Served, pick
from mt.serve.requests import TranslateRequest, prepare, request_constraints, request_decode, request_terms

log = logging.getLogger(__name__)
PAGE = (Path(__file__).parent / "page.html").read_text(encoding="utf-8")
LIMITS = ("max_sentences", "max_request_tokens", "max_beam", "max_body_bytes", "max_output_tokens", "max_queue_tokens",
          "request_timeout_s", "requests_per_minute", "tokens_per_minute")  # fmt: skip
ROUTES = ("/translate", "/info", "/health", "/metrics", "/")
COUNTS = ("batches", "requests", "dropped", "refused", "restarts", "queued_tokens")


def create_app(models, cfg: ServeConfig, info: dict | None = None, keys: ApiKeys | None = None) -> FastAPI:
    """The app over loaded models: a list of `Served`, or one mt.decode.translator.Translator (this project's model, an
    ensemble or a CTranslate2 export) with its `info`. `keys`: the API keys (None: the server has none)."""
    if not isinstance(models, list):
        models = [Served("default", models, info or {})]
    metrics = Metrics()
    gate = Gate(keys, cfg.requests_per_minute, cfg.tokens_per_minute, on_refuse=metrics.refuse)
    for served in models:
        served.batcher = Batcher(_decoder(served.translator, cfg.batch_rows), cfg.batch_wait_ms / 1000,
                                 cfg.batch_tokens, cfg.max_queue_tokens, cfg.request_timeout_s,
                                 observe=metrics.batch_observer(served.name))  # fmt: skip
        metrics.add_model(served.name, served.info, lambda b=served.batcher: b.queued_tokens)
        if served.translator.glossary is not None:  # a request's own glossary is matched beside the server's
            served.translator.glossary.compile()  # (mt.decode.terminology.Stacked): compiled once, here

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        for served in models:
            served.batcher.start()
        if keys is not None:
            try:
                asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, keys.reload)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread (tests), or no SIGHUP
                pass
        yield
        try:  # uvicorn waits for the requests in flight before this; the queues are empty by then
            await asyncio.wait_for(asyncio.gather(*(m.batcher.drained() for m in models)), cfg.request_timeout_s)
        except asyncio.TimeoutError:  # noqa: UP041 (3.10's wait_for raises this)
            log.error("stopping with requests still queued after request_timeout_s=%g", cfg.request_timeout_s)
        for served in models:
            served.batcher.worker.cancel()

    app = FastAPI(title="mt translation server", lifespan=lifespan)
    app.state.models, app.state.gate, app.state.metrics = models, gate, metrics
    app.state.batcher, app.state.translator = models[0].batcher, models[0].translator  # the first (the tests)
    app.add_middleware(BodyLimit, limit=cfg.max_body_bytes)
    app.add_middleware(Guarded, gate=gate)  # added last: runs first, before the body is read
    app.add_middleware(Observed, metrics=metrics, log_requests=cfg.access_log, paths=ROUTES)

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
        restarts = sum(m.batcher.restarts for m in models)
        if not all(m.batcher.alive for m in models):
            return JSONResponse({"status": "down", "worker_restarts": restarts}, status_code=503)
        return JSONResponse({"status": "ok", "worker_restarts": restarts})

    @app.get("/metrics")
    async def scrape() -> Response:
        return Response(metrics.text(), media_type=metrics.content_type)

    @app.get("/", response_class=HTMLResponse)
    async def page() -> str:
        return PAGE

    @app.get("/info")
    async def about() -> dict:
        limits = {k: getattr(cfg, k) for k in LIMITS}
        listed = [{"name": m.name, **m.info, "served": {k: getattr(m.batcher, k) for k in COUNTS}} for m in models]
        first = {k: v for k, v in listed[0].items() if k != "name"}
        keyed = {"api_keys": keys is not None}
        decode = dataclasses.asdict((models[0].cfg or cfg).decode)
        return {**first, "decode": decode, "limits": limits, **keyed, "models": listed}

    @app.post("/translate")
    async def translate(req: TranslateRequest, request: Request) -> dict:
        served = pick(models, req.model, req.tgt_lang)
        translator, own = served.translator, served.cfg or cfg
        decode = request_decode(req, own, translator)
        request_terms(req, own, translator, decode)
        # Off the event loop from here (sentence splitting, glossary matching): a large request must not hold up
        # the others, nor /health.
        try:
            p = await asyncio.to_thread(prepare, req, translator, decode, own)
        except BadRequest as e:  # a request refused for its size pays for the counting it caused
            gate.charge(request.state.who, e.cost)
            raise
        doc, lines, src_ids, prefixes, warnings, tokens = p.doc, p.lines, p.src_ids, p.prefixes, p.warnings, p.tokens
        request.state.sentences, request.state.tokens = len(src_ids), tokens  # (the access log)
        gate.count_tokens(request.state.who, tokens)
        rules = await asyncio.to_thread(request_constraints, req, lines, translator, decode, own.glossary_ignore_case)
        for i, pieces in doc.cut() if doc is not None else ():
            warnings.append(f"src[{i}]: a sentence over the model's {translator.limit} tokens, translated in {pieces} "
                            "pieces cut at clause boundaries (else between words)")  # fmt: skip
        hyps = await served.batcher.translate(src_ids, prefixes, decode, gone=request.is_disconnected,
                                              constraints=rules)  # fmt: skip
        if p.lead:  # the target-language token forced first
            hyps = [[Hypothesis(h.tokens[p.lead :], h.score, h.logprob) for h in hs] for hs in hyps]
        metrics.served(served.name, len(src_ids), tokens, sum(len(h[0].tokens) + 1 for h in hyps))
        for i, (rule, hs) in enumerate(zip(rules or [], hyps)):
            if rule and rule.count_met(hs[0].tokens) < len(rule.phrases):
                where = f"src[{doc.line_of(i)}] (a sentence of it)" if doc is not None else f"src[{i}]"
                warnings.append(f"{where}: {len(rule.phrases) - rule.count_met(hs[0].tokens)} of "
                                f"{len(rule.phrases)} constraints not met within the length limit; translated "
                                "without them")  # fmt: skip
        tgt = translator.vocabs.tgt
        if decode.nbest == 1:  # each line's translation, score and flags (mt/decode/confidence.py)
            texts = tgt.decode_batch([h[0].tokens for h in hyps])
            line_of = [doc.line_of(k) for k in range(len(texts))] if doc is not None else None
            texts = doc.join(texts) if doc is not None else texts
            found = await asyncio.to_thread(records, translator, req.src, src_ids, [h[0] for h in hyps], texts, decode,
                                            req.tgt_lang, None, line_of)  # fmt: skip
            out: dict = {"translations": texts, "scores": [r["score"] for r in found],
                         "flags": [r["flags"] for r in found]}  # fmt: skip
        else:
            out = {"translations": [[{"text": tgt.decode(h.tokens), "score": h.score} for h in hs] for hs in hyps]}
        out |= {"model": served.name} if len(models) > 1 else {}
        return out | ({"warnings": warnings} if warnings else {})

    return app


def _decoder(translator, batch_rows: int):
    """The decoding a model's worker calls (in its thread): the lines by length, in decodes of at most `batch_rows`
    decoder rows (a line takes one per beam, or per sample) and of even size (a small last part would cost a whole
    decode's steps for a few lines), each stopped by `stop()` (mt.decode.batched.Stoppable)."""

    def decode(src_ids, settings, prefixes, numbers, constraints, stop):
        most = max(1, batch_rows // max(settings.beam_size, settings.nbest))
        per = math.ceil(len(src_ids) / math.ceil(len(src_ids) / most))  # even parts: no small last decode
        order = sorted(range(len(src_ids)), key=lambda i: len(src_ids[i]))
        out = [None] * len(src_ids)
        for at in range(0, len(order), per):
            idx = order[at : at + per]
            pre = [prefixes[i] for i in idx]
            rules = [constraints[i] for i in idx]
            hyps = decode_ids(translator.model, [src_ids[i] for i in idx], settings, translator.device, translator.amp,
                              pre if any(pre) else None, [numbers[i] for i in idx], rules if any(rules) else None,
                              stop)  # fmt: skip
            for i, h in zip(idx, hyps):
                out[i] = h
        return out

    return decode
