"""Request-level frontend benchmark at 400 requests: vLLM 0.33's media path vs lazymedia through
transformers' Qwen2-VL processor, scenarios pool_720p, unique_720p (all misses), pool_4k and
video_pool. It is `lazymedia bench` with more requests and no files unless asked; the scenarios
live in lazymedia/benchmarking/serving.py. Exit status 1 when eager and lazy outputs differ.

    python benchmarks/bench_frontend.py [--requests 400] [--concurrency 32] [--scenarios A,B] [--json P] [--chart P]
"""

import sys

from lazymedia.bench import main

if __name__ == "__main__":
    sys.exit(main(["--requests", "400", "--json", "", "--chart", "", *sys.argv[1:]]))
