"""Device probe (grew out of the project's shared/gpu-probes/nvjpeg_nvdec_probe.py; the device run
carries only the repository, so gpu_check.sh runs this one):

(B) PyNvVideoCodec's bare decoder fed as lazymedia's NVDEC backend feeds it (CreateDecoder, then
    Decode(PacketData) of every packet in decode order, the parameter sets before the first, each
    packet with its container PTS and CUVID_PKT_TIMESTAMP, an empty packet to flush), on an MP4
    whose edit list discards a pre-roll keyframe and on FFmpeg's default B-frame MP4: per frame,
    the PTS fed and the PTS returned, whether the container presents it, and its PSNR against the
    CPU decode of the frame with that PTS; the decoder's creation time; a PASS / FAIL line per clip.
    gpu_check.sh runs B in its first look, right after the build.
(A) nvjpegDecodeBatched timed directly (ctypes; NVJ=libnvjpeg.so.13), the hardware backend at
    512^2, 1080p and 4K and the default (hybrid) backend at 512^2 only, x planar / interleaved
    output x flags 0 (torchvision's), 32 (INTERPOLATION) and 36 (STRICT | INTERPOLATION, lazymedia's)
    x pageable / pinned input, beside torchvision on the same blobs: nvJPEG's own costs apart from
    the library's sequencing.

    python benchmarks/nvjpeg_nvdec_probe.py [B] [A] [--rehearse]

--rehearse: no GPU; PyNvVideoCodec, libnvjpeg and torchvision are lazymedia.benchmarking.rehearsal's
CPU stand-ins, sizes 8x smaller a side, and every line is marked REHEARSAL.
"""

from __future__ import annotations

import argparse
import ctypes as c
import io
import os
import sys
import time
import traceback

import numpy as np
import torch

import lazymedia
from lazymedia import ops, synthetic
from lazymedia.benchmarking import rehearsal
from lazymedia.benchmarking.harness import encode, psnr

# nvjpegBackend_t, and the flags of nvjpegCreateEx
HARDWARE, DEFAULT = 3, 0
FLAGS = {0: "none (torchvision's)", 32: "INTERPOLATION", 36: "STRICT|INTERPOLATION (lazymedia's)"}
A_CASES = [
    ("512x512", (512, 512), (HARDWARE, DEFAULT)),
    ("1920x1080", (1080, 1920), (HARDWARE,)),
    ("3840x2160", (2160, 3840), (HARDWARE,)),
]
BACKEND_NAMES = {HARDWARE: "HARDWARE", DEFAULT: "DEFAULT"}
B_CASES = {"edit list, discarded pre-roll keyframe": {"preroll": 2}, "B-frames, FFmpeg's default edit list": {}}
MIN_DB = 40.0


