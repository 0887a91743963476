"""Per-request frontend cost, eager vs lazy: the benchmark `lazymedia bench` runs (it lives in
the package so the console script works from an installed wheel).

    python benchmarks/bench_lazy_decode.py [--quick] [--json PATH] [--chart PATH]
"""
import sys

from lazymedia.bench import main

if __name__ == "__main__":
    sys.exit(main())
