#!/usr/bin/env bash
# The GPU half verified in ONE call on a fresh, offline H200 (the image has torch, nvcc, pytest,
# pybind11; the rest comes in .gpu/, prepared here by benchmarks/fetch_gpu_wheels.sh):
#
#   device run, carry [".gpu"], timeout_s 600:   bash benchmarks/gpu_check.sh
#   the second call (full tables, no tests):      bash benchmarks/gpu_check.sh --full
#   here, to see the plan:                        bash benchmarks/gpu_check.sh --dry-run
#
# Steps run in order, each under its own time limit, and no failure stops a later step: the
# environment probe first (so a missing driver library is on record even if all else fails), then
# install, build (all cores), the GPU tests (per-test and overall time-outs), the nvJPEG
# probe (benchmarks/nvjpeg_nvdec_probe.py A: nvjpegDecodeBatched timed directly, per backend,
# output format, flag and input memory, beside torchvision: nvJPEG's own costs apart from the
# library's sequencing; a copy of the project's shared/gpu-probes one, as the device run carries
# only the repository), the GPU benchmark (--quick; --full: all sizes and the knob grid) and the serving job on the
# device (lazymedia bench --device cuda). Each
# step's log goes to $OUT (8 files at most); summary.txt has each step's exit status and seconds.
# The whole stays under 10 minutes.
#
# Before the steps, the driver's video libraries (libnvcuvid.so.1 for NVDEC and nvJPEG's hardware
# engines, libnvidia-encode.so.1 for importing PyNvVideoCodec) are put on the loader path
# (LD_LIBRARY_PATH) when the loader does not find them; probe.txt says where they came from.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench-out/gpu-check}
site=/tmp/lazymedia-site
mode=check
if [ "${1:-}" = "--full" ]; then mode=full; shift; fi
if [ $mode = check ]; then
  STEPS=(probe install build tests nvjprobe bench serving)
  declare -A BUDGET=([probe]=15 [install]=45 [build]=90 [tests]=130 [nvjprobe]=70 [bench]=130 [serving]=90)
  bench_args="--quick"
  serving_args="--quick --requests 8 --concurrency 8 --scenarios unique_720p,unique_4k,video_unique,mixed"
else  # the second call: the full tables, no tests
  STEPS=(probe install build bench serving)
  declare -A BUDGET=([probe]=15 [install]=45 [build]=90 [bench]=250 [serving]=180)
  bench_args="--grid"
  serving_args="--requests 64"  # 160 a scenario across 4 modes and 7 scenarios would not fit one call
fi
declare -A WHAT=(
  [probe]="nvidia-smi, the driver's video libraries (libnvcuvid), libcuda, nvcc, torch's view of the GPU"
  [install]="wheels from .gpu/wheels and the slimmed PyNvVideoCodec into $site (no network)"
  [build]="LAZYMEDIA_CUDA=1 setup.py build_ext --inplace on all cores (sm_90, sm_100), both extensions imported (else a serial rebuild), lazymedia info"
  [tests]="pytest -p no:asyncio tests/test_gpu.py (all marked gpu) and tests/test_cuda_build.py, 60 s a test"
  [nvjprobe]="benchmarks/nvjpeg_nvdec_probe.py A (nvjpegDecodeBatched per backend x format x flag x input, vs torchvision) and B (the PTS PyNvVideoCodec returns beside PyAV's)"
  [bench]="benchmarks/bench_gpu.py $bench_args: nvJPEG vs torchvision (ratios, p99, verdicts) and peers (--full: the knob grid), NVDEC vs the CPU path (bench_nvdec)"
  [serving]="lazymedia bench --device cuda $serving_args: every mode, device checks, verdicts (into bench.txt)"
)

total=0
for step in "${STEPS[@]}"; do total=$((total + BUDGET[$step])); done

# Finds the driver's video libraries; exports LD_LIBRARY_PATH where the loader misses them. Prints
# one line a library: where it is found (the loader path, or a folder added here), or that it is not.
video_libraries() {
  local links=/tmp/lazymedia-driver-libs lib found dir
  for lib in libnvcuvid.so.1 libnvidia-encode.so.1; do
    if ldconfig -p 2>/dev/null | grep -q "$lib "; then
      echo "$lib: on the loader path ($(ldconfig -p | grep "$lib " | head -n 1 | sed 's/.*=> //'))"
      continue
    fi
    found=$(find /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib /usr/local/nvidia \
              /run/nvidia/driver/usr /usr/local/cuda/compat /usr/lib/wsl -maxdepth 4 \
              \( -name "$lib" -o -name "${lib%.1}.[0-9]*" \) 2>/dev/null | head -n 1)
    if [ -z "$found" ]; then
      echo "$lib: NOT FOUND (the driver lacks its video capability: no NVDEC, no PyNvVideoCodec import, no nvJPEG engines)"
      continue
    fi
    dir=$(dirname "$found")
    if [ "$(basename "$found")" != "$lib" ]; then  # only the versioned file: give it its soname
      mkdir -p "$links" && ln -sf "$found" "$links/$lib" && dir=$links
    fi
    case ":${LD_LIBRARY_PATH:-}:" in
      *":$dir:"*) ;;
      *) export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;;
    esac
    echo "$lib: not on the loader path; using $found (LD_LIBRARY_PATH += $dir)"
  done
}

