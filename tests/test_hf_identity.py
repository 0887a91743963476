"""The model sees the same numbers: a real HF processor (Qwen2-VL, built from its defaults) gives
identical outputs for Pillow-decoded (eager) and lazymedia-decoded inputs."""

import io
import warnings

import pytest
import torch
from PIL import Image, ImageOps

import lazymedia

from conftest import corpus_bytes, corpus_params, encode, make_image

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf():
    try:
        from transformers import Qwen2VLImageProcessorPil as Processor
    except ImportError:
        from transformers import Qwen2VLImageProcessor as Processor
    return Processor()


def eager_input(data: bytes):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Image.open(io.BytesIO(data)) as image:
            return ImageOps.exif_transpose(image.convert("RGB"))


def outputs_equal(a, b):
    return all(torch.equal(a[key], b[key]) for key in ("pixel_values", "image_grid_thw"))


@pytest.mark.parametrize(
    "data", [encode(make_image(720, 1280), "JPEG"), encode(make_image(300, 200), "PNG")], ids=["jpeg-720p", "png"]
)
def test_generated_images(hf, data):
    eager = hf(images=[eager_input(data)], return_tensors="pt")
    lazy = hf(images=[lazymedia.load_image(data).numpy()], return_tensors="pt")
    assert outputs_equal(eager, lazy)


def rotated_or_cmyk(param) -> bool:
    row = param.values[0]
    return row is None or "orientation" in row["path"] or row["path"].endswith("cmyk.jpg")


@pytest.mark.parametrize("row", [p for p in corpus_params("image", {"decodes"}) if rotated_or_cmyk(p)])
def test_corpus_rotated_and_cmyk(hf, row):
    data = corpus_bytes(row)
    eager = hf(images=[eager_input(data)], return_tensors="pt")
    lazy = hf(images=[lazymedia.load_image(data).numpy()], return_tensors="pt")
    assert outputs_equal(eager, lazy)


def test_through_the_processor_cache(hf):
    data = encode(make_image(480, 640, seed=5), "JPEG")
    processor = lazymedia.Processor(lambda items: [hf(images=[i.numpy()], return_tensors="pt") for i in items])
    first = processor.apply([lazymedia.load_image(data)])[0]
    hit = processor.apply([lazymedia.load_image(data)])[0]
    eager = hf(images=[eager_input(data)], return_tensors="pt")
    assert outputs_equal(first, eager) and hit is first
