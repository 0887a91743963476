"""What every benchmark shares: generated media encoders, timing (interleaved rounds, ratios with
their spread), a busy-machine warning, JSON reports, matplotlib charts, a loopback HTTP server
and a progress bar. `lazymedia bench` and benchmarks/*.py import it from here."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

import numpy as np
import numpy.typing as npt

from lazymedia import synthetic

if TYPE_CHECKING:
    import multiprocessing.queues

    from aiohttp import web
    from matplotlib.figure import Figure

# Printed above and below a --quick run's tables (and on its charts): its figures only show the job runs.
QUICK_BANNER = "QUICK RUN (--quick): few requests on small media, a smoke test; these figures are not measurements"


def encode(array: np.ndarray, fmt: str) -> bytes:
    return synthetic.encode_image(array, fmt) if fmt == "JPEG" else synthetic.encode_image(array, fmt, compress_level=6)


def encode_video(seconds: float, height: int, width: int, fps: int = 30, gop: int = 30) -> bytes:
    """H.264 (libx264 veryfast, yuv420p) of moving photo-like content, a keyframe every `gop` frames."""
    return synthetic.video(frames=int(seconds * fps), height=height, width=width, fps=fps, gop=gop, preset="veryfast")


def psnr(a: npt.ArrayLike, b: npt.ArrayLike) -> float:
    """Peak signal-to-noise ratio (dB) of two uint8 images or frame stacks; inf when equal."""
    mse = np.mean((np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)) ** 2)
    return float("inf") if mse == 0 else float(10 * np.log10(255**2 / mse))


class Shaped(Protocol):
    """A tensor or an array: what `shape_of` reads."""

    @property
    def shape(self) -> Sequence[int]: ...


def shape_of(items: Iterable[Shaped]) -> list[tuple[int, ...]]:
    """Each item's shape: a process function that costs nothing (the benchmarks time the rest)."""
    return [tuple(item.shape) for item in items]


class Ratio(TypedDict):
    """`ratio`'s figures: the median of the per-round ratios and their spread."""

    median: float
    low: float
    high: float


def median_time(
    fn: Callable[[], object], repeats: int, warmup: int = 1, after: Callable[[], object] | None = None
) -> float:
    """Median seconds of `fn()` over `repeats` runs after `warmup` ones; `after()` (e.g.
    torch.cuda.synchronize) runs inside each timed run, so asynchronous work is counted."""
    for _ in range(warmup):
        fn()
        if after is not None:
            after()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if after is not None:
            after()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved(
    variants: Mapping[str, tuple[Callable[[], object], int]], rounds: int, settle: dict[str, float] | None = None
) -> dict[str, list[float]]:
    """Seconds per call of each variant, one sample per round. `variants` maps a name to
    (fn, calls): every round times each variant in turn, as a batch of `calls` calls, so load
    that comes and goes during the run hits every variant alike and per-round ratios stay fair.
    `settle` maps variant names to an untimed pause (seconds) before their batches, so that what
    the variant before leaves running (torch's OpenMP workers spin for a few ms after a parallel
    region) is not timed in them."""
    for fn, _ in variants.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (fn, calls) in variants.items():
            if settle and settle.get(name):
                time.sleep(settle[name])
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - start) / calls)
    return times


def ratio(numerator: list[float], denominator: list[float]) -> Ratio:
    """Median of the per-round ratios and their spread (lowest, highest): a regression moves the
    median beyond the spread of a noisy run."""
    ratios = sorted(a / b for a, b in zip(numerator, denominator))
    return {"median": statistics.median(ratios), "low": ratios[0], "high": ratios[-1]}


def per_call(fn: Callable[[], object], min_time: float = 0.2) -> float:
    """Median seconds per call of a microsecond-scale `fn`, timed in batches of calls that last
    at least min_time/5 each (one call is too short for the clock)."""
    fn()
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if time.perf_counter() - start > min_time / 5:
            break
        calls *= 4
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def busy_warning() -> str | None:
    """A warning when the machine is busy (1-minute load above half its cores), else None."""
    cores = len(os.sched_getaffinity(0))
    load = os.getloadavg()[0]
    if load > cores / 2:
        return f"warning: the machine is busy (1-minute load {load:.1f} on {cores} cores): timings are noisy"
    return None


def write_json(report: Mapping[str, Any], path: str | None) -> None:
    """Writes a benchmark report (creating its folder) and says where; no-op without a path."""
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {path}")


def pyplot() -> ModuleType | None:
    """matplotlib's pyplot on the Agg backend, or None when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Figure, path: str) -> None:
    """Writes a matplotlib figure (made through `pyplot()`) as a PNG (creating its folder) and frees it."""
    import matplotlib.pyplot as plt

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def serve_on_loopback(
    add_routes: Callable[[web.UrlDispatcher], object], port_queue: multiprocessing.queues.Queue[int]
) -> None:
    """Runs an aiohttp server on 127.0.0.1 (a free port, put on `port_queue`) until killed;
    `add_routes(router)` installs the handlers. Benchmarks run it in a child process."""
    import asyncio

    from aiohttp import web

    async def main() -> None:
        app = web.Application()
        add_routes(app.router)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port_queue.put(runner.addresses[0][1])
        await asyncio.Event().wait()

    asyncio.run(main())


class Progress:
    """A tqdm bar over the benchmark's stages when tqdm is installed, else one line per stage."""

    def __init__(self, total: int) -> None:
        """Args:
        total: the stages `step` will be called for.
        """
        try:
            from tqdm import tqdm

            self._bar = tqdm(total=total, file=sys.stderr, unit="stage", leave=False)
        except ImportError:
            self._bar = None
        self._done, self._total = 0, total

    def step(self, name: str) -> None:
        self._done += 1
        if self._bar is not None:
            self._bar.set_description(name)
            self._bar.update(1)
        else:
            print(f"[{self._done}/{self._total}] {name}", file=sys.stderr)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
