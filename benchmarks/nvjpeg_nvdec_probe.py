"""Device probe (the project's shared/gpu-probes/nvjpeg_nvdec_probe.py, reformatted; the device run
carries only the repository, so gpu_check.sh runs this copy): (A) nvJPEG batched decode, backend x
output format x flags, vs torchvision, same blobs;
(B) PyNvVideoCodec: returned PTS vs container PTS and which CPU frame each NVDEC frame matches."""

import ctypes as c
import io
import os
import sys
import tempfile
import time
import traceback

import numpy as np
import torch

print("torch", torch.__version__, flush=True)


def t(f, n=5):
    f()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        s = time.perf_counter()
        f()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - s)
    return sorted(ts)[n // 2]


def partA():
    from torchvision.io import decode_jpeg

    from lazymedia import synthetic
    from lazymedia.benchmarking.harness import encode

    L = c.CDLL(os.environ["NVJ"])

    class Img(c.Structure):
        _fields_ = [("channel", c.c_void_p * 4), ("pitch", c.c_size_t * 4)]

    stream = torch.cuda.current_stream().cuda_stream
    for h, w in [(512, 512), (1080, 1920), (2160, 3840)]:
        blobs = [encode(synthetic.photo(h, w, seed=i), "JPEG") for i in range(8)]
        B = 64
        chunk = [blobs[i % 8] for i in range(B)]
        ts = [torch.frombuffer(bytearray(x), dtype=torch.uint8) for x in chunk]
        tv = t(lambda: decode_jpeg(ts, device="cuda"))
        print(f"{w}x{h} b{B} torchvision {B / tv:8.0f} img/s", flush=True)
        bufs = [c.create_string_buffer(x, len(x)) for x in chunk]
        ptrs = (c.c_void_p * B)(*[c.addressof(b) for b in bufs])
        lens = (c.c_size_t * B)(*[len(x) for x in chunk])
        # pinned copies of the same bitstreams
        pinned = [torch.frombuffer(bytearray(x), dtype=torch.uint8).pin_memory() for x in chunk]
        pptrs = (c.c_void_p * B)(*[p.data_ptr() for p in pinned])
        for backend, bname in ((3, "HARDWARE"), (0, "DEFAULT"), (2, "GPU_HYBRID")):
            for fmt, fname in ((3, "RGB"), (5, "RGBI")):
                for flags in (0, 32):
                    try:
                        hnd, st = c.c_void_p(), c.c_void_p()
                        s = L.nvjpegCreateEx(backend, None, None, flags, c.byref(hnd))
                        if s:
                            print(f"  {bname:10s} {fname:4s} flags={flags:2d}: create {s}", flush=True)
                            continue
                        assert L.nvjpegJpegStateCreate(hnd, c.byref(st)) == 0
                        s = L.nvjpegDecodeBatchedInitialize(hnd, st, B, 16, fmt)
                        if s:
                            print(f"  {bname:10s} {fname:4s} flags={flags:2d}: init {s}", flush=True)
                            continue
                        if fmt == 3:
                            outs = [torch.empty((3, h, w), dtype=torch.uint8, device="cuda") for _ in range(B)]
                            imgs = (Img * B)()
                            for i, o in enumerate(outs):
                                for ch in range(3):
                                    imgs[i].channel[ch] = o[ch].data_ptr()
                                    imgs[i].pitch[ch] = w
                        else:
                            outs = [torch.empty((h, w, 3), dtype=torch.uint8, device="cuda") for _ in range(B)]
                            imgs = (Img * B)()
                            for i, o in enumerate(outs):
                                imgs[i].channel[0] = o.data_ptr()
                                imgs[i].pitch[0] = w * 3
                        for src, sname in ((ptrs, "pageable"), (pptrs, "pinned")):
                            rc = [0]

                            def run():
                                rc[0] = L.nvjpegDecodeBatched(hnd, st, src, lens, imgs, c.c_void_p(stream))

                            sec = t(run)
                            print(
                                f"  {bname:10s} {fname:4s} flags={flags:2d} {sname:8s}: {B / sec:8.0f} img/s  "
                                f"rc={rc[0]}  ratio_tv={tv / sec:.2f}",
                                flush=True,
                            )
                        L.nvjpegJpegStateDestroy(st)
                        L.nvjpegDestroy(hnd)
                    except Exception:
                        traceback.print_exc()


def clip(opts, mux_opts, n=30, w=640, h=360):
    import av

    b = io.BytesIO()
    with av.open(b, "w", format="mp4", options=mux_opts) as ctr:
        s = ctr.add_stream("libx264", rate=30, options=opts)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        y, x = np.mgrid[0:h, 0:w]
        for i in range(n):
            a = np.stack(
                [(x * 2 + 17 * i) % 256, (y * 3 + 5 * i) % 256, ((x + y) // 2 + 40 * (i % 7)) % 256], -1
            ).astype(np.uint8)
            a[:, : 8 * (i + 1) % w] = 255
            for p in s.encode(av.VideoFrame.from_ndarray(a, format="rgb24")):
                ctr.mux(p)
        for p in s.encode():
            ctr.mux(p)
    return b.getvalue()


def partB():
    import av
    import PyNvVideoCodec as nvc

    from lazymedia import ops

    cases = {
        "x264 default (B-frames, edit list)": ({}, {}),
        "x264 bframes=0": ({"bf": "0"}, {}),
        "x264 B-frames, no edit list": ({}, {"use_editlist": "0"}),
    }
    for name, (opts, mux) in cases.items():
        try:
            data = clip(opts, mux)
            path = os.path.join(tempfile.gettempdir(), f"probe_{abs(hash(name))}.mp4")
            open(path, "wb").write(data)
            with av.open(io.BytesIO(data)) as ctr:
                st = ctr.streams.video[0]
                cpu = []
                cpts = []
                for f in ctr.decode(video=0):
                    cpu.append(f.to_ndarray(format="rgb24").astype(np.float64))
                    cpts.append(f.pts)
                tb = st.time_base
            d = nvc.SimpleDecoder(path, gpu_id=0, use_device_memory=True, output_color_type=nvc.OutputColorType.NATIVE)
            idx = list(range(len(cpu)))
            fr = d.get_batch_frames_by_index(idx)
            npts = [int(f.getPTS()) for f in fr]
            nv12 = torch.stack([torch.from_dlpack(f) for f in fr])
            torch.cuda.synchronize()
            rgb = ops.nv12_frames_to_rgb(nv12, 360, 640, "bt601", False).cpu().numpy().astype(np.float64)
            best = []
            for k in range(len(rgb)):
                sc = {
                    j: 10 * np.log10(255**2 / max(((rgb[k] - cpu[j]) ** 2).mean(), 1e-9))
                    for j in range(max(0, k - 2), min(len(cpu), k + 3))
                }
                j = max(sc, key=sc.get)
                best.append((j - k, round(sc[j], 1)))
            print(f"B {name}: tb={tb} frames cpu={len(cpu)} nvdec={len(fr)}", flush=True)
            print(f"   cpu pts  {cpts[:10]}", flush=True)
            print(f"   nvdec pts {npts[:10]}", flush=True)
            print(
                f"   nvdec frame k best matches cpu frame k+offset (offset, dB): {best[:10]} ... "
                f"all offsets {sorted(set(o for o, _ in best))} min dB {min(db for _, db in best)}",
                flush=True,
            )
            sub = [0, 4, 9, 13, 17, 21, 25, 29]
            fr2 = d.get_batch_frames_by_index(sub)
            print(
                f"   sampled {sub}: nvdec pts {[int(f.getPTS()) for f in fr2]} cpu pts {[cpts[i] for i in sub]}",
                flush=True,
            )
        except Exception:
            traceback.print_exc()


which = sys.argv[1] if len(sys.argv) > 1 else "AB"
if "B" in which:
    partB()
if "A" in which:
    partA()
