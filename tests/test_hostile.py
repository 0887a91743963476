"""Hostile input within the limits, generated in the test: every item is refused with 413 before
anything big is allocated, or decodes with peak memory close to its output
(peak RSS growth <= 1.25 x output bytes + 32 MB, plus the working memory its header declares and
Limits.max_working_bytes bounds: a progressive JPEG's coefficients). Each case runs in a child interpreter under an
address-space cap, so a regression fails the test instead of taking the machine's memory; cases
that cost CPU where the decoder works (repeated scans, chained IFDs) are also bounded in CPU
seconds."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REFUSED_GROWTH = 64 << 20
DECODE_SLACK = 32 << 20
REFUSED_CPU_SECONDS = 0.1  # a refusal reads headers only (the bombs below cost 28-63 s where they were decoded)
CAP_BYTES = 6 << 30  # address space the child may add after its imports

CHILD = """
import json, resource, sys, time
import numpy, torch, av, soundfile, PIL.Image
import lazymedia
import lazymedia.codecs._audio, lazymedia.codecs._image, lazymedia.codecs._video  # imports are not the item's cost
from lazymedia import synthetic

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
cpu_start = time.process_time()
try:
    item = {load}
    media = item.media
    report = {{"outcome": "decoded", "output_bytes": output_bytes(media),
               "working_bytes": getattr(item.header, "working_bytes", 0)}}
except lazymedia.MediaError as exc:
    report = {{"outcome": "refused", "status": exc.status_code, "error": str(exc)}}
except BaseException as exc:
    report = {{"outcome": "untyped", "error": f"{{type(exc).__name__}}: {{exc}}"}}
report["seconds"] = time.perf_counter() - start
report["cpu_seconds"] = time.process_time() - cpu_start
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
        assert report["cpu_seconds"] < REFUSED_CPU_SECONDS, report
    else:
        assert refused_status is None, report
        assert report["peak_growth"] <= 1.25 * report["output_bytes"] + report["working_bytes"] + DECODE_SLACK, report


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
data = synthetic.encode_image(numpy.zeros((10000, 10000, 3), numpy.uint8), "PNG")
assert len(data) < 400 << 10, len(data)
"""

PADDED_WEBP_10000 = """
import struct as _struct
raw = synthetic.encode_image(numpy.zeros((10000, 10000, 3), numpy.uint8), "WEBP", lossless=True, quality=0, method=0)
body = raw[12:] + b"JUNK" + _struct.pack("<I", 200000) + bytes(200000)  # padding that defeats ratio checks
data = b"RIFF" + _struct.pack("<I", 4 + len(body)) + b"WEBP" + body
"""

ZERO_GIF_6000 = """
data = synthetic.encode_image(numpy.zeros((6000, 6000), numpy.uint8), "GIF")
assert len(data) < 1 << 20, len(data)
"""

# -- bombs the output size does not show: the cost is in the decoder's own work -----------------
MP4_60M_SAMPLES = """
import io as _io, struct as _struct
def boxes(data):
    at, out = 0, []
    while at + 8 <= len(data):
        size, kind = _struct.unpack(">I4s", data[at:at + 8])
        out.append((kind, data[at + 8:at + size]))
        at += size
    return out
def rewrite(data, edit):
    out = b""
    for kind, payload in boxes(data):
        nested = kind in (b"moov", b"trak", b"mdia", b"minf", b"stbl")
        payload = rewrite(payload, edit) if nested else edit(kind, payload)
        if payload is not None:
            out += _struct.pack(">I4s", 8 + len(payload), kind) + payload
    return out
buf = _io.BytesIO()
with av.open(buf, mode="w", format="mp4") as out:
    stream = out.add_stream("mpeg4", rate=25)
    stream.width, stream.height, stream.pix_fmt = 16, 16, "yuv420p"
    frame = av.VideoFrame.from_ndarray(numpy.zeros((16, 16, 3), numpy.uint8), format="rgb24")
    for packet in [*stream.encode(frame), *stream.encode()]:
        out.mux(packet)
SAMPLES = 60_000_000  # one constant-size sample, declared 60 M times
TABLES = {b"stsz": _struct.pack(">IIII", 0, 1, SAMPLES, 0)[:12], b"stts": _struct.pack(">IIII", 0, 1, SAMPLES, 1),
          b"stsc": _struct.pack(">IIIII", 0, 1, 1, SAMPLES, 1), b"stss": None, b"ctts": None}
