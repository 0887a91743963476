#!/usr/bin/env bash
# Builds the libFuzzer targets with ASan+UBSan and runs each for $SECONDS_PER_TARGET seconds,
# seeded with ../shared/corpus (read-only; new inputs go to tests/fuzz/build/corpus-*).
#   bash tests/fuzz/run.sh [seconds_per_target]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
seconds=${1:-60}
cxx=${CXX:-$(command -v clang++-14 || command -v clang++ || true)}
out="$here/build"
mkdir -p "$out"
if [ -z "$cxx" ]; then
  # No clang (no libFuzzer): g++ with ASan+UBSan, random inputs from random_driver.cpp instead of
  # coverage-guided ones; fuzz_kernels' op 4 (the cache's level coder) gets a run of its own.
  flags=(-std=c++17 -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
         -I"$repo/csrc" -pthread)
  g++ "${flags[@]}" "$here/fuzz_probe.cpp" "$repo/csrc/probe.cpp" "$here/random_driver.cpp" -o "$out/random_probe"
  g++ "${flags[@]}" "$here/fuzz_kernels.cpp" "$repo/csrc/host_ops.cpp" "$repo/csrc/levels.cpp" "$repo/csrc/level_gather.cpp" \
    "$here/random_driver.cpp" -o "$out/random_kernels"
  "$out/random_probe" 20000 1
  "$out/random_kernels" 20000 1
  "$out/random_kernels" 40000 2 4
  exit 0
fi
flags=(-std=c++17 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=undefined -I"$repo/csrc" -pthread)
"$cxx" "${flags[@]}" "$here/fuzz_probe.cpp" "$repo/csrc/probe.cpp" -o "$out/fuzz_probe"
"$cxx" "${flags[@]}" "$here/fuzz_kernels.cpp" "$repo/csrc/host_ops.cpp" "$repo/csrc/levels.cpp" "$repo/csrc/level_gather.cpp" -o "$out/fuzz_kernels"
seeds="$repo/../shared/corpus"
for target in fuzz_probe fuzz_kernels; do
  mkdir -p "$out/corpus-$target"
  seed_dirs=()
  if [ "$target" = fuzz_probe ] && [ -d "$seeds/images" ]; then seed_dirs=("$seeds/images" "$seeds/images/bad"); fi
  echo "== $target for ${seconds}s"
  "$out/$target" -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -print_final_stats=1 \
    "$out/corpus-$target" "${seed_dirs[@]}" 2>&1 | tail -n 25
done
