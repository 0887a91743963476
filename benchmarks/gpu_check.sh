#!/usr/bin/env bash
# One-shot GPU verification for a fresh H200 (the device tool's 'cuda' image: torch, nvcc, no
# network): build the CUDA extension, run the GPU tests, run the GPU benchmark; under 8 minutes.
# Missing Python packages travel as wheels (benchmarks/fetch_gpu_wheels.sh):
#   call 1, carry .whl/part1:  bash benchmarks/gpu_check.sh --install-only
#   call 2, carry .whl/part2 and .corpus:  bash benchmarks/gpu_check.sh   (within 30 s, machine warm)
# Results land in $OUT (the device tool's folder) or bench-out/.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench-out}
mkdir -p "$out"
site=/tmp/lazymedia-site
mkdir -p "$site"
export PYTHONPATH="$site:$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
[ -d .corpus ] && export LAZYMEDIA_CORPUS="$PWD/.corpus"
for dir in .whl/part1 .whl/part2 .whl; do
  if compgen -G "$dir/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$dir"/*.whl
  fi
done
if [ "${1:-}" = "--install-only" ]; then
  echo "installed wheels into $site"
  exit 0
fi
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
echo "== build (nvcc $(nvcc --version | tail -1))"
LAZYMEDIA_CUDA=1 python3 setup.py build_ext --inplace 2>&1 | grep -E "gencode|error|warning: " | tail -n 20
python3 -m lazymedia info | tee "$out/info.txt"
echo "== GPU tests"
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_cuda_build.py tests/test_kernels.py \
  2>&1 | tee "$out/pytest_gpu.txt" | tail -n 40
echo "== GPU benchmark"
timeout 300 python3 benchmarks/bench_gpu.py --json "$out/bench_gpu.json" 2>&1 | tee "$out/bench_gpu.txt" | tail -n 60
echo "gpu_check finished in $(( $(date +%s) - start )) s"
