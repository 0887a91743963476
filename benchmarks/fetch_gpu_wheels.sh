#!/usr/bin/env bash
# Run HERE (where PyPI is reachable), before a device run: downloads the Python 3.12 x86-64 wheels
# the H200 image lacks into .whl/part1 and .whl/part2 (each under the device tool's 64 MiB carry
# limit; carry one per call: part1 with `gpu_check.sh --install-only`, then part2 and .corpus with
# the check), and copies the test corpus into .corpus (../shared does not travel).
# DALI (~200 MB) does not fit: its GPU test and benchmark column are skipped there.
set -euo pipefail
cd "$(dirname "$0")/.."
for ignored in /.whl/ /.corpus/; do
  grep -qx "$ignored" .git/info/exclude 2>/dev/null || echo "$ignored" >> .git/info/exclude
done
if [ -d ../shared/corpus ]; then
  rm -rf .corpus && cp -r ../shared/corpus .corpus && chmod -R u+w .corpus
fi
platforms=()
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_24_x86_64 manylinux_2_27_x86_64 manylinux_2_28_x86_64 \
         manylinux_2_31_x86_64 manylinux_2_34_x86_64 manylinux1_x86_64 manylinux_2_5_x86_64; do
  platforms+=(--platform "$p")
done
fetch() {
  local dir=$1; shift
  mkdir -p "$dir"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
    -d "$dir" "$@"
}
fetch .whl/part1 pynvvideocodec==2.2.4 nvidia-nvjpeg blake3 simplejpeg pybase64 soxr soundfile cffi pycparser pytest-asyncio
fetch .whl/part2 av==18.1.0
du -sh .whl/part1 .whl/part2 .corpus
