import csv
import io
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

REPO = Path(__file__).resolve().parent.parent
CORPUS = Path(os.environ.get("LAZYMEDIA_CORPUS", REPO.parent / "shared" / "corpus"))


requires_corpus = pytest.mark.skipif(not (CORPUS / "MANIFEST.tsv").exists(), reason=f"corpus not found at {CORPUS}")
try:
    import torch as _torch

    _HAS_GPU = _torch.cuda.is_available()
except Exception:
    _HAS_GPU = False
without_gpu = pytest.mark.skipif(_HAS_GPU, reason="checks the behaviour of a machine without a GPU")


def corpus_rows(kind):
    """MANIFEST.tsv rows of one kind; empty when the corpus is not beside the checkout."""
    manifest = CORPUS / "MANIFEST.tsv"
    if not manifest.exists():
        return []
    with open(manifest, newline="") as f:
        return [row for row in csv.DictReader(f, delimiter="\t") if row["kind"] == kind]


def corpus_params(kind, expected=None):
    rows = [r for r in corpus_rows(kind) if expected is None or r["expected"] in expected]
    if not rows:
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"corpus not found at {CORPUS}"))]
    return [pytest.param(r, id=r["path"]) for r in rows]


def corpus_bytes(row):
    return (CORPUS / row["path"]).read_bytes()


def make_image(height, width, seed=0):
    """Smooth gradients plus noise: compresses like a photo, unlike pure noise or flat colour."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([128 + 100 * np.sin(x / 37.0 + seed), 128 + 100 * np.cos(y / 23.0), (x + y) / (height + width) * 255],
                    axis=2)
    return np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)


def encode(array, fmt="JPEG", **kwargs):
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, fmt, **kwargs)
    return buf.getvalue()


@pytest.fixture(scope="session")
def jpeg_bytes():
    return encode(make_image(240, 320), "JPEG", quality=90)


def pytest_collection_modifyitems(config, items):
    if _HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with a driver")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
