"""Generated test clips (PyAV encoders) and audio (numpy + soundfile)."""
import io
from fractions import Fraction

import av
import numpy as np


def make_video(codec="libx264", frames=60, width=160, height=96, fps=30, gop=12, container="mp4", vfr=False,
               pix_fmt="yuv420p"):
    """A clip whose frame i shows a gradient shifted by i and a bright bar at row i % height, so
    frames are distinguishable after lossy coding. With vfr, frame durations alternate 1 and 2 ticks."""
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container) as out:
        stream = out.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
        stream.codec_context.gop_size = gop
        if codec == "libx264":
            stream.options = {"preset": "ultrafast", "bf": "2"}
        if vfr:
            stream.codec_context.time_base = Fraction(1, fps * 2)
        yy, xx = np.mgrid[0:height, 0:width]
        pts = 0
        for i in range(frames):
            img = np.stack([(xx * 2 + i * 4) % 256, (yy * 2 + i * 2) % 256, np.full_like(xx, (i * 9) % 256)],
                           axis=2).astype(np.uint8)
            img[(i * 3) % height] = 255
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            if vfr:
                frame.pts = pts
                frame.time_base = Fraction(1, fps * 2)
                pts += 1 if i % 2 == 0 else 3
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def make_tone(seconds=1.0, rate=16000, channels=2, fmt="WAV"):
    import soundfile

    t = np.arange(int(seconds * rate)) / rate
    signal = np.stack([0.5 * np.sin(2 * np.pi * 440 * (c + 1) * t) for c in range(channels)], axis=1)
    buf = io.BytesIO()
    soundfile.write(buf, signal.astype(np.float32), rate, format=fmt, subtype="PCM_16" if fmt == "WAV" else None)
    return buf.getvalue()
