"""The server a team can expose: API keys (and their file re-read), rate limits, Prometheus metrics, several
models in one process, the access log, and a SIGTERM that answers what it holds and exits 0."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import types
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from mt.config import DecodeConfig, ServeConfig
from mt.decode.batched import decode_ids
from tests.conftest import ROOT, train_tiny

pytest.importorskip("fastapi")
pytest.importorskip("limits")
pytest.importorskip("prometheus_client")
from fastapi.testclient import TestClient  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from mt.decode.translator import Translator
from mt.serve import Served, create_app  # noqa: E402
from mt.serve.access import ApiKeys  # noqa: E402

LINE = "the cat sees a dog"


@pytest.fixture(scope="module")
def toy(toy_vocab):
    pairs, vocabs = toy_vocab
    return train_tiny(vocabs, pairs), vocabs


def _app(toy, keys=None, models=None, **serve):
    model, vocabs = toy
    cfg = ServeConfig(checkpoint="toy", decode=DecodeConfig(beam_size=1), batch_wait_ms=1, access_log=True, **serve)
    if models is None:
        models = Translator(model, vocabs, cfg.decode, torch.device("cpu"), None, {})
    return create_app(models, cfg, {"model": "toy", "src_lang": "xx", "tgt_lang": "yy"}, keys=keys), cfg


def _keys(tmp_path, text="alice:key-of-alice-123\nbob:key-of-bob-45678\n"):
    path = tmp_path / "keys.txt"
    path.write_text(text)
    return path, ApiKeys(str(path))


def _metrics(client) -> dict[tuple, float]:
    """/metrics parsed with prometheus_client's own parser: {(sample name, sorted labels): value}."""
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    families = text_string_to_metric_families(r.text)
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def test_keys_401_without_or_with_a_wrong_key_and_a_revoked_key_stops_working(toy, tmp_path, caplog):
    path, keys = _keys(tmp_path)
    app, _ = _app(toy, keys)
    with TestClient(app) as client, caplog.at_level("INFO", logger="mt.access"):
        for headers in ({}, {"authorization": "Bearer nope"}, {"x-api-key": "key-of-alice-12"}):
            r = client.post("/translate", json={"src": [LINE]}, headers=headers)
            assert r.status_code == 401 and set(r.json()) == {"error"} and "\n" not in r.json()["error"]
            assert r.headers["www-authenticate"] == "Bearer"
        assert "no API key" in client.post("/translate", json={"src": [LINE]}).json()["error"]
        r = client.post("/translate", content="{not json", headers={"x-api-key": "wrong"})
        assert r.status_code == 401  # the key is checked before the body is read or parsed
        assert client.get("/info").status_code == 401
        good = client.post("/translate", json={"src": [LINE]}, headers={"authorization": "Bearer key-of-alice-123"})
        assert good.status_code == 200
        assert (
            client.post("/translate", json={"src": [LINE]}, headers={"x-api-key": "key-of-bob-45678"}).status_code
            == 200
        )
        assert client.get("/info", headers={"x-api-key": "key-of-bob-45678"}).json()["api_keys"] is True
        for open_route in ("/health", "/metrics", "/"):
            assert client.get(open_route).status_code == 200
        path.write_text("alice:key-of-alice-123\n")  # bob revoked
        keys.looked -= 2  # (the file is looked at no more than once a second)
        r = client.post("/translate", json={"src": [LINE]}, headers={"x-api-key": "key-of-bob-45678"})
        assert r.status_code == 401
        path.write_text("alice key with spaces\n")  # a broken file keeps the keys there were
        keys.looked -= 2
        assert (
            client.post("/translate", json={"src": [LINE]}, headers={"x-api-key": "key-of-alice-123"}).status_code
            == 200
        )
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name == "mt.access")
    assert re.search(r'^\S+Z alice \S+ "POST /translate" 200 sentences=1 tokens=\d+ \d+ms$', logged, re.M), logged
    assert re.search(r'^\S+Z - \S+ "POST /translate" 401 ', logged, re.M), logged
    assert "key-of-" not in logged  # names only, never keys


