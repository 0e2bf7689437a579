"""Entry points (`train.py`, `translate.py`, `python -m mt.export` ...) started from a warm interpreter, for tests
that run many of them.

Most of a short entry-point process is Python starting and importing torch (~3 s of one core). A `WarmStart` is a
process of its own that imports the heavy third-party libraries once, runs no thread, and forks itself for each
command: the child is a new process that runs the entry point as `python ARGS` would, with its own argv, working
directory, stdin, stdout and stderr (files), its exit code, and the interpreter's normal exit (threads joined,
atexit handlers, streams flushed; an uncaught exception prints its traceback and exits 1). Only the libraries of
PRELOAD are imported ahead; the project's own modules load in the child, as in a cold start. Linux only (fork).
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# Not datasets: importing it starts a thread (pyarrow), and a process with threads cannot be forked safely.
PRELOAD = ("torch", "hydra", "omegaconf", "tokenizers", "sacrebleu", "safetensors")

# The forking server: reads one JSON job a line from its requests fd, forks, answers the child's exit code.
# torch started with OMP_NUM_THREADS above 1 starts its OpenMP threads at import, and OpenMP's pool does not survive a
# fork: the server imports with one thread and each child sets the count the environment asked for, as torch does at
# a cold start (the intra-op pool then starts in the child, at its first parallel operation).
SERVER = r"""
import json, os, runpy, signal, sys
for name in sys.argv[1].split(","):
    __import__(name)
threads = len(os.listdir("/proc/self/task"))
if threads != 1:
    sys.exit(f"warm start: {threads} threads after importing {sys.argv[1]}: forking would be unsafe")
requests, replies = os.fdopen(int(sys.argv[2]), "r"), os.fdopen(int(sys.argv[3]), "w")
omp_threads = sys.argv[4]
for line in requests:
    job = json.loads(line)
    pid = os.fork()
    if pid:
        replies.write(json.dumps(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])) + "\n")
        replies.flush()
        continue
    requests.close()
    replies.close()
    write = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    for fd, path, flags in ((0, job["stdin"], os.O_RDONLY), (1, job["stdout"], write), (2, job["stderr"], write)):
        opened = os.open(path, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    os.chdir(job["cwd"])
    if omp_threads:
        os.environ["OMP_NUM_THREADS"] = omp_threads
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(int(omp_threads))
    signal.alarm(job["timeout"])
    args = job["args"]
    if args[0] == "-m":
        sys.argv, sys.path[0] = ["-m", *args[2:]], os.getcwd()
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv, sys.path[0] = list(args), os.path.dirname(os.path.abspath(args[0]))
        runpy.run_path(os.path.abspath(args[0]), run_name="__main__")  # __file__ absolute, as Python's own
    sys.exit(0)
"""


class WarmStart:
    """One forking server; `run` is `subprocess.run([sys.executable, *args], ...)` without the start-up. One
    command at a time: a thread pool gives each worker its own."""

    def __init__(self, env: dict[str, str], cwd: Path, preload: tuple[str, ...] = PRELOAD):
        self.cwd = cwd
        job_r, job_w = os.pipe()
        reply_r, reply_w = os.pipe()
        self.log = tempfile.TemporaryFile()
        omp_threads = env.get("OMP_NUM_THREADS", "1")
        omp_threads = "" if omp_threads == "1" else omp_threads  # what a child sets; the server imports with one
        self.server = subprocess.Popen(
            [sys.executable, "-c", SERVER, ",".join(preload), str(job_r), str(reply_w), omp_threads],
            pass_fds=(job_r, reply_w),
            env={**env, "OMP_NUM_THREADS": "1"} if omp_threads else env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self.log,
        )
        os.close(job_r)
        os.close(reply_w)
        self.jobs, self.replies = os.fdopen(job_w, "w"), os.fdopen(reply_r, "r")

    def run(
        self, args: list[str], stdin: str | bytes | None = None, timeout: int = 300, text: bool = False
    ) -> subprocess.CompletedProcess:
        """Run `python ARGS` (a script path or `-m MODULE`, then its arguments) in the working directory the server
        started in; a command past `timeout` seconds is killed by SIGALRM (return code -14). `text`: stdout and
        stderr as str, as `subprocess.run(..., text=True)` gives them."""
        with tempfile.TemporaryDirectory() as tmp:
            files = {name: Path(tmp) / name for name in ("stdin", "stdout", "stderr")}
            files["stdin"].write_bytes(stdin.encode() if isinstance(stdin, str) else stdin or b"")
            job = {"args": args, "cwd": str(self.cwd), "timeout": timeout, **{k: str(v) for k, v in files.items()}}
            self.jobs.write(json.dumps(job) + "\n")
            self.jobs.flush()
            reply = self.replies.readline()
            if not reply:
                self.log.seek(0)
                raise RuntimeError(f"the warm-start server died: {self.log.read().decode()[-2000:]}")
            out, err = files["stdout"].read_bytes(), files["stderr"].read_bytes()
        if text:
            out, err = out.decode(errors="replace"), err.decode(errors="replace")
        return subprocess.CompletedProcess([sys.executable, *args], json.loads(reply), out, err)

    def close(self) -> None:
        try:
            self.jobs.close()
        except BrokenPipeError:  # the server died; `run` said why
            pass
        self.server.wait(timeout=60)
        self.replies.close()
        self.log.close()


_SHARED: dict[tuple, WarmStart] = {}


def shared(env: dict[str, str], cwd: Path) -> WarmStart:
    """The test session's one server for this environment and working directory, started at the first call and
    closed when the session's interpreter exits. For tests that start entry points one at a time."""
    key = (tuple(sorted(env.items())), str(cwd))
    if key not in _SHARED:
        if not _SHARED:
            atexit.register(_close_shared)
        _SHARED[key] = WarmStart(env, cwd)
    return _SHARED[key]


def _close_shared() -> None:
    for starter in _SHARED.values():
        starter.close()
    _SHARED.clear()
