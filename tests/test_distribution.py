"""The name that installs this project (issue 48): `lazymedia` on the public index is an unrelated
project, so the distribution has its own name, and every install line, extra and hint uses it; the
import name and the vLLM entry point stay `lazymedia`."""

import re
import tomllib
from pathlib import Path

from conftest import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
DISTRIBUTION = PYPROJECT["project"]["name"]
EXTRAS = set(PYPROJECT["project"]["optional-dependencies"])
# A requirement with extras: the distribution's name (or "." for a checkout) and the extras.
WITH_EXTRAS = re.compile(r"(?<![\w/-])(\.|lazymedia[\w.-]*)\[([a-z]\w*(?:, ?[a-z]\w*)*)\]")
# `pip install lazymedia`, `pip install "lazymedia[...]"`, `pip install -U lazymedia==...`: the other project.
BARE_NAME = re.compile(r"pip install[^\n`&;|#]*?[\s\"'](lazymedia)(?![\w.-])")


def _texts() -> dict[str, str]:
    """What a user reads or runs: the README, the docs, the package's messages, the scripts."""
    paths = [
        REPO / "README.md",
        *(REPO / "docs").glob("*.md"),
        *(REPO / "lazymedia").rglob("*.py"),
        *(REPO / "benchmarks").glob("*.py"),
        *(REPO / "benchmarks").glob("*.sh"),
        REPO / ".ci" / "run",
    ]
    return {str(path.relative_to(REPO)): path.read_text() for path in paths}


def test_the_distribution_is_not_the_public_index_lazymedia():
    assert DISTRIBUTION == "lazymedia-decode"
    assert PYPROJECT["project"]["scripts"] == {"lazymedia": "lazymedia.cli:main"}
    assert PYPROJECT["project"]["entry-points"]["vllm.general_plugins"] == {
        "lazymedia": "lazymedia.integrations.vllm_plugin:register"
    }  # VLLM_MEDIA_CONNECTOR=lazymedia


def test_every_install_line_and_hint_names_the_distribution_and_a_real_extra():
    found = 0
    for name, text in _texts().items():
        for match in WITH_EXTRAS.finditer(text):
            requirement, extras = match.group(1), {e.strip() for e in match.group(2).split(",")}
            line = text[: match.start()].count("\n") + 1
            assert requirement in (".", DISTRIBUTION), f"{name}:{line}: {match.group(0)} is not {DISTRIBUTION}"
            assert extras <= EXTRAS, f"{name}:{line}: {match.group(0)}: no extra {sorted(extras - EXTRAS)}"
            found += 1
        bare = BARE_NAME.search(text)
        assert bare is None, f"{name}:{text[: bare.start()].count(chr(10)) + 1}: installs the other project"
    assert found >= 10  # the README's commands, the docs' extras, the error hints


def test_the_patterns_catch_the_old_lines():
    assert BARE_NAME.search('pip install "lazymedia[vllm,opencv]"')
    assert BARE_NAME.search("pip install lazymedia")
    assert not BARE_NAME.search('pip install "lazymedia-decode[metrics]"')
    assert WITH_EXTRAS.search("pip install 'lazymedia[bench]'").group(1) == "lazymedia"
    assert WITH_EXTRAS.search('pip install -e ".[test,dali]"').groups() == (".", "test,dali")


def test_no_extra_installs_vllm():
    """Adding the plugin to a running deployment must not bring vLLM's own pins (a different torch)."""
    for extra, requirements in PYPROJECT["project"]["optional-dependencies"].items():
        for requirement in requirements:
            assert not re.match(r"vllm\b", requirement), (extra, requirement)


def test_the_readme_says_how_to_install_before_publication():
    readme = " ".join((REPO / "README.md").read_text().split())  # sentences, whatever their line breaks
    assert f"`{DISTRIBUTION}`" in readme and "not published yet" in readme
    assert "Python 3.11" in readme and "C++17" in readme and "without a GPU" in readme
    assert PYPROJECT["project"]["requires-python"] == ">=3.11"
    assert "pip install -c /tmp/deployment.txt" in readme  # the plugin beside an existing vLLM
    assert Path(REPO / "benchmarks" / "vllm_resolve.py").exists()
