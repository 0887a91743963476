import csv
import os
from pathlib import Path

import pytest

from lazymedia.samples import encode_image as encode
from lazymedia.samples import photo as make_image

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


@pytest.fixture(scope="session")
def jpeg_bytes():
    return encode(make_image(240, 320), "JPEG", quality=90)


def pytest_collection_modifyitems(config, items):
    if _HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with a driver")
    for item in items:
        if item.get_closest_marker("gpu") is not None:  # not `in keywords`: a folder named gpu is a keyword
            item.add_marker(skip)


def _corpus_line() -> str:
    files = len(corpus_rows("image") + corpus_rows("video") + corpus_rows("audio"))
    if files:
        return f"corpus: {files} files from {CORPUS}: corpus tests run"
    return (f"corpus: not found at {CORPUS}: corpus tests skip (set LAZYMEDIA_CORPUS to the folder holding "
            "MANIFEST.tsv)")


def pytest_report_header(config):
    return _corpus_line()


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(_corpus_line())
