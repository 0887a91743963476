"""The benchmarks' side-by-side timing (benchmarking/harness.py): every round times each variant
in turn, and a variant's settle pause falls before its timed batch, outside it."""

from lazymedia.benchmarking import harness


def test_interleaved_rounds_time_each_variant_in_turn_after_its_settle_pause(monkeypatch):
    events: list[str] = []
    clock = iter(range(1000))
    monkeypatch.setattr(harness.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(harness.time, "sleep", lambda seconds: events.append(f"settle {seconds}"))
    times = harness.interleaved(
        {"a": (lambda: events.append("a"), 2), "b": (lambda: events.append("b"), 1)}, rounds=2, settle={"b": 0.02}
    )
    assert events == ["a", "b"] + ["a", "a", "settle 0.02", "b"] * 2  # warm-ups, then rounds
    assert times == {"a": [0.5, 0.5], "b": [1, 1]}  # one clock tick a batch: the pause is not in it
    events.clear()
    harness.interleaved({"a": (lambda: events.append("a"), 1)}, rounds=1)
    assert events == ["a", "a"]  # no pause unless asked
