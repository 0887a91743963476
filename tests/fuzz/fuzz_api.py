"""Mutation fuzz of the public API: corpus files, randomly flipped, truncated, extended or
spliced, go through load_image / load_video / load_audio and `.media` in a child process under
an address-space cap. Every outcome must be a decode or a typed MediaError: an untyped
exception, a crash (the child dies) or a hang (no progress within --hang-s) is a finding, and its
input is kept for replay. The harness's own MemoryError under the cap (mutating, encoding or
reporting an input, outside the API call) is counted as "harness-memory", not as a finding: a
child that dies of one exits with a MemoryError traceback, a decoder crash by a signal.

    python tests/fuzz/fuzz_api.py --seconds 600 [--memory-cap-mb 1600] [--corpus DIR] [--out DIR] [--seed N]
    python tests/fuzz/fuzz_api.py --replay FILE.json [--memory-cap-mb 1600]  # one finding, in this process

Prints a table and writes summary.json into --out. A crash finding keeps the child's whole
stderr (faulthandler's stacks of every thread, and what the native libraries printed).
"""

from __future__ import annotations

import argparse
import base64
import csv
import faulthandler
import importlib
import json
import os
import random
import resource
import select
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CORPUS = Path(os.environ.get("LAZYMEDIA_CORPUS", REPO.parent / "shared" / "corpus"))
SETTINGS = {
    "image": [{}, {"size": (64, 48)}, {"mode": "L"}, {"mode": "RGBA"}, {"apply_orientation": False}],
    "video": [{"num_frames": 4}, {"num_frames": 2, "size": (32, 32)}, {"fps": 1.0}],
    "audio": [{}, {"sample_rate": 16000}, {"sample_rate": 8000, "mono": True}],
}


