"""Load test of serve.py on loopback: throughput and latency with 1, 8 and 32 concurrent clients, batched across
requests and one request at a time.

    python benchmarks/reliability/serve_load.py RUN_DIR [--clients 1 8 32] [--requests 20] [--max-seconds 120]
        [--plot docs/serve_load.png]

Starts `serve.py checkpoint=RUN_DIR` twice on a free port: as configured (requests that arrive together are
decoded together) and with `batch_tokens=1` (each request decoded alone, the reference). Each of N client threads
sends M requests of 1-8 real Multi30k sentences (val, English) and waits for each answer; every run stops by
itself after M requests per client or `--max-seconds`. Prints sentences/s, p50/p99 latency and errors per row, and
the batched/alone throughput ratio; `--plot` also draws sentences/s and p99 latency against clients, both modes.

    python benchmarks/reliability/serve_load.py RUN_DIR --team --clients 8 --requests 12 [--limit 120] [--greedy-s 20]

    python benchmarks/reliability/serve_load.py RUN_DIR --compare OTHER_CHECKOUT [--ab] [--keys] [--repeats 2]
        [--other-checkpoint CKPT]

The same load on this checkout's serve.py and on another checkout's (e.g. a `git worktree` of an older commit),
both started at once and measured in turn, row by row, so that the host's speed drifts alike for both: requests/s
and p99 of each and their ratio. `--ab` sends the load with ApacheBench (apt install apache2-utils; C, so the
clients take little of the CPU the servers share): `--requests` in all per row, each the same body of
`--sentences` sentences. `--keys`: both servers with an api_keys file, the clients sending a key.

A server a team exposes: the same load on a keyless server and on one with `api_keys` and
`requests_per_minute=LIMIT`, the clients sending one key that stays under its limit (the throughput ratio of the
two is the cost of keys and limits); then one client with another key sends as fast as it can for `--greedy-s`
seconds: its 200s must be exactly LIMIT in the first minute, the rest 429 with Retry-After, none 5xx, and the
server's /metrics must count those 429s.
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

ROOT = Path(__file__).resolve().parents[2]
VAL = ROOT.parent / "shared" / "data" / "multi30k" / "val.en.gz"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(checkpoint: str, port: int, extra: list[str], root: Path = ROOT,
                 log: Path | None = None) -> subprocess.Popen:  # fmt: skip
    """serve.py of the checkout `root` on `port`, once it answers /health; its stderr into `log` (else a pipe)."""
    cmd = [sys.executable, "serve.py", f"checkpoint={checkpoint}", f"port={port}", *extra]
    stderr = log.open("w") if log is not None else subprocess.PIPE
    proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.DEVNULL, stderr=stderr, text=True)
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            said = log.read_text() if log is not None else proc.stderr.read()
            sys.exit(f"serve.py exited: {said[-2000:]}")
        time.sleep(0.2)
    proc.kill()
    sys.exit("serve.py did not answer /health within 120 s")


def load(port: int, sentences: list[str], clients: int, requests: int, max_seconds: float, seed: int,
         headers: dict | None = None) -> dict:  # fmt: skip
    latencies: list[float] = []
    errors, n_sentences, lock = [0], [0], threading.Lock()
    deadline = time.perf_counter() + max_seconds

    def client(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120, headers=headers) as http:
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
            "p99_ms": 1000 * q[98], "errors": errors[0], "seconds": seconds}  # fmt: skip


def ab_load(port: int, body: dict, clients: int, requests: int, headers: dict | None = None) -> dict:
    """ApacheBench posting `body` `requests` times from `clients` concurrent connections: its figures."""
    import json
    import re
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(body, f)
    extra = [a for k, v in (headers or {}).items() for a in ("-H", f"{k}: {v}")]
    cmd = ["ab", "-q", "-n", str(requests), "-c", str(clients), "-p", f.name, "-T", "application/json", *extra,
           f"http://127.0.0.1:{port}/translate"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600).stdout
    Path(f.name).unlink()
    number = lambda pattern: float(re.search(pattern, out, re.M).group(1))  # noqa: E731
    non_2xx = re.search(r"^Non-2xx responses:\s+(\d+)", out, re.M)
    errors = int(number(r"^Failed requests:\s+(\d+)")) + (int(non_2xx.group(1)) if non_2xx else 0)
    per_s = number(r"^Requests per second:\s+([\d.]+)")
    return {"requests": requests, "requests_per_s": per_s, "sentences_per_s": per_s * len(body["src"]),
            "p50_ms": number(r"^\s+50%\s+(\d+)"), "p99_ms": number(r"^\s+99%\s+(\d+)"), "errors": errors}  # fmt: skip


def compare(args, sentences: list[str]) -> None:
    """The --compare run (see the module docstring): this checkout's server and another's, row by row in turn."""
    import shutil
    import tempfile

    if args.ab and shutil.which("ab") is None:
        sys.exit("--ab: ApacheBench not found; apt-get install apache2-utils, or drop --ab")
    tmp = Path(tempfile.mkdtemp())
    extra, headers = ["access_log=false"], None
    if args.keys:
        (tmp / "keys.txt").write_text("load:load-key-0123456789\n")
        extra, headers = [*extra, f"api_keys={tmp / 'keys.txt'}"], {"x-api-key": "load-key-0123456789"}
    roots = {"this": ROOT, "other": args.compare.resolve()}
    ports = {name: free_port() for name in roots}
    checkpoints = {"this": args.checkpoint, "other": args.other_checkpoint or args.checkpoint}
    servers = {name: start_server(checkpoints[name], ports[name], [*args.server, *extra], root, tmp / f"{name}.log")
               for name, root in roots.items()}  # fmt: skip
    body = {"src": random.Random(0).sample(sentences, args.sentences)}
    rows: dict[tuple[str, int], list[dict]] = {}
    try:
        for name in roots:  # warm-up
            load(ports[name], sentences, 2, 2, 30, seed=99, headers=headers)
        for n in args.clients:
            for _ in range(args.repeats):
                for name in roots:
                    if args.ab:
                        r = ab_load(ports[name], body, n, args.requests, headers)
                    else:
                        r = load(ports[name], sentences, n, args.requests, args.max_seconds, seed=n, headers=headers)
                        r["requests_per_s"] = r["requests"] / max(r.pop("seconds"), 1e-9)
                    rows.setdefault((name, n), []).append(r)
                    print(f"{name:5s} {n:3d} clients: {r['requests_per_s']:6.1f} requests/s, p50 {r['p50_ms']:6.0f} "
                          f"ms, p99 {r['p99_ms']:6.0f} ms, errors {r['errors']}", flush=True)  # fmt: skip
    finally:
        for server in servers.values():
            server.terminate()
            server.wait(timeout=30)
    print(f"\nthis: {ROOT}\nother: {roots['other']}")
    print("| clients | this requests/s | other requests/s | this / other | this p99 ms | other p99 ms |")
    print("|---|---|---|---|---|---|")
    for n in args.clients:
        mine, theirs = rows[("this", n)], rows[("other", n)]
        speed = lambda rs: " / ".join(f"{r['requests_per_s']:.1f}" for r in rs)  # noqa: E731
        p99 = lambda rs: " / ".join(f"{r['p99_ms']:.0f}" for r in rs)  # noqa: E731
        ratio = statistics.mean(r["requests_per_s"] for r in mine) / statistics.mean(
            r["requests_per_s"] for r in theirs
        )
        print(f"| {n} | {speed(mine)} | {speed(theirs)} | {ratio:.2f}x | {p99(mine)} | {p99(theirs)} |")


def greedy(port: int, sentence: str, key: str, seconds: float) -> dict:
    """One client sending one-sentence requests back to back for `seconds`: its status codes counted."""
    statuses: dict[int, int] = {}
    retry_after = set()
    end = time.perf_counter() + seconds
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120, headers={"x-api-key": key}) as http:
        while time.perf_counter() < end:
            r = http.post("/translate", json={"src": [sentence]})
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            if r.status_code == 429:
                retry_after.add(r.headers.get("retry-after"))
    return {"statuses": statuses, "retry_after": sorted(retry_after, key=lambda v: int(v or 0))}


def refused_429(port: int) -> float:
    """mt_refused_total{reason="requests"} from the server's /metrics (parsed by prometheus_client)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "mt_refused_total" and s.labels.get("reason") == "requests")  # fmt: skip


