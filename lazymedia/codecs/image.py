"""Image codec: header probe (native), JPEG through libjpeg-turbo (simplejpeg), the rest
through Pillow; orientation by the shared native kernel, so every backend rotates identically.

Both decoders release the GIL while decoding, so a thread pool scales across cores.
"""
from __future__ import annotations

import dataclasses
import io
from dataclasses import dataclass

import numpy as np
import simplejpeg
import torch
from PIL import Image

from .. import _C, ops
from ..errors import InvalidMediaError, MediaError, MediaTooLargeError, UnprocessableMediaError
from ..spec import DEFAULT_LIMITS, ImageSpec, Limits

_CHANNELS = {"RGB": 3, "RGBA": 4, "L": 1}
_RESAMPLE = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}


@dataclass(frozen=True)
class ImageHeader:
    """What the native probe read from the encoded bytes (see csrc/probe.h)."""

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

    def output_shape(self, spec: ImageSpec) -> tuple[int, int, int]:
        """(H, W, C) of the decoded tensor under `spec`, known before decoding."""
        if spec.size is not None:
            height, width = spec.size
        elif spec.apply_orientation and self.orientation >= 5:
            height, width = self.width, self.height
        else:
            height, width = self.height, self.width
        return (height, width, _CHANNELS[spec.mode])


_HEADER_FIELDS = [f.name for f in dataclasses.fields(ImageHeader)]


REMEMBER_HEADERS = False  # the native probe costs about a microsecond


def probe(data, limits: Limits, spec: ImageSpec) -> ImageHeader:
    """Header of an encoded image; rejects non-images (400), broken headers (422) and items over
    `limits` (413) before anything is decoded."""
    result = _C.probe(data)
    if result.status == "unknown_format":
        raise InvalidMediaError(result.error, modality="image")
    if result.status != "ok":
        raise UnprocessableMediaError(f"{result.format} header is {result.status}: {result.error}", modality="image")
    header = ImageHeader(*[getattr(result, name) for name in _HEADER_FIELDS])
    check_limits(header, limits, spec, len(data))
    return header


def check_limits(header: ImageHeader, limits: Limits, spec: ImageSpec, encoded_bytes: int) -> None:
    """Refuses (413) what `limits` do not allow, from the header alone."""
    pixels = header.max_frame_width * header.max_frame_height
    if pixels > limits.max_pixels:
        raise MediaTooLargeError(
            f"{header.max_frame_width}x{header.max_frame_height} image exceeds the {limits.max_pixels} pixel limit",
            modality="image")
    height, width, channels = header.output_shape(spec)
    limits.check_decoded(height * width * channels, "image", f"{width}x{height}x{channels} pixels")
    if header.format == "jpeg" and header.bit_depth != 8:
        raise UnprocessableMediaError(f"{header.bit_depth}-bit JPEG is not supported", modality="image")


def _uses_libjpeg_turbo(header: ImageHeader, spec: ImageSpec) -> bool:
    """simplejpeg matches Pillow bit for bit on 8-bit YCbCr/gray JPEGs; CMYK/YCCK and colour to L
    (Pillow converts decoded RGB with its own luma weights) go to Pillow."""
    if header.format != "jpeg" or header.components not in (1, 3):
        return False
    return spec.mode in ("RGB", "RGBA") or header.components == 1


class _NeedsTolerantDecoder(Exception):
    """libjpeg-turbo (strict) refused a stream that Pillow's decoder accepts."""


def _decode_jpeg(data, colorspace: str, out: np.ndarray | None) -> np.ndarray:
    """A truncated stream is an error, as in Pillow. Other libjpeg warnings (junk bytes between
    markers, bad APP segments), which simplejpeg reports as errors, send the file to Pillow."""
    try:
        return simplejpeg.decode_jpeg(data, colorspace=colorspace, buffer=out)
    except ValueError as exc:
        if "Premature end" in str(exc):
            raise
        raise _NeedsTolerantDecoder() from exc


def _decode_with_pillow(data, mode: str) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as opened:
        # convert() to the same mode would copy the pixels once more
        array = np.asarray(opened if opened.mode == mode else opened.convert(mode))
    return array[:, :, None] if array.ndim == 2 else array


def _decode_native_orientation(data, header: ImageHeader, spec: ImageSpec, out: np.ndarray | None) -> np.ndarray:
    if _uses_libjpeg_turbo(header, spec):
        try:
            if header.components == 3:
                return _decode_jpeg(data, spec.mode, out)
            gray = _decode_jpeg(data, "GRAY", None).reshape(header.height, header.width, 1)
        except _NeedsTolerantDecoder:
            return _decode_with_pillow(data, spec.mode)
        if spec.mode == "L":
            return gray
        rgb = np.repeat(gray, 3, axis=2)
        return rgb if spec.mode == "RGB" else np.concatenate([rgb, np.full_like(gray, 255)], axis=2)
    return _decode_with_pillow(data, spec.mode)


def decode(data, header: ImageHeader, spec: ImageSpec, out: torch.Tensor | None = None,
           limits: Limits = DEFAULT_LIMITS) -> torch.Tensor:
    """Decodes to a uint8 HWC tensor (into `out` when given: a pinned or caller-owned buffer)."""
    shape = header.output_shape(spec)
    if out is not None and (tuple(out.shape) != shape or out.dtype != torch.uint8 or not out.is_contiguous()):
        raise ValueError(f"out must be a contiguous uint8 tensor of shape {shape}, got {tuple(out.shape)} {out.dtype}")
    direct = (out is not None and spec.size is None and header.components == 3
              and not (spec.apply_orientation and header.orientation != 1) and _uses_libjpeg_turbo(header, spec))
    out_array = out.numpy() if out is not None and direct else None
    try:
        array = _decode_native_orientation(data, header, spec, out_array)
    except MediaError:
        raise
    except Image.DecompressionBombError as exc:
        raise MediaTooLargeError(f"decompression bomb: {exc}", modality="image") from None
    except ValueError as exc:
        if "Decompressed data too large" in str(exc):
            raise MediaTooLargeError(f"decompression bomb: {exc}", modality="image") from None
        raise UnprocessableMediaError(f"corrupt {header.format}: {exc}", modality="image") from None
    except Exception as exc:  # decoders raise OSError, SyntaxError, EOFError, struct.error, ...
        raise UnprocessableMediaError(f"corrupt {header.format}: {type(exc).__name__}: {exc}",
                                      modality="image") from None
    if out is not None and out_array is not None and array.ctypes.data == out_array.ctypes.data:
        return out  # decoded in place
    if spec.apply_orientation and header.orientation != 1:
        array = ops.orient(torch.from_numpy(array), header.orientation).numpy()
    if spec.size is not None:
        array = _resize(array, spec.size, spec.resample)
    if not array.flags.writeable or not array.flags.c_contiguous:  # Pillow hands out read-only views
        array = np.array(array, order="C")
    tensor = torch.from_numpy(array)
    if out is None:
        return tensor
    out.copy_(tensor)
    return out


def _resize(array: np.ndarray, size: tuple[int, int], resample: str) -> np.ndarray:
    height, width = size
    image = Image.fromarray(array[:, :, 0] if array.shape[2] == 1 else array)
    resized = np.asarray(image.resize((width, height), _RESAMPLE[resample]))
    return resized[:, :, None] if resized.ndim == 2 else resized
