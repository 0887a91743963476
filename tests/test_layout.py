"""The code's shape: the README's layout table names real files, every module imports on its
own (no import cycle, no hidden order), no module reads another module's underscore names, and
importing the package loads no heavy dependency."""
import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "lazymedia"
SCANNED = [PACKAGE, REPO / "benchmarks", REPO / "tests"]
# Names that are private by Python's convention but public by contract: none.
ALLOWED_PRIVATE_READS: set[tuple[str, str]] = set()


def modules():
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


@pytest.mark.parametrize("module", modules())
def test_each_module_imports_alone(module):
    result = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_import_loads_no_heavy_dependency():
    code = "import sys, lazymedia; print(sorted(m for m in ('torch', 'av', 'soundfile', 'soxr', 'aiohttp', 'cv2') " \
           "if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


def _is_module(package_dir: Path, name: str) -> bool:
    return any(package_dir.glob(f"{name}.py")) or any(package_dir.glob(f"{name}.pyi")) or \
        any(package_dir.glob(f"{name}.*.so")) or (package_dir / name).is_dir()


def _private_reads(path: Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = path.parent
                for _ in range(node.level - 1):
                    base = base.parent
                package_dir = base.joinpath(*(node.module or "").split(".")) if node.module else base
            else:
                package_dir = REPO.joinpath(*(node.module or "").split("."))
            for alias in node.names:
                name = alias.name
                if name.startswith("_") and not name.startswith("__") and not _is_module(package_dir, name):
                    yield node.lineno, f"from {node.module or '.'} import {name}"
        elif isinstance(node, ast.Attribute):
            name = node.attr
            if not name.startswith("_") or name.startswith("__"):
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            yield node.lineno, f"{ast.unparse(owner)}.{name}"


def test_no_module_reads_another_modules_underscore_names():
    found = []
    for root in SCANNED:
        for path in sorted(root.rglob("*.py")):
            for line, read in _private_reads(path):
                where = str(path.relative_to(REPO))
                if (where, read) not in ALLOWED_PRIVATE_READS:
                    found.append(f"{where}:{line}: {read}")
    assert not found, "private names read across modules:\n" + "\n".join(found)


def test_readme_layout_table_names_real_paths():
    readme = (REPO / "README.md").read_text()
    table = readme.split("## Layout", 1)[1]
    paths = re.findall(r"^\| `([^`]+)` \|", table, re.M)
    assert len(paths) >= 10
    for path in paths:
        assert (REPO / path.rstrip("/")).exists(), f"README layout names {path}, which does not exist"
    listed = {p.rstrip("/") for p in paths}
    for module in PACKAGE.iterdir():
        public_file = module.suffix == ".py" and not module.name.startswith("_")
        if public_file or module.is_dir() and module.name != "__pycache__":
            where = str(module.relative_to(REPO))
            assert where in listed, f"{where} is missing from the README layout"
