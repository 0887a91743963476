"""Memory that comes back (issue 34 item 4): decode a burst of mixed items in this process
(every third a video at 8 or 32 frames, 1080p to 2160x3840 images, the corpus's decodable
files), drop every output, stay idle, and compare RSS with the RSS after import.

    python benchmarks/memory_after_burst.py [--items 200] [--idle-s 10] [--corpus DIR] [--no-release]

--no-release sets LAZYMEDIA_POOL_IDLE_S=inf (the pool keeps its buffers and the heap is never
trimmed: the behaviour before the idle release). Verdict: RSS after the idle within 150 MB of
the RSS after import. The numbers are bytes of this process, not timings.
"""

from __future__ import annotations

import argparse
import csv
import gc
import os
import sys
import time
from pathlib import Path

GOAL_BYTES = 150 << 20


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def corpus_items(folder: Path) -> list[tuple[str, bytes]]:
    """(modality, bytes) of every corpus file MANIFEST.tsv says decodes."""
    manifest = folder / "MANIFEST.tsv"
    if not manifest.is_file():
        return []
    with manifest.open() as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    return [(row["kind"], (folder / row["path"]).read_bytes()) for row in rows if row["expected"] == "decodes"]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--corpus", default=os.environ.get("LAZYMEDIA_CORPUS", "/work/shared/corpus"))
    parser.add_argument("--no-release", action="store_true", help="keep pool buffers and skip heap trims")
    args = parser.parse_args(argv)
    if args.no_release:
        os.environ["LAZYMEDIA_POOL_IDLE_S"] = "inf"

    import lazymedia
    from lazymedia import memory, synthetic
    from lazymedia.codecs import codec

    for modality in ("audio", "image", "video"):
        codec(modality)  # imports the codec modules: the imports are the baseline, not the burst

    videos = [synthetic.video(frames=48, height=1080, width=1920), synthetic.video(frames=24, height=1440, width=2560)]
    images = [
        synthetic.jpeg(1080, 1920, seed=1),
        synthetic.jpeg(2160, 3840, seed=2),
        synthetic.encode_image(synthetic.photo(1440, 2560, seed=3), "PNG"),
    ]
    corpus = [item for item in corpus_items(Path(args.corpus)) if item[0] in ("image", "audio")]
    gc.collect()
    memory.trim_heap()
    after_import = rss_bytes()

    decoded = refused = 0
    peak = after_import
    others = [("image", data) for data in images] + corpus
    for i in range(args.items):
        if i % 3 == 0:
            item = lazymedia.load_video(videos[i // 3 % len(videos)], num_frames=8 if i % 2 else 32)
        else:
            modality, data = others[i % len(others)]
            item = lazymedia.load(modality, data)
        try:
            output = item.media
            decoded += 1
            del output
        except lazymedia.MediaError:
            refused += 1
        del item
        peak = max(peak, rss_bytes())
    gc.collect()
    after_burst = rss_bytes()
    time.sleep(args.idle_s)  # the scenario is an idle process: nothing here measures time
    after_idle = rss_bytes()
    pool = memory.frame_buffers().stats()

    mb = 1 << 20
    print(f"items: {args.items} ({decoded} decoded, {refused} refused; {len(corpus)} corpus files in the mix)")
    release = os.environ.get(memory.POOL_IDLE_ENV, f"{memory.DEFAULT_POOL_IDLE_S:g} s")
    print(f"pool idle release: {'off (--no-release)' if args.no_release else release}")
    print(f"RSS after import: {after_import / mb:.0f} MB")
    print(f"RSS peak during the burst: {peak / mb:.0f} MB")
    print(f"RSS right after the burst: {after_burst / mb:.0f} MB")
    print(f"RSS after {args.idle_s:g} s idle: {after_idle / mb:.0f} MB (+{(after_idle - after_import) / mb:.0f} MB)")
    print(
        f"frame pool: cached {pool['cached_bytes'] / mb:.0f} MB, leased {pool['leased_bytes'] / mb:.0f} MB, "
        f"released {pool['released_bytes'] / mb:.0f} MB"
    )
    within = after_idle - after_import <= GOAL_BYTES
    print(f"verdict: {'PASS' if within else 'FAIL'} (goal: within {GOAL_BYTES // mb} MB of the RSS after import)")
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
