"""An HTTP translation server: a FastAPI app (run by uvicorn from serve.py) over this project's decoder or a
CTranslate2 export, one model or several.

    POST /translate {"src": ["...", ...], "model"?: name, "tgt_lang"?: lang, "beam_size"?: int, "nbest"?: int,
                     "prefix"?: ["...", ...], "sampling"?: bool, "topk"?: int, "topp"?: float,
                     "temperature"?: float, "seed"?: int, "constraints"?: [["phrase", ...], ...],
                     "glossary"?: {"source term": "target term", ...},
                     "constraint_order"?: "unordered" | "ordered", "split"?: bool}
         -> {"translations": ["...", ...]}  (nbest > 1: [[{"text": .., "score": ..}, ...], ...]), order kept
    GET  /health -> {"status": "ok", "worker_restarts": n} (503 "down" if a decoding worker is not running)
    GET  /info -> the (first) model, languages, test scores, decode settings, limits, counters; "models": all
    GET  /metrics -> Prometheus text format (mt/serve/metrics.py)
    GET  /       -> a page to try the model in a browser (page.html: no external scripts, fonts or styles)

With `api_keys=FILE`, /translate and /info need a key (`Authorization: Bearer KEY` or `X-API-Key`), else 401;
`requests_per_minute` and `tokens_per_minute` bound each key (or client address) with a 429 and Retry-After
(mt/serve/access.py). Each model has one decoding worker that batches the requests arriving together
(mt/serve/batching.py). Bad requests get a 4xx with a one-line JSON error ({"error": "..."}) and the server goes
on. What one request may cost is bounded: its body (`max_body_bytes`, refused while it arrives), its source tokens
(`max_request_tokens`, counted before lines are cut to the model), its sentences, beam and output length
(`max_output_tokens`); and what all of them may queue (`max_queue_tokens`), how long a request may wait
(`request_timeout_s`). SIGTERM stops accepting connections, answers the requests held, and exits 0.
"""

from mt.serve.app import create_app
from mt.serve.http import Server, listening_socket
from mt.serve.models import Served, load

__all__ = ["Server", "Served", "create_app", "listening_socket", "load"]
