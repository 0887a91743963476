"""`lazymedia bench`, the main job: the serving win, request by request. Requests at concurrency
through a real HF processor (transformers' Qwen2-VL image processor), vLLM 0.33's media path
(eager) vs lazymedia, per scenario: a table, JSON and a PNG chart. `--items` adds the per-item
tables (image sizes, video, audio, RSS) and their chart. The scenarios live in
lazymedia.benchmarking.serving, shared with benchmarks/bench_frontend.py.

    lazymedia bench [--device auto|cuda|cpu] [--requests 160] [--concurrency 32] [--items] [--quick]
                    [--json PATH] [--chart PATH]

--device cuda (the default where a GPU, nvJPEG and NVDEC are usable) adds the GPU modes (vLLM's
path with its processor on the GPU, lazymedia on the GPU) and the scenarios unique_4k,
video_unique and mixed. Exit status 1 when eager and lazy outputs differ or a device check
fails (or a GPU request failed), 2 when transformers is missing. --rehearse (no GPU, with --device
cuda): the GPU modes and scenarios run on the CPU through lazymedia.benchmarking.rehearsal's
stand-ins of nvJPEG and NVDEC, media 8x smaller a side, timing verdicts marked REHEARSAL: every
code path of the device run, for benchmarks/gpu_check.sh --rehearse.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import platform
import sys
from typing import Any

from . import __version__

REQUESTS, QUICK_REQUESTS = 160, 16
CPU_SCENARIOS = ("pool_720p", "unique_720p", "pool_4k", "video_pool")
DEVICE_SCENARIOS = ("unique_4k", "video_unique", "mixed")


def resolve_device(choice: str) -> str:
    """ "cuda" or "cpu": auto is cuda where torch sees a GPU and nvJPEG and NVDEC are usable."""
    if choice != "auto":
        return choice
    from .engine import backends

    usable = {status.name for status in backends() if status.available}
    return "cuda" if {"nvjpeg", "nvdec"} <= usable else "cpu"


def positive_int(text: str) -> int:
    """An argparse type: a whole number above 0 (argparse then exits 2 naming the option)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def scenario_list(text: str) -> list[str]:
    from .benchmarking.serving import SCENARIOS

    names = [name for name in text.split(",") if name]
    unknown = sorted(set(names) - set(SCENARIOS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown scenarios {unknown}: choose from {', '.join(SCENARIOS)}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `lazymedia bench` (the CLI's subcommand and this module's main share them)."""
    parser.add_argument(
        "--requests",
        type=positive_int,
        help=f"requests per scenario and frontend (default {REQUESTS}, {QUICK_REQUESTS} with --quick)",
    )
    parser.add_argument("--concurrency", type=positive_int, default=32, help="requests in flight (default 32)")
    parser.add_argument(
        "--workers",
        type=positive_int,
        default=len(os.sched_getaffinity(0)),
        help="decode/process threads of each frontend (default: the cores)",
    )
    parser.add_argument(
        "--device",
        choices=("auto", "cuda", "cpu"),
        default="auto",
        help="where lazymedia's GPU mode decodes and processes (auto: cuda where a GPU, nvJPEG "
        "and NVDEC are usable here, else cpu)",
    )
    parser.add_argument(
        "--scenarios",
        type=scenario_list,
        default=None,
        help=f"comma-separated, from {', '.join(CPU_SCENARIOS + DEVICE_SCENARIOS)} ('' for none; "
        f"default: {','.join(CPU_SCENARIOS)}, and with a device {','.join(DEVICE_SCENARIOS)})",
    )
    parser.add_argument(
        "--items",
        action="store_true",
        help="add the per-item tables (images by size, parallel decode, RSS, batch window, video, audio)",
    )
    parser.add_argument("--quick", action="store_true", help="few requests, small item sizes (a smoke run)")
    parser.add_argument(
        "--rehearse",
        action="store_true",
        help="no GPU: run --device cuda's modes on the CPU through stand-ins (gpu_check.sh --rehearse)",
    )
    parser.add_argument(
        "--json",
        default=os.path.join("bench-out", "lazymedia_bench.json"),
        help="write the report here (default %(default)s)",
    )
    parser.add_argument(
        "--chart",
        default=os.path.join("bench-out", "lazymedia_bench.png"),
        help="write the PNG chart here; --items adds <name>_items.png (needs matplotlib; default %(default)s)",
    )


def items_chart_path(chart: str) -> str:
    stem, _ = os.path.splitext(chart)
    return stem + "_items.png"


def unwritable(path: str) -> str | None:
    """Why a report could not be written at `path` (its folder is made), checked before the run
    rather than after it; None when it can."""
    if not path:
        return None
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        return f"cannot make its folder: {exc.strerror}"
    if os.path.isdir(path):
        return "is a folder: name a file"
    if not os.access(folder, os.W_OK):
        return f"cannot write in {folder}"
    return None


def run(args: argparse.Namespace) -> int:
    """Runs the job `args` asks for (parsed by add_arguments' options); the exit status."""
    from .benchmarking import items, serving
    from .benchmarking.harness import Progress, busy_warning, write_json

    for option, path in (("--json", args.json), ("--chart", args.chart)):
        why = unwritable(path)
        if why:
            print(f"error: argument {option}: {path!r} {why}", file=sys.stderr)
            return 2
    if args.device == "cuda" and not getattr(args, "rehearse", False):  # a rehearsal's CUDA is the stand-ins'
        import torch

        if not torch.cuda.is_available():
            print(
                "error: argument --device: cuda, but torch sees no usable GPU here (--device cpu, or auto)",
                file=sys.stderr,
            )
            return 2
    device = resolve_device(args.device)
    rehearse = bool(getattr(args, "rehearse", False)) and device == "cuda"
    scenarios = args.scenarios
    if scenarios is None:
        scenarios = list(CPU_SCENARIOS + (DEVICE_SCENARIOS if device == "cuda" else ()))
    if scenarios and importlib.util.find_spec("transformers") is None:
        print(
            "error: the serving scenarios run transformers' Qwen2-VL processor: pip install transformers "
            "(the lazymedia-decode[bench] extra) "
            "(or --scenarios '' --items for the per-item tables alone)",
            file=sys.stderr,
        )
        return 2
    requests = args.requests or (QUICK_REQUESTS if args.quick else REQUESTS)
    warning = busy_warning()
    if warning:
        print(warning, file=sys.stderr)
    report: dict[str, Any] = {
        "version": __version__,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": platform.machine() + " " + platform.processor(),
        "cpus": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "quick": args.quick,
        "rehearsal": rehearse,
        "load_1min_before": os.getloadavg()[0],
    }
    progress = Progress(total=len(scenarios) + (items.stages(args.quick) if args.items else 0))
    if scenarios:
        report["serving"] = serving.run(
            scenarios, requests, args.concurrency, args.workers, progress, device, quick=args.quick, rehearse=rehearse
        )
    if args.items:
        report["items"] = items.run(args.quick, progress)
    progress.close()
    report["load_1min_after"] = os.getloadavg()[0]
    report["busy_warning"] = warning or busy_warning()
    print(
        f"\nlazymedia {report['version']} on {report['machine']} ({report['cpus']} CPUs), {report['date']}, "
        f"1-minute load {report['load_1min_before']:.1f} before, {report['load_1min_after']:.1f} after"
    )
    if report["busy_warning"]:
        print(report["busy_warning"])
    if scenarios:
        serving.print_table(report["serving"])
    if args.items:
        items.print_tables(report["items"])
    write_json(report, args.json)
    if args.chart:
        charts = [
            (serving.write_chart, report.get("serving"), args.chart),
            (items.write_chart, report.get("items"), items_chart_path(args.chart)),
        ]
        for write, part, path in charts:
            if part is not None:
                print(f"wrote {path}" if write(part, path) else "no chart: matplotlib is not installed")
    serving_report = report.get("serving", {})
    return 0 if serving_report.get("identical_outputs", True) and serving_report.get("device_ok", True) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="lazymedia bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
