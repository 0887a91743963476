"""Every Python example in the README and docs/usage.md runs as written, each in a fresh
interpreter (a block whose first line is `# needs: gpu` runs only where a GPU is)."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", REPO / "docs" / "usage.md"]
try:
    import torch

    HAS_GPU = torch.cuda.is_available()
except Exception:
    HAS_GPU = False


def examples():
    found = []
    for doc in DOCS:
        for number, block in enumerate(re.findall(r"```python\n(.*?)```", doc.read_text(), re.S)):
            marks = [pytest.mark.gpu] if block.startswith("# needs: gpu") else []
            found.append(pytest.param(block, id=f"{doc.name}-{number}", marks=marks))
    return found


def test_docs_have_examples():
    assert len(examples()) >= 4


@pytest.mark.parametrize("code", examples())
def test_example_runs(code, tmp_path):
    if "# needs: gpu" in code and not HAS_GPU:
        pytest.skip("needs an NVIDIA GPU with a driver")
    script = tmp_path / "example.py"
    script.write_text(code)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
