"""Audio codec: WAV/FLAC/OGG/AIFF through libsndfile (soundfile), everything else (and what
libsndfile fails on) through PyAV; channel averaging and soxr resampling as spec settings.

Decoding streams block by block into one preallocated float32 `[C, N]` output, sized from the
header: mixing and resampling happen per block, so peak memory is the output plus a block. Where
a header cannot be trusted (MP3 durations are estimates, a FLAC may not store its length), the
output grows as samples arrive, and decoding stops with 413 once it passes the limits.
"""

from __future__ import annotations

import io
import math

import av
import numpy as np
import numpy.typing as npt
import soundfile
import soxr
import torch

from ..errors import InvalidMediaError, MediaError, MediaTooLargeError, UnprocessableMediaError
from ..spec import DEFAULT_LIMITS, AudioSpec, Limits
from ._ffmpeg import DecodedFrames
from ._metadata import check_metadata
from .types import AudioHeader, AudioMetadata, AudioSamples, EncodedBytes

REMEMBER_HEADERS = True  # a libsndfile or FFmpeg probe costs milliseconds

_SIGNATURES = (
    (0, b"RIFF"),
    (0, b"fLaC"),
    (0, b"OggS"),
    (0, b"ID3"),
    (0, b"\xff\xfb"),
    (0, b"\xff\xf3"),
    (0, b"\xff\xf2"),
    (0, b"\xff\xf1"),
    (0, b"\xff\xf9"),
    (4, b"ftyp"),
    (0, b"\x1a\x45\xdf\xa3"),
    (0, b"FORM"),
)

# Containers libsndfile reads exactly; it also reads MP3, but its MP3 durations are estimates,
# so MP3 and everything else goes through FFmpeg.
_SOUNDFILE_FORMATS = {"WAV", "WAVEX", "FLAC", "OGG", "AIFF", "W64", "RF64", "CAF"}
# libsndfile reports this many frames (2^63 - 1) for a stream that does not store its length.
_UNKNOWN_FRAMES = 1 << 62
_BLOCK_BYTES = 4 << 20  # float32 samples read from libsndfile at a time, all channels together
# The resampler is fed so that one call yields about this many frames (64 channels: 28 MiB): libsoxr's buffers grow
# with what one call produces (about 80 bytes per output frame and channel, measured with
# soxr 0.5 from 1 Hz to 65,535 Hz), on top of about 250 KB of state per channel at most.
_RESAMPLE_FRAMES_PER_CALL = 2048
_RESAMPLER_BYTES_PER_CHANNEL = 256 << 10
_RESAMPLER_BYTES_PER_OUTPUT_FRAME = 96


def looks_like_audio(data: EncodedBytes) -> bool:
    """Whether the bytes start like an audio container (so a decoder failure means corrupt)."""
    head = bytes(data[:16])
    return any(head[offset : offset + len(magic)] == magic for offset, magic in _SIGNATURES)


def probe(data: EncodedBytes, limits: Limits, spec: AudioSpec) -> AudioHeader:
    """Container header: reader, rate, channels and duration, checked against `limits` and the
    decoded-size budget of `spec` before anything is decoded."""
    if len(data) == 0:
        raise UnprocessableMediaError("empty audio file: send the audio's bytes", modality="audio")
    check_metadata(data, "audio")  # before libsndfile or FFmpeg parse tags (FFmpeg's cost is their square)
    try:
        info = soundfile.info(io.BytesIO(data))
    except Exception:  # libsndfile does not know the format: FFmpeg may
        info = None
    if info is not None and info.format in _SOUNDFILE_FORMATS and 0 <= info.frames < _UNKNOWN_FRAMES:
        header = AudioHeader(
            "soundfile",
            info.format,
            int(info.samplerate),
            int(info.channels),
            info.frames / info.samplerate if info.samplerate > 0 else 0.0,
            int(info.frames),
        )
    else:
        header = _probe_with_av(data)
    if header.sample_rate <= 0 or header.channels <= 0:
        raise UnprocessableMediaError(
            "audio stream has no sample rate or channels: re-encode the file or send another", modality="audio"
        )
    check_limits(header, limits, spec, len(data))
    return header


def output_shape(header: AudioHeader, spec: AudioSpec) -> tuple[int, int]:
    """(channels, samples) the decode is expected to produce (samples estimated from the
    header's duration where it stores no exact length)."""
    rate = spec.sample_rate or header.sample_rate
    frames = header.frames if header.frames else header.duration * header.sample_rate
    return (1 if spec.mono else header.channels), math.ceil(frames * rate / header.sample_rate)


