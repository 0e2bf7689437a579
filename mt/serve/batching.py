"""The decoding worker of one served model: requests that arrive together are decoded together. A single worker
takes the first waiting request, collects the others that arrive within `batch_wait_ms` (or that arrived while the
previous batch was decoding) up to `batch_tokens` source tokens, decodes them as one length-sorted batch per decode
setting, and answers each request with its own lines. What all requests may queue is bounded (`max_queue_tokens`:
beyond it a 503 with Retry-After), as is how long one may wait (`request_timeout_s`); a request whose client has
gone is dropped before it is decoded, and a decode all of whose requests have gone (or timed out) stops at its
next step. A request that fails its decode fails alone: the batch is decoded again request by request, and each
request gets its own answer or its own one-line error (a 422 for what its settings cannot do)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import math
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from mt.config import ConfigError, DecodeConfig
from mt.decode.batched import Stopped
from mt.decode.constraints import Constraints
from mt.decode.search import Hypothesis

log = logging.getLogger(__name__)

# The decoding worker's restarts after failures (Batcher.supervise): a failure within RESTART_QUIET_S of the last
# start waits RESTART_FIRST_WAIT_S, then twice as long each time, at most RESTART_MAX_WAIT_S.
RESTART_QUIET_S, RESTART_FIRST_WAIT_S, RESTART_MAX_WAIT_S = 1.0, 0.05, 5.0


class BadRequest(Exception):
    def __init__(self, status: int, message: str, headers: dict | None = None):
        self.status, self.message, self.headers = status, message, headers
        self.cost = 0  # source tokens of work done before the refusal, charged to the caller's tokens_per_minute


@dataclass
class Job:
    src_ids: list[list[int]]
    prefixes: list[list[int]] | None
    decode: DecodeConfig
    constraints: list[Constraints] | None
    done: asyncio.Future  # cancelled when its client is gone or its time is up: then it is not decoded
    tokens: int = field(init=False)
    # set with `done` cancelled: what the decoding thread reads (an asyncio future belongs to the event loop)
    abandoned: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self):
        self.tokens = sum(len(s) + 1 for s in self.src_ids)


def failure(e: Exception) -> BadRequest:
    """What a request whose decode raised `e` is answered: a 422 with the one-line reason for what its settings
    cannot do, else a 500 that names no internals (the traceback goes to the log)."""
    if isinstance(e, BadRequest):
        return e
    if isinstance(e, ConfigError):
        return BadRequest(422, str(e))
    log.error("decoding failed", exc_info=e)
    return BadRequest(500, "decoding failed; the error is in the server's log")


class Batcher:
    """One worker that decodes the waiting requests' sentences together (see the module docstring), supervised:
    an exception that escapes it fails the requests it held (503) and starts it again."""

    def __init__(self, decode, wait_s: float, batch_tokens: int, max_queue_tokens: int, timeout_s: float,
                 observe=None):  # fmt: skip
        """`decode(src_ids, settings, prefixes, numbers, constraints, stop)` runs in a thread (`stop()`: whether no
        one waits for the answer any more); `observe(sentences, seconds)` is told of every batch decoded (the
        metrics)."""
        self.decode, self.wait_s, self.batch_tokens, self.observe = decode, wait_s, batch_tokens, observe
        self.max_queue_tokens, self.timeout_s = max_queue_tokens, timeout_s
        self.queue: asyncio.Queue[Job] = asyncio.Queue()
        self.queued_tokens = 0  # source tokens of the jobs waiting in the queue
        self.taken: list[Job] = []  # the jobs the worker holds now
        self.tokens_per_s = 0.0  # decoding speed, for Retry-After
        self.worker: asyncio.Task | None = None
        # Every decode on one thread of its own: torch's OpenMP keeps a team of threads per calling thread, and
        # decodes hopping between the event loop's shared threads (which also prepare requests) left the idle teams
        # spinning beside the busy one: a quarter of the throughput at 32 clients on 2 cores.
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="decode")
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
            if not job.done.done():  # not answered: the worker skips the job, or stops decoding it
                job.abandoned.set()
            job.done.cancel()

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
                try:
                    hyps = await self._decode(group)
                except Stopped:  # every request of the group went while it decoded
                    self.dropped += len(group)
                    continue
                except Exception as e:  # one request's failure must not fail the others: each decoded alone
                    if len(group) > 1:
                        for job in group:
                            await self._alone(job)
                    elif not group[0].done.done():
                        group[0].done.set_exception(failure(e))
                    continue
                self.batches, self.requests = self.batches + 1, self.requests + len(group)
                start = 0
                for job in group:
                    if not job.done.done():  # (its client may have left during the decode)
                        job.done.set_result(hyps[start : start + len(job.src_ids)])
                    start += len(job.src_ids)

    async def _decode(self, group: list[Job]) -> list[list[Hypothesis]]:
        """The hypotheses of a group's lines, decoded together in a thread; stopped (`Stopped`) at the next step
        once no request of the group is waiting for them."""
        src_ids = [s for job in group for s in job.src_ids]
        prefixes = [p for job in group for p in (job.prefixes or [[]] * len(job.src_ids))]
        numbers = [i for job in group for i in range(len(job.src_ids))]  # each request's own line numbers
        rules = [c for job in group for c in (job.constraints or [Constraints([])] * len(job.src_ids))]
        stop = lambda: all(job.abandoned.is_set() for job in group)  # noqa: E731
        start = time.perf_counter()
        decode = functools.partial(self.decode, src_ids, group[0].decode, prefixes, numbers, rules, stop)
        hyps = await asyncio.get_running_loop().run_in_executor(self.executor, decode)
        tokens, seconds = sum(job.tokens for job in group), time.perf_counter() - start
        self.tokens_per_s = tokens / max(seconds, 1e-6)
        if self.observe is not None:
            self.observe(len(src_ids), seconds)
        return hyps

    async def _alone(self, job: Job) -> None:
        """Decode one request by itself, after its batch failed: its answer, or its own error."""
        if job.done.done():
            return
        try:
            hyps = await self._decode([job])
        except Stopped:
            self.dropped += 1
            return
        except Exception as e:
            if not job.done.done():
                job.done.set_exception(failure(e))
            return
        self.batches, self.requests = self.batches + 1, self.requests + 1
        if not job.done.done():
            job.done.set_result(hyps)

    async def supervise(self) -> None:
        """`run`, started again whenever an exception escapes it; the requests it held get a 503."""
        loop, delay = asyncio.get_running_loop(), 0.0
        while True:
            started = loop.time()
            try:
                await self.run()
            except Exception:
                self.restarts += 1
                log.exception("the decoding worker failed; restarting it (restart %d)", self.restarts)
                for job in self.taken:
                    if not job.done.done():
                        job.done.set_exception(BadRequest(503, "the decoding worker failed; retry the request"))
                # A worker that fails again as soon as it starts (a broken device, a model that cannot decode)
                # would restart in a busy loop that starves the event loop: wait, twice as long each time, up to
                # RESTART_MAX_WAIT_S; a worker that ran for a while restarts at once.
                quick = loop.time() - started < RESTART_QUIET_S
                delay = min(max(2 * delay, RESTART_FIRST_WAIT_S), RESTART_MAX_WAIT_S) if quick else 0.0
                await asyncio.sleep(delay)

    def start(self) -> None:
        self.worker = asyncio.get_running_loop().create_task(self.supervise())

    async def drained(self) -> None:
        """Returns once no request waits or decodes (the graceful stop)."""
        while self.queue.qsize() or any(not job.done.done() for job in self.taken):
            await asyncio.sleep(0.05)

    @property
    def alive(self) -> bool:
        return self.worker is not None and not self.worker.done()
