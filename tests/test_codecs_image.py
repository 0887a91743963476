"""CPU image decoding held to Pillow's pixels and to the corpus manifest's expectations."""
import struct
import warnings

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

import lazymedia
from lazymedia import InvalidMediaError, MediaError, MediaTooLargeError, UnprocessableMediaError
from lazymedia.codecs import image as image_codec

from conftest import CORPUS, corpus_bytes, corpus_params, encode, make_image, requires_corpus


def pillow_reference(path_or_bytes, mode="RGB"):
    import io

    src = io.BytesIO(path_or_bytes) if isinstance(path_or_bytes, bytes) else path_or_bytes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        image = Image.open(src).convert(mode)
        try:
            image = ImageOps.exif_transpose(image)
        except (SyntaxError, struct.error):  # Pillow gives up on a broken EXIF block; we ignore it
            pass
        array = np.asarray(image)
    return array[:, :, None] if array.ndim == 2 else array


@pytest.mark.parametrize("row", corpus_params("image", {"decodes"}))
def test_corpus_decodes_equal_to_pillow(row):
    data = corpus_bytes(row)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tensor = lazymedia.load_image(data).media
    assert tensor.dtype == torch.uint8 and tensor.ndim == 3
    np.testing.assert_array_equal(tensor.numpy(), pillow_reference(CORPUS / row["path"]))


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
    with pytest.raises(MediaTooLargeError, match="limit of one item"):
        lazymedia.load_image(data, limits=limits)
    assert lazymedia.load_image(data, limits=limits, size=(1000, 1000)).header.width == 2000  # the output fits
    with pytest.raises(MediaTooLargeError):
        lazymedia.load_image(data, limits=limits, mode="RGBA", size=(2000, 1500))
