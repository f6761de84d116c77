#!/usr/bin/env python3
"""Cold-process wall time of ``spotwise prices --gpu H100 --format json`` vs ``python -c "import spotwise"``.

Both are measured in the same run, alternating, several repetitions each; prints the medians and
the ratio (prices / bare import). The bare import is the floor: interpreter start + our package.
Also times ``spotwise --help`` (the CLI framework's own start-up, which every command pays) so the
pricing code's share is visible. Runs with an empty SPOTWISE_HOME so the shipped snapshot is what is read.

    .venv/bin/python bench/bench_prices.py [--reps 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time


def _time(cmd: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as home:
        env = dict(os.environ, SPOTWISE_HOME=home)
        base = [sys.executable, "-c", "import spotwise"]
        prices = [sys.executable, "-m", "spotwise.cli", "prices", "--gpu", "H100", "--format", "json"]
        helpcmd = [sys.executable, "-m", "spotwise.cli", "--help"]
        _time(base, env), _time(prices, env), _time(helpcmd, env)  # warm the OS file cache
        tb, tp, th = [], [], []
        for _ in range(args.reps):
            tb.append(_time(base, env))
            tp.append(_time(prices, env))
            th.append(_time(helpcmd, env))
    mb, mp, mh = statistics.median(tb), statistics.median(tp), statistics.median(th)
    print(f"python -c 'import spotwise'               median {mb * 1000:7.1f} ms  (n={len(tb)})")
    print(f"spotwise --help (CLI framework floor)     median {mh * 1000:7.1f} ms  (n={len(th)})")
    print(f"spotwise prices --gpu H100 --format json  median {mp * 1000:7.1f} ms  (n={len(tp)})")
    print(f"ratio prices / import: {mp / mb:.1f}x   (extra {1000 * (mp - mb):.0f} ms)")
    print(f"ratio prices / --help: {mp / mh:.2f}x   (pricing's own share {1000 * (mp - mh):.0f} ms)")


if __name__ == "__main__":
    main()
