"""The native header probe against Pillow on every corpus image, and on hostile input."""

import warnings

import pytest
from PIL import Image

from lazymedia import _C

from conftest import CORPUS, corpus_bytes, corpus_params, corpus_path, encode, make_image, requires_corpus

PIL_COMPONENTS = {"L": 1, "RGB": 3, "CMYK": 4, "RGBA": 4, "LA": 2, "I;16": 1, "1": 1}


def pillow_view(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Image.open(path) as image:
            try:
                image.load()
            except Exception:
                pass
            orientation = image.getexif().get(0x0112, 1)
            return image.size, image.mode, orientation if orientation in range(2, 9) else 1


@pytest.mark.parametrize("row", corpus_params("image", {"decodes"}))
def test_probe_matches_pillow(row):
    result = _C.probe(corpus_bytes(row))
    assert result.status == "ok", result.error
    size, mode, orientation = pillow_view(corpus_path(row))
    assert (result.width, result.height) == size
    assert result.orientation == orientation
    assert result.format == row["format"].replace("apng", "png")
    if mode in PIL_COMPONENTS and row["format"] in ("jpeg", "png", "apng") and mode not in ("RGBA", "LA"):
        assert result.components == PIL_COMPONENTS[mode]


@pytest.mark.parametrize("row", corpus_params("image", {"corrupt", "bomb", "unsupported"}))
def test_probe_never_fails_untyped_on_bad_images(row):
    data = corpus_bytes(row)
    result = _C.probe(data)
    assert result.status in ("ok", "truncated", "malformed", "unknown_format")
    # every prefix, too: the probe must never read past the end
    for cut in range(0, min(len(data), 600), 7):
        assert _C.probe(data[:cut]).status in ("ok", "truncated", "malformed", "unknown_format")


def test_jpeg_details():
    data = encode(make_image(48, 64), "JPEG", quality=85, subsampling=2)
    r = _C.probe(data)
    assert (r.width, r.height, r.components) == (64, 48, 3)
    assert r.jpeg_encoding == "baseline" and r.chroma_subsampling == "420"
    r = _C.probe(encode(make_image(48, 64), "JPEG", subsampling=0, progressive=True))
    assert r.jpeg_encoding == "progressive" and r.chroma_subsampling == "444"
    r = _C.probe(encode(make_image(48, 64), "JPEG", subsampling=1))
    assert r.chroma_subsampling == "422"


@requires_corpus
def test_cmyk_and_adobe_markers():
    r = _C.probe((CORPUS / "images/pil_sample_cmyk.jpg").read_bytes())
    assert r.components == 4 and r.has_adobe and r.adobe_transform == 2


@pytest.mark.parametrize("byte_order", ["<", ">"])
def test_exif_orientation_both_byte_orders(byte_order):
    exif = Image.Exif()
    exif[0x0112] = 6
    data = encode(make_image(20, 30), "JPEG", exif=exif.tobytes(offset=8) if byte_order == "<" else _big_endian_exif(6))
    assert _C.probe(data).orientation == 6


def _big_endian_exif(orientation):
    import struct

    ifd = struct.pack(">H", 1) + struct.pack(">HHIHH", 0x0112, 3, 1, orientation, 0) + struct.pack(">I", 0)
    return b"Exif\0\0" + b"MM\0\x2a" + struct.pack(">I", 8) + ifd


def test_png_webp_gif_details():
    png = _C.probe(encode(make_image(10, 12), "PNG"))
    assert (png.format, png.width, png.height, png.png_color_type, png.bit_depth) == ("png", 12, 10, 2, 8)
    webp = _C.probe(encode(make_image(10, 12), "WEBP", lossless=True))
    assert (webp.format, webp.webp_kind, webp.width, webp.height) == ("webp", "VP8L", 12, 10)
    gif = _C.probe(encode(make_image(10, 12), "GIF"))
    assert (gif.format, gif.width, gif.height, gif.frame_count) == ("gif", 12, 10, 1)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xff\xd8",
        b"\xff\xd8\xff",
        b"\x89PNG\r\n\x1a\n",
        b"GIF89a",
        b"RIFF\0\0\0\0WEBP",
        b"hello world",
        b"\xff\xd8\xff\xc0\x00\x11\x08\x00\x00\x00\x10\x03" + b"\x00" * 9,
    ],
)
def test_garbage_returns_status(data):
    r = _C.probe(data)
    assert r.status != "ok"
    assert r.error


def test_probe_rejects_non_contiguous_buffers():
    import numpy as np

    with pytest.raises(ValueError):
        _C.probe(np.zeros(20, dtype=np.uint8)[::2])


def jpeg_scans(data: bytes) -> int:
    """SOS markers counted by decoding the file's structure with Pillow's reference: libjpeg
    reports the scan count of a progressive file through its own walk (PIL keeps none), so the
    count comes from Python: markers after the first SOS, walked through entropy-coded data."""
    count, at = 0, 2
    while at + 1 < len(data):
        if data[at] != 0xFF or data[at + 1] in (0x00, 0xFF, *range(0xD0, 0xD8)):
            at += 1
            continue
        marker = data[at + 1]
        if marker == 0xD9:
            break
        count += marker == 0xDA
        at += 2 + int.from_bytes(data[at + 2 : at + 4], "big")
    return count


def test_jpeg_scan_count():
    """Baseline: one scan, and the walk stops there; progressive: every scan, walked through the
    entropy-coded data (stuffed FF00 bytes and RSTn markers included) to EOI."""
    image = make_image(300, 400)
    assert _C.probe(encode(image, "JPEG", quality=90)).scan_count == 1
    progressive = encode(image, "JPEG", quality=95, progressive=True)
    assert _C.probe(progressive).scan_count == jpeg_scans(progressive) == 10  # libjpeg's colour progression
    gray = encode(image[:, :, 0], "JPEG", quality=95, progressive=True)
    assert _C.probe(gray).scan_count == jpeg_scans(gray) == 6
    with_restarts = encode(image, "JPEG", progressive=True, restart_marker_blocks=1)
    assert _C.probe(with_restarts).scan_count == 10
    eoi = progressive.rindex(b"\xff\xd9")
    scan = progressive.rindex(b"\xff\xda")
    repeated = progressive[:eoi] + progressive[scan:eoi] * 40 + b"\xff\xd9"
    assert _C.probe(repeated).scan_count == 50
    for cut in range(progressive.index(b"\xff\xda") + 16, len(progressive), 97):  # a cut file: what it holds
        assert 1 <= _C.probe(progressive[:cut]).scan_count <= 10
