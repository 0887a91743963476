"""Hostile input within the limits, generated in the test: every item is refused with 413 before
anything big is allocated, or decodes with peak memory close to its output
(peak RSS growth <= 1.25 x output bytes + 32 MB). Each case runs in a child interpreter under an
address-space cap, so a regression fails the test instead of taking the machine's memory."""
import json
import subprocess
import sys
import textwrap

import pytest

REFUSED_GROWTH = 64 << 20
DECODE_SLACK = 32 << 20
CAP_BYTES = 6 << 30  # address space the child may add after its imports

CHILD = """
import json, resource, sys, time
import numpy, torch, av, soundfile, PIL.Image
import lazymedia
from lazymedia import samples

def status(name):
    for line in open("/proc/self/status"):
        if line.startswith(name + ":"):
            return int(line.split()[1]) * 1024

def output_bytes(media):
    for field in ("frames", "samples"):
        if hasattr(media, field):
            return getattr(media, field).numel() * getattr(media, field).element_size()
    return media.numel() * media.element_size()

{setup}
limit = status("VmSize") + {cap}
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # peak RSS (VmHWM) restarts from the current RSS
before = status("VmRSS")
start = time.perf_counter()
try:
    media = ({load}).media
    report = {{"outcome": "decoded", "output_bytes": output_bytes(media)}}
except lazymedia.MediaError as exc:
    report = {{"outcome": "refused", "status": exc.status_code, "error": str(exc)}}
except BaseException as exc:
    report = {{"outcome": "untyped", "error": f"{{type(exc).__name__}}: {{exc}}"}}
report["seconds"] = time.perf_counter() - start
report["peak_growth"] = status("VmHWM") - before
print(json.dumps(report))
"""


def run_capped(setup: str, load: str) -> dict:
    """Runs `setup` (which builds `data`), then `load` (an expression giving a LazyMedia) and its
    decode in a child under the address-space cap; returns what happened and the peak RSS growth."""
    code = CHILD.format(setup=textwrap.dedent(setup), load=load, cap=CAP_BYTES)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def assert_bounded(report: dict, refused_status: int | None = None) -> None:
    assert report["outcome"] != "untyped", report
    if report["outcome"] == "refused":
        assert refused_status is not None and report["status"] == refused_status, report
        assert report["peak_growth"] < REFUSED_GROWTH, report
    else:
        assert refused_status is None, report
        assert report["peak_growth"] <= 1.25 * report["output_bytes"] + DECODE_SLACK, report


BLACK_1080P_MP4 = """
import io as _io
buf = _io.BytesIO()
with av.open(buf, mode="w", format="mp4") as out:
    stream = out.add_stream("libx264", rate=30, options={"preset": "ultrafast", "crf": "51"})
    stream.width, stream.height, stream.pix_fmt = 1920, 1080, "yuv420p"
    black = av.VideoFrame.from_ndarray(numpy.zeros((1080, 1920, 3), numpy.uint8), format="rgb24")
    for _ in range(300):
        for packet in stream.encode(black):
            out.mux(packet)
    for packet in stream.encode():
        out.mux(packet)
data = buf.getvalue()
assert len(data) < 64 << 10, len(data)
"""

SILENT_FLAC_8CH = """
import io as _io
buf = _io.BytesIO()
with soundfile.SoundFile(buf, "w", samplerate=44100, channels=8, format="FLAC", subtype="PCM_16") as f:
    block = numpy.zeros((44100, 8), numpy.int16)
    for _ in range(300):
        f.write(block)
data = buf.getvalue()
assert len(data) < 1 << 20, len(data)
"""

WAV_256CH_1HZ = """
import io as _io
buf = _io.BytesIO()
soundfile.write(buf, numpy.zeros((1800, 256), numpy.int16), 1, format="WAV", subtype="PCM_16")
data = buf.getvalue()
assert len(data) < 1 << 20, len(data)
"""

ZERO_PNG_10000 = """
data = samples.encode_image(numpy.zeros((10000, 10000, 3), numpy.uint8), "PNG")
assert len(data) < 400 << 10, len(data)
"""

PADDED_WEBP_10000 = """
import struct as _struct
raw = samples.encode_image(numpy.zeros((10000, 10000, 3), numpy.uint8), "WEBP", lossless=True, quality=0, method=0)
body = raw[12:] + b"JUNK" + _struct.pack("<I", 200000) + bytes(200000)  # padding that defeats ratio checks
data = b"RIFF" + _struct.pack("<I", 4 + len(body)) + b"WEBP" + body
"""

ZERO_GIF_6000 = """
data = samples.encode_image(numpy.zeros((6000, 6000), numpy.uint8), "GIF")
assert len(data) < 1 << 20, len(data)
"""

CASES = {
    # A 1x1 GIF whose canvas says 65535 x 65535: refused from its header.
    "gif_canvas_bomb": ("data = bytearray(samples.encode_image(numpy.zeros((1, 1), numpy.uint8), 'GIF'))\n"
                        "data[6:10] = b'\\xff\\xff\\xff\\xff'",
                        "lazymedia.load_image(bytes(data))", 413),
    # 292 KB of PNG: 10000 x 10000 zeros, 300 MB decoded (within the goal; Pillow's path took 4x).
    "zero_png_10000": (ZERO_PNG_10000, "lazymedia.load_image(data)", None),
    # A lossless WebP of the same canvas, padded with a 200 KB JUNK chunk, as RGB and as RGBA.
    "padded_webp_10000_rgb": (PADDED_WEBP_10000, "lazymedia.load_image(data)", None),
    "padded_webp_10000_rgba": (PADDED_WEBP_10000, "lazymedia.load_image(data, mode='RGBA')", None),
    # A GIF (Pillow's path, exported in slabs): 6000 x 6000 of zeros.
    "zero_gif_6000": (ZERO_GIF_6000, "lazymedia.load_image(data)", None),
    # The PNG asked for 4x its size: refused from the header, whatever the file's size.
    "zero_png_10000_upscaled": (ZERO_PNG_10000, "lazymedia.load_image(data, size=(20000, 20000))", 413),
    # 22 KB of H.264: 300 black 1080p frames, no sampling asked: 1.9 GB of frames, refused from the header.
    "black_1080p_mp4_every_frame": (BLACK_1080P_MP4, "lazymedia.load_video(data, num_frames=None)", 413),
    # The same clip sampled: 8 frames decode within the goal.
    "black_1080p_mp4_8_frames": (BLACK_1080P_MP4, "lazymedia.load_video(data, num_frames=8)", None),
    # A few hundred KB of FLAC: 300 s of 8-channel silence, 423 MB decoded: within the goal.
    "silent_flac_8_channels_300s": (SILENT_FLAC_8CH, "lazymedia.load_audio(data)", None),
    # 0.9 MB of WAV: 256 channels at 1 Hz, asked for 16 kHz: 29 GB, refused before the resampler allocates.
    "wav_256_channels_1hz_to_16khz": (WAV_256CH_1HZ, "lazymedia.load_audio(data, sample_rate=16000, mono=False)", 413),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_input_is_bounded(case):
    setup, load, refused = CASES[case]
    assert_bounded(run_capped(setup, load), refused)
