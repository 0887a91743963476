"""Does the plugin's install line (README.md, "Use with vLLM") change anything in a vLLM deployment?
pip's own resolver answers, and nothing is installed:

1. the deployment: `pip install --dry-run --ignore-installed --report vllm==0.33.0` resolves vLLM's
   whole dependency set for this Python and platform (wheel metadata only: about a minute, a few MB);
   or `--deployment FILE` reads the `pip list --format=freeze` of a real deployment;
2. its packages as the constraints file the README's `pip list --format=freeze` writes;
3. the README's line, `pip install -c constraints ".[opencv]"` from this checkout, as a dry run that
   ignores what this environment holds (so only the deployment's versions count);
4. the comparison: each package of the deployment the line would install at another version
   (vLLM's own `==` pins listed apart), and the packages it adds.

    python benchmarks/vllm_resolve.py [--vllm 0.33.0] [--deployment FREEZE] [--extras opencv] [--json PATH]

Exit status 0 when nothing of the deployment changes, 1 when something would, 2 when pip cannot
resolve (the message says which package conflicts).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def canonical(name: str) -> str:
    """A distribution name as the index compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_freeze(text: str) -> dict[str, str]:
    """{name: version} of `pip list --format=freeze` / `pip freeze` lines (`name==version`); comments,
    options and unpinned lines are skipped."""
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*([^\s;]+)", line)
        if match:
            pins[canonical(match.group(1))] = match.group(2)
    return pins


def report_versions(report: dict) -> dict[str, str]:
    """{name: version} of what a `pip install --report` would install."""
    return {canonical(item["metadata"]["name"]): item["metadata"]["version"] for item in report["install"]}


def exact_pins(report: dict, package: str) -> dict[str, str]:
    """The `name==version` requirements `package` itself declares for this platform (markers
    evaluated here; extras' requirements left out)."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pip's own copy
        from pip._vendor.packaging.requirements import Requirement
    for item in report["install"]:
        if canonical(item["metadata"]["name"]) == canonical(package):
            pins = {}
            for text in item["metadata"].get("requires_dist", []):
                requirement = Requirement(text)
                if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                    continue
                exact = [spec.version for spec in requirement.specifier if spec.operator == "=="]
                if exact:
                    pins[canonical(requirement.name)] = exact[0]
            return pins
    return {}


def compare(deployment: dict[str, str], resolved: dict[str, str]) -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    """(changed: {name: (deployed, resolved)}, added: {name: version}) of a resolve against a deployment."""
    changed = {
        name: (deployment[name], version)
        for name, version in resolved.items()
        if name in deployment and deployment[name] != version
    }
    added = {name: version for name, version in resolved.items() if name not in deployment}
    return changed, added


def dry_run(requirements: list[str], report: Path, constraints: Path | None = None) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--ignore-installed",
        "--quiet",
        "--report",
        str(report),
        *(["-c", str(constraints)] if constraints else []),
        *requirements,
    ]
    print("$", " ".join(command), flush=True)
    # The CUDA extension is not built for a dry run (only the metadata is read).
    return subprocess.run(command, capture_output=True, text=True, env={**os.environ, "LAZYMEDIA_CUDA": "0"})


def pip_error(result: subprocess.CompletedProcess) -> str:
    lines = [line for line in result.stderr.splitlines() if not line.startswith("WARNING: Location")]
    return "\n".join(lines[-25:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--vllm", default="0.33.0", help="the vLLM version whose deployment is resolved (default %(default)s)"
    )
    parser.add_argument("--deployment", type=Path, help="a real deployment's `pip list --format=freeze` instead")
    parser.add_argument(
        "--extras", default="opencv", help="the extras of the plugin's install line (default %(default)s; '' for none)"
    )
    parser.add_argument("--json", type=Path, help="write the comparison here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vllm-resolve-") as folder:
        work = Path(folder)
        started = time.monotonic()
        if args.deployment is not None:
            deployment = parse_freeze(args.deployment.read_text())
            vllm_pins: dict[str, str] = {}
            source = str(args.deployment)
        else:
            result = dry_run([f"vllm=={args.vllm}"], work / "deployment.json")
            if result.returncode != 0:
                print(f"pip could not resolve vllm=={args.vllm} here:\n{pip_error(result)}", file=sys.stderr)
                return 2
            report = json.loads((work / "deployment.json").read_text())
            deployment = report_versions(report)
            vllm_pins = exact_pins(report, "vllm")
            source = f"vllm=={args.vllm} resolved by pip"
        print(
            f"deployment ({source}): {len(deployment)} packages, vLLM's == pins: "
            + ", ".join(f"{name}=={version}" for name, version in sorted(vllm_pins.items())),
            flush=True,
        )
        constraints = work / "deployment.txt"  # what the README's `pip list --format=freeze` writes
        constraints.write_text("".join(f"{name}=={version}\n" for name, version in sorted(deployment.items())))
        requirement = f"{REPO}[{args.extras}]" if args.extras else str(REPO)
        result = dry_run([requirement], work / "plugin.json", constraints)
        if result.returncode != 0:
            print(
                f"pip refuses the plugin's install line against this deployment:\n{pip_error(result)}", file=sys.stderr
            )
            return 2
        resolved = report_versions(json.loads((work / "plugin.json").read_text()))
        seconds = time.monotonic() - started
    changed, added = compare(deployment, resolved)
    changed_pins = {name: change for name, change in changed.items() if name in vllm_pins}
    print(
        f'the plugin\'s line (-c deployment.txt ".[{args.extras}]") installs {len(resolved)} packages: '
        f"{len(changed)} of the deployment's {len(deployment)} at another version, "
        f"{len(changed_pins)} of vLLM's {len(vllm_pins)} == pins changed; {len(added)} added: "
        + ", ".join(f"{name}=={version}" for name, version in sorted(added.items()))
    )
    for name, (before, after) in sorted(changed.items()):
        print(f"  changed: {name} {before} -> {after}{'  (a vLLM pin)' if name in vllm_pins else ''}")
    print(f"({seconds:.0f} s)")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "deployment": source,
                    "deployment_packages": len(deployment),
                    "vllm_pins": vllm_pins,
                    "changed": changed,
                    "added": added,
                },
                indent=1,
            )
        )
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