if [ "${1:-}" = "--dry-run" ]; then
  echo "mode: $mode"
  echo "driver video libraries here:"
  video_libraries | sed 's/^/  /'
  if [ -d .gpu ]; then
    echo ".gpu/ to carry: $(du -sh .gpu | cut -f1) ($(find .gpu -type f | wc -l) files; limit 60 MiB), built for $(cat .gpu/PLATFORM 2>/dev/null || echo "an unrecorded platform")"
  else
    echo ".gpu/ missing: run bash benchmarks/fetch_gpu_wheels.sh here first"
  fi
  echo "working tree that travels besides: $(git ls-files -co --exclude-standard -z | du -ch --files0-from=- 2>/dev/null | tail -1 | cut -f1)"
  printf '%-8s %8s  %s\n' step budget what
  for step in "${STEPS[@]}"; do printf '%-8s %7ss  %s\n' "$step" "${BUDGET[$step]}" "${WHAT[$step]}"; done
  echo "total budget ${total} s (< 580 s); device call: timeout_s 600, carry [\".gpu\"]; logs in \$OUT:"
  echo "  probe.txt install.txt build.txt pytest.txt nvjpeg_probe.txt bench.txt bench_gpu.json summary.txt (8 files)"
  exit 0
fi

mkdir -p "$out" "$site"
export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
[ -d .gpu/corpus ] && export LAZYMEDIA_CORPUS="$PWD/.gpu/corpus"
started=$(date +%s)
: > "$out/summary.txt"
video_libraries | tee "$out/probe.txt"  # in this shell, before any step: its exports reach them all

run_step() {  # run_step NAME LOG COMMAND...: time-limited, logged, never fatal
  local name=$1 log=$2
  shift 2
  local begin rc
  begin=$(date +%s)
  echo "== $name (budget ${BUDGET[$name]} s)" | tee -a "$log"
  timeout --kill-after=5 "${BUDGET[$name]}" bash -c "$*" >> "$log" 2>&1
  rc=$?
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then echo "$name: stopped at its ${BUDGET[$name]} s budget" >> "$log"; fi
  printf '%-8s rc=%-3s %4s s\n' "$name" "$rc" "$(( $(date +%s) - begin ))" | tee -a "$out/summary.txt"
  tail -n 15 "$log"
}

run_step probe "$out/probe.txt" '
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader
  echo "-- driver libraries (LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-})"; ldconfig -p | grep -E "libcuda\.so|libnvcuvid|libnvidia-encode" || echo "none on the loader path"
  echo "-- platform $(uname -m); .gpu/ built for $(cat .gpu/PLATFORM 2>/dev/null || echo "an unrecorded platform")"
  echo "-- toolchain"; nvcc --version | tail -n 2; g++ --version | head -n 1
  python3 -c "import sys, torch; print(sys.version.split()[0], \"torch\", torch.__version__, torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name(0))"
  python3 -c "import numpy, PIL, aiohttp, pytest, pytest_timeout; print(\"numpy\", numpy.__version__, \"Pillow\", PIL.__version__, \"pytest\", pytest.__version__)" || echo "MISSING: a package lazymedia or its tests need is not in the image"
  nproc; df -h /tmp | tail -n 1'

run_step install "$out/install.txt" '
  set -eo pipefail
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target '"$site"' .gpu/wheels/*.whl
  tar -C '"$site"' -xJf .gpu/pynvvideocodec.tar.xz
  python3 -c "import av, blake3, simplejpeg, soundfile, soxr, pybase64; print(\"PyAV\", av.__version__)"
  python3 -c "import PyNvVideoCodec as n; print(\"PyNvVideoCodec\", n.__version__)" || echo "PyNvVideoCodec does not import here"
  ls '"$site"'/nvidia/cu13/lib/libnvjpeg.so.13'

run_step build "$out/build.txt" '
  set -eo pipefail
  rm -f lazymedia/_C*.so  # a stale build must not pass for this one
  LAZYMEDIA_CUDA=1 python3 setup.py build_ext --inplace --parallel "$(nproc)" 2>&1 | { grep -E "lazymedia:|gencode|error|warning: " || true; } | cut -c1-300
  if ! python3 -c "import lazymedia._C, lazymedia._C_cuda"; then
    echo "build: an extension does not import after the parallel build: rebuilding serially"
    rm -rf build lazymedia/_C*.so
    LAZYMEDIA_CUDA=1 python3 setup.py build_ext --inplace 2>&1 | { grep -E "error|warning: " || true; } | cut -c1-300
  fi
  python3 -c "import lazymedia._C, lazymedia._C_cuda; print(\"build: lazymedia._C and lazymedia._C_cuda both import\")"
  python3 -m lazymedia info'

[ $mode = check ] && run_step tests "$out/pytest.txt" "
  python3 -m pytest -p no:cacheprovider -p no:asyncio -rA -s --timeout=60 \
    tests/test_gpu.py tests/test_cuda_build.py"

[ $mode = check ] && run_step nvjprobe "$out/nvjpeg_probe.txt" "NVJ='$site/nvidia/cu13/lib/libnvjpeg.so.13' python3 benchmarks/nvjpeg_nvdec_probe.py A; python3 benchmarks/nvjpeg_nvdec_probe.py B"

run_step bench "$out/bench.txt" "python3 benchmarks/bench_gpu.py $bench_args --json '$out/bench_gpu.json'"

# The serving step logs into bench.txt (the device call brings back 8 files at most); its table,
# device checks and verdict lines end that file.
run_step serving "$out/bench.txt" "python3 -m lazymedia bench --device cuda $serving_args --json '' --chart ''"

echo "gpu_check: $(( $(date +%s) - started )) s in all (budget ${total} s)" | tee -a "$out/summary.txt"