def test_a_key_file_splits_at_the_first_colon_and_refuses_short_keys_without_printing_them(tmp_path):
    """Before: "alice:s3cr3t:xy" made the two-character key "xy" and the name "alice:s3cr3t", which the access log
    then printed. Now a name ends at the first colon (a key may hold colons) and a key under 16 characters is
    refused at load, naming the line and never the key."""
    from mt.config import ConfigError
    from mt.serve.access import read_keys

    path = tmp_path / "keys.txt"
    path.write_text("# team\nalice:s3cr3t:xy\n")
    with pytest.raises(ConfigError, match=r"keys.txt line 2: a key of 9 characters, shorter than 16") as e:
        read_keys(path)
    assert "s3cr3t" not in str(e.value)
    path.write_text("alice:s3cr3t:0123456789abcdef\n0123456789abcdefg\n")
    keys = read_keys(path)
    assert set(keys) == {"alice", "line 2"}
    api = ApiKeys(str(path))
    assert api.name_of("s3cr3t:0123456789abcdef") == "alice" and api.name_of("0123456789abcdef") is None


def test_the_access_log_escapes_what_a_caller_sends(toy, caplog):
    """Before: uvicorn hands the path over percent-decoded, and "/%0A..." wrote a forged second line (caller
    "admin", status 200); an ESC would drive a terminal; "%22%20200" closed the quoted request inside the line and
    wrote a status of the caller's choosing. Now control characters, quotes and spaces are escaped in every field
    (as nginx escapes them): a line holds one quoted request and one status."""
    app, _ = _app(toy)
    forged = "/%0A2026-01-01T00:00:00Z%20admin%20127.0.0.1%20%22POST%20/translate%22%20200%1B[2J"
    quoted = "/x%22%20200%20sentences=9%20tokens=9%20%22"
    with TestClient(app) as client, caplog.at_level("INFO", logger="mt.access"):
        assert client.get(forged).status_code == 404 and client.get(quoted).status_code == 404
    first, second = [r.getMessage() for r in caplog.records if r.name == "mt.access"]
    assert "\n" not in first and "\x1b" not in first and first.count(" 404 ") == 1
    assert (
        '"GET /\\x0a2026-01-01T00:00:00Z\\x20admin\\x20127.0.0.1\\x20\\x22POST\\x20/translate\\x22\\x20200\\x1b[2J" 404'
        in first
    )
    assert second.count('"') == 2 and second.count(" 404 ") == 1 and "sentences=9" not in second.split('"')[2]


def test_rate_limits_429_with_retry_after_per_caller_then_recovery(toy, tmp_path, monkeypatch):
    import limits.storage.memory

    _, keys = _keys(tmp_path)
    app, _ = _app(toy, keys, requests_per_minute=2, tokens_per_minute=1000)
    alice, bob = {"x-api-key": "key-of-alice-123"}, {"x-api-key": "key-of-bob-45678"}
    with TestClient(app) as client:
        assert [client.post("/translate", json={"src": [LINE]}, headers=alice).status_code for _ in range(2)] == [
            200
        ] * 2
        r = client.post("/translate", json={"src": [LINE]}, headers=alice)
        assert r.status_code == 429 and "requests_per_minute=2" in r.json()["error"] and set(r.json()) == {"error"}
        assert 1 <= int(r.headers["retry-after"]) <= 60
        assert client.post("/translate", json={"src": [LINE]}, headers=bob).status_code == 200  # per caller
        later = time.time() + 61
        monkeypatch.setattr(limits.storage.memory, "time", types.SimpleNamespace(time=lambda: later))
        assert client.post("/translate", json={"src": [LINE]}, headers=alice).status_code == 200  # a minute on
    app, _ = _app(toy, None, tokens_per_minute=20)  # no keys: per client address; source tokens
    with TestClient(app) as client:
        assert client.post("/translate", json={"src": [LINE]}).status_code == 200  # 6 tokens with </s>
        assert client.post("/translate", json={"src": [LINE, LINE]}).status_code == 200  # 18 of 20
        r = client.post("/translate", json={"src": [LINE]})
        assert r.status_code == 429 and "tokens_per_minute=20" in r.json()["error"] and "retry-after" in r.headers
        r = client.post("/translate", json={"src": [LINE] * 4})
        assert r.status_code == 413 and "more than tokens_per_minute=20 allows at once" in r.json()["error"]


