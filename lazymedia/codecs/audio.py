"""Audio codec: WAV/FLAC/OGG through libsndfile (soundfile), everything else through PyAV;
resampling with soxr and channel averaging as spec settings. Output is float32 `[C, N]`."""
from __future__ import annotations

import io
from dataclasses import dataclass

import av
import numpy as np
import soundfile
import soxr
import torch

from ..errors import InvalidMediaError, MediaTooLargeError, UnprocessableMediaError
from ..spec import AudioSpec, Limits

REMEMBER_HEADERS = True  # a libsndfile or FFmpeg probe costs milliseconds

_SIGNATURES = ((0, b"RIFF"), (0, b"fLaC"), (0, b"OggS"), (0, b"ID3"), (0, b"\xff\xfb"), (0, b"\xff\xf3"),
               (0, b"\xff\xf2"), (0, b"\xff\xf1"), (0, b"\xff\xf9"), (4, b"ftyp"), (0, b"\x1a\x45\xdf\xa3"),
               (0, b"FORM"))


# Containers libsndfile reads exactly; it also reads MP3, but its MP3 durations are estimates,
# so MP3 and everything else goes through FFmpeg.
_SOUNDFILE_FORMATS = {"WAV", "WAVEX", "FLAC", "OGG", "AIFF", "W64", "RF64", "CAF"}


@dataclass(frozen=True)
class AudioHeader:
    reader: str  # "soundfile" or "av"
    format: str
    sample_rate: int
    channels: int
    duration: float


@dataclass
class AudioSamples:
    samples: torch.Tensor  # float32 [channels, samples]
    sample_rate: int


def looks_like_audio(data) -> bool:
    """Whether the bytes start like an audio container (so a decoder failure means corrupt)."""
    head = bytes(data[:16])
    return any(head[offset:offset + len(magic)] == magic for offset, magic in _SIGNATURES)


def probe(data, limits: Limits, spec: AudioSpec) -> AudioHeader:
    if len(data) == 0:
        raise UnprocessableMediaError("empty audio file", modality="audio")
    try:
        info = soundfile.info(io.BytesIO(data))
    except Exception:  # libsndfile does not know the format: FFmpeg may
        info = None
    if info is not None and info.format in _SOUNDFILE_FORMATS:
        header = AudioHeader("soundfile", info.format, int(info.samplerate), int(info.channels), float(info.duration))
    else:
        header = _probe_with_av(data)
    if header.sample_rate <= 0 or header.channels <= 0:
        raise UnprocessableMediaError("audio stream has no sample rate or channels", modality="audio")
    check_limits(header, limits, spec, len(data))
    return header


def check_limits(header: AudioHeader, limits: Limits, spec: AudioSpec, encoded_bytes: int) -> None:
    """Refuses (413) what `limits` do not allow, from the header alone."""
    if header.duration > limits.max_audio_seconds:
        raise MediaTooLargeError(f"{header.duration:.0f} s audio exceeds the {limits.max_audio_seconds:.0f} s limit",
                                 modality="audio")


def _probe_with_av(data) -> AudioHeader:
    try:
        with av.open(io.BytesIO(data), metadata_errors="ignore") as container:
            if not container.streams.audio:
                raise InvalidMediaError("no audio stream", modality="audio")
            stream = container.streams.audio[0]
            if stream.duration is not None and stream.time_base is not None:
                duration = float(stream.duration * stream.time_base)
            else:
                duration = (container.duration or 0) / av.time_base
            return AudioHeader("av", container.format.name, int(stream.codec_context.sample_rate or 0),
                               int(stream.codec_context.channels or 0), duration)
    except av.error.FFmpegError as exc:
        if looks_like_audio(data):
            raise UnprocessableMediaError(f"corrupt audio: {exc}", modality="audio") from None
        raise InvalidMediaError(f"not audio: {exc}", modality="audio") from None


def _read_with_av(data) -> np.ndarray:
    chunks = []
    with av.open(io.BytesIO(data), metadata_errors="ignore") as container:
        stream = container.streams.audio[0]
        resampler = av.AudioResampler(format="fltp", layout=stream.codec_context.layout,
                                      rate=stream.codec_context.sample_rate)
        for frame in container.decode(stream):
            for converted in resampler.resample(frame):
                chunks.append(converted.to_ndarray())
        for converted in resampler.resample(None):
            chunks.append(converted.to_ndarray())
    if not chunks:
        raise UnprocessableMediaError("audio has no decodable frames", modality="audio")
    return np.concatenate(chunks, axis=1)


def decode(data, header: AudioHeader, spec: AudioSpec, out: torch.Tensor | None = None) -> AudioSamples:
    try:
        if header.reader == "soundfile":
            samples = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)[0].T
        else:
            samples = _read_with_av(data)
    except UnprocessableMediaError:
        raise
    except Exception as exc:  # libsndfile raises RuntimeError/LibsndfileError, FFmpeg FFmpegError
        raise UnprocessableMediaError(f"corrupt {header.format} audio: {type(exc).__name__}: {exc}",
                                      modality="audio") from None
    rate = header.sample_rate
    if spec.mono and samples.shape[0] > 1:
        samples = samples.mean(axis=0, keepdims=True)
    if spec.sample_rate is not None and spec.sample_rate != rate:
        samples = soxr.resample(np.ascontiguousarray(samples.T), rate, spec.sample_rate).T
        rate = spec.sample_rate
    tensor = torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32))
    if out is not None:
        out.copy_(tensor)
        tensor = out
    return AudioSamples(tensor, rate)
