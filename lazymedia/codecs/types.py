"""The headers and results of every codec, in one place: what a probe reads (`ImageHeader`,
`VideoHeader`, `AudioHeader`) and what a decode returns (`VideoFrames`, `AudioSamples`, both a
`TensorResult`; an image decodes to a plain uint8 tensor [H, W, C] with `CHANNELS[mode]`
channels)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Self, TypeAlias, TypedDict

from ..spec import ImageSpec

if TYPE_CHECKING:  # annotations only: importing the types loads neither torch nor numpy
    import numpy as np
    import numpy.typing as npt
    import torch

CHANNELS = {"RGB": 3, "RGBA": 4, "L": 1, "LA": 2}


@dataclass(frozen=True)
class ImageHeader:
    """What the probe read from the encoded bytes (csrc/probe.h for JPEG/PNG/GIF/WebP; Pillow's
    header parse for the rest). `mode` is the mode Pillow opens the image in, which decides how
    it converts (vLLM's loaders convert from it)."""

    format: str
    width: int
    height: int
    components: int
    bit_depth: int
    has_alpha: bool
    orientation: int
    has_icc: bool
    jpeg_encoding: str
    chroma_subsampling: str
    has_adobe: bool
    adobe_transform: int
    png_color_type: int
    png_interlaced: bool
    animated: bool
    frame_count: int
    max_frame_width: int
    max_frame_height: int
    webp_kind: str
    png_compressed_text: bool = False
    scan_count: int = 1  # JPEG: scans the decoder runs (csrc/probe.h)
    mode: str = "RGB"
    bmp_rle: bool = False  # a run-length coded BMP (Pillow's Python RLE decoder)

    @property
    def working_bytes(self) -> int:
        """Memory the decoder holds besides the output: a JPEG decoded in several scans
        (progressive, or components in separate scans) keeps every DCT coefficient of the image,
        2 bytes per sample of each component, for the whole decode (libjpeg's whole-image
        coefficient buffer); a run-length BMP goes through Pillow's RLE decoder, which grows its
        palette indices in a bytearray, copies them to bytes and then into its image (about 5
        bytes a pixel measured, 6 declared); a single-scan JPEG and the other decoders work in
        rows or hold what the output holds."""
        if self.bmp_rle:
            return 6 * self.width * self.height
        if self.format != "jpeg" or self.scan_count <= 1:
            return 0
        planes = _COMPONENT_PLANES.get(self.chroma_subsampling, self.components)
        padded = (self.width + 31) // 32 * 32 * ((self.height + 31) // 32 * 32)  # whole 4x4-sampled MCUs at most
        return int(planes * padded * 2)

    @property
    def has_transparency(self) -> bool:
        """An alpha channel or a transparent colour (PNG tRNS, GIF transparency)."""
        return self.has_alpha

    def target_mode(self, spec: ImageSpec) -> str:
        """The output mode: spec.mode, or for mode=None the source's own: L, LA, RGB or RGBA
        (palette images widen to RGB, or RGBA when they have a transparent colour)."""
        if spec.mode is not None:
            return spec.mode
        if self.mode in ("1", "L", "I", "I;16", "I;16B", "I;16L", "F"):
            return "L"
        if self.mode in ("LA", "La"):
            return "LA"
        if self.mode in ("RGBA", "RGBa", "PA") or self.mode == "P" and self.has_transparency:
            return "RGBA"
        return "RGB"

    def output_shape(self, spec: ImageSpec) -> tuple[int, int, int]:
        """(H, W, C) of the decoded tensor under `spec`, known before decoding."""
        if spec.size is not None:
            height, width = spec.size
        elif spec.apply_orientation and self.orientation >= 5:
            height, width = self.width, self.height
        else:
            height, width = self.height, self.width
        return (height, width, CHANNELS[self.target_mode(spec)])


# Full-resolution planes a JPEG's components add up to, by chroma subsampling ("other": assume
# every component at full resolution).
_COMPONENT_PLANES = {"gray": 1, "444": 3, "422": 2, "440": 2, "420": 1.5, "411": 1.5, "410": 1.25}


# What a codec reads: the encoded bytes, or a view of them (a shared-memory hand-off).
EncodedBytes: TypeAlias = "bytes | memoryview"
# What a probe returns and a decode takes, of any modality.
MediaHeader: TypeAlias = "ImageHeader | VideoHeader | AudioHeader"
# What a decode returns, of any modality: an image's uint8 [H, W, C] tensor, or a TensorResult.
DecodedMedia: TypeAlias = "torch.Tensor | VideoFrames | AudioSamples"


class TensorResult(ABC):
    """A decoded result that carries its media as one tensor beside plain fields (`VideoFrames`,
    `AudioSamples`): the engine places, ships and copies that tensor through `tensor` and
    `with_tensor` without knowing which result it is."""

    @property
    @abstractmethod
    def tensor(self) -> torch.Tensor:
        """The result's one tensor."""

    @abstractmethod
    def with_tensor(self, tensor: torch.Tensor) -> Self:
        """This result with `tensor` (of the same shape, or fewer leading entries) in place of its
        own; the other fields are shared, not copied."""


@dataclass(frozen=True)
class VideoHeader:
    """The container's header, with `total_frames` counted from the packets the decoder will
    present (edit-list pre-roll excluded, fragments included)."""

    container: str
    codec: str
    width: int
    height: int
    fps: float
    duration: float
    total_frames: int
    has_audio: bool
    pixel_format: str = ""  # e.g. yuv420p, yuv420p10le (decides whether NVDEC can take it)
    color_matrix: str = "bt709"  # the CPU path's YUV -> RGB matrix: bt601, bt709 or one NVDEC leaves to the CPU
    full_range: bool = False
    index_bytes: int = 0  # the demuxer's sample index, as the container's tables declare it (MP4/MOV)


@dataclass
class VideoFrames(TensorResult):
    """Sampled frames `[T, H, W, 3]` uint8 with the indices and timestamps (s) they came from.
    `metadata` holds exactly the transformers VideoMetadata keys (total_num_frames, fps,
    duration, frames_indices, video_backend, do_sample_frames), as vLLM hands them to a model's
    processor; `info` says what decoded them."""

    frames: torch.Tensor
    indices: list[int]
    timestamps: list[float]
    fps: float
    duration: float
    total_frames: int
    metadata: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.frames.ndim != 4:
            raise ValueError(f"frames must be [T, H, W, C], got {self.frames.ndim} dimensions")
        if not len(self.indices) == len(self.timestamps) == self.frames.shape[0]:
            raise ValueError(
                f"{self.frames.shape[0]} frames need as many indices and timestamps, got "
                f"{len(self.indices)} and {len(self.timestamps)}"
            )

    def __repr__(self) -> str:
        return _repr(
            self,
            frames=self.frames,
            fps=self.fps,
            duration=self.duration,
            total_frames=self.total_frames,
            indices=self.indices,
            info=self.info,
        )

    @property
    def tensor(self) -> torch.Tensor:
        """`frames`."""
        return self.frames

    def with_tensor(self, tensor: torch.Tensor) -> VideoFrames:
        return replace(self, frames=tensor)


@dataclass(frozen=True)
class AudioHeader:
    reader: str  # "soundfile" or "av"
    format: str
    sample_rate: int
    channels: int
    duration: float  # seconds; 0.0 when the container does not say (decoding then enforces the limits)
    frames: int = 0  # source frames when the container stores them exactly, else 0

    def __post_init__(self) -> None:
        if self.reader not in ("soundfile", "av"):
            raise ValueError(f"unknown audio reader {self.reader!r}")


class AudioMetadata(TypedDict, total=False):
    """What decoded an `AudioSamples`."""

    reader: str  # "soundfile" (libsndfile) or "av" (FFmpeg)
    skipped_packets: int  # damaged packets FFmpeg stepped over
    soundfile_failed: bool  # libsndfile accepted the file, failed on it, and FFmpeg decoded it


@dataclass
class AudioSamples(TensorResult):
    """Decoded audio: float32 `samples` [channels, samples] at `sample_rate`. `metadata` says
    which reader decoded it and how many damaged packets it skipped."""

    samples: torch.Tensor
    sample_rate: int
    metadata: AudioMetadata = field(default_factory=AudioMetadata)

    def __post_init__(self) -> None:
        if self.samples.ndim != 2:
            raise ValueError(f"samples must be [channels, samples], got {self.samples.ndim} dimensions")

    def __repr__(self) -> str:
        return _repr(self, samples=self.samples, sample_rate=self.sample_rate, metadata=self.metadata)

    @property
    def data(self) -> torch.Tensor:
        """`samples` under torchcodec's name (AudioSamples.data there)."""
        return self.samples

    @property
    def tensor(self) -> torch.Tensor:
        """`samples`."""
        return self.samples

    def with_tensor(self, tensor: torch.Tensor) -> AudioSamples:
        return replace(self, samples=tensor)

    def numpy(self) -> npt.NDArray[np.float32]:
        """The samples as numpy (no copy): 1-D for one channel, else [channels, samples]."""
        array: npt.NDArray[np.float32] = self.samples.numpy()
        return array[0] if array.shape[0] == 1 else array

    def as_tuple(self) -> tuple[npt.NDArray[np.float32], int]:
        """(samples, rate) as vLLM's audio items are: mono audio is a 1-D array."""
        return self.numpy(), self.sample_rate


def _short(values: list[Any]) -> str:
    """A list as its first and last few items: a long clip's indices fill no screen."""
    return (
        repr(values)
        if len(values) <= 6
        else f"[{', '.join(map(repr, values[:3]))}, ..., {', '.join(map(repr, values[-3:]))}] ({len(values)})"
    )


def _repr(value: Any, **fields: Any) -> str:
    """`Name(field=...)` with each tensor as its shape, dtype and device, never its elements."""

    def shown(item: Any) -> str:
        if hasattr(item, "shape") and hasattr(item, "dtype"):
            device = getattr(item, "device", "cpu")
            return f"<{tuple(item.shape)} {str(item.dtype).removeprefix('torch.')} on {device}>"
        return _short(item) if isinstance(item, list) else repr(item)

    return f"{type(value).__name__}({', '.join(f'{name}={shown(item)}' for name, item in fields.items())})"
