"""Per-item cost, eager vs lazy (images by size, parallel decode, RSS, batch window, video,
audio): `lazymedia bench --items` without the request-level scenarios; the tables live in
lazymedia/benchmarking/items.py.

    python benchmarks/bench_lazy_decode.py [--quick] [--json PATH] [--chart PATH]
"""

import sys

from lazymedia.bench import main

if __name__ == "__main__":
    sys.exit(main(["--items", "--scenarios", "", "--json", "", "--chart", "", *sys.argv[1:]]))
