"""`GET /metrics`: the server's counters in the Prometheus text format (prometheus-client), one registry per app
(so that two apps in one process, as in the tests, keep their own counts)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("mt_requests", "HTTP requests by route and status", ["route", "status"], registry=r)
        self.latency = Histogram("mt_request_seconds", "Time to answer a request", ["route"], buckets=LATENCY,
                                 registry=r)  # fmt: skip
        self.sentences = Counter("mt_sentences", "Sentences translated", ["model"], registry=r)
        self.source_tokens = Counter("mt_source_tokens", "Source tokens translated", ["model"], registry=r)
        self.target_tokens = Counter("mt_target_tokens", "Target tokens produced", ["model"], registry=r)
        self.batch = Histogram("mt_batch_sentences", "Sentences per decoded batch", ["model"], buckets=SIZES,
                               registry=r)  # fmt: skip
        self.decode = Histogram("mt_decode_seconds", "Time to decode one batch", ["model"], buckets=LATENCY,
                                registry=r)  # fmt: skip
        self.queue = Gauge("mt_queue_tokens", "Source tokens waiting to be decoded", ["model"], registry=r)
        self.refused = Counter("mt_refused", "Requests refused by keys and rate limits", ["reason"], registry=r)
        self.model = Info("mt_model", "A served model", ["model"], registry=r)

    def request(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def served(self, model: str, sentences: int, source_tokens: int, target_tokens: int) -> None:
        self.sentences.labels(model).inc(sentences)
        self.source_tokens.labels(model).inc(source_tokens)
        self.target_tokens.labels(model).inc(target_tokens)

    def batch_observer(self, model: str):
        """What a model's Batcher calls after each batch: (sentences, seconds)."""
        batch, decode = self.batch.labels(model), self.decode.labels(model)

        def observe(sentences: int, seconds: float) -> None:
            batch.observe(sentences)
            decode.observe(seconds)

        return observe

    def add_model(self, name: str, info: dict, queued) -> None:
        """A model's load info and its queue depth (`queued()`: source tokens waiting). /metrics needs no key, so it
        names no file: the checkpoint's path is in /info, behind the keys."""
        fields = {"engine": "engine", "src_lang": "src_lang", "tgt_lang": "tgt_lang"}
        self.model.labels(name).info({k: str(info.get(v) or "") for k, v in fields.items()})
        self.queue.labels(name).set_function(queued)

    def refuse(self, reason: str) -> None:
        self.refused.labels(reason).inc()

    def text(self) -> bytes:
        return generate_latest(self.registry)
