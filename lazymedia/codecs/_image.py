"""Image codec: the header first (the native probe for JPEG/PNG/GIF/WebP, Pillow's lazy open for
every other format it reads), then the pixels, written once into the output buffer on the plain
path (EXIF rotation, `size=` and `out=` each add a copy):

- JPEG through libjpeg-turbo (simplejpeg), PNG and WebP through libspng/libwebp (imagecodecs),
  each into one array that becomes the output; alpha composited or gray widened in place by the
  native kernels, so peak memory is the output (x 4/3 while an alpha channel is packed);
- every other format, and what those decoders refuse, through Pillow, exported in slabs, so
  peak memory is Pillow's own image plus the output.

Pixels follow Pillow's rules (what vLLM's loaders produce): `convert(mode)`, except RGBA to RGB,
which is composited over `ImageSpec.background` as vLLM's rgba_to_rgb does. Orientation is the
shared native kernel, so every backend rotates identically. Every decoder here releases the GIL.
"""

from __future__ import annotations

import dataclasses
import io
import struct
import warnings
import zlib

import numpy as np
import numpy.typing as npt
import simplejpeg
import torch
from PIL import Image, UnidentifiedImageError

from .. import _C, ops
from ..errors import InvalidMediaError, MediaError, MediaTooLargeError, UnprocessableMediaError, described
from ..spec import DEFAULT_LIMITS, ImageSpec, Limits
from .types import CHANNELS, EncodedBytes, ImageHeader

# A decoded image's pixels: uint8 [H, W, C] (or flat while it is assembled).
Pixels = npt.NDArray[np.uint8]

_RESAMPLE = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}
# What Pillow may open: vLLM 0.33's allow-list (vllm/multimodal/image.py), the still-image readers
# that decode in-process. Denied there and here: EPS (runs Ghostscript), WMF, the BUFR/GRIB/HDF5
# stubs and MPEG. AVIF only where Pillow was built with it.
Image.init()
PILLOW_FORMATS = tuple(
    name
    for name in (
        "AVIF",
        "BLP",
        "BMP",
        "CUR",
        "DCX",
        "DDS",
        "DIB",
        "FITS",
        "FLI",
        "FTEX",
        "GBR",
        "GIF",
        "ICNS",
        "ICO",
        "IM",
        "IMT",
        "IPTC",
        "JPEG",
        "JPEG2000",
        "MCIDAS",
        "MSP",
        "PCD",
        "PCX",
        "PIXAR",
        "PNG",
        "PPM",
        "PSD",
        "QOI",
        "SGI",
        "SPIDER",
        "SUN",
        "TGA",
        "TIFF",
        "WEBP",
        "XBM",
        "XPM",
        "XVTHUMB",
    )
    if name in Image.OPEN
)
_SLAB_BYTES = 4 << 20  # Pillow images are exported this many bytes at a time
# Pages of a TIFF the probe walks (multi-page scans have hundreds; frame 0 is what decodes).
_MAX_TIFF_PAGES = 1024


_NATIVE_FIELDS = [f.name for f in dataclasses.fields(ImageHeader) if f.name not in ("mode", "bmp_rle")]
_PNG_MODES = {2: "RGB", 3: "P", 4: "LA", 6: "RGBA"}


def _native_header(result: _C.ProbeResult, mode: str) -> ImageHeader:
    return ImageHeader(**{name: getattr(result, name) for name in _NATIVE_FIELDS}, mode=mode)


def _native_mode(result: _C.ProbeResult) -> str | None:
    """Pillow's mode from the native header, where it follows from the header alone."""
    if result.format == "jpeg":
        return {1: "L", 3: "RGB", 4: "CMYK"}.get(result.components)
    if result.format == "png":
        if result.png_color_type == 0:
            return {1: "1", 16: "I;16"}.get(result.bit_depth, "L")
        return _PNG_MODES.get(result.png_color_type)
    return None  # GIF and WebP: Pillow's header parse says (a GIF with a gray palette opens as L)


REMEMBER_HEADERS = False  # the native probe costs about a microsecond, Pillow's header parse tens


