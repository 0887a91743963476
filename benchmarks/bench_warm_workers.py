"""Warm isolation workers: the first isolated video miss of a fresh engine after
`DecodeEngine.warm_up()` against its later misses, over several fresh pools (the median of the
per-pool ratios), with what warm-up cost.

    python benchmarks/bench_warm_workers.py [--pools 3 --misses 6]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import lazymedia
from lazymedia import DecodeEngine, synthetic
from lazymedia.engine import IsolatedPool


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pools", type=int, default=3)
    parser.add_argument("--misses", type=int, default=6)
    args = parser.parse_args(argv)
    clip = synthetic.video(frames=30, height=96, width=160)
    ratios = []
    for _ in range(args.pools):
        pool = IsolatedPool(workers=1)
        try:
            with DecodeEngine(max_workers=1, isolate=("video",), isolation_pool=pool) as engine:
                start = time.perf_counter()
                report = engine.warm_up()
                warm_s = time.perf_counter() - start
                times = []
                for _ in range(args.misses):
                    item = lazymedia.load_video(clip, num_frames=8)
                    start = time.perf_counter()
                    engine.submit(item).result()
                    times.append(time.perf_counter() - start)
        finally:
            pool.close()
        later = statistics.median(times[1:])
        ratios.append(times[0] / later)
        print(
            f"warm_up {warm_s:.2f} s (in the worker {report[0].get('seconds', 0):.2f} s); first miss "
            f"{times[0] * 1e3:.1f} ms, later misses (median) {later * 1e3:.1f} ms, ratio {ratios[-1]:.2f}"
        )
    print(
        f"median first/later ratio over {args.pools} fresh pools: {statistics.median(ratios):.2f} "
        f"(1-minute load {os.getloadavg()[0]:.1f} on {len(os.sched_getaffinity(0))} cores)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
