"""Load test of serve.py on loopback: throughput and latency with 1, 8 and 32 concurrent clients, batched across
requests and one request at a time.

    python benchmarks/serve_load.py RUN_DIR [--clients 1 8 32] [--requests 20] [--max-seconds 120]

Starts `serve.py checkpoint=RUN_DIR` twice on a free port: as configured (requests that arrive together are
decoded together) and with `batch_tokens=1` (each request decoded alone, the reference). Each of N client threads
sends M requests of 1-8 real Multi30k sentences (val, English) and waits for each answer; every run stops by
itself after M requests per client or `--max-seconds`. Prints sentences/s, p50/p99 latency and errors per row, and
the batched/alone throughput ratio.
"""

from __future__ import annotations

import argparse
import gzip
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
VAL = ROOT.parent / "shared" / "data" / "multi30k" / "val.en.gz"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(checkpoint: str, port: int, extra: list[str]) -> subprocess.Popen:
    cmd = [sys.executable, "serve.py", f"checkpoint={checkpoint}", f"port={port}", *extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            sys.exit(f"serve.py exited: {proc.stderr.read()[-2000:]}")
        time.sleep(0.2)
    proc.kill()
    sys.exit("serve.py did not answer /health within 120 s")


def load(port: int, sentences: list[str], clients: int, requests: int, max_seconds: float, seed: int) -> dict:
    latencies: list[float] = []
    errors, n_sentences, lock = [0], [0], threading.Lock()
    deadline = time.perf_counter() + max_seconds

    def client(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
            for _ in range(requests):
                if time.perf_counter() > deadline:
                    return
                src = rng.sample(sentences, rng.randint(1, 8))
                t = time.perf_counter()
                try:
                    r = http.post("/translate", json={"src": src})
                    ok = r.status_code == 200 and len(r.json()["translations"]) == len(src)
                except httpx.HTTPError:
                    ok = False
                with lock:
                    latencies.append(time.perf_counter() - t)
                    errors[0] += not ok
                    n_sentences[0] += len(src) if ok else 0

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [latencies[0]] * 99
    return {"requests": len(latencies), "sentences_per_s": n_sentences[0] / seconds, "p50_ms": 1000 * q[49],
            "p99_ms": 1000 * q[98], "errors": errors[0]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--requests", type=int, default=20, help="per client")
    ap.add_argument("--max-seconds", type=float, default=120, help="per row")
    ap.add_argument("--server", nargs="*", default=[], help="extra serve.py overrides, e.g. decode.beam_size=5")
    args = ap.parse_args()
    with gzip.open(VAL, "rt", encoding="utf-8") as f:
        sentences = [line.strip() for line in f if line.strip()]
    results = {}
    for mode, extra in (("batched", []), ("alone", ["batch_tokens=1"])):
        port = free_port()
        server = start_server(args.checkpoint, port, [*args.server, *extra])
        try:
            load(port, sentences, 2, 2, 30, seed=99)  # warm-up
            for n in args.clients:
                r = results[(mode, n)] = load(port, sentences, n, args.requests, args.max_seconds, seed=n)
                row = f"{mode:8s} {n:3d} clients: {r['requests']:4d} requests"
                speed = f"{r['sentences_per_s']:7.1f} sentences/s"
                latency = f"p50 {r['p50_ms']:7.0f} ms, p99 {r['p99_ms']:7.0f} ms"
                print(f"{row}, {speed}, {latency}, errors {r['errors']}", flush=True)
        finally:
            server.terminate()
            server.wait(timeout=30)
    for n in args.clients:
        gain = results[("batched", n)]["sentences_per_s"] / results[("alone", n)]["sentences_per_s"]
        print(f"{n:3d} clients: batched / one request at a time = {gain:.2f}x")


if __name__ == "__main__":
    main()
