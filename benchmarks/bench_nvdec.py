"""NVDEC against the CPU path on all cores, for the same sampled frames (needs an NVIDIA GPU; part of
bench_gpu.py, or alone):

  * 10 s 1080p clips (H.264, and HEVC), 32 frames sampled by vLLM's rule from each: per-clip latency
    (p50 / max) and aggregate frames/s with 1, 8 and 64 clips in flight, through DecodeEngine (NVDEC
    as its batch decoder; the CPU path: the engine's isolated workers on every core);
  * every frame of 8 concurrent 1080p H.264 clips: aggregate frames/s;
  * torchcodec's CUDA decoder as a column where it is installed, else "did not run: why";
  * a backend that falls back to the CPU for a clip is reported "fell back: reason", never a crash;
  * verdict lines for the issue's goals.

  * every frame is asked with a decode limit that holds it (10 s of 1080p is 1.7 GiB, over the
    default 1 GiB); a warm-up that fails is that row's failure, never the section's;
  * --quick (gpu_check.sh's check): 4 s clips, 2 distinct a codec, HEVC at 8 clips only, the
    CPU path's 64-clip cell at 16 clips (its clips/s is the figure compared);
  * beside the table: NVDEC's sessions and caps, decoders created against clips decoded (reuse),
    demux time per clip, the device memory NVDEC took outside torch's allocator;
  * --rehearse: the same code paths without a GPU, PyNvVideoCodec replaced by
    lazymedia.benchmarking.rehearsal's FFmpeg stand-in on the CPU, clips 8x smaller a side and
    2 s long; timing verdicts read REHEARSAL.

    python benchmarks/bench_nvdec.py [--json PATH [--merge]] [--quick] [--rehearse]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import lazymedia
from lazymedia import synthetic
from lazymedia.benchmarking import rehearsal
from lazymedia.benchmarking.harness import write_json

CONCURRENCY = [1, 8, 64]
SAMPLED = 32
DISTINCT = 4  # distinct clips per codec, cycled to fill 64 (encoding 64 distinct 10 s 1080p clips takes minutes)
GOALS = {"speedup_64": 3.0, "every_frame_fps": 3000.0}
SECONDS, QUICK_SECONDS, REHEARSAL_SECONDS = 10, 4, 2
QUICK_CPU_CLIPS = 16  # --quick: the CPU path's 64-clip cell decodes this many (its clips/s is compared)
# Every frame of a clip is more than the default decode limit (1 GiB: 10 s of 1080p is 1.7 GiB):
# the every-frame case asks with this one.
EVERY_FRAME_LIMITS = lazymedia.Limits(max_decoded_bytes=4 << 30)


def clips(codec: str, seconds: int, count: int, rehearse: bool = False) -> list[bytes]:
    """`count` distinct 1080p clips of `seconds` s at 30 fps, a keyframe every second (a
    rehearsal's: rehearsal.scaled)."""
    encoder, preset = ("libx264", "veryfast") if codec == "h264" else ("libx265", "ultrafast")
    height, width = rehearsal.scaled(1080, 1920, rehearse)
    return [
        synthetic.video(frames=seconds * 30, height=height, width=width, gop=30, codec=encoder, preset=preset, seed=k)
        for k in range(count)
    ]


def limits_for(num_frames: int | None) -> lazymedia.Limits:
    """The decode limits a case asks with: the default for sampled frames, EVERY_FRAME_LIMITS for all."""
    return EVERY_FRAME_LIMITS if num_frames is None else lazymedia.DEFAULT_LIMITS


def handles(datas: list[bytes], concurrency: int, num_frames: int | None) -> list:
    return [
        lazymedia.load_video(datas[k % len(datas)], num_frames=num_frames, limits=limits_for(num_frames))
        for k in range(concurrency)
    ]


def run_clips(engine, datas: list[bytes], concurrency: int, num_frames: int | None) -> dict:
    """`concurrency` clips submitted at once: seconds until each is decoded, and the frames."""
    items = handles(datas, concurrency, num_frames)
    done: list[float] = []
    lock = threading.Lock()
    start = time.perf_counter()

    def finished(_future) -> None:
        with lock:
            done.append(time.perf_counter() - start)

    futures = [engine.submit(item) for item in items]
    for future in futures:
        future.add_done_callback(finished)
    frames = sum(int(future.result().frames.shape[0]) for future in futures)
    wall = time.perf_counter() - start
    return {
        "clips": concurrency,
        "frames": frames,
        "wall_s": wall,
        "frames_per_s": frames / wall,
        "clips_per_s": concurrency / wall,
        "latency_p50_ms": statistics.median(done) * 1e3,
        "latency_max_ms": max(done) * 1e3,
    }


def torchcodec_column():
    """torchcodec's CUDA decoder, one call per clip on a thread each; (decode, None) or (None, why)."""
    try:
        import torch
        from torchcodec.decoders import VideoDecoder
    except Exception as exc:
        return None, f"torchcodec is not installed here ({type(exc).__name__}: {exc})"
    from lazymedia.codecs import sample_indices, sampling_source

    def decode(datas: list[bytes], concurrency: int, num_frames: int | None) -> dict:
        items = handles(datas, concurrency, num_frames)
        wanted = [sample_indices(sampling_source(item.header), item.spec) for item in items]
        done: list[float] = []
        start = time.perf_counter()

        def one(k: int) -> int:
            decoder = VideoDecoder(datas[k % len(datas)], device="cuda", seek_mode="exact")
            count = int(decoder.get_frames_at(wanted[k]).data.shape[0])
            torch.cuda.current_stream().synchronize()
            done.append(time.perf_counter() - start)
            return count

        with ThreadPoolExecutor(min(concurrency, 16)) as pool:
            frames = sum(pool.map(one, range(concurrency)))
        wall = time.perf_counter() - start
        return {
            "clips": concurrency,
            "frames": frames,
            "wall_s": wall,
            "frames_per_s": frames / wall,
            "clips_per_s": concurrency / wall,
            "latency_p50_ms": statistics.median(done) * 1e3,
            "latency_max_ms": max(done) * 1e3,
        }

    return decode, None


def measured(label: str, fn, backend=None) -> dict:
    """One table cell: fn()'s result, "fell back: reasons" where the backend sent clips to the
    CPU meanwhile, or "failed: error" (the table goes on)."""
    before = len(backend.fallbacks) if backend is not None else 0
    try:
        row = fn()
    except Exception as exc:
        print(f"  {label}: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return {"status": f"failed: {type(exc).__name__}: {exc}"}
    if backend is not None and len(backend.fallbacks) > before:
        reasons = sorted(set(list(backend.fallbacks)[before:]))
        row["status"] = "fell back: " + "; ".join(reasons)[:300]
    else:
        row["status"] = "ok"
    print(
        f"  {label}: {row['frames_per_s']:8.0f} frames/s, p50 {row['latency_p50_ms']:7.1f} ms [{row['status']}]",
        file=sys.stderr,
    )
    return row


def bench(
    quick: bool, device: int | str = 0, video_codec=None, seconds: int | None = None, rehearse: bool = False
) -> dict:
    """The NVDEC section: rows of (codec, frames asked, concurrency) x (nvdec, cpu, torchcodec).
    rehearse: on the CPU through the FFmpeg stand-in of PyNvVideoCodec (device and video_codec
    are then the rehearsal's)."""
    from lazymedia.codecs import demux
    from lazymedia.engine import NvdecBatchDecoder

    if rehearse:
        device, video_codec = "cpu", rehearsal.video_codec(caps=True)
    seconds = seconds or (REHEARSAL_SECONDS if rehearse else QUICK_SECONDS if quick else SECONDS)
    memory_before = rehearsal.device_memory(f"cuda:{device}" if isinstance(device, int) else device)
    try:
        backend = NvdecBatchDecoder(device=device, video_codec=video_codec)
    except Exception as exc:  # no PyNvVideoCodec / driver: the section says so
        return {"unavailable": f"{type(exc).__name__}: {exc}", "rehearsal": rehearse}
    cpus = len(os.sched_getaffinity(0))
    gpu_engine = lazymedia.DecodeEngine(max_workers=cpus, batch_decoders=[backend])
    # the CPU path on every core: as many isolation workers as cores (the process-wide pool has fewer)
    cpu_engine = lazymedia.DecodeEngine(max_workers=cpus, isolation_workers=cpus)
    cpu_engine.warm_up()
    torchcodec, torchcodec_missing = (None, f"not run in a {rehearsal.MARK}") if rehearse else torchcodec_column()
    distinct = 2 if quick else DISTINCT
    report: dict = {
        "clip_seconds": seconds,
        "sampled": SAMPLED,
        "distinct_clips": distinct,
        "cpus": cpus,
        "sessions": backend.sessions,
        "caps": backend.caps_note,
        "rehearsal": rehearse,
        "clip_size": "x".join(map(str, rehearsal.scaled(1080, 1920, rehearse)[::-1])),
        "torchcodec": torchcodec_missing or "ran",
        "rows": [],
    }
    # every frame of one clip (one session: its rate against 8 clips' shows what the host waits cost)
    cases = [("h264", SAMPLED, level) for level in CONCURRENCY] + [("h264", None, 1), ("h264", None, 8)]
    cases += [("hevc", SAMPLED, level) for level in ([8] if quick else CONCURRENCY)]
    sources = {codec: clips(codec, seconds, distinct, rehearse) for codec in ("h264", "hevc")}
    demux_ms = []
    for data in sources["h264"] + sources["hevc"]:
        frames = lazymedia.load_video(data).header.total_frames
        begin = time.perf_counter()
        demux(data, frames)
        demux_ms.append((time.perf_counter() - begin) * 1e3)
    report["demux_ms_per_clip"] = statistics.median(demux_ms)
    clips_to_nvdec = 0
    for codec, num_frames, level in cases:
        datas = sources[codec]
        label = f"{codec} {'every frame' if num_frames is None else f'{num_frames} sampled'} x{level}"
        row: dict = {"codec": codec, "frames_asked": num_frames or "all", "concurrency": level}
        warm = measured(
            f"{label} nvdec warm-up", lambda: run_clips(gpu_engine, datas, min(level, 8), num_frames), backend
        )  # decoders built, engines up; a failure is this row's, not the section's
        clips_to_nvdec += min(level, 8)
        if warm["status"].startswith("failed"):
            row["nvdec"] = {"status": f"warm-up {warm['status']}"}
        else:
            row["nvdec"] = measured(f"{label} nvdec", lambda: run_clips(gpu_engine, datas, level, num_frames), backend)
            clips_to_nvdec += level
        cpu_level = min(level, QUICK_CPU_CLIPS) if quick else level
        row["cpu"] = measured(f"{label} cpu", lambda: run_clips(cpu_engine, datas, cpu_level, num_frames))
        if torchcodec is not None:
            row["torchcodec"] = measured(f"{label} torchcodec", lambda: torchcodec(datas, level, num_frames))
        else:
            row["torchcodec"] = {"status": f"did not run: {torchcodec_missing}"}
        report["rows"].append(row)
    report["nvdec_outside_torch_bytes"] = rehearsal.outside_torch(
        memory_before, rehearsal.device_memory(backend.device)
    )  # the sessions' decoders are still alive
    gpu_engine.shutdown()
    cpu_engine.shutdown()
    backend.close()
    report["fallbacks"] = sorted(set(backend.fallbacks))
    report["videos_decoded_on_nvdec"] = backend.decoded
    report["clips_to_nvdec"] = clips_to_nvdec
    report["decoders_created"] = backend.decoders_created
    report["clips_on_reused_decoders"] = backend.clips_on_reused_decoders
    report["packets_fed"], report["packets_skipped"] = backend.packets_fed, backend.packets_skipped
    report["verdicts"] = verdicts(report)
    return report


def _cell(rows: list[dict], codec: str, asked, level: int, column: str) -> dict:
    return next(
        (r[column] for r in rows if (r["codec"], r["frames_asked"], r["concurrency"]) == (codec, asked, level)), {}
    )


def verdicts(report: dict) -> list[str]:
    """One line per goal of issue 31: PASS / FAIL with the measured figure (a timing goal in a
    rehearsal: REHEARSAL), or why it is unknown."""
    rows, lines = report["rows"], []

    def judged(ok: bool) -> str:
        return rehearsal.judged(ok, report.get("rehearsal", False))

    fallbacks = report["fallbacks"]
    lines.append(
        f"{'PASS' if not fallbacks else 'FAIL'} 0 NVDEC fallbacks on the bench's clips "
        f"(got {len(fallbacks)}: {'; '.join(fallbacks)[:200]})"
    )
    gpu, cpu = _cell(rows, "h264", SAMPLED, 64, "nvdec"), _cell(rows, "h264", SAMPLED, 64, "cpu")
    if "clips_per_s" in gpu and "clips_per_s" in cpu:
        ratio = gpu["clips_per_s"] / cpu["clips_per_s"]
        lines.append(
            f"{judged(ratio >= GOALS['speedup_64'])} 64 clips x {SAMPLED} sampled, 1080p H.264: "
            f"NVDEC {gpu['clips_per_s']:.1f} clips/s = {ratio:.2f}x the CPU path's {cpu['clips_per_s']:.1f} "
            f"({cpu['clips']} clips) "
            f"(goal >= {GOALS['speedup_64']:.0f}x) [{gpu['status']}]"
        )
    else:
        lines.append(f"UNKNOWN 64-clip speedup: nvdec {gpu.get('status')}, cpu {cpu.get('status')}")
    gpu, cpu = _cell(rows, "h264", SAMPLED, 1, "nvdec"), _cell(rows, "h264", SAMPLED, 1, "cpu")
    if "latency_p50_ms" in gpu and "latency_p50_ms" in cpu:
        ok = gpu["latency_p50_ms"] <= cpu["latency_p50_ms"]
        lines.append(
            f"{judged(ok)} one clip alone: NVDEC {gpu['latency_p50_ms']:.0f} ms vs CPU "
            f"{cpu['latency_p50_ms']:.0f} ms (goal: no worse) [{gpu['status']}]"
        )
    else:
        lines.append(f"UNKNOWN one-clip latency: nvdec {gpu.get('status')}, cpu {cpu.get('status')}")
    gpu = _cell(rows, "h264", "all", 8, "nvdec")
    if "frames_per_s" in gpu:
        ok = gpu["frames_per_s"] >= GOALS["every_frame_fps"]
        lines.append(
            f"{judged(ok)} every frame, 8 clips of 1080p H.264: {gpu['frames_per_s']:.0f} "
            f"frames/s (goal >= {GOALS['every_frame_fps']:.0f}) [{gpu['status']}]"
        )
    else:
        lines.append(f"UNKNOWN every-frame throughput: {gpu.get('status')}")
    hevc = [r for r in rows if r["codec"] == "hevc"]
    measured_hevc = [r for r in hevc if "clips_per_s" in r["nvdec"] and "clips_per_s" in r["cpu"]]
    if measured_hevc:
        lines.append(
            "INFO HEVC 1080p: "
            + ", ".join(
                f"x{r['concurrency']} {r['nvdec']['clips_per_s'] / r['cpu']['clips_per_s']:.2f}x the CPU "
                f"[{r['nvdec']['status']}]"
                for r in measured_hevc
            )
            + (f" [{rehearsal.MARK}]" if report.get("rehearsal") else "")
        )
    else:
        lines.append("UNKNOWN HEVC 1080p: " + ", ".join(str(r["nvdec"].get("status")) for r in hevc))
    return lines


def table(report: dict) -> list[str]:
    """The printed NVDEC table and its verdicts."""
    if "unavailable" in report:
        return [f"NVDEC unavailable: {report['unavailable']}"]
    lines = [
        f"NVDEC vs the CPU path ({report['cpus']} CPUs), {report['clip_seconds']} s 1080p clips "
        f"({report['distinct_clips']} distinct a codec, cycled), {report['sessions']} sessions, "
        f"caps: {report['caps']}",
        f"{'codec':5s} {'frames':>7s} {'clips':>5s} | {'nvdec f/s':>9s} {'p50 ms':>7s} | {'cpu f/s':>8s} "
        f"{'p50 ms':>7s} | {'ratio':>5s} | {'torchcodec f/s':>14s} | status",
    ]
    for row in report["rows"]:
        gpu, cpu, tc = row["nvdec"], row["cpu"], row["torchcodec"]
        ratio = gpu["frames_per_s"] / cpu["frames_per_s"] if "frames_per_s" in gpu and "frames_per_s" in cpu else None
        lines.append(
            f"{row['codec']:5s} {str(row['frames_asked']):>7s} {row['concurrency']:5d} | "
            f"{gpu.get('frames_per_s', float('nan')):9.0f} {gpu.get('latency_p50_ms', float('nan')):7.1f} | "
            f"{cpu.get('frames_per_s', float('nan')):8.0f} {cpu.get('latency_p50_ms', float('nan')):7.1f} | "
            f"{ratio if ratio is not None else float('nan'):5.2f} | "
            f"{tc.get('frames_per_s', float('nan')):14.0f} | nvdec {gpu['status']}; cpu {cpu['status']}; "
            f"torchcodec {tc['status']}"
        )
    mark = f" [{rehearsal.MARK}]" if report.get("rehearsal") else ""
    one, eight = (_cell(report["rows"], "h264", "all", level, "nvdec").get("frames_per_s") for level in (1, 8))
    if one and eight:
        lines.append(
            f"NVDEC every frame of 1080p H.264: one clip (one session) {one:.0f} frames/s, 8 clips "
            f"{eight:.0f} frames/s ({eight / one:.1f}x on {min(8, report['sessions'])} sessions){mark}"
        )
    lines.append(
        f"NVDEC sessions {report['sessions']}, {report['decoders_created']} decoders created for "
        f"{report['clips_to_nvdec']} clips ({report['clips_on_reused_decoders']} on a reused decoder), "
        f"{report['videos_decoded_on_nvdec']} decoded on NVDEC, {report['packets_fed']} packets fed, "
        f"{report['packets_skipped']} skipped; demux {report['demux_ms_per_clip']:.1f} ms a clip; "
        f"device memory outside torch's allocator "
        f"{report['nvdec_outside_torch_bytes'] / 2**20:.0f} MiB{mark}"
    )
    return lines + ["VERDICT " + line for line in report["verdicts"]]


def merge(path: str, report: dict) -> None:
    """`report` as the "nvdec" part of the JSON report at `path` (a new one where there is none)."""
    try:
        with open(path) as f:
            whole = json.load(f)
    except (OSError, ValueError):
        whole = {}
    whole["nvdec"] = report
    write_json(whole, path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json")
    parser.add_argument(
        "--merge",
        action="store_true",
        help='write the report as the "nvdec" part of the JSON already at --json (bench_gpu\'s)',
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rehearse", action="store_true", help="no GPU: the FFmpeg stand-in, figures marked REHEARSAL")
    args = parser.parse_args(argv)
    if args.merge and args.json:  # a mark first: a step stopped at its budget leaves it saying so
        merge(args.json, {"status": "did not finish: the NVDEC section was still running"})
    report = bench(args.quick, rehearse=args.rehearse)
    if args.merge and args.json:
        merge(args.json, report)
    else:
        write_json(report, args.json)
    print("\n".join(table(report)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
