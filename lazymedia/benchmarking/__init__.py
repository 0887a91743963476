"""The benchmark harness, kept out of the library core: `harness` (timing, reports, charts, a
loopback server), `serving` (the request-level scenarios `lazymedia bench` and
benchmarks/bench_frontend.py run) and `items` (per-item tables, `lazymedia bench --items`)."""
