"""Writes the small real files of tests/data and their MANIFEST.tsv (the external corpus's
columns), each made by a real encoder: libjpeg (Pillow), libpng, libwebp, giflib-compatible
Pillow GIF, libx264 through PyAV, libsndfile. Run from the repository root:
`python tests/data/make.py`; the files are committed, so tests never run this."""

import csv
import io
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import soundfile
from PIL import Image

HERE = Path(__file__).resolve().parent
COLUMNS = ["path", "source_repo", "source_path", "commit", "bytes", "kind", "format", "expected", "notes"]


def picture(width, height, seed=0, noise=12):
    """Smooth gradients plus a little noise: compresses like a photo, a few KB at this size."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), (x + y) * 127 // (width + height)], -1)
    return np.clip(rgb + rng.integers(-noise, noise + 1, rgb.shape), 0, 255).astype(np.uint8)


def jpeg(image, **options):
    buf = io.BytesIO()
    image.save(buf, "JPEG", **options)
    return buf.getvalue()


def encoded(image, fmt, **options):
    buf = io.BytesIO()
    image.save(buf, fmt, **options)
    return buf.getvalue()


def oriented(orientation):
    exif = Image.Exif()
    exif[0x0112] = orientation
    return jpeg(Image.fromarray(picture(48, 32, orientation)), quality=90, exif=exif.tobytes())


def palette_with_transparency():
    image = Image.fromarray(picture(40, 24, 7)).quantize(16)
    return encoded(image, "PNG", transparency=0)


def animated_gif():
    frames = [Image.fromarray(picture(32, 24, i)).quantize(32) for i in range(3)]
    return encoded(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)


def clip(frames=30, pre_roll=False):
    """An H.264 MP4 of 64x48; with pre_roll, its first sample is an edit list's pre-roll (pts -1:
    decoded, never shown)."""
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=30, options={"preset": "ultrafast", "bf": "0", "g": "10"})
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        stream.codec_context.time_base = Fraction(1, 30)
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(picture(64, 48, i, noise=2), format="rgb24")
            frame.pts, frame.time_base = i - (1 if pre_roll else 0), Fraction(1, 30)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def tone(fmt, seconds=0.5, rate=8000, channels=2, subtype=None):
    t = np.arange(int(seconds * rate)) / rate
    samples = np.stack([np.sin(2 * np.pi * 440 * (c + 1) * t) * 0.3 for c in range(channels)], -1).astype(np.float32)
    buf = io.BytesIO()
    soundfile.write(buf, samples, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


FILES = [  # path, format, expected, notes, bytes
    (
        "image/cmyk.jpg",
        "jpeg",
        "decodes",
        "CMYK JPEG (Adobe APP14), Pillow/libjpeg",
        lambda: jpeg(Image.fromarray(picture(48, 32, 1)).convert("CMYK"), quality=90),
    ),
    (
        "image/orientation_6.jpg",
        "jpeg",
        "decodes",
        "EXIF orientation 6 (rotate 90 CW), 48x32 stored",
        lambda: oriented(6),
    ),
    ("image/orientation_3.jpg", "jpeg", "decodes", "EXIF orientation 3 (rotate 180)", lambda: oriented(3)),
    (
        "image/progressive.jpg",
        "jpeg",
        "decodes",
        "progressive JPEG, 4:2:0",
        lambda: jpeg(Image.fromarray(picture(48, 32, 2)), quality=85, progressive=True),
    ),
    (
        "image/gray16.png",
        "png",
        "decodes",
        "16-bit grayscale PNG (mode I;16)",
        lambda: encoded(Image.fromarray(picture(40, 24, 3)[..., 0].astype(np.uint16) * 257), "PNG"),
    ),
    (
        "image/palette_trns.png",
        "png",
        "decodes",
        "palette PNG with a transparent index (tRNS)",
        palette_with_transparency,
    ),
    (
        "image/rgba.webp",
        "webp",
        "decodes",
        "lossless WebP with alpha",
        lambda: encoded(
            Image.fromarray(np.dstack([picture(40, 24, 4), np.full((24, 40), 128, np.uint8)])), "WEBP", lossless=True
        ),
    ),
    ("image/animated.gif", "gif", "decodes", "3-frame animated GIF", animated_gif),
    (
        "image/truncated.jpg",
        "jpeg",
        "corrupt",
        "a baseline JPEG cut to half its bytes",
        lambda: (lambda data: data[: len(data) // 2])(jpeg(Image.fromarray(picture(48, 32, 5)), quality=90)),
    ),
    ("video/h264.mp4", "mp4", "decodes", "H.264 64x48, 30 frames at 30 fps, keyframe every 10", lambda: clip(30)),
    (
        "video/pre_roll.mp4",
        "mp4",
        "decodes",
        "H.264 MP4 whose first sample is an edit list's pre-roll: 29 frames shown",
        lambda: clip(30, pre_roll=True),
    ),
    (
        "video/truncated.mp4",
        "mp4",
        "corrupt",
        "the H.264 MP4 cut to half its bytes (moov at the end: lost)",
        lambda: (lambda data: data[: len(data) // 2])(clip(30)),
    ),
    ("audio/tone.flac", "flac", "decodes", "FLAC 8000 Hz stereo 0.5 s, libsndfile", lambda: tone("FLAC")),
    ("audio/tone.wav", "wav", "decodes", "PCM 16-bit WAV 8000 Hz stereo 0.5 s", lambda: tone("WAV", subtype="PCM_16")),
    ("audio/tone.ogg", "ogg", "decodes", "Ogg Vorbis 8000 Hz stereo 0.5 s", lambda: tone("OGG")),
    (
        "audio/broken.flac",
        "flac",
        "corrupt",
        "a FLAC with its STREAMINFO zeroed past the block header",
        lambda: (lambda data: data[:8] + bytes(34) + data[42:])(tone("FLAC", seconds=0.3)),
    ),
    (
        "audio/truncated.flac",
        "flac",
        "corrupt",
        "a FLAC cut to 60% of its bytes",
        lambda: (lambda data: data[: len(data) * 3 // 5])(tone("FLAC", seconds=0.5)),
    ),
]


def main():
    rows = []
    for path, fmt, expected, notes, make in FILES:
        data = make()
        (HERE / path).parent.mkdir(parents=True, exist_ok=True)
        (HERE / path).write_bytes(data)
        kind = path.split("/")[0]
        rows.append(
            {
                "path": path,
                "source_repo": "lazymedia",
                "source_path": "tests/data/make.py",
                "commit": "",
                "bytes": len(data),
                "kind": kind,
                "format": fmt,
                "expected": expected,
                "notes": notes,
            }
        )
    with open(HERE / "MANIFEST.tsv", "w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS, delimiter="\t", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
