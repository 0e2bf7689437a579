"""tests/warm_start.py: a command forked from the warm interpreter ends as the same command started cold does."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from tests.warm_start import WarmStart

SCRIPT = """
import atexit, sys, threading, time
print("argv", sys.argv[1:], "path0", sys.path[0].rsplit("/", 1)[-1])
print("stdin", sys.stdin.read().split())
print("to stderr", file=sys.stderr)
atexit.register(lambda: print("atexit ran"))
threading.Thread(target=lambda: (time.sleep(0.2), print("thread joined"))).start()
how = sys.argv[1]
if how == "raise":
    raise ValueError("uncaught")
if how == "message":
    sys.exit("a message exits 1")
if how == "code":
    sys.exit(2)
"""


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("cwd")
    (cwd / "script.py").write_text(SCRIPT)
    (cwd / "pkg").mkdir()
    (cwd / "pkg" / "__init__.py").write_text("")
    (cwd / "pkg" / "__main__.py").write_text("import sys\nprint('module', sys.argv[1:])\nsys.exit(3)\n")
    starter = WarmStart(dict(os.environ), cwd, preload=("json",))
    yield starter, cwd
    starter.close()


@pytest.mark.parametrize("how", ["ok", "raise", "message", "code"])
def test_a_script_ends_as_it_does_started_cold(warm, how):
    starter, cwd = warm
    args = ["script.py", how, "--flag"]
    cold = subprocess.run([sys.executable, *args], cwd=cwd, input=b"one two\n", capture_output=True, timeout=60)
    forked = starter.run(args, b"one two\n", timeout=60)
    assert forked.returncode == cold.returncode == {"ok": 0, "raise": 1, "message": 1, "code": 2}[how]
    assert forked.stdout == cold.stdout and b"atexit ran" in cold.stdout and b"thread joined" in cold.stdout
    last = forked.stderr.decode().splitlines()[-1]
    assert last == cold.stderr.decode().splitlines()[-1]  # the traceback's last line, the message, or stderr's line
    assert ("Traceback" in forked.stderr.decode()) == (how == "raise")


def test_a_module_runs_as_python_dash_m(warm):
    starter, cwd = warm
    cold = subprocess.run([sys.executable, "-m", "pkg", "x"], cwd=cwd, capture_output=True, timeout=60)
    forked = starter.run(["-m", "pkg", "x"])
    assert (forked.returncode, forked.stdout) == (cold.returncode, cold.stdout) == (3, b"module ['x']\n")


def test_a_command_past_its_timeout_is_killed_and_the_next_one_runs(warm):
    starter, cwd = warm
    (cwd / "sleeps.py").write_text("import time\ntime.sleep(30)\n")
    assert starter.run(["sleeps.py"], timeout=1).returncode == -14  # SIGALRM
    assert starter.run(["script.py", "code"]).returncode == 2


def test_two_starters_run_side_by_side(warm, tmp_path):
    (tmp_path / "a.py").write_text("import sys\nprint(sys.argv[1])\n")
    starters = [WarmStart(dict(os.environ), tmp_path, preload=("json",)) for _ in range(2)]
    out = {}
    threads = [threading.Thread(target=lambda i=i: out.update({i: starters[i].run(["a.py", str(i)])})) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in starters:
        s.close()
    assert [out[i].stdout for i in (0, 1)] == [b"0\n", b"1\n"]


def test_a_child_has_the_threads_its_environment_asks_for(tmp_path):
    """torch imported with OMP_NUM_THREADS=2 starts a thread, which would make forking unsafe: the server imports it
    with one, and the child sets the two the environment asked for, as a cold start's torch has them."""
    (tmp_path / "threads.py").write_text(
        "import os, torch\nprint(torch.get_num_threads(), os.environ['OMP_NUM_THREADS'])\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    cold = subprocess.run([sys.executable, "threads.py"], cwd=tmp_path, capture_output=True, timeout=120, env=env)
    starter = WarmStart(env, tmp_path, preload=("torch",))
    try:
        forked = starter.run(["threads.py"], timeout=120)
    finally:
        starter.close()
    assert forked.returncode == cold.returncode == 0, forked.stderr.decode()[-1000:]
    assert forked.stdout == cold.stdout == b"2 2\n"