def timed(fn, sync, repeats: int = 5) -> float:
    fn()
    sync()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        seconds.append(time.perf_counter() - start)
    return sorted(seconds)[repeats // 2]


def part_b(rehearse: bool) -> bool:
    """The PTS round trip through the bare decoder; True when every clip's passes."""
    import av

    from lazymedia.codecs import demux

    mark = f" [{rehearsal.MARK}]" if rehearse else ""
    if rehearse:
        nvc, device, stream = rehearsal.video_codec(), torch.device("cpu"), 0
    else:
        import PyNvVideoCodec as nvc

        device = torch.device("cuda", 0)
        torch.cuda.init()
        stream = torch.cuda.current_stream(device).cuda_stream
        print("PyNvVideoCodec", getattr(nvc, "__version__", "?"), flush=True)
    height, width = rehearsal.scaled(360, 640, rehearse)
    passed = True
    for name, options in B_CASES.items():
        try:
            data = synthetic.video(frames=30, height=height, width=width, gop=12, **options)
            header = lazymedia.load_video(data).header
            demuxed = demux(data, header.total_frames)
            if demuxed is None:
                raise RuntimeError("lazymedia's demux cannot identify the frames")
            with av.open(io.BytesIO(data)) as container:
                cpu = {frame.pts: frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)}
            start = time.perf_counter()
            decoder = nvc.CreateDecoder(
                gpuid=0,
                codec=nvc.cudaVideoCodec.H264,
                cudacontext=0,
                cudastream=stream,
                usedevicememory=True,
                maxwidth=1920,
                maxheight=1088,
            )
            created_ms = (time.perf_counter() - start) * 1e3
            returned: list[tuple[int, float | None]] = []

            def take(frames) -> None:
                for frame in frames:
                    pts = int(frame.getPTS())
                    surface = torch.from_dlpack(frame)
                    rgb = (
                        ops.nv12_frames_to_rgb(
                            surface[None],
                            surface.shape[0] * 2 // 3,
                            surface.shape[1],
                            header.color_matrix,
                            header.full_range,
                        )[0]
                        .cpu()
                        .numpy()
                    )
                    returned.append((pts, psnr(rgb, cpu[pts]) if pts in cpu else None))
                rehearsal.synchronize(device)  # the decoder reuses its surfaces at the next call

            start = time.perf_counter()
            for position, payload in enumerate(demuxed.payloads):
                buffer = np.frombuffer((demuxed.prefix if position == 0 else b"") + payload, dtype=np.uint8)
                packet = nvc.PacketData()
                packet.bsl_data, packet.bsl, packet.pts = buffer.ctypes.data, buffer.size, demuxed.pts[position]
                packet.bDiscontinuity = position == 0
                packet.decode_flag = nvc.VideoPacketFlag.TIMESTAMP
                take(decoder.Decode(packet))
            flush = nvc.PacketData()
            flush.bsl_data, flush.bsl = 0, 0
            flush.decode_flag = nvc.VideoPacketFlag.ENDOFSTREAM
            take(decoder.Decode(flush))
            decode_ms = (time.perf_counter() - start) * 1e3
            fed, presented = demuxed.pts, demuxed.table.pts
            got = [pts for pts, _ in returned]
            print(
                f"B {name}: {len(fed)} packets fed, {len(got)} frames returned, the container presents "
                f"{len(presented)}; decoder created in {created_ms:.1f} ms, decoded in {decode_ms:.1f} ms{mark}",
                flush=True,
            )
            print(f"   fed PTS (decode order)   {fed}", flush=True)
            print(f"   returned PTS (in order)  {got}", flush=True)
            print(f"   presented PTS (container) {presented}", flush=True)
            for k, (pts, db) in enumerate(returned):
                where = f"frame {presented.index(pts)}" if pts in presented else "not presented (pre-roll)"
                score = "no CPU frame" if db is None else f"{db:.1f} dB vs the CPU frame of that PTS"
                print(
                    f"   returned {k:2d}: PTS {pts:6d} fed {'yes' if pts in fed else 'NO'}, {where}, {score}",
                    flush=True,
                )
            shown = [pts for pts in got if pts in presented]
            scores = [db for pts, db in returned if pts in presented and db is not None]
            problems = []
            if set(presented) - set(got):
                problems.append(f"never returned {sorted(set(presented) - set(got))[:8]}")
            if set(got) - set(fed):
                problems.append(f"returned PTS no packet carried {sorted(set(got) - set(fed))[:8]}")
            if shown != sorted(shown):
                problems.append("presented frames out of display order")
            if scores and min(scores) < MIN_DB:
                problems.append(f"min {min(scores):.1f} dB < {MIN_DB:.0f}")
            ok = not problems
            passed = passed and ok
            print(
                f"PROBE B PTS round trip ({name}): {'PASS' if ok else 'FAIL'} {len(shown)} of {len(presented)} "
                f"presented frames returned with their PTS, {len(got) - len(shown)} pre-roll, min "
                f"{min(scores) if scores else float('nan'):.1f} dB{'; ' + '; '.join(problems) if problems else ''}"
                f"{mark}",
                flush=True,
            )
        except Exception:
            passed = False
            traceback.print_exc()
            print(f"PROBE B PTS round trip ({name}): FAIL (the probe raised, above){mark}", flush=True)
    return passed


class Img(c.Structure):  # nvjpegImage_t
    _fields_ = [("channel", c.c_void_p * 4), ("pitch", c.c_size_t * 4)]


