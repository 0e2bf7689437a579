"""Run a peer's training until a wall-clock deadline, then stop it the way Ctrl-C would.

    python benchmarks/peers/budget.py --deadline UNIX_TIME [--grace 900] -- CMD ARGS...

Peers without a time limit of their own (JoeyNMT, Eole) stop on SIGINT: they catch KeyboardInterrupt and save
their weights. SIGINT is restored to its default for the child, because a script started in the background
(`nohup bash run.sh &`) hands its children SIGINT ignored, and Python then never raises KeyboardInterrupt. Prints
one line saying when and how training ended; exits with the child's code (0 when it was interrupted).
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--deadline", type=float, required=True, help="unix time at which to interrupt")
    ap.add_argument("--grace", type=float, default=900, help="seconds to let it save before killing it")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no command after --")
    child = subprocess.Popen(cmd, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        code = child.wait(timeout=max(0.0, args.deadline - time.time()))
        print(f"budget: training ended by itself (exit {code}) {args.deadline - time.time():.0f} s before the deadline")
        return code
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGINT)
        print(f"budget: deadline reached at {time.strftime('%H:%M:%S')}: interrupted", flush=True)
    try:
        code = child.wait(timeout=args.grace)
    except subprocess.TimeoutExpired:
        child.kill()
        print(f"budget: still running {args.grace:.0f} s after the interrupt: killed", file=sys.stderr)
        return 1
    return 0 if code in (0, -signal.SIGINT, 130) else code


if __name__ == "__main__":
    sys.exit(main())