def _open(data: EncodedBytes) -> Image.Image:
    """Pillow's lazy open (header only) limited to PILLOW_FORMATS."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # our limits, checked from the header, decide
        return Image.open(io.BytesIO(data), formats=PILLOW_FORMATS)


def _probe_with_pillow(data: EncodedBytes, result: _C.ProbeResult | None) -> ImageHeader:
    try:
        image = _open(data)
    except UnidentifiedImageError:
        raise InvalidMediaError(
            "not an image format this server reads: send JPEG, PNG, GIF, WebP, BMP, TIFF "
            "or another format Pillow opens",
            modality="image",
        ) from None
    except Image.DecompressionBombError as exc:
        raise MediaTooLargeError(
            "decompression bomb: the image has more pixels than the limit: send a smaller image",
            hint=f"raise Limits.max_pixels ({exc})",
            modality="image",
        ) from None
    except Exception as exc:  # a recognised format whose header is broken
        raise UnprocessableMediaError(
            f"broken image header ({described(exc)}): re-encode the file or send another", modality="image"
        ) from None
    with image:
        width, height = image.size
        transparency = "A" in image.getbands() or "transparency" in image.info
        if result is not None and result.status == "ok":  # a native format: its header, Pillow's mode
            header = _native_header(result, image.mode)
            return dataclasses.replace(header, has_alpha=header.has_alpha or transparency)
        try:
            orientation = int(image.getexif().get(0x0112, 1))
        except Exception:  # a broken EXIF block: Pillow's exif_transpose would not rotate either
            orientation = 1
        if image.format == "TIFF":
            frames = _tiff_pages(data)
        else:  # ICO and MPO count their frames from one header table
            frames = int(getattr(image, "n_frames", 1) or 1) if image.format in ("ICO", "MPO") else 1
        return ImageHeader(
            format=(image.format or "unknown").lower(),
            width=width,
            height=height,
            components=len(image.getbands()),
            bit_depth=8,
            has_alpha=transparency,
            orientation=orientation if 1 <= orientation <= 8 else 1,
            has_icc="icc_profile" in image.info,
            jpeg_encoding="",
            chroma_subsampling="",
            has_adobe=False,
            adobe_transform=-1,
            png_color_type=-1,
            png_interlaced=False,
            animated=frames > 1,
            frame_count=frames,
            max_frame_width=width,
            max_frame_height=height,
            webp_kind="",
            png_compressed_text=False,
            mode=image.mode,
            bmp_rle=image.format == "BMP" and image.info.get("compression") in (1, 2),
        )


def _tiff_pages(data: EncodedBytes) -> int:
    """Pages (IFDs) a TIFF chains, from a walk of the chain that reads two fields per IFD
    (Pillow's n_frames parses every IFD and checks loops against a list: quadratic). Stops at an
    IFD seen before (a loop) or one outside the file; a chain longer than _MAX_TIFF_PAGES is a
    413 after that many steps."""
    view = memoryview(data)
    endian = "<" if bytes(view[:2]) == b"II" else ">"
    big = struct.unpack_from(endian + "H", view, 2)[0] == 43  # BigTIFF: 8-byte counts and offsets
    count_format, offset_format, entry_size = ("Q", "Q", 20) if big else ("H", "I", 12)
    count_size, offset_size = struct.calcsize(count_format), struct.calcsize(offset_format)
    offset = struct.unpack_from(endian + offset_format, view, 8 if big else 4)[0]
    pages, seen = 0, set()
    while 0 < offset <= len(data) - count_size and offset not in seen:
        seen.add(offset)
        pages += 1
        if pages > _MAX_TIFF_PAGES:
            raise MediaTooLargeError(f"TIFF chains more than {_MAX_TIFF_PAGES} pages", modality="image")
        next_at = offset + count_size + struct.unpack_from(endian + count_format, view, offset)[0] * entry_size
        if next_at > len(data) - offset_size:
            break
        offset = struct.unpack_from(endian + offset_format, view, next_at)[0]
    return max(pages, 1)


def probe_is_instant(data: EncodedBytes) -> bool:
    """Whether probe(data) takes microseconds whatever the bytes hold, so an event loop may run
    it inline: a JPEG or PNG (the native probe alone, linear in the size) of at most 1 MiB.
    Every other format goes through Pillow's header parse, and belongs on a thread."""
    head = bytes(data[:8])
    return len(data) <= 1 << 20 and (head[:3] == b"\xff\xd8\xff" or head == b"\x89PNG\r\n\x1a\n")


def probe(data: EncodedBytes, limits: Limits, spec: ImageSpec) -> ImageHeader:
    """Header of an encoded image; rejects non-images (400), broken headers (422) and items over
    `limits` (413) before anything is decoded."""
    result = _C.probe(data)
    if result.status == "unknown_format":
        header = _probe_with_pillow(data, None)
    elif result.status != "ok":
        raise UnprocessableMediaError(
            f"{result.format} header is {result.status} ({result.error}): re-encode the file or send another",
            modality="image",
        )
    else:
        mode = _native_mode(result)
        if mode is None:
            check_pixels(result.max_frame_width, result.max_frame_height, limits)  # before Pillow reads anything
            header = _probe_with_pillow(data, result)
        else:
            header = _native_header(result, mode)
    check_limits(header, limits, spec, len(data))
    return header


def check_pixels(width: int, height: int, limits: Limits) -> None:
    if width * height > limits.max_pixels:
        raise MediaTooLargeError(
            f"an image of (height, width)=({height}, {width}) is over the {limits.max_pixels} "
            "pixel limit: send a smaller image",
            hint="raise Limits.max_pixels",
            modality="image",
            limit="max_pixels",
            value=(width, height),
            maximum=limits.max_pixels,
        )


def check_limits(header: ImageHeader, limits: Limits, spec: ImageSpec, encoded_bytes: int) -> None:
    """Refuses (413) what `limits` do not allow, from the header alone: the largest frame's area
    (what the decoder holds) and the output's size (what the spec asks for)."""
    check_pixels(header.max_frame_width, header.max_frame_height, limits)
    if header.scan_count > limits.max_jpeg_scans:
        raise MediaTooLargeError(
            f"JPEG has {header.scan_count} scans, over the {limits.max_jpeg_scans} scan limit "
            "(each scan is a pass over the whole image)",
            hint="raise Limits.max_jpeg_scans",
            modality="image",
        )
    height, width, channels = header.output_shape(spec)
    limits.check_decoded(
        height * width * channels, "image", f"{width}x{height}x{channels} pixels", header.working_bytes
    )
    if header.format == "jpeg" and header.bit_depth != 8:
        raise UnprocessableMediaError(
            f"{header.bit_depth}-bit JPEG is not supported: re-encode it as 8-bit JPEG or PNG", modality="image"
        )
    least = least_encoded_bytes(header)
    if encoded_bytes < least and not (header.format == "jpeg" and height * width * channels <= TRUNCATED_JPEG_OUTPUT):
        raise UnprocessableMediaError(
            f"truncated {header.format.upper()}: {encoded_bytes} bytes, where a "
            f"{header.width}x{header.height} one needs {least} at least: send the whole "
            "file",
            modality="image",
        )


# A JPEG shorter than its floor (least_encoded_bytes) is still decoded when its output is at most
# this many bytes: libjpeg, so Pillow and vLLM, decodes what is there and fills the rest with grey
# (a warning, not an error). Past it the floor refuses it before the canvas is allocated, so a few
# hundred bytes cannot make the decoder allocate and fill a gigabyte.
TRUNCATED_JPEG_OUTPUT = 64 << 20
# Deflate's largest ratio: a 258-byte match per 2 bits of code, about 1032:1.
_DEFLATE_MAX_RATIO = 1032
_PNG_SAMPLES = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
_HUFFMAN_JPEG = ("baseline", "extended", "progressive")


def least_encoded_bytes(header: ImageHeader) -> int:
    """The fewest bytes a whole file of this header can have, so that a truncated one is refused
    before its canvas is allocated: a Huffman-coded JPEG codes every 8x8 block of its largest
    component in at least 1 bit (its DC), a PNG's pixel rows inflate at most 1032:1. 0 where the
    header tells nothing (arithmetic or lossless JPEG, GIF, WebP, BMP, TIFF: run-length and
    arithmetic coding have no useful floor)."""
    if header.format == "jpeg" and header.jpeg_encoding in _HUFFMAN_JPEG:
        return -(-header.width // 8) * -(-header.height // 8) // 8
    if header.format == "png" and header.png_color_type in _PNG_SAMPLES:
        row = -(-header.width * _PNG_SAMPLES[header.png_color_type] * header.bit_depth // 8)
        return header.height * row // _DEFLATE_MAX_RATIO
    return 0


# -- decoding ------------------------------------------------------------------------------------
class _TryPillow(Exception):
    """A fast decoder refused a stream Pillow may still read (libjpeg-turbo is strict about
    junk between markers, libpng about odd chunks); Pillow then decides."""


def _draft_size(header: ImageHeader, spec: ImageSpec) -> tuple[int, int] | None:
    """(height, width) at least as large as the target, before orientation, when spec.draft
    lets a JPEG decode at a reduced DCT scale; None otherwise."""
    if not spec.draft or spec.size is None or header.format != "jpeg":
        return None
    height, width = spec.size
    return (width, height) if spec.apply_orientation and header.orientation >= 5 else (height, width)


def _jpeg(data: EncodedBytes, header: ImageHeader, spec: ImageSpec, target: str) -> Pixels:
    """8-bit YCbCr/gray JPEG through libjpeg-turbo, bit-identical to Pillow (colour to L and
    CMYK/YCCK go to Pillow, which converts with its own weights)."""
    if header.components not in (1, 3) or target == "LA" or (header.components == 3 and target == "L"):
        raise _TryPillow()
    draft = _draft_size(header, spec)
    scale = {} if draft is None else {"min_height": draft[0], "min_width": draft[1]}
    gray = header.components == 1
    try:
        array: Pixels = simplejpeg.decode_jpeg(data, colorspace="GRAY" if gray else target, **scale)
    except ValueError as exc:
        if "Premature end" in str(exc):  # a truncated stream is an error, as in Pillow
            raise UnprocessableMediaError(
                f"corrupt jpeg ({exc}): re-encode the file or send another", modality="image"
            ) from None
        raise _TryPillow() from exc
    if not gray or target == "L":
        return array.reshape(array.shape[0], array.shape[1], -1)
    height, width = array.shape[:2]
    widened = np.empty((height, width, CHANNELS[target]), np.uint8)
    widened[:, :, :3] = array.reshape(height, width, 1)
    if target == "RGBA":
        widened[:, :, 3] = 255
    return widened


def _resized(array: Pixels, height: int, width: int, channels: int) -> Pixels:
    """`array`'s memory, owned by it alone, resized to height x width x channels bytes in place:
    realloc keeps the pages when shrinking and remaps them when growing, without copying."""
    array.resize(height * width * channels, refcheck=False)
    return array.reshape(height, width, channels)


def composites(header: ImageHeader, target: str) -> bool:
    """vLLM's rule: an image with transparency (an alpha band, or a transparent colour) decoded
    as RGB is converted to RGBA by Pillow's rules and composited over the background."""
    return target == "RGB" and (header.mode in ("RGBA", "LA", "PA") or header.has_transparency)


# What a PNG's compressed ancillary chunks may inflate to: each iCCP, zTXt or compressed iTXt
# 1 MiB (Pillow's MAX_TEXT_CHUNK; libspng inflates an iCCP whole, without a limit: a 1 MB chunk
# took 1 GiB), and all of them together 8 MiB (Pillow allows 64 MiB of text).
MAX_PNG_CHUNK_INFLATED = 1 << 20
MAX_PNG_ANCILLARY_INFLATED = 8 << 20


def check_png_ancillary(data: EncodedBytes) -> None:
    """Refuses (413) a PNG whose iCCP, zTXt or compressed iTXt chunks inflate past the bounds
    above, from inflates that stop there; the chunk walk reads lengths only."""
    view = memoryview(data).cast("B")
    offset, total = 8, 0
    while offset + 8 <= len(view):
        length = int.from_bytes(view[offset : offset + 4], "big")
        kind = bytes(view[offset + 4 : offset + 8])
        if kind == b"IEND":
            return
        if kind in (b"iCCP", b"zTXt", b"iTXt"):
            total += _inflated_size(bytes(view[offset + 8 : offset + 8 + length]), kind)
            if total > MAX_PNG_ANCILLARY_INFLATED:
                raise MediaTooLargeError(
                    f"the PNG's compressed chunks inflate past {MAX_PNG_ANCILLARY_INFLATED} "
                    "bytes: strip its text and profile",
                    modality="image",
                )
        offset += 12 + length


def _inflated_size(body: bytes, kind: bytes) -> int:
    """What one chunk's compressed part inflates to (0 when stored or broken: the decoders ignore
    or refuse it); a 413 past MAX_PNG_CHUNK_INFLATED."""
    keyword_end = body.find(b"\0", 0, 80)
    if keyword_end < 0:
        return 0
    start = keyword_end + 2  # after the keyword's NUL and the method byte
    if kind == b"iTXt":
        if body[keyword_end + 1 : keyword_end + 2] != b"\1":
            return 0  # stored text
        language_end = body.find(b"\0", keyword_end + 3)
        translated_end = body.find(b"\0", language_end + 1) if language_end >= 0 else -1
        if translated_end < 0:
            return 0
        start = translated_end + 1
    try:
        inflated = len(zlib.decompressobj().decompress(body[start:], MAX_PNG_CHUNK_INFLATED + 1))
    except zlib.error:
        return 0
    if inflated > MAX_PNG_CHUNK_INFLATED:
        raise MediaTooLargeError(
            f"a {kind.decode()} chunk of the PNG inflates past {MAX_PNG_CHUNK_INFLATED} bytes: "
            "strip its text and profile",
            modality="image",
        )
    return inflated


def _png(data: EncodedBytes, header: ImageHeader, spec: ImageSpec, target: str) -> Pixels:
    """8-bit and smaller PNGs through libspng, which expands palettes and low bit depths to G8,
    RGB8 or RGBA8 in one array this module then owns; the alpha is composited and gray widened
    in place. libspng ignores tRNS, so images with a transparent colour go to Pillow, as do the
    conversions it does not mirror (luma, gray with alpha)."""
    if header.has_icc or header.png_compressed_text:
        check_png_ancillary(data)
    if header.bit_depth > 8 or header.png_compressed_text or header.png_color_type == 4:
        raise _TryPillow()  # 16 bits, compressed text (Pillow bounds it: a 413), gray with alpha
    decoded = {0: 1, 2: 3, 3: 3, 6: 4}[header.png_color_type]
    transparent_colour = header.has_alpha and header.png_color_type in (0, 2, 3)
    if composites(header, target):
        if decoded != 4:
            raise _TryPillow()
    elif (
        not (
            target == "RGB" and decoded in (1, 3) or target == "L" and decoded == 1 or target == "RGBA" and decoded == 4
        )
        or transparent_colour
        and target != "L"
    ):
        raise _TryPillow()
    try:
        import imagecodecs  # a large library, loaded by the first PNG; absent, Pillow decodes

        array = imagecodecs.spng_decode(data)  # type: ignore[arg-type]  # any buffer; the stubs say bytes-likes
    except Exception as exc:  # libspng refuses (odd chunks, truncation): Pillow decides
        raise _TryPillow() from exc
    height, width = header.height, header.width
    if array.base is not None or array.dtype != np.uint8 or array.size != height * width * decoded:
        raise _TryPillow()  # not the one owned array this path needs
    if decoded == 4 and target == "RGB":
        _C.pack_alpha(array, height * width, 4, spec.background)
        return _resized(array, height, width, 3)
    if decoded == 1 and target == "RGB":
        array = _resized(array, height, width, 3)
        _C.gray_to_rgb(array, height * width)
    return array.reshape(height, width, CHANNELS[target])


def _webp(data: EncodedBytes, header: ImageHeader, spec: ImageSpec, target: str) -> Pixels:
    """WebP through libwebp into one array this module then owns (Pillow opens WebP with alpha
    as RGBA: composited over the background for RGB)."""
    if target not in ("RGB", "RGBA"):
        raise _TryPillow()
    composite = composites(header, target)
    channels = 4 if composite or target == "RGBA" else 3
    try:
        import imagecodecs

        array = imagecodecs.webp_decode(data, hasalpha=channels == 4)  # type: ignore[arg-type]  # as spng_decode
    except Exception as exc:
        raise _TryPillow() from exc
    height, width = header.height, header.width
    if array.base is not None or array.dtype != np.uint8 or array.size != height * width * channels:
        raise _TryPillow()
    if composite:
        _C.pack_alpha(array, height * width, 4, spec.background)
        return _resized(array, height, width, 3)
    return array.reshape(height, width, channels)


def _pillow(data: EncodedBytes, header: ImageHeader, spec: ImageSpec, target: str) -> Pixels:
    """Any format Pillow reads (frame 0), converted by vLLM's rules (transparency composited over
    the background for RGB, Pillow's convert otherwise) and exported in slabs into one array.
    Gray to RGB is exported as gray and widened in place once Pillow's image is gone, so the two
    never coexist at the output's size."""
    with _open(data) as image:
        draft = _draft_size(header, spec)
        if draft is not None and image.format == "JPEG":
            image.draft(target if target in ("RGB", "L") else None, (draft[1], draft[0]))
        image.load()
        composite = target == "RGB" and (image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info)
        widen = target == "RGB" and image.mode == "L" and not composite
        mode = "RGBA" if composite else "L" if widen else target
        channels = CHANNELS[mode]
        width, height = image.size
        buffer = np.empty(width * height * channels, np.uint8)
        rows = max(1, _SLAB_BYTES // max(1, width * 4))
        for top in range(0, height, rows):
            slab = image.crop((0, top, width, min(height, top + rows)))
            if slab.mode != mode:
                slab = slab.convert(mode)
            start = top * width * channels
            buffer[start : start + slab.height * width * channels] = np.asarray(slab).reshape(-1)
    if composite:
        _C.pack_alpha(buffer, width * height, 4, spec.background)
        channels = 3
    if widen:
        buffer = _resized(buffer, height, width, 3)
        _C.gray_to_rgb(buffer, width * height)
        return buffer
    return _resized(buffer, height, width, channels)


_FAST_DECODERS = {"jpeg": _jpeg, "png": _png, "webp": _webp}


def _pixels(data: EncodedBytes, header: ImageHeader, spec: ImageSpec) -> Pixels:
    target = header.target_mode(spec)
    fast = _FAST_DECODERS.get(header.format)
    if fast is not None:
        try:
            return fast(data, header, spec, target)
        except _TryPillow:
            pass
    return _pillow(data, header, spec, target)


def decode(
    data: EncodedBytes,
    header: ImageHeader,
    spec: ImageSpec,
    out: torch.Tensor | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> torch.Tensor:
    """Decodes to a uint8 HWC tensor (channels 1, 2, 3 or 4 for L, LA, RGB, RGBA), into `out`
    when given (a pinned or caller-owned buffer of the output shape)."""
    shape = header.output_shape(spec)
    if out is not None and (tuple(out.shape) != shape or out.dtype != torch.uint8 or not out.is_contiguous()):
        raise ValueError(f"out must be a contiguous uint8 tensor of shape {shape}, got {tuple(out.shape)} {out.dtype}")
    try:
        array = _pixels(data, header, spec)
    except MediaError:
        raise
    except Image.DecompressionBombError as exc:
        raise MediaTooLargeError(
            "decompression bomb: the image has more pixels than the limit: send a smaller image",
            hint=f"raise Limits.max_pixels ({exc})",
            modality="image",
        ) from None
    except ValueError as exc:
        if "Decompressed data too large" in str(exc):
            raise MediaTooLargeError(
                "decompression bomb: the image's data inflates past the limit: send a smaller image",
                hint=f"raise Limits.max_decoded_bytes ({exc})",
                modality="image",
            ) from None
        raise UnprocessableMediaError(
            f"corrupt {header.format} ({described(exc)}): re-encode the file or send another", modality="image"
        ) from None
    except Exception as exc:  # decoders raise OSError, SyntaxError, EOFError, struct.error, ...
        raise UnprocessableMediaError(
            f"corrupt {header.format} ({described(exc)}): re-encode the file or send another", modality="image"
        ) from None
    if array.shape[:2] != (header.height, header.width) and _draft_size(header, spec) is None:
        raise UnprocessableMediaError(
            f"{header.format} decoded to {array.shape[1]}x{array.shape[0]}, "
            f"not the {header.width}x{header.height} its header declares: re-encode the file "
            "or send another",
            modality="image",
        )
    if spec.apply_orientation and header.orientation != 1:
        array = ops.orient(torch.from_numpy(array), header.orientation).numpy()
    if spec.size is not None and array.shape[:2] != spec.size:
        array = _resize(array, spec.size, spec.resample)
    tensor = torch.from_numpy(array)
    if out is None:
        return tensor
    out.copy_(tensor)
    return out


def _resize(array: Pixels, size: tuple[int, int], resample: str) -> Pixels:
    """Pillow's resize, bit for bit: the native kernel for L and RGB, Pillow itself for images
    with alpha (it premultiplies them)."""
    if array.shape[2] in (1, 3):
        return ops.resize(torch.from_numpy(array), size, resample).numpy()
    height, width = size
    mode = "LA" if array.shape[2] == 2 else "RGBA"
    resized = Image.fromarray(array, mode).resize((width, height), _RESAMPLE[resample])
    return np.array(resized).reshape(height, width, array.shape[2])
