"""CPU image decoding held to Pillow's pixels and to the corpus manifest's expectations."""

import struct
import warnings

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

import lazymedia
from lazymedia import InvalidMediaError, MediaError, MediaTooLargeError, UnprocessableMediaError
from lazymedia.codecs import _image as image_codec

from conftest import CORPUS, corpus_bytes, corpus_params, corpus_path, encode, make_image, requires_corpus


def pillow_reference(path_or_bytes, mode="RGB", background=(255, 255, 255)):
    """What vLLM 0.33's ImageMediaIO produces: exif_transpose (a broken EXIF block is ignored),
    then for RGB an image with transparency converted to RGBA and pasted through its alpha onto
    the background, else Pillow's convert(mode)."""
    import io

    src = io.BytesIO(path_or_bytes) if isinstance(path_or_bytes, bytes) else path_or_bytes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        image = Image.open(src)
        try:
            image = ImageOps.exif_transpose(image)
        except (SyntaxError, struct.error):  # Pillow gives up on a broken EXIF block; so does vLLM
            pass
        image.load()
        if mode == "RGB" and (image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info):
            rgba = image.convert("RGBA") if image.mode != "RGBA" else image
            image = Image.new("RGB", rgba.size, background)
            image.paste(rgba, mask=rgba.split()[3])
        elif image.mode != mode:
            image = image.convert(mode)
        array = np.asarray(image)
    return array[:, :, None] if array.ndim == 2 else array


@pytest.mark.parametrize("row", corpus_params("image", {"decodes"}))
def test_corpus_decodes_equal_to_pillow(row):
    data = corpus_bytes(row)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tensor = lazymedia.load_image(data).media
    assert tensor.dtype == torch.uint8 and tensor.ndim == 3
    np.testing.assert_array_equal(tensor.numpy(), pillow_reference(corpus_path(row)))


@pytest.mark.parametrize("row", corpus_params("image", {"corrupt"}))
def test_corpus_corrupt_is_unprocessable_or_decodes_partially(row):
    data = corpus_bytes(row)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            tensor = lazymedia.load_image(data).media
        except UnprocessableMediaError as exc:
            assert exc.status_code == 422
            return
    # A corrupt file may yield the pixels it does hold (the manifest allows partial data).
    assert tensor.ndim == 3 and tensor.numel() > 0


@pytest.mark.parametrize("row", corpus_params("image", {"bomb"}))
def test_corpus_bombs_are_refused(row):
    data = corpus_bytes(row)
    with pytest.raises(MediaTooLargeError) as info:
        lazymedia.load_image(data).decode()
    assert info.value.status_code == 413


@pytest.mark.parametrize("row", corpus_params("image", {"unsupported"}))
def test_corpus_unsupported_decodes_or_fails_typed(row):
    try:
        tensor = lazymedia.load_image(corpus_bytes(row)).media
    except MediaError:
        return
    assert tensor.ndim == 3


@requires_corpus
def test_gif_bomb_refused_at_load_without_decoding(monkeypatch):
    path = CORPUS / "images/bad/decompression_bomb.gif"
    monkeypatch.setattr(image_codec, "decode", lambda *a, **k: pytest.fail("decoded a bomb"))
    with pytest.raises(MediaTooLargeError):
        lazymedia.load_image(path.read_bytes())


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L"])
@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_modes_match_pillow(mode, fmt):
    data = encode(make_image(33, 47), fmt, **({"quality": 90} if fmt != "PNG" else {}))
    tensor = lazymedia.load_image(data, mode=mode).media
    np.testing.assert_array_equal(tensor.numpy(), pillow_reference(data, mode))


def test_gray_jpeg_to_rgb_and_rgba():
    data = encode(make_image(20, 30)[:, :, 0], "JPEG")
    for mode in ("RGB", "RGBA", "L"):
        np.testing.assert_array_equal(lazymedia.load_image(data, mode=mode).media.numpy(), pillow_reference(data, mode))


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orientation_kernel_matches_pillow(orientation):
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = encode(make_image(24, 40, seed=orientation), "PNG", exif=exif.tobytes())
    media = lazymedia.load_image(data)
    assert media.header.orientation == orientation
    np.testing.assert_array_equal(media.media.numpy(), pillow_reference(data))
    unrotated = lazymedia.load_image(data, apply_orientation=False).media.numpy()
    np.testing.assert_array_equal(unrotated, make_image(24, 40, seed=orientation))


@pytest.mark.parametrize("resample", ["bilinear", "bicubic"])
def test_resize_is_pillows(resample):
    data = encode(make_image(120, 200), "JPEG", quality=95)
    tensor = lazymedia.load_image(data, size=(50, 70), resample=resample).media
    filt = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}[resample]
    expected = np.asarray(Image.open(__import__("io").BytesIO(data)).convert("RGB").resize((70, 50), filt))
    np.testing.assert_array_equal(tensor.numpy(), expected)


