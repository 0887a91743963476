"""The code's shape: each module imports only the layers docs/design.md allows it (the map
below is that table), the imports form no cycle, the README's layout table names real files,
every module imports on its own (no hidden order), no module reads another module's underscore
names, no module imports a private (underscored) module of a package it is not inside, and
importing the package loads no heavy dependency."""

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "lazymedia"
SCANNED = [PACKAGE, REPO / "benchmarks", REPO / "tests"]
# Names that are private by Python's convention but public by contract: torch's version counter,
# which autograd's in-place checks document and the LRU's mutation check reads.
# torch's wrapper-subclass constructor and the switch that reads a subclass's metadata without its
# __torch_function__, both torch's documented way to write a tensor subclass.
ALLOWED_PRIVATE_READS: set[tuple[str, str]] = {
    ("lazymedia/lru.py", "item._version"),
    ("lazymedia/integrations/_vllm_device.py", "torch.Tensor._make_wrapper_subclass"),
    ("lazymedia/integrations/_vllm_device.py", "torch._C"),
}


def modules():
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


# Modules that subclass an optional dependency's classes, so import it at their top: only code that
# has it imports them (vLLM's plugin loader imports the plugin).
NEEDS = {"lazymedia.integrations.vllm_plugin": "vllm"}


@pytest.mark.parametrize("module", modules())
def test_each_module_imports_alone(module):
    if module in NEEDS and importlib.util.find_spec(NEEDS[module]) is None:
        pytest.skip(f"{NEEDS[module]} is not installed")
    result = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_import_loads_no_heavy_dependency():
    code = (
        "import sys, lazymedia; print(sorted(m for m in ('torch', 'av', 'soundfile', 'soxr', 'aiohttp', 'cv2') "
        "if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


def _is_module(package_dir: Path, name: str) -> bool:
    return (
        any(package_dir.glob(f"{name}.py"))
        or any(package_dir.glob(f"{name}.pyi"))
        or any(package_dir.glob(f"{name}.*.so"))
        or (package_dir / name).is_dir()
    )


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


def _private_module_imports(path: Path):
    """The underscored modules of a package that `path` imports from outside that package:
    (line, dotted name), for `import a._b`, `from a._b import x`, `from a import _b`, relative or not."""
    where = path.relative_to(REPO).parts[:-1]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            base = list(where[: len(where) - node.level + 1]) if node.level else []
            target = base + (node.module.split(".") if node.module else [])
            names = [target + [alias.name] for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name.split(".") for alias in node.names]
        else:
            continue
        for dotted in names:
            if dotted[0] != "lazymedia":
                continue
            for depth in range(1, len(dotted)):
                owner, name = dotted[:depth], dotted[depth]
                inside = tuple(where[:depth]) == tuple(owner)
                if (
                    name.startswith("_")
                    and not name.startswith("__")
                    and not inside
                    and _is_module(REPO.joinpath(*owner), name)
                ):
                    yield node.lineno, ".".join(dotted[: depth + 1])


# (file, module) pairs allowed past that line: the native benchmark times the extension's own
# functions (the probe, the kernels), which no public name wraps one to one.
ALLOWED_PRIVATE_IMPORTS = {("benchmarks/bench_native.py", "lazymedia._C")}


def test_no_module_imports_another_packages_private_modules():
    """A package's underscored modules are its own: code outside the package (another room of
    lazymedia, a benchmark) imports the names its __init__ re-exports. Tests may reach in."""
    found = sorted(
        {
            f"{path.relative_to(REPO)}:{line}: {name}"
            for root in (PACKAGE, REPO / "benchmarks")
            for path in root.rglob("*.py")
            for line, name in _private_module_imports(path)
            if (str(path.relative_to(REPO)), name) not in ALLOWED_PRIVATE_IMPORTS
        }
    )
    assert not found, "private modules imported from outside their package:\n" + "\n".join(found)


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


# docs/design.md's layer table, bottom-up: (layer, its modules, the layers it may import besides
# its own). A package name covers its submodules; "lazymedia" is the package face alone (its
# __init__), so a new module is in no layer until a row names it.
LAYERS = [
    ("native", ["_C", "_C_cuda"], []),
    (
        "ground",
        [
            "errors",
            "hashing",
            "lru",
            "metrics",
            "ops",
            "levels",
            "memory",
            "_exports",
            "_singletons",
            "_profiling",
            "synthetic",
        ],
        ["native"],
    ),
    ("specs", ["spec"], ["ground"]),
    ("codecs", ["codecs"], ["specs", "ground", "native"]),
    ("handles", ["media"], ["codecs", "specs", "ground"]),
    ("engine", ["engine"], ["codecs", "specs", "ground", "native"]),
    ("frontend", ["processor", "connector", "guard", "cache"], ["handles", "engine", "specs", "ground"]),
    ("adapters", ["integrations"], ["frontend", "handles", "engine", "specs", "ground"]),
    ("face", ["lazymedia"], ["frontend", "engine", "handles", "codecs", "specs", "ground"]),
    (
        "benchmarking",
        ["benchmarking"],
        ["face", "adapters", "frontend", "engine", "handles", "codecs", "specs", "ground"],
    ),
    (
        "entry points",
        ["bench", "cli", "__main__"],
        ["benchmarking", "face", "adapters", "frontend", "engine", "handles", "codecs", "specs", "ground", "native"],
    ),
]


def _layer_of(module: str) -> str:
    for layer, names, _ in LAYERS:
        for name in names:
            if (
                name == "lazymedia"
                and module == "lazymedia"
                or name != "lazymedia"
                and (module == f"lazymedia.{name}" or module.startswith(f"lazymedia.{name}."))
            ):
                return layer
    raise AssertionError(f"{module} is in no layer of docs/design.md (add it to the table and LAYERS)")


def test_a_new_module_is_in_no_layer_until_a_row_names_it():
    assert _layer_of("lazymedia") == "face" and _layer_of("lazymedia.benchmarking.serving") == "benchmarking"
    assert _layer_of("lazymedia.codecs._video") == "codecs" and _layer_of("lazymedia.__main__") == "entry points"
    with pytest.raises(AssertionError, match="lazymedia.newthing is in no layer"):
        _layer_of("lazymedia.newthing")


def _package_modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(module: str, path: Path, known) -> set[str]:
    """Every lazymedia module `module` imports, at its top or inside a function."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "lazymedia":
                continue
            for alias in node.names:
                full = f"{target}.{alias.name}"
                found.add(full if full in known or alias.name in ("_C", "_C_cuda") else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "lazymedia")
    found.discard(module)
    return found


def _import_graph() -> dict[str, set[str]]:
    known = _package_modules()
    return {module: _imports(module, path, known) for module, path in known.items()}


def test_each_layer_imports_only_the_layers_below_it():
    allowed = {layer: {layer, *below} for layer, _, below in LAYERS}
    wrong = [
        f"{module} ({_layer_of(module)}) imports {target} ({_layer_of(target)})"
        for module, targets in sorted(_import_graph().items())
        for target in sorted(targets)
        if _layer_of(target) not in allowed[_layer_of(module)]
    ]
    assert not wrong, "imports across the layers of docs/design.md:\n" + "\n".join(wrong)


def test_the_imports_form_no_cycle():
    graph = _import_graph()
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            assert state.get(target) != 1, "import cycle: " + " -> ".join([*path, module, target])
            if target not in state:
                visit(target, [*path, module])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])


def test_design_md_layer_table_is_the_map():
    design = (REPO / "docs" / "design.md").read_text()
    rows = {
        m.group(1): (m.group(2), m.group(3)) for m in re.finditer(r"^\| ([a-z ]+) \| (.*?) \| (.*?) \|", design, re.M)
    }
    for layer, names, below in LAYERS:
        assert layer in rows, f"docs/design.md has no row for the {layer} layer"
        listed, may_import = rows[layer]
        for name in names:
            assert f"`{name}" in listed, f"docs/design.md's {layer} row does not name {name}"
        written = set() if may_import == "nothing" else {name.strip() for name in may_import.split(",")}
        assert written == set(below) or written == {"every layer"} and len(below) == len(LAYERS) - 1, (
            f"docs/design.md says {layer} may import {may_import}; LAYERS says {below}"
        )


def graph_counts() -> dict[str, int]:
    """The import graph's size: modules, edges between them, and edges that go up the layers (0
    while the layer test passes)."""
    graph = _import_graph()
    rank = {layer: index for index, (layer, _, _) in enumerate(LAYERS)}
    upward = sum(
        rank[_layer_of(target)] > rank[_layer_of(module)] for module, targets in graph.items() for target in targets
    )
    return {"modules": len(graph), "edges": sum(map(len, graph.values())), "upward edges": upward}


if __name__ == "__main__":  # python tests/test_layout.py: the counts a closing note quotes
    print(graph_counts())