def part_a(rehearse: bool) -> None:
    mark = f" [{rehearsal.MARK}]" if rehearse else ""
    if rehearse:
        library, device, stream = rehearsal.NvjpegLibrary(), torch.device("cpu"), 0

        def torchvision(tensors):
            return rehearsal.torchvision_decode_jpeg(tensors, device="cpu")
    else:
        from torchvision.io import decode_jpeg

        library, device = c.CDLL(os.environ["NVJ"]), torch.device("cuda", 0)
        stream = torch.cuda.current_stream(device).cuda_stream

        def torchvision(tensors):
            return decode_jpeg(tensors, device="cuda")

    repeats = 1 if rehearse else 5

    def sync() -> None:
        rehearsal.synchronize(device)

    batch = 64
    for label, size, backends in A_CASES:
        h, w = rehearsal.scaled(*size, rehearse)
        blobs = [encode(synthetic.photo(h, w, seed=i), "JPEG") for i in range(8)]
        chunk = [blobs[i % 8] for i in range(batch)]
        tensors = [torch.frombuffer(bytearray(x), dtype=torch.uint8) for x in chunk]
        tv = timed(lambda: torchvision(tensors), sync, repeats)
        print(f"A {label} b{batch} torchvision {batch / tv:8.0f} img/s{mark}", flush=True)
        buffers = [c.create_string_buffer(x, len(x)) for x in chunk]
        pageable = (c.c_void_p * batch)(*[c.addressof(b) for b in buffers])
        lengths = (c.c_size_t * batch)(*[len(x) for x in chunk])
        pinned_copies = [t.clone().pin_memory() if not rehearse else t.clone() for t in tensors]
        pinned = (c.c_void_p * batch)(*[p.data_ptr() for p in pinned_copies])
        for backend in backends:
            for fmt, fname in ((3, "RGB"), (5, "RGBI")):
                for flags in FLAGS:
                    where = f"  {label} {BACKEND_NAMES[backend]:8s} {fname:4s} flags={flags:2d}"
                    try:
                        handle, state = c.c_void_p(), c.c_void_p()
                        status = library.nvjpegCreateEx(backend, None, None, flags, c.pointer(handle))
                        if status:
                            print(f"{where}: create {status}{mark}", flush=True)
                            continue
                        assert library.nvjpegJpegStateCreate(handle, c.pointer(state)) == 0
                        status = library.nvjpegDecodeBatchedInitialize(handle, state, batch, 16, fmt)
                        if status:
                            print(f"{where}: init {status}{mark}", flush=True)
                            continue
                        images = (Img * batch)()
                        if fmt == 3:
                            outs = [torch.empty((3, h, w), dtype=torch.uint8, device=device) for _ in range(batch)]
                            for i, out in enumerate(outs):
                                for ch in range(3):
                                    images[i].channel[ch], images[i].pitch[ch] = out[ch].data_ptr(), w
                        else:
                            outs = [torch.empty((h, w, 3), dtype=torch.uint8, device=device) for _ in range(batch)]
                            for i, out in enumerate(outs):
                                images[i].channel[0], images[i].pitch[0] = out.data_ptr(), w * 3
                        for source, sname in ((pageable, "pageable"), (pinned, "pinned")):
                            status_box = [0]

                            def run(source=source):
                                status_box[0] = library.nvjpegDecodeBatched(
                                    handle, state, source, lengths, images, c.c_void_p(stream)
                                )

                            seconds = timed(run, sync, repeats)
                            print(
                                f"{where} {sname:8s}: {batch / seconds:8.0f} img/s  rc={status_box[0]}  "
                                f"ratio_tv={tv / seconds:.2f}{mark}",
                                flush=True,
                            )
                        library.nvjpegJpegStateDestroy(state)
                        library.nvjpegDestroy(handle)
                    except Exception:
                        traceback.print_exc()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("parts", nargs="*", default=["B", "A"], help="B (PTS round trip), A (nvjpegDecodeBatched)")
    parser.add_argument("--rehearse", action="store_true", help="no GPU: the CPU stand-ins, lines marked REHEARSAL")
    args = parser.parse_args(argv)
    parts = "".join(args.parts).upper()
    print("torch", torch.__version__, flush=True)
    ok = True
    if "B" in parts:  # first: the question the last run could not answer
        ok = part_b(args.rehearse)
    if "A" in parts:
        part_a(args.rehearse)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