def team(args, sentences: list[str]) -> None:
    """The --team run (see the module docstring)."""
    import tempfile

    keys = Path(tempfile.mkdtemp()) / "keys.txt"
    keys.write_text("steady:steady-key-0123456789\ngreedy:greedy-key-0123456789\n")
    rows = {}
    for mode, extra, headers in (("no keys", [], None),
                                 ("keys + limit", [f"api_keys={keys}", f"requests_per_minute={args.limit}"],
                                  {"x-api-key": "steady-key-0123456789"})):  # fmt: skip
        port = free_port()
        server = start_server(args.checkpoint, port, [*args.server, *extra, "access_log=false"])
        try:
            load(port, sentences, 2, 2, 30, seed=99, headers=headers)  # warm-up
            for n in args.clients:
                r = rows[(mode, n)] = load(port, sentences, n, args.requests, args.max_seconds, seed=n, headers=headers)
                print(f"{mode:13s} {n:3d} clients: {r['requests']:4d} requests, {r['sentences_per_s']:7.1f} "
                      f"sentences/s, p50 {r['p50_ms']:6.0f} ms, p99 {r['p99_ms']:6.0f} ms, errors {r['errors']}",
                      flush=True)  # fmt: skip
            if headers is not None:
                g = greedy(port, sentences[0], "greedy-key-0123456789", args.greedy_s)
                counted = refused_429(port)
                sent = sum(g["statuses"].values())
                print(f"greedy key, {args.greedy_s:g} s back to back: {sent} requests, statuses {g['statuses']}, "
                      f"Retry-After values {g['retry_after']}; requests_per_minute={args.limit}: expected "
                      f"{min(sent, args.limit)} x 200 and {max(sent - args.limit, 0)} x 429; /metrics counts "
                      f"{counted:.0f} refusals", flush=True)  # fmt: skip
        finally:
            server.terminate()
            server.wait(timeout=30)
    for n in args.clients:
        ratio = rows[("keys + limit", n)]["sentences_per_s"] / rows[("no keys", n)]["sentences_per_s"]
        print(f"{n:3d} clients: keys + limit / no keys = {ratio:.2f}x")