def test_decode_into_caller_buffer():
    data = encode(make_image(64, 96), "JPEG")
    out = torch.empty((64, 96, 3), dtype=torch.uint8)
    media = lazymedia.load_image(data)
    result = media.decode(out=out)
    assert result.data_ptr() == out.data_ptr()
    np.testing.assert_array_equal(out.numpy(), pillow_reference(data))
    rotated = lazymedia.load_image(encode(make_image(64, 96), "PNG"))
    out2 = torch.empty((64, 96, 3), dtype=torch.uint8)
    assert rotated.decode(out=out2).data_ptr() == out2.data_ptr()
    with pytest.raises(ValueError):
        lazymedia.load_image(data).decode(out=torch.empty((10, 10, 3), dtype=torch.uint8))


def test_non_media_is_invalid():
    with pytest.raises(InvalidMediaError) as info:
        lazymedia.load_image(b"<html>not an image</html>")
    assert info.value.status_code == 400


def test_pixel_limit_from_header():
    data = encode(make_image(100, 100), "PNG")
    with pytest.raises(MediaTooLargeError):
        lazymedia.load_image(data, limits=lazymedia.Limits(max_pixels=5000))


def test_byte_limit():
    data = encode(make_image(100, 100), "PNG")
    with pytest.raises(MediaTooLargeError):
        lazymedia.load_image(data, limits=lazymedia.Limits(max_bytes=100))


def test_decoded_size_budget_from_the_spec():
    data = encode(np.zeros((2000, 2000, 3), dtype=np.uint8), "PNG")
    limits = lazymedia.Limits(max_decoded_bytes=2000 * 2000 * 3 - 1)
    with pytest.raises(MediaTooLargeError, match="over the .* limit") as info:
        lazymedia.load_image(data, limits=limits)
    assert "Limits.max_decoded_bytes" in info.value.hint and "size=" in info.value.hint
    assert lazymedia.load_image(data, limits=limits, size=(1000, 1000)).header.width == 2000  # the output fits
    with pytest.raises(MediaTooLargeError):
        lazymedia.load_image(data, limits=limits, mode="RGBA", size=(2000, 1500))


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "LA", None])
@pytest.mark.parametrize("row", corpus_params("image", {"decodes"}))
def test_every_mode_follows_pillow(row, mode):
    """Each output mode equals Pillow's conversion of the same file (vLLM's rule for RGB);
    mode=None keeps the source's own channels (palettes widen to RGB, or RGBA with a
    transparent colour)."""
    data = corpus_bytes(row)
    item = lazymedia.load_image(data, mode=mode)
    target = item.header.target_mode(item.spec)
    if mode is not None:
        assert target == mode
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        decoded = item.media
    assert tuple(decoded.shape) == item.header.output_shape(item.spec)
    np.testing.assert_array_equal(decoded.numpy(), pillow_reference(data, target))


def transparent_corpus_images():
    """The corpus images with an alpha band or a transparent colour (vLLM composites those)."""
    return [
        param
        for param in corpus_params("image", {"decodes"})
        if param.values[0] is None
        or image_codec.composites(lazymedia.load_image(corpus_bytes(param.values[0])).header, "RGB")
    ]


@pytest.mark.parametrize("row", transparent_corpus_images())
def test_transparency_composites_over_the_chosen_background(row):
    data = corpus_bytes(row)
    item = lazymedia.load_image(data, background=(0, 128, 255))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        np.testing.assert_array_equal(item.media.numpy(), pillow_reference(data, "RGB", background=(0, 128, 255)))
    assert item.key != lazymedia.load_image(data).key  # the background is part of the key


def test_a_transparent_red_pixel_becomes_the_background():
    rgba = np.zeros((4, 4, 4), np.uint8)
    rgba[..., 0] = 255  # red, fully transparent
    for fmt in ("PNG", "WEBP"):
        data = encode(rgba, fmt, **({"lossless": True, "exact": True} if fmt == "WEBP" else {}))
        assert lazymedia.load_image(data).numpy()[0, 0].tolist() == [255, 255, 255]
        assert lazymedia.load_image(data, background=(1, 2, 3)).numpy()[0, 0].tolist() == [1, 2, 3]
        assert lazymedia.load_image(data, mode="RGBA").numpy()[0, 0].tolist() == [255, 0, 0, 0]


PILLOW_ONLY_FORMATS = [
    ("BMP", {}),
    ("TIFF", {}),
    ("TIFF", {"compression": "tiff_lzw"}),
    ("ICO", {}),
    ("PPM", {}),
    ("TGA", {}),
    ("SGI", {}),
    ("PCX", {}),
    ("QOI", {}),
]
if "JPEG2000" in image_codec.PILLOW_FORMATS:  # where Pillow was built with OpenJPEG
    PILLOW_ONLY_FORMATS.append(("JPEG2000", {}))