def load_seeds(corpus: Path) -> list[tuple[str, bytes]]:
    with open(corpus / "MANIFEST.tsv", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    return [(row["kind"], (corpus / row["path"]).read_bytes()) for row in rows if int(row["bytes"]) <= 4 << 20]


def mutate(rng: random.Random, data: bytes, seeds: list[tuple[str, bytes]]) -> bytes:
    """One to four random edits: bit flips, byte overwrites, truncation, insertion of random or
    repeated bytes, deletion, or a splice with another seed."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if not buf:
            buf = bytearray(rng.randbytes(16))
        kind = rng.randrange(7)
        at = rng.randrange(len(buf))
        if kind == 0:
            for _ in range(rng.randint(1, 16)):
                position = rng.randrange(len(buf))
                buf[position] ^= 1 << rng.randrange(8)
        elif kind == 1:
            buf[at : at + 4] = rng.choice(
                [b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\x7f\xff\xff\xff", rng.randbytes(4)]
            )
        elif kind == 2:
            del buf[rng.randrange(len(buf) + 1) :]
        elif kind == 3:
            buf[at:at] = rng.randbytes(rng.randint(1, 256))
        elif kind == 4:
            chunk = bytes(buf[at : at + rng.randint(1, 512)])
            buf[at:at] = chunk * rng.randint(1, 8)
        elif kind == 5:
            del buf[at : at + rng.randint(1, 512)]
        else:
            other = rng.choice(seeds)[1]
            cut = rng.randrange(len(other) + 1)
            buf = buf[:at] + bytearray(other[cut : cut + rng.randint(1, 4096)])
    return bytes(buf)


def run_one(modality: str, data: bytes, settings: dict) -> str:
    """Loads and decodes one input; 'ok' or the typed error's status, raising anything else."""
    import lazymedia

    try:
        lazymedia.load(modality, data, **settings).media
    except lazymedia.MediaError as exc:
        return str(exc.status_code)
    return "ok"


def cap_address_space(megabytes: int) -> None:
    """Loads the codecs (their libraries map large ranges), then caps this process's address
    space; a crash from here on prints every thread's Python stack."""
    faulthandler.enable(all_threads=True)
    for name in ("image", "video", "audio"):
        importlib.import_module(f"lazymedia.codecs.{name}")
    cap = megabytes << 20
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def child(args) -> None:
    """Fuzz loop: announce each input (the parent keeps it when this process dies or stalls),
    run it, report the outcome as one JSON line per execution."""
    cap_address_space(args.memory_cap_mb)
    wanted = args.modalities.split(",")
    seeds = [(modality, data) for modality, data in load_seeds(Path(args.corpus)) if modality in wanted]
    rng = random.Random(args.seed)
    current = Path(args.out) / f"current-{os.getpid()}.json"
    harness_memory = json.dumps({"outcome": "harness-memory"})  # made before the cap can refuse it
    while True:
        try:
            modality, data = rng.choice(seeds)
            modality = modality if rng.random() < 0.9 else rng.choice(wanted)
            data = mutate(rng, data, seeds)
            settings = rng.choice(SETTINGS[modality])
            case = {"modality": modality, "settings": settings, "data": base64.b64encode(data).decode()}
            current.write_text(json.dumps(case))
        except MemoryError:  # the harness's own, before the API saw the input
            print(harness_memory, flush=True)
            continue
        try:
            outcome = run_one(modality, data, settings)
            record = {"outcome": outcome}
        except BaseException as exc:  # an untyped error (a MemoryError from the API too): the finding
            record = {"outcome": "untyped", "error": f"{type(exc).__name__}: {exc}"[:500], "case": case}
        try:
            print(json.dumps(record), flush=True)
        except MemoryError:
            print(harness_memory, flush=True)


def harness_memory_death(returncode: int, stderr: str) -> bool:
    """Whether a child ended on the cap in Python (an exit status and a MemoryError traceback
    as its last words) rather than crashed in a decoder (killed by a signal, or any other end)."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return returncode > 0 and bool(lines) and lines[-1].startswith("MemoryError")


def supervise(args) -> dict:
    """Runs children until --seconds pass, restarting one that crashed or hung."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.seconds
    totals: dict[str, int] = {}
    findings: list[dict] = []
    seed = args.seed
    while time.monotonic() < deadline:
        command = [
            sys.executable,
            __file__,
            "--child",
            "--corpus",
            str(args.corpus),
            "--out",
            str(out),
            "--seed",
            str(seed),
            "--memory-cap-mb",
            str(args.memory_cap_mb),
            "--modalities",
            args.modalities,
        ]
        log = out / f"child-{seed}.log"
        with open(log, "wb") as stderr:
            proc = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            )
        assert proc.stdout is not None
        stdout = proc.stdout.fileno()
        last_progress = time.monotonic()
        buffer = b""
        while True:
            readable, _, _ = select.select([stdout], [], [], 0.05)
            chunk = os.read(stdout, 1 << 16) if readable else b""
            if chunk:
                last_progress = time.monotonic()
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    record = json.loads(line)
                    totals[record["outcome"]] = totals.get(record["outcome"], 0) + 1
                    if record["outcome"] == "untyped":
                        findings.append({"kind": "untyped", "error": record["error"], "case": record["case"]})
            current = out / f"current-{proc.pid}.json"
            if proc.poll() is not None:
                stderr_text = log.read_text(errors="replace")
                if harness_memory_death(proc.returncode, stderr_text):
                    totals["harness-memory"] = totals.get("harness-memory", 0) + 1
                    break
                totals["crash"] = totals.get("crash", 0) + 1
                findings.append(
                    {
                        "kind": "crash",
                        "exit_code": proc.returncode,
                        "stderr": stderr_text,  # whole: native frames come first
                        "case": json.loads(current.read_text()) if current.exists() else None,
                    }
                )
                break
            if time.monotonic() - last_progress > args.hang_s:
                proc.kill()
                proc.wait()
                totals["hang"] = totals.get("hang", 0) + 1
                findings.append({"kind": "hang", "case": json.loads(current.read_text()) if current.exists() else None})
                break
            if time.monotonic() >= deadline:
                proc.kill()
                proc.wait()
                break
        log.unlink()
        seed += 1_000_003  # a restarted child explores new inputs
    for leftover in out.glob("current-*.json"):
        leftover.unlink()
    for number, finding in enumerate(findings):
        (out / f"finding-{number:03d}-{finding['kind']}.json").write_text(json.dumps(finding))
    executions = sum(v for k, v in totals.items() if k not in ("crash", "hang", "harness-memory"))
    summary = {
        "seconds": args.seconds,
        "modalities": args.modalities,
        "executions": executions,
        "outcomes": totals,
        "untyped": totals.get("untyped", 0),
        "crashes": totals.get("crash", 0),
        "hangs": totals.get("hang", 0),
        "harness_memory": totals.get("harness-memory", 0),
        "memory_cap_mb": args.memory_cap_mb,
        "findings": len(findings),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def replay(path: Path, memory_cap_mb: int) -> None:
    cap_address_space(memory_cap_mb)
    case = json.loads(path.read_text())
    case = case.get("case", case)
    print(run_one(case["modality"], base64.b64decode(case["data"]), case["settings"]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "fuzz" / "build" / "api")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hang-s", type=float, default=60.0, help="no output for this long is a hang")
    parser.add_argument(
        "--memory-cap-mb", type=int, default=8192, help="address-space cap of each child (and of --replay), in MiB"
    )
    parser.add_argument(
        "--modalities",
        default="image,video,audio",
        help="comma-separated: fuzz only these (image alone: what decodes in-process in a server)",
    )
    parser.add_argument("--replay", type=Path)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.replay:
        replay(args.replay, args.memory_cap_mb)
        return 0
    if args.child:
        child(args)
        return 0
    if not (args.corpus / "MANIFEST.tsv").exists():
        parser.error(f"no corpus at {args.corpus} (give --corpus or set LAZYMEDIA_CORPUS)")
    summary = supervise(args)
    print(f"{'seconds':>8s} {'executions':>10s} {'untyped':>8s} {'crashes':>8s} {'hangs':>6s}  outcomes")
    print(
        f"{summary['seconds']:8.0f} {summary['executions']:10d} {summary['untyped']:8d} {summary['crashes']:8d} "
        f"{summary['hangs']:6d}  {summary['outcomes']}"
    )
    print(f"wrote {args.out / 'summary.json'}")
    return 0 if summary["findings"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