def plot(results: dict, clients: list[int], out: Path, title: str) -> None:
    """Sentences/s and p99 latency against clients, batched beside alone, in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (speed, latency) = plt.subplots(1, 2, figsize=(9, 3.6))
    for mode, label in (("batched", "batched across requests"), ("alone", "one request at a time")):
        speed.plot(clients, [results[(mode, n)]["sentences_per_s"] for n in clients], "o-", label=label)
        latency.plot(clients, [results[(mode, n)]["p99_ms"] / 1000 for n in clients], "o-", label=label)
    for ax, ylabel in ((speed, "sentences/s"), (latency, "p99 latency, s")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(clients, [str(n) for n in clients])
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    speed.legend()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"plot: {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--requests", type=int, default=20, help="per client")
    ap.add_argument("--max-seconds", type=float, default=120, help="per row")
    ap.add_argument("--server", nargs="*", default=[], help="extra serve.py overrides, e.g. decode.beam_size=5")
    ap.add_argument("--team", action="store_true", help="keys and a rate limit against no keys (see above)")
    ap.add_argument("--limit", type=int, default=120, help="--team: requests_per_minute of each key")
    ap.add_argument("--greedy-s", type=float, default=20, help="--team: how long the greedy key sends")
    ap.add_argument("--compare", type=Path, help="another checkout whose serve.py takes the same load, in turn")
    ap.add_argument(
        "--other-checkpoint",
        help="--compare: the same model as the other checkout reads it, when it "
        "cannot read this checkout's (e.g. a copy without config keys it does not know)",
    )
    ap.add_argument("--ab", action="store_true", help="--compare: the load from ApacheBench (see above)")
    ap.add_argument("--sentences", type=int, default=4, help="--ab: sentences in each request")
    ap.add_argument("--keys", action="store_true", help="--compare: both servers with API keys")
    ap.add_argument("--repeats", type=int, default=1, help="--compare: rows measured this many times each")
    ap.add_argument("--plot", type=Path, help="also draw sentences/s and p99 latency against clients (PNG)")
    ap.add_argument(
        "--title",
        default="serve.py on 2 CPU threads, clients on the same machine",
        help="--plot: the figure's title (name the machine and date)",
    )
    args = ap.parse_args()
    with gzip.open(VAL, "rt", encoding="utf-8") as f:
        sentences = [line.strip() for line in f if line.strip()]
    if args.compare is not None:
        if not (args.compare / "serve.py").is_file():
            sys.exit(f"--compare {args.compare}: no serve.py there; give a checkout of this project")
        return compare(args, sentences)
    if args.team:
        if sum(args.clients) * args.requests + 4 > args.limit:
            sys.exit(f"--team: the steady key would send {sum(args.clients) * args.requests + 4} requests, over "
                     f"--limit {args.limit}; send fewer (--clients, --requests) or raise --limit")  # fmt: skip
        return team(args, sentences)
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
    if args.plot is not None:
        plot(results, args.clients, args.plot, args.title)


if __name__ == "__main__":
    main()
