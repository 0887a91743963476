"""vLLM 0.33's own media tests, run twice: against vLLM, and through the lazymedia plugin.

The second run is the first with one change: before collection, `vllm.multimodal.media.MediaConnector`
(and the name in `vllm.multimodal.media.connector`) is the class the plugin registers as
"lazymedia" (lazymedia.integrations.vllm_plugin.connector_class()), so every `MediaConnector(...)`
a test or vLLM's own helpers build is lazymedia's, with the test's assertions unchanged. This file
is that pytest plugin too (`-p vllm_media_tests`, see pytest_configure); it adds no skips of its
own: a test that never builds a connector runs the same code on both sides. The tests' asset
server listens on 127.0.0.1, so the lazymedia run admits loopback addresses
(LAZYMEDIA_ALLOW_PRIVATE_NETWORKS=127.0.0.0/8,::1/128); the default refuses them.

vLLM is not a dependency: install it --no-deps into a folder, with the few packages its media
code imports, and check out the tests of the same release:

    pip install --no-deps --target /tmp/vllm-site vllm==0.33.0 cbor2 psutil pyzmq urllib3 requests \\
        certifi openai-harmony openai sniffio cachetools opencv-python-headless
    git clone --depth 1 --branch v0.33.0 https://github.com/vllm-project/vllm /tmp/vllm-src
    PYTHONPATH=/tmp/vllm-site python benchmarks/vllm_media_tests.py --vllm-src /tmp/vllm-src

First it runs lazymedia's own plugin and parity tests (tests/test_integrations_vllm_plugin.py:
vLLM's parser, hasher, processor cache and loaders against the plugin), which skip in CI where
vLLM is not installed. Then it prints, per side, pass / fail / skip counts with every skip's
reason, then each test whose outcome differs between the sides. The tests need what vLLM's
tests/conftest.py imports; a side that cannot collect reports the collection error rather than a
count.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_TESTS = ["tests/multimodal/media"]
LOOPBACK = "127.0.0.0/8,::1/128"


def pytest_configure(config) -> None:
    """The lazymedia side: vLLM's MediaConnector name is lazymedia's plugin connector."""
    import vllm.multimodal.media as media
    import vllm.multimodal.media.connector as connector_module

    from lazymedia.integrations.vllm_plugin import connector_class, register

    register()
    media.MediaConnector = connector_module.MediaConnector = connector_class()


def outcomes(report: Path) -> dict[str, tuple[str, str]]:
    """test id -> (outcome, skip or failure message) from a junit XML report."""
    found = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                message = (child.get("message") or "").splitlines()[0][:200] if child.get("message") else ""
                break
        found[test_id] = (outcome, message)
    return found


def run_side(side: str, src: Path, tests: list[str], out: Path) -> tuple[dict[str, tuple[str, str]], str]:
    report = out / f"{side}.xml"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), str(HERE), env.get("PYTHONPATH", "")) if p)
    command = [sys.executable, "-m", "pytest", *tests, "-q", "-rs", "-p", "no:cacheprovider",
               f"--junitxml={report}", "-o", "addopts="]
    if side == "lazymedia":
        command += ["-p", "vllm_media_tests"]
        env.setdefault("LAZYMEDIA_ALLOW_PRIVATE_NETWORKS", LOOPBACK)
    result = subprocess.run(command, cwd=src, env=env, capture_output=True, text=True)
    tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-3:])
    return (outcomes(report) if report.exists() else {}), tail


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-src", type=Path, required=True, help="a vLLM checkout of the installed release")
    parser.add_argument("--tests", nargs="+", default=DEFAULT_TESTS, help="paths under the checkout")
    parser.add_argument("--json", type=Path, help="write both sides' outcomes here")
    args = parser.parse_args()
    try:
        import vllm
    except ImportError:
        print("vLLM is not importable: put its --no-deps folder on PYTHONPATH (see the docstring)", file=sys.stderr)
        return 2
    missing = [t for t in args.tests if not (args.vllm_src / t).exists()]
    if missing:
        print(f"{missing} not under {args.vllm_src}: git clone --depth 1 --branch v{vllm.__version__} "
              f"https://github.com/vllm-project/vllm {args.vllm_src}", file=sys.stderr)
        return 2
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    own = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                          "tests/test_integrations_vllm_plugin.py"], cwd=REPO, env=env, capture_output=True, text=True)
    print("lazymedia's plugin and parity tests (tests/test_integrations_vllm_plugin.py):")
    print("   " + "\n   ".join((own.stdout + own.stderr).strip().splitlines()[-4:]))
    commit = subprocess.run(["git", "-C", str(args.vllm_src), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "not a git checkout"
    build = importlib.metadata.version("vllm")
    print(f"vLLM {vllm.__version__} (distribution {build}) installed; tests from {args.vllm_src} at {commit}")
    results = {}
    with tempfile.TemporaryDirectory() as out:
        for side in ("vllm", "lazymedia"):
            found, tail = run_side(side, args.vllm_src, args.tests, Path(out))
            results[side] = found
            counts = Counter(outcome for outcome, _ in found.values())
            print(f"\n== {side}: {counts['passed']} pass / {counts['failed'] + counts['error']} fail / "
                  f"{counts['skipped']} skip ({len(found)} tests)")
            if not found:
                print(f"   no report: {tail}")
            for test_id, (outcome, message) in sorted(found.items()):
                if outcome == "skipped":
                    print(f"   skip {test_id}: {message or 'no reason given'}")
    ours, theirs = results["lazymedia"], results["vllm"]
    print("\n== outcomes that differ (vllm -> lazymedia)")
    for test_id in sorted(set(ours) | set(theirs)):
        before, after = theirs.get(test_id, ("absent", "")), ours.get(test_id, ("absent", ""))
        if before[0] != after[0]:
            print(f"   {test_id}: {before[0]} -> {after[0]} {after[1]}")
    if args.json:
        args.json.write_text(json.dumps({side: {k: list(v) for k, v in found.items()}
                                         for side, found in results.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
