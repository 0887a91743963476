"""OpenCV video reader (VideoSpec(decoder="opencv")): the same frame sampling as the PyAV path
(codecs.sampling), through cv2.VideoCapture's FFmpeg reader.
Frames between sampled ones are grabbed (decoded, not converted); a seek goes straight to the
sampled frame. OpenCV reads from a path, so the bytes are handed over as a memfd. Probing is
PyAV's (the header is the container's, whichever reader decodes)."""

from __future__ import annotations

import importlib.util

import torch

from ..errors import InvalidMediaError, UnprocessableMediaError
from ..spec import Limits, VideoSpec
from . import _video as video
from ._frames import frame_timestamps, memfd_path, sampled_output, video_frames
from ._sampling import decode_plan, sample_indices, sampling_source
from ._video import REMEMBER_HEADERS, check_limits, probe
from .types import EncodedBytes, VideoFrames, VideoHeader

__all__ = ["REMEMBER_HEADERS", "check_limits", "decode", "probe"]


def check_available() -> None:
    """Refuses (400) the OpenCV reader where OpenCV is not installed; checked where the reader
    is chosen (load, decode), not in VideoSpec, so a cache hit by id never needs OpenCV."""
    if importlib.util.find_spec("cv2") is None:
        raise InvalidMediaError(
            "decoder='opencv' is not installed on this server: use decoder='pyav'",
            hint="pip install opencv-python-headless (the lazymedia-decode[opencv] extra)",
            modality="video",
        )


def decode(
    data: EncodedBytes,
    header: VideoHeader,
    spec: VideoSpec,
    out: torch.Tensor | None = None,
    limits: Limits | None = None,
) -> VideoFrames:
    check_available()
    import cv2

    source = sampling_source(header)
    indices = sample_indices(source, spec)
    height, width = spec.size or (header.height, header.width)
    frames = sampled_output(out, len(indices), height, width)
    table = video.read_frame_table(data, header.total_frames)
    plan = decode_plan(indices, table) if len(indices) * 2 < header.total_frames else [None] * len(indices)
    buffer = frames.numpy()
    got: list[int] = []
    try:
        with memfd_path(data) as path:
            capture = cv2.VideoCapture(path, cv2.CAP_FFMPEG)
            if not capture.isOpened():
                raise UnprocessableMediaError(
                    "OpenCV cannot open the video: re-encode the file, or use decoder='pyav'", modality="video"
                )
            position = 0
            for index, seek_to in zip(indices, plan):
                if seek_to is not None:
                    capture.set(cv2.CAP_PROP_POS_FRAMES, index)
                    position = index
                while position < index and capture.grab():
                    position += 1
                ok, frame = capture.read()
                position += 1
                if not ok:
                    break  # the stream ended early
                rgb = cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)
                if spec.size is not None:
                    rgb = cv2.resize(rgb, (width, height), interpolation=cv2.INTER_AREA)
                buffer[len(got)] = rgb
                got.append(index)
            capture.release()
    except cv2.error as exc:
        raise UnprocessableMediaError(
            f"corrupt {header.codec} video ({exc}): re-encode the file or send another", modality="video"
        ) from None
    if not got and indices:
        raise UnprocessableMediaError(
            "video has no decodable frames: re-encode the file or send another", modality="video"
        )
    return video_frames(frames, got, frame_timestamps(got, table, header.fps), header, source, "opencv")
