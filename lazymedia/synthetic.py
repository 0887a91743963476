"""Generated media for the benchmark, the examples and the tests: photo-like images, clips whose
frames can be told apart after lossy coding, and tones. Nothing is downloaded or shipped."""

from __future__ import annotations

import io
from fractions import Fraction
from typing import Any

import numpy as np


def photo(height: int, width: int, seed: int = 0) -> np.ndarray:
    """uint8 RGB [height, width, 3]: smooth gradients plus sensor-like noise, which compresses
    like a photo (a 2048^2 q90 JPEG is ~1-2 MB), unlike flat colour or pure noise."""
    rng = np.random.default_rng(seed)
    y = np.linspace(0, 1, height, dtype=np.float32)[:, None]
    x = np.linspace(0, 1, width, dtype=np.float32)[None, :]
    channels = [
        128 + 90 * np.sin(2 * np.pi * (3 * x + 2 * y + seed)),
        128 + 90 * np.cos(2 * np.pi * (2 * x - 4 * y)),
        255 * (x * y) + 0 * x,
    ]
    base = np.stack(channels, axis=2)
    return np.clip(base + rng.normal(0, 6, base.shape), 0, 255).astype(np.uint8)


def encode_image(array: np.ndarray, fmt: str = "JPEG", **save_options: Any) -> bytes:
    """`array` (HW or HWC uint8) encoded by Pillow; JPEG defaults to quality 90."""
    from PIL import Image

    if fmt.upper() == "JPEG":
        save_options.setdefault("quality", 90)
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, fmt, **save_options)
    return buf.getvalue()


def jpeg(height: int = 480, width: int = 640, seed: int = 0) -> bytes:
    """A photo-like JPEG (quality 90)."""
    return encode_image(photo(height, width, seed), "JPEG")


def video(
    frames: int = 60,
    height: int = 96,
    width: int = 160,
    fps: int = 30,
    gop: int = 12,
    codec: str = "libx264",
    container: str = "mp4",
    pix_fmt: str = "yuv420p",
    vfr: bool = False,
    preset: str = "ultrafast",
    seed: int = 0,
    preroll: int = 0,
) -> bytes:
    """A clip panning across a photo-like image, with a bright bar at row 3*i of frame i, so
    frames stay distinguishable after lossy coding; a keyframe every `gop` frames. With vfr,
    frame durations alternate 1 and 3 ticks of 1/(2*fps). `seed` picks another photo. `preroll`
    frames come before time 0 (in MP4, FFmpeg writes an edit list and its demuxer marks them
    discard: decoded as references, never presented)."""
    import av

    base = photo(height, width + frames * 4, seed)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container) as out:
        stream = out.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
        stream.codec_context.gop_size = gop
        if codec == "libx264":
            stream.options = {"preset": preset, "bf": "2"}
        elif codec == "libx265":
            stream.options = {"preset": preset}
        if vfr or preroll:
            stream.codec_context.time_base = Fraction(1, fps * 2)
        pts = -2 * preroll  # ticks of 1/(2*fps), two a frame
        for i in range(frames):
            image = np.ascontiguousarray(base[:, i * 4 : i * 4 + width])
            image[(i * 3) % height] = 255
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            if vfr or preroll:
                frame.pts = pts
                frame.time_base = Fraction(1, fps * 2)
                pts += (1 if i % 2 == 0 else 3) if vfr else 2
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def tone(seconds: float = 1.0, rate: int = 16000, channels: int = 2, fmt: str = "wav") -> bytes:
    """Sines at 440 Hz x (channel + 1): WAV (16-bit), FLAC or OGG through libsndfile, MP3
    through FFmpeg."""
    t = np.arange(int(seconds * rate)) / rate
    signal = np.stack([0.5 * np.sin(2 * np.pi * 440 * (c + 1) * t) for c in range(channels)]).astype(np.float32)
    buf = io.BytesIO()
    if fmt.lower() != "mp3":
        import soundfile

        soundfile.write(buf, signal.T, rate, format=fmt.upper(), subtype="PCM_16" if fmt.lower() == "wav" else None)
        return buf.getvalue()
    import av

    layout = "mono" if channels == 1 else "stereo"
    with av.open(buf, mode="w", format="mp3") as out:
        stream = out.add_stream("mp3", rate=rate)
        stream.layout = layout
        for start in range(0, signal.shape[1], 1152 * 64):
            frame = av.AudioFrame.from_ndarray(
                np.ascontiguousarray(signal[:, start : start + 1152 * 64]), format="fltp", layout=layout
            )
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()
