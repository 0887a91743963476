"""OpenCV video reader (VideoSpec(decoder="opencv")): the same frame sampling as the PyAV path
(codecs.sampling), through cv2.VideoCapture's FFmpeg reader.
Frames between sampled ones are grabbed (decoded, not converted); a seek goes straight to the
sampled frame. OpenCV reads from a path, so the bytes are handed over as a memfd. Probing is
PyAV's (the header is the container's, whichever reader decodes)."""
from __future__ import annotations

import os

import torch

from ..errors import UnprocessableMediaError
from . import video
from .sampling import decode_plan, hf_metadata, sample_indices, sampling_source
from .video import REMEMBER_HEADERS, check_limits, probe
from .video_common import frame_buffers

__all__ = ["REMEMBER_HEADERS", "check_limits", "decode", "probe"]


def decode(data, header, spec, out: torch.Tensor | None = None, limits=None) -> video.VideoFrames:
    import cv2

    source = sampling_source(header)
    indices = sample_indices(source, spec)
    height, width = spec.size or (header.height, header.width)
    frames = out if out is not None else frame_buffers().empty((len(indices), height, width, 3))
    if tuple(frames.shape) != (len(indices), height, width, 3):
        raise ValueError(f"out must have shape {(len(indices), height, width, 3)}")
    table = video.read_frame_table(data, header.total_frames)
    plan = decode_plan(indices, table) if len(indices) * 2 < header.total_frames else [None] * len(indices)
    buffer = frames.numpy()
    got: list[int] = []
    fd = os.memfd_create("lazymedia-video", os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        capture = cv2.VideoCapture(f"/proc/self/fd/{fd}", cv2.CAP_FFMPEG)
        if not capture.isOpened():
            raise UnprocessableMediaError("OpenCV cannot open the video", modality="video")
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
        raise UnprocessableMediaError(f"corrupt {header.codec} video: {exc}", modality="video") from None
    finally:
        os.close(fd)
    if not got and indices:
        raise UnprocessableMediaError("video has no decodable frames", modality="video")
    timestamps = [table.seconds(i) if table else i / (header.fps or 1) for i in got]
    return video.VideoFrames(frames[:len(got)], got, timestamps, header.fps, source.duration, source.total_frames,
                             hf_metadata(source, got, "opencv"),
                             {"codec": header.codec, "container": header.container, "decoder": "opencv"})
