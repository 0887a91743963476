"""The benchmark harness, kept out of the library core: `harness` (timing, reports, charts, a
loopback server), `serving` (the request-level scenarios `lazymedia bench` and
benchmarks/bench_frontend.py run), `items` (per-item tables, `lazymedia bench --items`) and
`redis_cluster` (a Redis Cluster of local redis-server processes, for the shared tier's tests and
benchmarks/bench_shared_cache.py --cluster)."""