data = rewrite(buf.getvalue(), lambda kind, payload: TABLES.get(kind, payload))
assert len(data) < 2048 and av.open(_io.BytesIO(data)).streams.video[0].frames == SAMPLES
"""

WAV_65407_CHANNELS = """
import struct as _struct
channels, rate = 65407, 65535  # libsndfile refuses over 1024 channels; FFmpeg reads the header
align = channels * 2 & 0xFFFF  # 16-bit samples: the block alignment overflows its field, FFmpeg does not mind
data = (b"RIFF" + _struct.pack("<I", 36) + b"WAVE" + b"fmt " + _struct.pack("<IHHIIHH", 16, 1, channels, rate,
        rate * align, align, 16) + b"data" + _struct.pack("<I", 0))
assert len(data) == 44
"""

WAV_1024_CHANNELS = """
import io as _io
buf = _io.BytesIO()
soundfile.write(buf, numpy.zeros((16000, 1024), numpy.int16), 16000, format="WAV", subtype="PCM_16")
data = buf.getvalue()
"""

WAV_64_CHANNELS = """
import io as _io
buf = _io.BytesIO()
soundfile.write(buf, (numpy.arange(48000 * 64) % 2000 - 1000).astype(numpy.int16).reshape(48000, 64), 48000,
                format="WAV", subtype="PCM_16")
data = buf.getvalue()
"""

JPEG_500_SCANS = """
import io as _io
def segments(jpeg):
    # (start, end) of each marker segment, a scan's entropy-coded data included
    at, out = 2, []
    while at < len(jpeg):
        marker, start = jpeg[at + 1], at
        at += 2 if marker == 0xD9 else 2 + int.from_bytes(jpeg[at + 2:at + 4], "big")
        if marker == 0xDA:
            while not (jpeg[at] == 0xFF and jpeg[at + 1] not in (0, *range(0xD0, 0xD8))):
                at += 1
        out.append((marker, start, at))
    return out
buf = _io.BytesIO()
PIL.Image.fromarray(numpy.zeros((4096, 4096), numpy.uint8)).save(buf, "JPEG", progressive=True, quality=90)
jpeg = buf.getvalue()
parts = segments(jpeg)
last_scan = max(i for i, (marker, _, _) in enumerate(parts) if marker == 0xDA)
table = parts[last_scan - 1] if parts[last_scan - 1][0] == 0xC4 else parts[last_scan]
repeat = jpeg[table[1]:parts[last_scan][2]]  # the last scan with its Huffman table
data = jpeg[:parts[-1][1]] + repeat * 500 + b"\\xff\\xd9"
"""

PROGRESSIVE_JPEG_10000 = """
import io as _io
buf = _io.BytesIO()
PIL.Image.fromarray(numpy.zeros((10000, 10000, 3), numpy.uint8)).save(buf, "JPEG", progressive=True, quality=90)
data = buf.getvalue()
"""

PROGRESSIVE_JPEG_3300 = """
import io as _io
buf = _io.BytesIO()
noise = numpy.random.default_rng(0).integers(0, 256, (3300, 3300, 3), numpy.uint8)
PIL.Image.fromarray(noise).save(buf, "JPEG", progressive=True, quality=90)
data = buf.getvalue()
"""

PROGRESSIVE_4600 = PROGRESSIVE_JPEG_10000.replace("10000, 10000", "4600, 4600")
STRICT = "lazymedia.Limits(max_working_bytes=32 << 20)"

TIFF_80K_IFDS = """
import struct as _struct
# IFDs of three entries each (width, height, strip offset: a 1x1 bilevel page), each pointing to
# the next; the last points nowhere.
count, header = 80_000, 8
def ifd(at, last):
    entries = b"".join(_struct.pack("<HHII", tag, 4, 1, value) for tag, value in ((256, 1), (257, 1), (273, 0)))
    return _struct.pack("<H", 3) + entries + _struct.pack("<I", 0 if last else at + 42)
