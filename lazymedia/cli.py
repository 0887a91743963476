"""The `lazymedia` command: bench (the main job), decode, info, hash-threads.

Exit codes: 0 everything worked; 1 some input was bad media (or could not be fetched), each
reported on one `error:` line; 2 a usage error (bad options, an unavailable backend); 141
(128 + SIGPIPE, as shell tools report it) when the reader of the output went away
(`lazymedia info | head -1`), which ends the command quietly.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from . import __version__
from .bench import add_arguments as add_bench_arguments
from .bench import positive_float, positive_int
from .engine import BACKENDS, Fallback
from .errors import InvalidMediaError, MediaError

if TYPE_CHECKING:  # the commands import what they use when they run
    from .connector import MediaConnector
    from .engine import BatchDecoder
    from .media import LazyMedia

EXIT_OK, EXIT_BAD_MEDIA, EXIT_USAGE, EXIT_CLOSED_PIPE = 0, 1, 2, 141
_URL_SCHEMES = ("http", "https", "data", "file")


def _read(source: str, connector: MediaConnector) -> bytes:
    """The bytes of a path or URL, read once (a URL is downloaded once, whatever it holds)."""
    from .media import read_file

    if urlsplit(source).scheme in _URL_SCHEMES:
        return connector.download_sync(source)
    return read_file(source)


def _settings(modality: str, args: argparse.Namespace) -> dict[str, Any]:
    """The spec settings the command line asks of `modality`."""
    if modality == "image":
        return {"size": args.size}
    if modality == "video":
        sampled = (
            {"num_frames": None}
            if args.all_frames
            else {"fps": args.fps}
            if args.fps
            else {"num_frames": args.num_frames}
        )
        return {"size": args.size, **sampled}
    return {"sample_rate": args.sample_rate, "mono": args.mono}


def _load(source: str, args: argparse.Namespace, connector: MediaConnector) -> LazyMedia[Any]:
    """A LazyMedia for a path or URL: the bytes are read once, probed once to tell the modality
    (unless --modality says it), then loaded, so a bomb is a 413 and not a guess that failed."""
    from .codecs import guess_modality
    from .media import load

    data = _read(source, connector)
    modality = args.modality or guess_modality(data)
    if modality is None:
        raise InvalidMediaError(
            "not an image, video or audio file lazymedia reads (--modality says which one it is, if it is)"
        )
    return load(modality, data, **_settings(modality, args))


# `decoded` below is what `media` decoded to: a tensor, VideoFrames or AudioSamples by its modality.
def _save(media: LazyMedia[Any], decoded: Any, out_dir: Path, stem: str) -> str:
    import numpy as np
    from PIL import Image

    out_dir.mkdir(parents=True, exist_ok=True)
    if media.modality == "image":
        array = decoded.cpu().numpy()
        path = out_dir / f"{stem}.png"
        Image.fromarray(array[:, :, 0] if array.shape[2] == 1 else array).save(path)
    elif media.modality == "video":
        path = out_dir / f"{stem}_frames.npz"
        np.savez_compressed(
            path,
            frames=decoded.frames.numpy(),
            indices=np.array(decoded.indices),
            timestamps=np.array(decoded.timestamps),
        )
    else:
        import soundfile

        path = out_dir / f"{stem}.wav"
        soundfile.write(path, decoded.samples.numpy().T, decoded.sample_rate)
    return str(path)


def _shape(media: LazyMedia[Any], decoded: Any) -> str:
    if media.modality == "image":
        return "x".join(str(d) for d in decoded.shape)
    if media.modality == "video":
        return "x".join(str(d) for d in decoded.frames.shape) + f" frames {decoded.indices[:3]}..."
    return "x".join(str(d) for d in decoded.samples.shape) + f" @ {decoded.sample_rate} Hz"


def _shorten(source: str, limit: int = 80) -> str:
    """data: URLs are megabytes long; a log line needs their head only."""
    return source if len(source) <= limit else source[: limit - 3] + "..."


def _image_backend(name: str) -> BatchDecoder | str | None:
    """The batched image backend for --backend (None = the CPU decoder), or the reason it is
    unavailable as a string."""
    from .engine import backends

    if name == "cpu":
        return None
    status = {b.name: b for b in backends() if b.modality == "image"}
    candidates = ["nvjpeg"] if name == "auto" else [name]
    for candidate in candidates:
        if status[candidate].available:
            if candidate == "nvjpeg":
                from .engine import NvjpegBatchDecoder

                return NvjpegBatchDecoder(device=0)
            import torch

            from .engine import DaliBatchDecoder

            return DaliBatchDecoder(device="gpu" if torch.cuda.is_available() else "cpu")
    return None if name == "auto" else f"backend {name} is unavailable: {status[name].reason}"


def _decode_with(media: LazyMedia[Any], backend: BatchDecoder | None) -> tuple[Any, str]:
    """Decodes through `backend` when it takes the item, else on the CPU; (result, backend name)."""
    if backend is not None and backend.accepts(media):
        (result,) = backend.decode_batch([media])
        if isinstance(result, Fallback):  # handed back: the CPU decodes it, as a DecodeEngine would
            return media.decode(), "cpu"
        if isinstance(result, BaseException):
            raise result
        return result, backend.name
    return media.decode(), "cpu"


def cmd_decode(args: argparse.Namespace) -> int:
    from .connector import MediaConnector

    backend = _image_backend(args.backend)
    if isinstance(backend, str):
        print(f"error: {backend}", file=sys.stderr)
        return EXIT_USAGE
    failures = 0
    # A command-line user fetches what they name: no SSRF guard, any local file.
    connector = MediaConnector(allow_private_networks=True, allowed_local_path="/")
    try:
        for source in args.sources:
            try:
                media = _load(source, args, connector)
                start = time.perf_counter()
                decoded, used = _decode_with(media, backend)
                elapsed = (time.perf_counter() - start) * 1e3
                line = (
                    f"{_shorten(source)}: {media.modality} key={media.key[:16]} "
                    f"shape={_shape(media, decoded)} backend={used} decode={elapsed:.1f} ms"
                )
                if args.out:
                    stem = Path(urlsplit(source).path).stem or "media"
                    line += f" -> {_save(media, decoded, Path(args.out), stem)}"
                print(line)
            except MediaError as exc:
                failures += 1
                print(f"error: {_shorten(source)}: {exc.operator_message} (HTTP {exc.status_code})", file=sys.stderr)
    finally:
        connector.close()
    return EXIT_BAD_MEDIA if failures else EXIT_OK


def _size(text: str) -> tuple[int, int]:
    from .spec import MAX_SIDE

    try:
        height, width = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"size must be HEIGHTxWIDTH, got {text!r}") from None
    if not (0 < height <= MAX_SIDE and 0 < width <= MAX_SIDE):
        raise argparse.ArgumentTypeError(f"size sides must be in 1..{MAX_SIDE}, got {text!r}")
    return height, width


def _frame_count(text: str) -> int:
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (--all-frames decodes every frame)") from None


def _opencv_line() -> str:
    try:
        import cv2
    except ImportError:
        return "  OpenCV: not installed (decoder='opencv' needs pip install opencv-python-headless)"
    return f"  OpenCV: {cv2.__version__} (decoder='opencv' available)"


def cmd_info(args: argparse.Namespace) -> int:
    from . import _C
    from .engine import backends

    print(f"lazymedia {__version__}")
    print(f"  native core: {_C.__file__}")
    try:
        from . import _C_cuda
        from .engine import wheel_library

        print(f"  CUDA extension: built for {_C_cuda.arches()}")
        versions = _C_cuda.versions(wheel_library())  # nvJPEG, its cudart, ours, the driver's CUDA
        print("  versions: " + ", ".join(f"{name} {value}" for name, value in versions.items()))
    except ImportError:
        print("  CUDA extension: not built (no nvcc at build time, or LAZYMEDIA_CUDA=0)")
    print(_opencv_line())
    pinned, reason = _C.pinned_memory_available()
    print(f"  pinned host buffers: {'yes' if pinned else 'no (' + reason + ')'}")
    found = backends()
    nvjpeg = next(b for b in found if b.name == "nvjpeg")
    if nvjpeg.available:
        import torch

        from .engine import NvjpegBatchDecoder

        gpu = torch.cuda.get_device_name(0)
        try:  # info reports a broken nvJPEG (missing libnvjpeg, old driver); it never fails on it
            decoder = NvjpegBatchDecoder(device=0)
        except Exception as exc:
            print(f"  GPU: {gpu}, nvJPEG unusable: {type(exc).__name__}: {exc}")
        else:
            print(
                f"  GPU: {gpu}, nvJPEG hardware engines: {decoder.engines} ({decoder.cores_per_engine} cores each)"
                if decoder.hardware
                else f"  GPU: {gpu}, no nvJPEG hardware engines (hybrid decoding)"
            )
            print(f"  nvJPEG chroma upsampling: {'interpolated' if decoder.upsampling_interpolated else 'replicated'}")
            print("  nvJPEG creation:")  # why the hardware backend was or was not taken
            for line in decoder.creation_log.splitlines():
                print(f"    {line}")
    else:
        print(f"  GPU: none usable ({nvjpeg.reason})")
    print("backends:")
    for backend in found:
        state = "available" if backend.available else "unavailable"
        print(f"  {backend.modality:5s} {backend.name:7s} {state:11s} {backend.reason}")
    return 0


def cmd_hash_threads(args: argparse.Namespace) -> int:
    """Measures the crossover `args.runs` times and advises a setting only when every run agrees
    on a quiet machine (docs/benchmarks.md: one run on a busy machine is noise)."""
    from .benchmarking.harness import busy_warning
    from .hashing import THRESHOLD_VARIABLE, measure_crossover, multithread_min_bytes

    results = [measure_crossover() for _ in range(args.runs)]
    print(f"{'size':>8s} " + " ".join(f"{f'run {n + 1} one/all ms':>21s}" for n in range(len(results))))
    for size in results[0]["medians_s"]:
        print(
            f"{size >> 20:5d} MiB "
            + " ".join(
                f"{r['medians_s'][size]['one'] * 1e3:10.2f}/{r['medians_s'][size]['all'] * 1e3:<10.2f}" for r in results
            )
        )
    settings = ["never" if r["crossover_bytes"] is None else str(r["crossover_bytes"]) for r in results]
    now = str(multithread_min_bytes() or "never")
    print(
        f"{results[0]['cores']} cores: hashing on all cores pays from {', '.join(settings)} bytes "
        f"(one figure per run); now: {now}"
    )
    busy = busy_warning()
    if busy is not None:
        print(f"{busy}: nothing to set from this measurement; rerun on a quiet machine")
    elif len(set(settings)) > 1:
        print("the runs disagree, so the machine is too noisy to tell: keep the current setting")
    elif settings[0] == now:
        print("every run agrees with the current setting: nothing to change")
    else:
        print(f"every run agrees: to use it, export {THRESHOLD_VARIABLE}={settings[0]}")
    return EXIT_OK


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench import run

    return run(args)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lazymedia", description="Lazy, cache-aware media decoding.")
    parser.add_argument("--version", action="version", version=f"lazymedia {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser(
        "bench",
        help="the serving win: requests through a real HF processor, vLLM 0.33's "
        "path vs lazymedia per scenario (table, JSON, PNG)",
        epilog="exit codes: 0 ok, 1 eager and lazy outputs differ, 2 usage (transformers missing)",
    )
    add_bench_arguments(bench)
    bench.set_defaults(run=cmd_bench)
    decode = sub.add_parser(
        "decode",
        help="decode files or URLs; print key, shape, backend, time",
        epilog="exit codes: 0 ok, 1 some input was bad media, 2 usage error, 141 the output pipe closed",
    )
    decode.add_argument(
        "sources",
        nargs="+",
        metavar="FILE_OR_URL",
        help="files, or http(s), data: or file: URLs (fetched without the SSRF guard)",
    )
    decode.add_argument(
        "--backend",
        choices=(*(name for modality, name in BACKENDS if modality == "image"), "auto"),
        default="auto",
        help="image decoder: auto (nvJPEG where a GPU is usable, else the CPU), or one by name",
    )
    decode.add_argument("--modality", choices=("image", "video", "audio"), help="default: told by the content")
    decode.add_argument("--out", help="directory for the decoded output (PNG, NPZ of frames, WAV)")
    decode.add_argument("--size", type=_size, metavar="HxW", help="resize images and video frames")
    frames = decode.add_mutually_exclusive_group()
    frames.add_argument("--num-frames", type=_frame_count, default=8, help="video: sample this many frames (default 8)")
    frames.add_argument(
        "--fps", type=positive_float, help="video: sample at this rate instead (at most 32 frames, vLLM's rule)"
    )
    frames.add_argument("--all-frames", action="store_true", help="video: decode every frame")
    decode.add_argument("--sample-rate", type=positive_int, help="audio: resample to this rate (Hz)")
    decode.add_argument(
        "--mono",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="audio: average the channels, as load_audio does by default (--no-mono keeps them)",
    )
    decode.set_defaults(run=cmd_decode)
    hash_threads = sub.add_parser("hash-threads", help="measure from which size hashing on all cores pays here")
    hash_threads.add_argument(
        "--runs",
        type=positive_int,
        default=3,
        help="independent measurements; a setting is advised only when all agree (default 3)",
    )
    hash_threads.set_defaults(run=cmd_hash_threads)
    info = sub.add_parser("info", help="version, build, backends and devices")
    info.set_defaults(run=cmd_info)
    args = parser.parse_args(argv)
    try:
        code: int = args.run(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader closed the pipe: send what is left to /dev/null so that the interpreter's
        # final flush does not fail again, and end quietly.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_CLOSED_PIPE
    return code