def test_metrics_parse_and_count_requests_sentences_tokens_and_refusals(toy, tmp_path):
    _, keys = _keys(tmp_path)
    app, _ = _app(toy, keys, requests_per_minute=3)
    alice = {"x-api-key": "key-of-alice-123"}
    model, vocabs = toy
    with TestClient(app) as client:
        before = _metrics(client)
        labels = (("engine", ""), ("model", "default"), ("src_lang", "xx"), ("tgt_lang", "yy"))
        assert before[("mt_model_info", labels)] == 1  # no checkpoint path: /metrics needs no key (/info has it)
        batches = [[LINE, "a big red house"], ["the dog runs"]]
        for src in batches:
            assert client.post("/translate", json={"src": src}, headers=alice).status_code == 200
        assert client.post("/translate", json={"src": [LINE]}).status_code == 401
        assert client.post("/translate", json={"src": [LINE]}, headers=alice).status_code == 200
        assert client.post("/translate", json={"src": [LINE]}, headers=alice).status_code == 429
        after = _metrics(client)
    lines = [s for src in batches for s in src] + [LINE]
    tokens = sum(len(ids) + 1 for ids in vocabs.src.encode_batch(lines))
    expect = {("mt_requests_total", (("route", "/translate"), ("status", "200"))): 3,
              ("mt_requests_total", (("route", "/translate"), ("status", "401"))): 1,
              ("mt_requests_total", (("route", "/translate"), ("status", "429"))): 1,
              ("mt_sentences_total", (("model", "default"),)): 4,
              ("mt_source_tokens_total", (("model", "default"),)): tokens,
              ("mt_refused_total", (("reason", "unauthorized"),)): 1,
              ("mt_refused_total", (("reason", "requests"),)): 1,
              ("mt_request_seconds_count", (("route", "/translate"),)): 5}  # fmt: skip
    for key, value in expect.items():
        assert after.get(key, 0) - before.get(key, 0) == value, key
    hyps = [decode_ids(model, vocabs.src.encode_batch(src), DecodeConfig(beam_size=1), torch.device("cpu"), None)
            for src in [*batches, [LINE]]]  # fmt: skip
    produced = sum(len(h[0].tokens) + 1 for batch in hyps for h in batch)
    assert after[("mt_target_tokens_total", (("model", "default"),))] == produced
    assert after[("mt_batch_sentences_count", (("model", "default"),))] == 3
    assert after[("mt_batch_sentences_sum", (("model", "default"),))] == 4
    assert ("mt_queue_tokens", (("model", "default"),)) in after
    assert after[("mt_decode_seconds_count", (("model", "default"),))] == 3


def test_several_models_each_picked_by_name_or_target_language(toy, toy_vocab):
    model, vocabs = toy
    other = train_tiny(vocabs, toy_vocab[0], d_model=16, n_heads=2)  # another model: other outputs
    settings = DecodeConfig(beam_size=1)
    served = [
        Served("yy", Translator(model, vocabs, settings, torch.device("cpu"), None, {}), {"tgt_lang": "yy"}),
        Served("zz", Translator(other, vocabs, settings, torch.device("cpu"), None, {}), {"tgt_lang": "zz"}),
    ]
    app, _ = _app(toy, models=served)
    src = [LINE, "a big red house"]
    expected = {name: vocabs.tgt.decode_batch([h[0].tokens for h in decode_ids(m, vocabs.src.encode_batch(src),
                                                                               settings, torch.device("cpu"), None)])
                for name, m in (("yy", model), ("zz", other))}  # fmt: skip
    assert expected["yy"] != expected["zz"]
    with TestClient(app) as client:
        for body, name in (({}, "yy"), ({"model": "zz"}, "zz"), ({"tgt_lang": "zz"}, "zz"), ({"model": "yy"}, "yy")):
            r = client.post("/translate", json={"src": src, **body})
            assert r.status_code == 200 and r.json()["translations"] == expected[name] and r.json()["model"] == name
            assert set(r.json()) == {"translations", "scores", "flags", "model"}
        refused = [({"model": "fr"}, "model: no model named 'fr'; this server has yy, zz"),
                   ({"tgt_lang": "fr"}, "tgt_lang: no model translates into 'fr'"),
                   ({"model": "yy", "tgt_lang": "zz"}, "model 'yy' translates into yy, not 'zz'")]  # fmt: skip
        for body, message in refused:
            r = client.post("/translate", json={"src": src, **body})
            assert r.status_code == 422 and message in r.json()["error"]
        info = client.get("/info").json()
        assert [m["name"] for m in info["models"]] == ["yy", "zz"] and info["tgt_lang"] == "yy"
        assert client.app.state.models[1].batcher is not client.app.state.models[0].batcher  # a worker each


