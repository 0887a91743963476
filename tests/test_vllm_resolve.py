"""benchmarks/vllm_resolve.py, the check that the plugin's install line changes nothing in a vLLM
deployment: its reading of pip's freeze and report, and the comparison (the resolve itself needs the
package index: run the script)."""

import importlib.util
import re

import pytest

from conftest import REPO

spec = importlib.util.spec_from_file_location("vllm_resolve", REPO / "benchmarks" / "vllm_resolve.py")
vllm_resolve = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vllm_resolve)


def _item(name, version, requires=()):
    return {"metadata": {"name": name, "version": version, "requires_dist": list(requires)}}


def test_a_freeze_reads_as_pins():
    text = (
        "# made by pip\nTorch==2.14.0\nopencv_python_headless==4.13.0.90\n-e git+https://x#egg=y\nvllm==0.33.0 \n"
        "pkg @ file:///tmp/pkg.whl\nbare\n"
    )
    assert vllm_resolve.parse_freeze(text) == {
        "torch": "2.14.0",
        "opencv-python-headless": "4.13.0.90",
        "vllm": "0.33.0",
    }


def test_a_changed_pin_is_found_and_new_packages_are_listed():
    deployment = {"torch": "2.14.0", "numpy": "2.3.5", "pillow": "13.0.0"}
    changed, added = vllm_resolve.compare(
        deployment, {"torch": "2.13.0", "numpy": "2.3.5", "av": "18.1.0", "lazymedia-decode": "0.1.0"}
    )
    assert changed == {"torch": ("2.14.0", "2.13.0")}
    assert added == {"av": "18.1.0", "lazymedia-decode": "0.1.0"}
    assert vllm_resolve.compare(deployment, {"numpy": "2.3.5"}) == ({}, {})


def test_vllms_exact_pins_are_read_from_its_metadata():
    report = {
        "install": [
            _item(
                "vLLM",
                "0.33.0",
                [
                    "torch==2.14.0",
                    "numpy",
                    "xgrammar==0.2.8; python_version >= '3'",
                    "protobuf==7.36.1; python_version < '3'",
                    "pytest==8.0; extra == 'test'",
                    "lark (==1.2.2)",
                    "fastapi[standard]<0.137.0,>=0.133.0",
                ],
            ),
            _item("Torch", "2.14.0"),
        ]
    }
    assert vllm_resolve.report_versions(report) == {"vllm": "0.33.0", "torch": "2.14.0"}
    # a pin whose marker does not hold here (vLLM's protobuf for s390x) and an extra's are left out
    assert vllm_resolve.exact_pins(report, "vllm") == {"torch": "2.14.0", "xgrammar": "0.2.8", "lark": "1.2.2"}


def test_the_readme_line_is_the_one_the_script_checks():
    """The script resolves `-c <the deployment's pins> ".[opencv]"`, the README's line."""
    readme = (REPO / "README.md").read_text()
    line = next(line for line in readme.splitlines() if line.startswith("pip install -c "))
    assert re.match(r'pip install -c /tmp/deployment.txt "\.\[opencv\]"', line), line
    assert "pip list --format=freeze > /tmp/deployment.txt" in readme
    with pytest.raises(SystemExit) as exited:
        vllm_resolve.main(["--help"])
    assert exited.value.code == 0