data = b"II*\\x00" + _struct.pack("<I", header) + b"".join(ifd(header + 42 * i, i == count - 1) for i in range(count))
"""

TIFF_GRAY_10000 = """
import io as _io
buf = _io.BytesIO()
PIL.Image.fromarray(numpy.zeros((10000, 10000), numpy.uint8)).save(buf, "TIFF", compression="tiff_deflate")
data = buf.getvalue()
assert len(data) < 1 << 20, len(data)
"""

FLAC_50K_COMMENTS = r"""
import struct as _struct
flac = synthetic.tone(0.5, fmt="flac")
assert flac[:4] == b"fLaC" and flac[4] & 0x7F == 0  # STREAMINFO first
entries = b"".join(_struct.pack("<I", 7) + b"T=%05d" % i for i in range(50_000))
body = _struct.pack("<I", 6) + b"vendor" + _struct.pack("<I", 50_000) + entries
block = bytes([4]) + len(body).to_bytes(3, "big") + body  # VORBIS_COMMENT, not the last block
data = flac[:4] + bytes([flac[4] & 0x7F]) + flac[5:42] + block + flac[42:]
"""

MP3_100K_ID3_FRAMES = r"""
frames = b"".join(b"TXXX" + (3).to_bytes(4, "big") + b"\x00\x00" + b"\x00a\x00" for _ in range(100_000))
size = len(frames)
syncsafe = bytes([(size >> 21) & 0x7F, (size >> 14) & 0x7F, (size >> 7) & 0x7F, size & 0x7F])
data = b"ID3\x03\x00\x00" + syncsafe + frames + synthetic.tone(0.5, fmt="mp3")
"""

# A Matroska file whose Segment holds `parts` Tags elements of `entries` SimpleTags before its tracks.
MKV_TAGS = r"""
def element(element_id, payload):
    return element_id + (len(payload) | 1 << 56).to_bytes(8, "big") + payload  # 8-byte sizes
clip = synthetic.video(frames=8, height=64, width=64, container="matroska")
at = clip.index(b"\x18\x53\x80\x67") + 4 + 8  # the Segment's data (its size: 8 bytes)
simple = element(b"\x67\xc8", element(b"\x45\xa3", b"A") + element(b"\x44\x87", b"1"))
tags = element(b"\x12\x54\xc3\x67", element(b"\x73\x73", simple * {entries})) * {parts}
data = clip[:at - 8] + b"\x01\xff\xff\xff\xff\xff\xff\xff" + tags + clip[at:]  # the Segment's size: unknown
"""

PNG_ICCP_256MB = r"""
import zlib as _zlib
packer = _zlib.compressobj(9)
zeros = bytes(16 << 20)
profile = b"".join(packer.compress(zeros) for _ in range(16)) + packer.flush()  # 256 MiB of zeros, ~256 KB
body = b"icc\0\0" + profile
chunk = len(body).to_bytes(4, "big") + b"iCCP" + body + _zlib.crc32(b"iCCP" + body).to_bytes(4, "big")
png = synthetic.encode_image(numpy.zeros((64, 64, 3), numpy.uint8), "PNG")
data = png[:33] + chunk + png[33:]  # after IHDR
del zeros
"""

JPEG_10000_CUT = r"""
jpeg = bytearray(synthetic.jpeg(64, 64))
sof = jpeg.index(b"\xff\xc0")
jpeg[sof + 5:sof + 9] = (10000).to_bytes(2, "big") * 2  # the SOF's height and width
data = bytes(jpeg[:2048])  # 2 KB of a 10000 x 10000 JPEG
"""

PNG_10000_CUT = r"""
import zlib as _zlib
png = bytearray(synthetic.encode_image(numpy.zeros((64, 64, 3), numpy.uint8), "PNG"))
png[16:24] = (10000).to_bytes(4, "big") * 2  # IHDR's width and height
png[29:33] = _zlib.crc32(bytes(png[12:29])).to_bytes(4, "big")
data = bytes(png)
"""

APNG_10K_FRAMES_4K = r"""
import struct as _struct, zlib as _zlib

def chunk(kind, body):
    return _struct.pack(">I", len(body)) + kind + body + _struct.pack(">I", _zlib.crc32(kind + body))

width, height, frames = 3840, 2160, 10_000
parts = [b"\x89PNG\r\n\x1a\n", chunk(b"IHDR", _struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)),
         chunk(b"acTL", _struct.pack(">II", frames, 0)),
         chunk(b"fcTL", _struct.pack(">IIIIIHHBB", 0, width, height, 0, 0, 1, 30, 0, 0))]
packer = _zlib.compressobj(9)
rows = b"".join(packer.compress(b"\0" + bytes(width * 4)) for _ in range(height)) + packer.flush()
parts.append(chunk(b"IDAT", rows))
pixel = _zlib.compress(b"\0\xff\0\0\xff")
for i in range(1, frames):  # 1x1 frames, each painted on the whole canvas
    parts.append(chunk(b"fcTL", _struct.pack(">IIIIIHHBB", 2 * i - 1, 1, 1, i % 64, 0, 1, 30, 0, 0)))
    parts.append(chunk(b"fdAT", _struct.pack(">I", 2 * i) + pixel))