@pytest.mark.parametrize("fmt, options", PILLOW_ONLY_FORMATS)
def test_formats_pillow_reads(fmt, options):
    array = make_image(48, 64)
    data = encode(array, fmt, **options)
    item = lazymedia.load_image(data)
    assert item.header.format == ("jpeg2000" if fmt == "JPEG2000" else fmt.lower())
    np.testing.assert_array_equal(item.numpy(), pillow_reference(data))
    assert lazymedia.load_image(data, mode=None, size=(24, 32)).media.shape == (24, 32, 3)


def test_formats_outside_the_allow_list_are_400():
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n%%EndComments\nshowpage\n"
    for data in (eps, b"%PDF-1.4\n1 0 obj\n<<>>\nendobj\n", b"plain text"):
        with pytest.raises(InvalidMediaError) as info:
            lazymedia.load_image(data)
        assert info.value.status_code == 400


def test_huge_canvas_in_a_pillow_format_is_413_from_the_header(monkeypatch):
    header = struct.pack("<2sIHHI", b"BM", 0, 0, 0, 54) + struct.pack(
        "<IiiHHIIiiII", 40, 30000, 30000, 1, 24, 0, 0, 0, 0, 0, 0
    )
    monkeypatch.setattr(image_codec, "decode", lambda *a, **k: pytest.fail("decoded past the header"))
    with pytest.raises(MediaTooLargeError):
        lazymedia.load_image(header + bytes(64))


def test_draft_decodes_jpeg_at_a_reduced_scale_then_resizes():
    data = encode(make_image(2160, 3840), "JPEG", quality=90)
    exact = lazymedia.load_image(data, size=(720, 1280)).media.numpy().astype(int)
    draft = lazymedia.load_image(data, size=(720, 1280), draft=True)
    assert draft.key != lazymedia.load_image(data, size=(720, 1280)).key
    pixels = draft.media.numpy().astype(int)
    assert pixels.shape == exact.shape
    difference = np.abs(pixels - exact)
    assert 0 < difference.mean() < 3 and difference.max() < 128  # close to the exact path, not equal to it
    png = encode(make_image(200, 300), "PNG")  # other formats ignore draft
    assert torch.equal(
        lazymedia.load_image(png, size=(50, 75), draft=True).media, lazymedia.load_image(png, size=(50, 75)).media
    )


def test_draft_respects_orientation():
    data = encode(make_image(1200, 1600), "JPEG", exif=_exif_orientation(6))
    item = lazymedia.load_image(data, size=(400, 300), draft=True)
    assert item.media.shape == (400, 300, 3)


def _exif_orientation(value):
    exif = Image.Exif()
    exif[0x0112] = value
    return exif.tobytes()


def test_to_pil_shares_memory_for_l_and_rgba(jpeg_bytes):
    rgba = lazymedia.load_image(jpeg_bytes, mode="RGBA")
    image = rgba.to_pil()
    assert image.mode == "RGBA" and np.array_equal(np.asarray(image), rgba.numpy())
    rgba.numpy()[0, 0, 0] ^= 0xFF
    assert np.asarray(image)[0, 0, 0] == rgba.numpy()[0, 0, 0]  # one buffer
    rgb = lazymedia.load_image(jpeg_bytes)
    assert rgb.to_pil().mode == "RGB" and np.array_equal(np.asarray(rgb.to_pil()), rgb.numpy())


def tiff_chain(pages: int, loop_to: int | None = None, big: bool = False) -> bytes:
    """A TIFF of `pages` 1x1 bilevel IFDs, each pointing to the next; the last to IFD `loop_to`
    (a loop) or nowhere. BigTIFF with `big`."""
    count_format, entry_format, offset_format = ("<Q", "<HHQQ", "<Q") if big else ("<H", "<HHII", "<I")
    header = b"II+\x00" + struct.pack("<HHQ", 8, 0, 16) if big else b"II*\x00" + struct.pack("<I", 8)
    entries = b"".join(struct.pack(entry_format, tag, 4, 1, value) for tag, value in ((256, 1), (257, 1), (273, 0)))
    size = struct.calcsize(count_format) + len(entries) + struct.calcsize(offset_format)
    ifds = []
    for page in range(pages):
        following = page + 1 if page + 1 < pages else loop_to
        ifds.append(
            struct.pack(count_format, 3)
            + entries
            + struct.pack(offset_format, 0 if following is None else len(header) + size * following)
        )
    return header + b"".join(ifds)