def test_a_checkpoint_named_twice_is_loaded_once(toy_run):
    """checkpoint={a: RUN, b: RUN}: two names, one model in memory (each name still has its own worker)."""
    from mt.serve import load

    models = load(ServeConfig(checkpoint={"a": str(toy_run), "b": str(toy_run)}, device="cpu"), [])
    assert [m.name for m in models] == ["a", "b"] and models[0].translator is models[1].translator
    listed = load(ServeConfig(checkpoint=[str(toy_run)], device="cpu"), [])
    assert [m.name for m in listed] == [toy_run.name]


def _serve(run, *args):
    """serve.py on a free port: (process, URL); its stderr is read by the caller."""
    env = {k: v for k, v in os.environ.items() if k != "FORWARDED_ALLOW_IPS"}  # uvicorn's default trust: 127.0.0.1
    p = subprocess.Popen([sys.executable, "serve.py", f"checkpoint={run}", "device=cpu", "port=0", *args], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    import urllib.request

    for line in p.stderr:
        found = re.search(r"on http://[^:]+:(\d+)", line)
        if found:
            url = f"http://127.0.0.1:{found.group(1)}"
            urllib.request.urlopen(url + "/health", timeout=30)  # uvicorn handles signals once it answers
            return p, url, line
    pytest.fail(f"serve.py exited with {p.wait()} before serving")


def _post(url, body, key=None, timeout=60, headers=None):
    import urllib.error
    import urllib.request

    headers = {"content-type": "application/json", **({"x-api-key": key} if key else {}), **(headers or {})}
    request = urllib.request.Request(url + "/translate", json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_sigterm_answers_the_requests_in_flight_and_exits_0_and_sighup_rereads_the_keys(toy_run, tmp_path):
    """Before: SIGTERM ended the server with status 143. Requests wait 2 s in the batcher (batch_wait_ms), so
    all four are in flight when SIGTERM comes; each gets its 200, then the process exits 0. SIGHUP: a key file
    edited in place with its size and time unchanged (so only the signal can tell) is read again."""
    keys = tmp_path / "keys.txt"
    keys.write_text("team:aaaaaaaaaaaaaaaa\n")
    stamp = os.stat(keys)
    p, url, first = _serve(toy_run, f"api_keys={keys}", "batch_wait_ms=2000", "batch_tokens=100000")
    try:
        assert "API keys from" in first and "unauthenticated" not in first
        assert _post(url, {"src": [LINE]}, "aaaaaaaaaaaaaaaa")[0] == 200
        keys.write_text("team:bbbbbbbbbbbbbbbb\n")
        os.utime(keys, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
        p.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        assert _post(url, {"src": [LINE]}, "bbbbbbbbbbbbbbbb")[0] == 200
        assert _post(url, {"src": [LINE]}, "aaaaaaaaaaaaaaaa")[0] == 401
        with ThreadPoolExecutor(4) as pool:
            flight = [pool.submit(_post, url, {"src": [LINE, f"a dog {i}"]}, "bbbbbbbbbbbbbbbb") for i in range(4)]
            time.sleep(1.0)  # all four wait in the batcher now
            p.send_signal(signal.SIGTERM)
            answers = [f.result(timeout=60) for f in flight]
        assert [status for status, _ in answers] == [200] * 4 and all(len(a["translations"]) == 2 for _, a in answers)
        assert p.wait(timeout=60) == 0
    finally:
        if p.poll() is None:
            p.kill()
    err = p.stderr.read()
    assert "SIGTERM" in err and "bbbbbbbbbbbbbbbb" not in err and "aaaaaaaaaaaaaaaa" not in err


def test_without_keys_the_first_line_says_unauthenticated_and_another_host_warns(toy_run):
    """Also: behind a reverse proxy on the same machine, the limits count per caller (the address the proxy puts
    in X-Forwarded-For, which uvicorn trusts from 127.0.0.1), not all callers as the proxy's one address."""
    p, url, first = _serve(toy_run, "host=0.0.0.0", "requests_per_minute=1")
    warning = p.stderr.readline()
    callers = ["203.0.113.7", "203.0.113.8", "203.0.113.7"]  # the third is the first again: over its 1 a minute
    statuses = [_post(url, {"src": [LINE]}, headers={"x-forwarded-for": a})[0] for a in callers]
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=60) == 0
    assert "unauthenticated" in first and warning.startswith("WARNING host=0.0.0.0 without api_keys"), warning
    assert statuses == [200, 200, 429]
    log = p.stderr.read()
    assert "203.0.113.7" in log and "203.0.113.8" in log
