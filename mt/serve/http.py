"""The HTTP edges of the server: ASGI middleware (body size limit, keys and request rates, metrics and the access
log), the listening socket, and a uvicorn server whose SIGTERM is a graceful stop that exits 0."""

from __future__ import annotations

import errno
import json
import logging
import signal
import socket
import time
import unicodedata

import uvicorn

from mt.config import ConfigError
from mt.serve.access import Gate
from mt.serve.batching import BadRequest
from mt.serve.metrics import Metrics

log = logging.getLogger(__name__)
access_log = logging.getLogger("mt.access")


async def send_error(send, status: int, message: str, headers: dict | None = None) -> None:
    """A one-line JSON error as a complete ASGI response."""
    body = json.dumps({"error": message}).encode()
    extra = [(k.lower().encode(), str(v).encode()) for k, v in (headers or {}).items()]
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


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
        await send_error(send, 413, f"request body over max_body_bytes={self.limit}; split the request")


class Guarded:
    """ASGI middleware in front of the routes that need a key (`Gate.guards`): a request without a valid key gets
    a 401, one over its caller's request rate a 429 with Retry-After, before its body is read; the caller's name
    goes on to the route (`request.state.caller`) and to the access log."""

    def __init__(self, app, gate: Gate):
        self.app, self.gate = app, gate

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self.gate.guards(scope["path"]):
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        state = scope.setdefault("state", {})
        try:
            state["who"] = self.gate.identify(headers, (scope.get("client") or ("?",))[0])  # a name or an address
            state["caller"] = state["who"] if self.gate.keys is not None else None
            self.gate.count_request(state["who"])
        except BadRequest as e:
            return await send_error(send, e.status, e.message, e.headers)
        await self.app(scope, receive, send)


def printable(value) -> str:
    """`value` as text safe for a log line: control and format characters (a newline that would start a forged
    line, the ESC of a terminal escape sequence, line and paragraph separators) as \\xNN or \\uNNNN escapes, and
    the backslash itself escaped, so that every logged field is one line and can be told from its escapes; and,
    as nginx does, the double quote and the space (a percent-decoded path with them could close the quoted
    request and write its own status and counters into the line)."""
    out = []
    for c in str(value):
        if c == "\\":
            out.append("\\\\")
        elif c in ('"', " "):
            out.append(f"\\x{ord(c):02x}")
        elif unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
            out.append(f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return "".join(out)


class Observed:
    """ASGI middleware around everything: each request's status and latency into the metrics (by route; an
    unknown path is "other", so that scanners make no new series), and one access-log line (UTC time, caller name
    (never the key), client, method, path, status, sentences, source tokens, milliseconds), each field `printable`
    (uvicorn hands the path over percent-decoded: "/%0A..." would otherwise write a line of the caller's making)."""

    def __init__(self, app, metrics: Metrics, log_requests: bool, paths: tuple[str, ...]):
        """`paths`: the app's routes (a request refused before routing, a 401, still counts under its route)."""
        self.app, self.metrics, self.log_requests, self.paths = app, metrics, log_requests, set(paths)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.perf_counter(), 500

        async def sent(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sent)
        finally:
            seconds = time.perf_counter() - start
            self.metrics.request(scope["path"] if scope["path"] in self.paths else "other", status, seconds)
            if self.log_requests:
                state, now = scope.get("state") or {}, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                fields = (
                    state.get("caller") or "-",
                    (scope.get("client") or ("-",))[0],
                    scope["method"],
                    scope["path"],
                )
                access_log.info('%s %s %s "%s %s" %d sentences=%s tokens=%s %.0fms', now, *map(printable, fields),
                                status, state.get("sentences", "-"), state.get("tokens", "-"),
                                seconds * 1000)  # fmt: skip


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


class Server(uvicorn.Server):
    """uvicorn's server, but a SIGTERM is a graceful stop that exits 0: it stops accepting connections, answers the
    requests it holds (those queued too), then exits (uvicorn itself raises the signal again at the end, so the
    process would die with status 143). SIGINT keeps uvicorn's behaviour (a second one forces the exit)."""

    def handle_exit(self, sig: int, frame) -> None:
        if sig == signal.SIGTERM:
            log.info("SIGTERM: no new connections; answering the requests held, then exiting")
            self.should_exit = True
            return
        super().handle_exit(sig, frame)