def test_tiff_pages_are_counted_by_a_bounded_walk(monkeypatch):
    """Pillow's n_frames parses every IFD and checks loops against a list (28 CPU-s for 80 k
    pages); the probe walks the chain itself: counted, loop-safe, refused past 1024 pages."""
    from PIL import TiffImagePlugin

    multipage = encode(make_image(16, 16), "TIFF", save_all=True, append_images=[Image.new("RGB", (8, 8))] * 2)
    monkeypatch.setattr(TiffImagePlugin.TiffImageFile, "n_frames", property(lambda self: pytest.fail("n_frames")))
    for big in (False, True):
        assert (
            image_codec.probe(tiff_chain(3, big=big), lazymedia.DEFAULT_LIMITS, lazymedia.ImageSpec()).frame_count == 3
        )
        assert (
            image_codec.probe(
                tiff_chain(5, loop_to=1, big=big), lazymedia.DEFAULT_LIMITS, lazymedia.ImageSpec()
            ).frame_count
            == 5
        )
        assert (
            image_codec.probe(tiff_chain(1024, big=big), lazymedia.DEFAULT_LIMITS, lazymedia.ImageSpec()).frame_count
            == 1024
        )
        with pytest.raises(MediaTooLargeError, match="more than 1024 pages"):
            lazymedia.load_image(tiff_chain(1025, big=big))
    assert lazymedia.load_image(multipage).header.frame_count == 3


@pytest.mark.parametrize("fmt", ["TIFF", "BMP", "PNG"])
def test_gray_widened_to_rgb_in_place_equals_pillow(fmt):
    data = encode(make_image(70, 90)[:, :, 0], fmt)
    np.testing.assert_array_equal(lazymedia.load_image(data).numpy(), pillow_reference(data, "RGB"))


def test_jpeg_scans_and_coefficients_are_limited_from_the_header(monkeypatch):
    image = make_image(600, 800)
    progressive = encode(image, "JPEG", quality=90, progressive=True)
    header = lazymedia.load_image(progressive).header
    assert header.scan_count == 10 and header.working_bytes == 1.5 * 608 * 800 * 2  # 4:2:0, whole 32-pixel MCUs
    assert lazymedia.load_image(encode(image, "JPEG", quality=90)).header.working_bytes == 0  # one scan: rows only
    monkeypatch.setattr(image_codec, "decode", lambda *a, **k: pytest.fail("decoded past the header"))
    eoi = progressive.rindex(b"\xff\xd9")
    repeated = progressive[:eoi] + progressive[progressive.rindex(b"\xff\xda") : eoi] * 91 + b"\xff\xd9"
    with pytest.raises(MediaTooLargeError, match="101 scans, over the 100 scan limit"):
        lazymedia.load_image(repeated)
    with pytest.raises(MediaTooLargeError, match="working memory"):
        lazymedia.load_image(progressive, limits=lazymedia.Limits(max_working_bytes=header.working_bytes - 1))


def test_only_small_jpeg_and_png_probe_on_the_event_loop():
    jpeg, png = encode(make_image(8, 8), "JPEG"), encode(make_image(8, 8), "PNG")
    assert image_codec.probe_is_instant(jpeg) and image_codec.probe_is_instant(png)
    assert not image_codec.probe_is_instant(jpeg + bytes(1 << 20))
    for fmt in ("TIFF", "BMP", "GIF", "WEBP"):
        assert not image_codec.probe_is_instant(encode(make_image(8, 8), fmt))


def _tall_jpeg(width: int, height: int, keep: int) -> bytes:
    noise = np.random.default_rng(1).integers(0, 256, (height, width, 3), np.uint8)
    return encode(noise, "JPEG", quality=90)[:keep] + b"\xff\xd9"  # cut, with its end marker


def test_a_short_jpeg_decodes_as_libjpeg_fills_it_within_a_bound():
    """A JPEG cut short (its end marker kept) decodes in libjpeg, so in Pillow and vLLM, with the
    missing blocks filled: lazymedia decodes it the same while its output stays under
    TRUNCATED_JPEG_OUTPUT; past that, the encoded-size floor refuses it before any allocation."""
    data = _tall_jpeg(193, 31237, 2000)  # 18 MB of pixels from 2 KB, where 12 KB is the floor
    header = lazymedia.load_image(data).header
    assert len(data) < image_codec.least_encoded_bytes(header)
    expected = np.asarray(Image.open(__import__("io").BytesIO(data)).convert("RGB"))
    assert np.array_equal(lazymedia.load_image(data).decode().numpy(), expected)
    over = _tall_jpeg(1200, 20000, 2000)  # 72 MB of pixels: over the bound
    assert 1200 * 20000 * 3 > image_codec.TRUNCATED_JPEG_OUTPUT
    with pytest.raises(UnprocessableMediaError, match="truncated"):
        lazymedia.load_image(over)