data = b"".join(parts + [chunk(b"IEND", b"")])
"""

PNG_64_ZTXT = r"""
import zlib as _zlib
body = b"k\0\0" + _zlib.compress(bytes(1 << 20), 9)  # 1 MiB of text: Pillow's limit for one chunk
chunk = len(body).to_bytes(4, "big") + b"zTXt" + body + _zlib.crc32(b"zTXt" + body).to_bytes(4, "big")
png = synthetic.encode_image(numpy.zeros((64, 64, 3), numpy.uint8), "PNG")
data = png[:33] + chunk * 64 + png[33:]
"""

BMP_RLE8_1500 = r"""
import struct as _struct
width, height = 1500, 1500
row = bytes([1, 0, 1, 1]) * (width // 2) + b"\0\0"  # 1-pixel runs, then the end of the line
pixels = row * height + b"\0\1"
palette = b"".join(bytes([i, 255 - i, i // 2, 0]) for i in range(256))
info = _struct.pack("<IiiHHIIiiII", 40, width, height, 1, 8, 1, len(pixels), 2835, 2835, 256, 0)
offset = 14 + len(info) + len(palette)
data = b"BM" + _struct.pack("<IHHI", offset + len(pixels), 0, 0, offset) + info + palette + pixels
"""

CASES = {
    # An RLE8 BMP of 1-pixel runs: Pillow's RLE decoder holds about 5 bytes a pixel besides the output,
    # declared as working memory (6 a pixel): decodes within it, and is refused under the strict limit.
    "bmp_rle8_1500": (BMP_RLE8_1500, "lazymedia.load_image(data)", None),
    "bmp_rle8_2500_strict": (
        BMP_RLE8_1500.replace("1500, 1500", "2500, 2500"),
        f"lazymedia.load_image(data, limits={STRICT})",
        413,
    ),
    # 700 KB of APNG: 10,000 1x1 frames on a 4K canvas; 8 frames sampled paint every canvas (47 CPU-s).
    "apng_10k_frames_on_4k": (APNG_10K_FRAMES_4K, "lazymedia.load_video(data, num_frames=8)", 413),
    # Truncated files whose headers declare 10000 x 10000: refused (422) before the 286 MB canvas.
    "jpeg_10000_cut_at_2kb": (JPEG_10000_CUT, "lazymedia.load_image(data)", 422),
    "png_10000_cut": (PNG_10000_CUT, "lazymedia.load_image(data)", 422),
    # A 64 x 64 PNG whose ICC profile inflates to 256 MiB: refused from an inflate that stops at 1 MiB.
    # The same bytes as zTXt and iTXt chunks; 64 zTXt chunks of 1 MiB each (Pillow alone allows 64 MiB).
    "png_ztxt_256mb": (
        PNG_ICCP_256MB.replace('b"iCCP"', 'b"zTXt"').replace('b"icc\\0\\0"', 'b"k\\0\\0"'),
        "lazymedia.load_image(data)",
        413,
    ),
    "png_itxt_256mb": (
        PNG_ICCP_256MB.replace('b"iCCP"', 'b"iTXt"').replace('b"icc\\0\\0"', 'b"k\\0\\1\\0\\0\\0"'),
        "lazymedia.load_image(data)",
        413,
    ),
    "png_64_ztxt_of_1mb": (PNG_64_ZTXT, "lazymedia.load_image(data)", 413),
    "png_iccp_256mb": (PNG_ICCP_256MB, "lazymedia.load_image(data)", 413),
    # 350 KB of FLAC Vorbis comments (50,000; FFmpeg's probe: 19 CPU-s): counted and refused before any parse.
    "flac_50k_vorbis_comments": (FLAC_50K_COMMENTS, "lazymedia.load_audio(data)", 413),
    # An MP3 behind an ID3v2 tag of 100,000 frames (FFmpeg's probe ran past 120 s).
    "mp3_100k_id3_frames": (MP3_100K_ID3_FRAMES, "lazymedia.load_audio(data)", 413),
    # A Matroska file whose Segment holds 100,000 SimpleTags before its tracks (ran past 120 s).
    "mkv_100k_tags": (MKV_TAGS.format(parts=1, entries=100_000), "lazymedia.load_video(data, num_frames=4)", 413),
    # Just under the cap (2000 entries in all, the file's own blocks, tags and frames included), the same files
    # decode.
    "flac_1990_vorbis_comments": (FLAC_50K_COMMENTS.replace("50_000", "1_990"), "lazymedia.load_audio(data)", None),
    "mp3_1990_id3_frames": (MP3_100K_ID3_FRAMES.replace("100_000", "1_990"), "lazymedia.load_audio(data)", None),
    # A 1x1 GIF whose canvas says 65535 x 65535: refused from its header.
    "gif_canvas_bomb": (
        "data = bytearray(synthetic.encode_image(numpy.zeros((1, 1), numpy.uint8), 'GIF'))\n"
        "data[6:10] = b'\\xff\\xff\\xff\\xff'",
        "lazymedia.load_image(bytes(data))",
        413,
    ),
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
    # 879 bytes of MP4 whose sample tables declare 60 M samples: refused before FFmpeg builds its index.
    "mp4_declaring_60m_samples": (MP4_60M_SAMPLES, "lazymedia.load_video(data, num_frames=4)", 413),
    # 44 bytes of WAV declaring 65,407 channels, resampled: over the channel cap, before soxr allocates.
    "wav_65407_channels_to_16khz": (WAV_65407_CHANNELS, "lazymedia.load_audio(data, sample_rate=16000)", 413),
    # 1024 channels of real samples: over the channel cap (its decode peaked at 3x the output).
    "wav_1024_channels": (WAV_1024_CHANNELS, "lazymedia.load_audio(data)", 413),
    # 64 channels, the cap, resampled: decodes within the goal, the resampler's state included.
    "wav_64_channels_to_16khz": (WAV_64_CHANNELS, "lazymedia.load_audio(data, sample_rate=16000, mono=False)", None),
    # A progressive JPEG with its last scan repeated 500 times: refused by the header probe's scan count.
    "jpeg_500_scans": (JPEG_500_SCANS, "lazymedia.load_image(data)", 413),
    # A progressive 10000 x 10000 JPEG: its coefficient buffer (300 MB) is over the working-memory limit.
    "progressive_jpeg_10000": (PROGRESSIVE_JPEG_10000, "lazymedia.load_image(data)", 413),
    # Under the strict working limit (32 MiB: decodes within 1.25 x output + 32 MB, coefficients included),
    # a progressive 3300 x 3300 JPEG of noise (33 MB of coefficients) decodes, a 4600 x 4600 one (64 MB) is
    # refused (decoded, it peaked at 2.0x its output).
    "progressive_jpeg_3300_strict": (PROGRESSIVE_JPEG_3300, f"lazymedia.load_image(data, limits={STRICT})", None),
    "progressive_jpeg_4600_strict": (PROGRESSIVE_4600, f"lazymedia.load_image(data, limits={STRICT})", 413),
    # Under the default (128 MiB), the 4600 x 4600 photo decodes, holding no more than its declared coefficients.
    "progressive_jpeg_4600": (PROGRESSIVE_4600, "lazymedia.load_image(data)", None),
    # A TIFF chaining 80,000 IFDs: refused from a bounded walk of the chain.
    "tiff_80k_ifds": (TIFF_80K_IFDS, "lazymedia.load_image(data)", 413),
    # A gray 10000 x 10000 TIFF asked for as RGB: widened in place (Pillow's image and the output never both held).
    "tiff_gray_10000_to_rgb": (TIFF_GRAY_10000, "lazymedia.load_image(data)", None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_input_is_bounded(case):
    setup, load, refused = CASES[case]
    assert_bounded(run_capped(setup, load), refused)


def test_the_fuzz_harness_tells_its_own_memory_error_from_a_decoder_crash():
    sys.path.insert(0, str(Path(__file__).parent / "fuzz"))
    try:
        import fuzz_api
    finally:
        sys.path.pop(0)
    own = 'Traceback (most recent call last):\n  File "fuzz_api.py", line 120, in child\nMemoryError\n'
    assert fuzz_api.harness_memory_death(1, own)
    assert not fuzz_api.harness_memory_death(-11, own)  # killed by SIGSEGV: a crash, whatever it printed
    assert not fuzz_api.harness_memory_death(
        1,
        "Fatal Python error: Aborted\n\nCurrent thread 0x1 (most recent "
        'call first):\n  File "codecs/_video.py", line 3 in decode\n',
    )
    assert not fuzz_api.harness_memory_death(1, "")
