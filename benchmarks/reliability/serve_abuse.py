"""Hostile requests against serve.py on loopback: what each does to the requests beside it.

    python benchmarks/reliability/serve_abuse.py RUN_DIR [--root CHECKOUT] [--moses MOSES_RUN] [--out results.json]

Starts `serve.py` of CHECKOUT (default: this one; give an older checkout to measure before a fix) with API keys, a
server glossary of 4,000 terms, beam 4 and batch_wait_ms=300, and a second one on a CTranslate2 export of the run.
For each hostile request it prints its status and time, and the latency of a /health and of an ordinary request
(one sentence) sent while it is in flight, beside the same two measured with nothing else going on:

  1. a POST whose "glossary" has 20,000 terms (329 KB), and one of 1,000 (max_glossary_terms' default);
  2. on the CTranslate2 export, a request with "constraints" and an ordinary request in the same batch;
  4. a GET whose path forges an access-log line (caller "admin", status 200); the server's log is searched for it;
  6. one line of 900 sentences with "split": true and beam_size 16;
  7. on a server with a 20,000-term glossary, three requests each with a one-term "glossary" of its own, and an
     ordinary request sent beside them;
  8. with `--moses MOSES_RUN` (a run with tokenizer.pretokenize=moses), on a server of that run: a request of one
     960 KB line (over max_request_tokens), and one of 64 lines just over the cap (~5,000 tokens).

Every loop is bounded: each request has a 120 s timeout, each server is stopped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import free_port, start_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
KEY = "abuse-bench-key-0123456789"
LINE = "A man in a blue shirt is standing on a ladder."
FORGED = "/%0A2026-01-01T00:00:00Z%20admin%20127.0.0.1%20%22POST%20/translate%22%20200"


@contextlib.contextmanager
def serving(root: Path, checkpoint: str, extra: list[str], log: Path) -> Iterator[str]:
    """serve.py of `root` on a free port while the block runs: its URL."""
    port = free_port()
    proc = start_server(checkpoint, port, ["device=cpu", *extra], root, log)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def timed(method: str, url: str, body: dict | None = None) -> tuple[int, float]:
    start = time.perf_counter()
    try:
        r = httpx.request(method, url, json=body, headers={"x-api-key": KEY}, timeout=120)
        status = r.status_code
    except httpx.HTTPError:
        status = 0
    return status, time.perf_counter() - start


def quiet(url: str) -> dict:
    """The two latencies with nothing else going on (medians of 5)."""
    health = statistics.median(timed("GET", url + "/health")[1] for _ in range(5))
    ordinary = statistics.median(timed("POST", url + "/translate", {"src": [LINE]})[1] for _ in range(5))
    return {"health_ms": 1000 * health, "ordinary_ms": 1000 * ordinary}


def beside(url: str, method: str, path: str, body: dict | None, wait: float = 0.2) -> dict:
    """The hostile request, and 0.2 s after it a /health and then an ordinary request."""
    hostile: dict = {}
    thread = threading.Thread(target=lambda: hostile.update(zip(("status", "s"), timed(method, url + path, body))))
    thread.start()
    time.sleep(wait)
    health = timed("GET", url + "/health")
    ordinary = timed("POST", url + "/translate", {"src": [LINE]})
    thread.join(timeout=130)
    return {"hostile_status": hostile.get("status"), "hostile_s": hostile.get("s"), "health_status": health[0],
            "health_ms": 1000 * health[1], "ordinary_status": ordinary[0],
            "ordinary_ms": 1000 * ordinary[1]}  # fmt: skip


def batch_mates(url: str) -> dict:
    """A request with constraints and an ordinary one sent together (within batch_wait_ms): both statuses."""
    out: dict = {}
    bad = threading.Thread(target=lambda: out.update(
        constrained=timed("POST", url + "/translate", {"src": [LINE], "constraints": [["Haus"]]})))  # fmt: skip
    bad.start()
    time.sleep(0.05)
    out["ordinary"] = timed("POST", url + "/translate", {"src": [LINE]})
    bad.join(timeout=130)
    health = timed("GET", url + "/health")
    return {"hostile_status": out["constrained"][0], "hostile_s": out["constrained"][1], "health_status": health[0],
            "health_ms": 1000 * health[1], "ordinary_status": out["ordinary"][0],
            "ordinary_ms": 1000 * out["ordinary"][1]}  # fmt: skip


def glossary_requests(url: str, n: int = 3) -> dict:
    """`n` requests with a one-term glossary of their own, and an ordinary request 0.05 s after them."""
    out: list = []
    body = {"src": [LINE], "glossary": {"ladder": "Leiter"}}
    threads = [threading.Thread(target=lambda: out.append(timed("POST", url + "/translate", body))) for _ in range(n)]
    for thread in threads:
        thread.start()
    time.sleep(0.05)
    ordinary = timed("POST", url + "/translate", {"src": [LINE]})
    for thread in threads:
        thread.join(timeout=130)
    health = timed("GET", url + "/health")
    return {"hostile_status": ",".join(str(s) for s, _ in out), "hostile_s": max((t for _, t in out), default=0),
            "health_status": health[0], "health_ms": 1000 * health[1], "ordinary_status": ordinary[0],
            "ordinary_ms": 1000 * ordinary[1]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout whose serve.py to start")
    ap.add_argument("--out", type=Path, help="also write the rows as JSON")
    ap.add_argument("--moses", help="a run dir with tokenizer.pretokenize=moses, for the rows of finding 8")
    args = ap.parse_args()
    root, tmp = args.root.resolve(), Path(tempfile.mkdtemp())
    (tmp / "keys.txt").write_text(f"bench:{KEY}\n")
    (tmp / "glossary.tsv").write_text("".join(f"term{i}\tBegriff{i}\n" for i in range(4000)))
    common = [f"api_keys={tmp / 'keys.txt'}", "decode.beam_size=4", "batch_wait_ms=300", "request_timeout_s=100"]
    rows = {}
    with serving(root, args.checkpoint, [*common, f"glossary={tmp / 'glossary.tsv'}"], tmp / "server.log") as url:
        rows["quiet"] = quiet(url)
        terms = {f"word{i}": f"Wort{i}" for i in range(20_000)}
        rows["1 glossary of 20,000 terms"] = beside(url, "POST", "/translate", {"src": [LINE], "glossary": terms})
        cap = dict(list(terms.items())[:1000])  # max_glossary_terms' default: let in, and prepared off the loop
        rows["1 glossary of 1,000 terms"] = beside(url, "POST", "/translate", {"src": [LINE], "glossary": cap}, 0.05)
        rows["4 forged log line"] = beside(url, "GET", FORGED, None, wait=0.0)
        split = {"src": ["the cat. " * 900], "split": True, "beam_size": 16}
        rows["6 split 900 sentences, beam 16"] = beside(url, "POST", "/translate", split)
    (tmp / "glossary20k.tsv").write_text("".join(f"term{i}\tBegriff{i}\n" for i in range(20_000)))
    with serving(root, args.checkpoint, [*common, f"glossary={tmp / 'glossary20k.tsv'}"], tmp / "g20k.log") as url:
        rows["7 quiet (20,000-term glossary)"] = quiet(url)
        rows["7 three 1-term glossary requests"] = glossary_requests(url)
    if args.moses:
        with serving(root, args.moses, common, tmp / "moses.log") as url:
            rows["8 quiet (Moses)"] = quiet(url)
            huge = {"src": [("A man, in a blue shirt (on a ladder): " * 25_000)[:960_000]]}
            rows["8 Moses: one 960 KB line"] = beside(url, "POST", "/translate", huge, 0.05)
            over = {"src": ["A man, in a blue shirt (on a ladder): " * 7] * 64}  # ~5,000 tokens in 64 lines
            rows["8 Moses: 64 lines just over the cap"] = beside(url, "POST", "/translate", over, 0.05)
    log = (tmp / "server.log").read_text()
    rows["4 forged log line"]["forged_line_in_log"] = any(
        line.startswith("2026-01-01T00:00:00Z admin") for line in log.splitlines()
    )
    export = tmp / "ct2"
    made = subprocess.run([sys.executable, "-m", "mt.export", "ctranslate2", args.checkpoint, str(export)], cwd=root,
                          capture_output=True, text=True)  # fmt: skip
    if made.returncode != 0:
        print(f"(no CTranslate2 export, finding 2 skipped: {made.stderr.strip()[-300:]})")
    else:
        with serving(root, str(export), common, tmp / "ct2.log") as url:
            rows["2 quiet (CTranslate2)"] = quiet(url)
            rows["2 constraints on CTranslate2 + batch-mate"] = batch_mates(url)
    print(f"serve.py of {root}")
    print(f"{'case':42s} {'hostile':>8s} {'its s':>7s} {'/health ms':>11s} {'ordinary':>9s} {'its ms':>8s}")
    for name, r in rows.items():
        if "hostile_status" not in r:
            print(f"{name:42s} {'':8s} {'':7s} {r['health_ms']:11.0f} {'':9s} {r['ordinary_ms']:8.0f}")
            continue
        print(f"{name:42s} {r['hostile_status']!s:>8s} {r['hostile_s'] or 0:7.2f} {r['health_ms']:11.0f} "
              f"{r['ordinary_status']!s:>9s} {r['ordinary_ms']:8.0f}")  # fmt: skip
    print(f"forged access-log line written: {rows['4 forged log line']['forged_line_in_log']}")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
