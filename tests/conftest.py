import csv
import os
import threading
from pathlib import Path

import pytest
import torch

import lazymedia
from lazymedia.synthetic import encode_image as encode
from lazymedia.synthetic import photo as make_image

REPO = Path(__file__).resolve().parent.parent
CORPUS = Path(os.environ.get("LAZYMEDIA_CORPUS", REPO.parent / "shared" / "corpus"))
# Small real files committed with the tests (tests/data/make.py wrote them): the corpus tests run
# on them in any checkout; the external corpus above, where present, is the extended run.
IN_REPO = REPO / "tests" / "data"


requires_corpus = pytest.mark.skipif(not (CORPUS / "MANIFEST.tsv").exists(), reason=f"corpus not found at {CORPUS}")
try:
    import torch as _torch

    _HAS_GPU = _torch.cuda.is_available()
except Exception:
    _HAS_GPU = False
without_gpu = pytest.mark.skipif(_HAS_GPU, reason="checks the behaviour of a machine without a GPU")


def _manifest_rows(root: Path, kind: str) -> list[dict]:
    manifest = root / "MANIFEST.tsv"
    if not manifest.exists():
        return []
    with open(manifest, newline="") as f:
        return [{**row, "root": str(root)} for row in csv.DictReader(f, delimiter="\t") if row["kind"] == kind]


def corpus_rows(kind, external_only=False):
    """MANIFEST.tsv rows of one kind: tests/data's, then the external corpus's where it is beside
    the checkout. Each row's "root" is its folder, "path" is relative to it."""
    return ([] if external_only else _manifest_rows(IN_REPO, kind)) + _manifest_rows(CORPUS, kind)


def corpus_params(kind, expected=None):
    rows = [r for r in corpus_rows(kind) if expected is None or r["expected"] in expected]
    if not rows:
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"no {kind} files expected {expected}"))]
    return [pytest.param(r, id=("tests/data/" if r["root"] == str(IN_REPO) else "") + r["path"]) for r in rows]


def corpus_path(row) -> Path:
    return Path(row["root"]) / row["path"]


def corpus_bytes(row):
    return corpus_path(row).read_bytes()


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
    in_repo = sum(len(_manifest_rows(IN_REPO, kind)) for kind in ("image", "video", "audio"))
    files = sum(len(corpus_rows(kind, external_only=True)) for kind in ("image", "video", "audio"))
    if files:
        return f"corpus: {in_repo} files from tests/data and {files} from {CORPUS}: corpus tests run"
    return (
        f"corpus: {in_repo} files from tests/data; the external corpus is not at {CORPUS} (set "
        "LAZYMEDIA_CORPUS to the folder holding MANIFEST.tsv for the extended run)"
    )


def pytest_report_header(config):
    return _corpus_line()


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(_corpus_line())


META = torch.device("meta")


class FakeGpuDecoder:
    """Stands in for nvJPEG with output="cuda": takes RGB JPEGs, returns their pixels on the
    fake device, and records every item it got."""

    name = "fake-gpu"

    def __init__(self, device=META):
        self.device = device
        self.seen: list = []
        self.lock = threading.Lock()

    def accepts(self, item) -> bool:
        return item.modality == "image" and item.header.format == "jpeg" and not item.is_derived

    def decode_batch(self, items):
        with self.lock:
            self.seen.extend(items)
        return [lazymedia.load_image(bytes(item.encoded())).decode().to(self.device) for item in items]