def check_limits(header: AudioHeader, limits: Limits, spec: AudioSpec, encoded_bytes: int) -> None:
    """Refuses (413) what `limits` do not allow, from the header alone: the channel count, the
    duration, and the output with the resampler's working memory."""
    if header.channels > limits.max_audio_channels:
        raise MediaTooLargeError(
            f"{header.channels} audio channels exceed the {limits.max_audio_channels} channel limit",
            hint="raise Limits.max_audio_channels",
            modality="audio",
        )
    if header.duration > limits.max_audio_seconds:
        raise MediaTooLargeError(
            f"{header.duration:.0f} s of audio is over the {limits.max_audio_seconds:.0f} s limit: send a shorter clip",
            hint="raise Limits.max_audio_seconds",
            modality="audio",
            limit="max_audio_seconds",
            value=header.duration,
            maximum=limits.max_audio_seconds,
        )
    channels, samples = output_shape(header, spec)
    limits.check_decoded(
        channels * samples * 4, "audio", f"{channels} channels x {samples} samples", resampler_bytes(header, spec)
    )


def _input_frames_per_call(source_rate: int, rate: int) -> int:
    """Input frames per resampler call, so that one call yields about _RESAMPLE_FRAMES_PER_CALL
    frames (one input frame at least: an upsampling ratio r yields r frames per call)."""
    return max(1, _RESAMPLE_FRAMES_PER_CALL * source_rate // rate)


def resampler_bytes(header: AudioHeader, spec: AudioSpec) -> int:
    """Peak memory of the resampler (none when the rate stays): its per-channel state and the
    buffers of one call, for the channels it converts."""
    rate = spec.sample_rate or header.sample_rate
    if rate == header.sample_rate:
        return 0
    channels = 1 if spec.mono else header.channels
    frames_per_call = math.ceil(_input_frames_per_call(header.sample_rate, rate) * rate / header.sample_rate)
    return channels * (_RESAMPLER_BYTES_PER_CHANNEL + frames_per_call * _RESAMPLER_BYTES_PER_OUTPUT_FRAME)


def _probe_with_av(data: EncodedBytes) -> AudioHeader:
    try:
        with av.open(io.BytesIO(data), metadata_errors="ignore") as container:
            if not container.streams.audio:
                raise InvalidMediaError("no audio stream: send a file with audio", modality="audio")
            stream = container.streams.audio[0]
            context = stream.codec_context
            if context is None:
                raise UnprocessableMediaError(
                    "FFmpeg has no decoder for this audio stream: re-encode it as WAV, FLAC or MP3", modality="audio"
                )
            if stream.duration is not None and stream.time_base is not None:
                duration = float(stream.duration * stream.time_base)
            else:
                duration = (container.duration or 0) / av.time_base
            return AudioHeader(
                "av",
                container.format.name,
                int(context.sample_rate or 0),
                int(context.channels or 0),
                max(duration, 0.0),
            )
    except av.error.FFmpegError as exc:
        if looks_like_audio(data):
            raise UnprocessableMediaError(
                f"corrupt audio ({exc.strerror}): re-encode the file or send another", modality="audio"
            ) from None
        raise InvalidMediaError(
            f"not audio ({exc.strerror}): send WAV, FLAC, MP3, Ogg or another format libsndfile or FFmpeg reads",
            modality="audio",
        ) from None


class _Output:
    """The preallocated [channels, capacity] float32 output, filled block by block. Blocks come
    frames-major ([n, source channels]); channels are averaged and the rate converted per block
    (soxr's stream gives the one-shot result bit for bit). Grows when a header under-counted,
    up to the decoded-size budget."""

    def __init__(self, header: AudioHeader, spec: AudioSpec, limits: Limits, out: torch.Tensor | None):
        self.mono = spec.mono and header.channels > 1
        self.rate = spec.sample_rate or header.sample_rate
        channels, expected = output_shape(header, spec)
        self.channels = channels
        self.resampler: soxr.ResampleStream | None = None
        if self.rate != header.sample_rate:
            self.resampler = soxr.ResampleStream(header.sample_rate, self.rate, channels, dtype="float32")
            self.frames_per_call = _input_frames_per_call(header.sample_rate, self.rate)
        self.max_frames = min(limits.max_decoded_bytes // (4 * channels), int(limits.max_audio_seconds * self.rate) + 1)
        if out is not None:
            if out.dtype != torch.float32 or out.ndim != 2 or out.shape[0] != channels or not out.is_contiguous():
                raise ValueError(f"out must be a contiguous float32 tensor [{channels}, n]")
            self.tensor = out
        else:
            capacity = expected + expected // 100 + 1024  # room for estimates and resampler rounding
            self.tensor = torch.empty((channels, min(capacity, self.max_frames)), dtype=torch.float32)
        self.array = self.tensor.numpy()
        self.position = 0

    def write(self, block: npt.NDArray[np.float32]) -> None:
        if self.mono:
            block = block.mean(axis=1, keepdims=True, dtype=np.float32)
        if self.resampler is None:
            self._append(block)
            return
        for start in range(0, block.shape[0], self.frames_per_call):
            piece = np.ascontiguousarray(block[start : start + self.frames_per_call], dtype=np.float32)
            self._append(self.resampler.resample_chunk(piece, last=False))

    def finish(self) -> torch.Tensor:
        if self.resampler is not None:
            self._append(self.resampler.resample_chunk(np.zeros((0, self.channels), np.float32), last=True))
        return self.tensor[:, : self.position]

    def _append(self, block: npt.NDArray[np.float32]) -> None:
        count = block.shape[0]
        end = self.position + count
        if end > self.array.shape[1]:
            if end > self.max_frames:
                raise MediaTooLargeError(
                    f"audio decodes past {self.max_frames} samples per channel, over the limit: send a shorter clip",
                    hint="pass mono=True or a lower sample_rate, or raise "
                    "Limits.max_decoded_bytes or Limits.max_audio_seconds",
                    modality="audio",
                )
            grown = torch.empty(
                (self.channels, min(max(end, self.array.shape[1] * 5 // 4), self.max_frames)), dtype=torch.float32
            )
            grown[:, : self.position] = self.tensor[:, : self.position]
            self.tensor, self.array = grown, grown.numpy()
        self.array[:, self.position : end] = block.T
        self.position = end


def _read_soundfile(data: EncodedBytes, output: _Output) -> AudioMetadata:
    with soundfile.SoundFile(io.BytesIO(data)) as f:
        blocksize = max(1024, _BLOCK_BYTES // (4 * f.channels))
        for block in f.blocks(blocksize=blocksize, dtype="float32", always_2d=True):
            output.write(block)
    return {"reader": "soundfile"}


def _read_av(data: EncodedBytes, output: _Output) -> AudioMetadata:
    """Decodes packet by packet: a damaged packet is skipped and counted (FFmpeg's own tools
    keep going), so a file damaged past its first frames keeps what decoded."""
    decoded = 0
    with av.open(io.BytesIO(data), metadata_errors="ignore") as container:
        stream = container.streams.audio[0]
        context = stream.codec_context
        if context is None:
            raise UnprocessableMediaError(
                "no decoder for this audio stream: re-encode it as WAV, FLAC or MP3", modality="audio"
            )
        resampler = av.AudioResampler(format="fltp", layout=context.layout, rate=context.sample_rate)
        frames = DecodedFrames(container, stream)
        for frame in frames:
            for converted in resampler.resample(frame):
                output.write(converted.to_ndarray().T)
                decoded += 1
        for converted in resampler.resample(None):
            output.write(converted.to_ndarray().T)
    if decoded == 0:
        raise UnprocessableMediaError(
            "audio has no decodable frames: re-encode the file or send another", modality="audio"
        )
    return {"reader": "av", "skipped_packets": frames.skipped}


def decode(
    data: EncodedBytes,
    header: AudioHeader,
    spec: AudioSpec,
    out: torch.Tensor | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> AudioSamples:
    """Decodes to float32 [channels, samples] (into `out` when given: [channels, >= samples];
    the result is a view of its filled part)."""
    output = _Output(header, spec, limits, out)  # a bad `out` is the caller's ValueError
    try:
        if header.reader == "soundfile":
            try:
                metadata = _read_soundfile(data, output)
            except MediaError:
                raise
            except Exception:  # libsndfile failed on a file it accepted (a FLAC it cannot seek): FFmpeg may not
                output = _Output(header, spec, limits, out)
                metadata = _read_av(data, output)
                metadata["soundfile_failed"] = True
        else:
            metadata = _read_av(data, output)
        samples = output.finish()
    except MediaError:
        raise
    except Exception as exc:  # libsndfile raises RuntimeError/LibsndfileError, FFmpeg FFmpegError
        raise UnprocessableMediaError(
            f"corrupt {header.format} audio ({type(exc).__name__}: "
            f"{getattr(exc, 'strerror', None) or exc}): re-encode the file or send another",
            modality="audio",
        ) from None
    return AudioSamples(samples, output.rate, metadata)
