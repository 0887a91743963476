#!/usr/bin/env bash
# The GPU half verified in ONE call on a fresh, offline H200 (the image has torch, nvcc, pytest,
# pybind11; the rest comes in .gpu/, prepared here by benchmarks/fetch_gpu_wheels.sh):
#
#   device run, carry [".gpu"], timeout_s 600:   bash benchmarks/gpu_check.sh
#   the second call (full tables, no tests):      bash benchmarks/gpu_check.sh --full
#   here, to see the plan:                        bash benchmarks/gpu_check.sh --dry-run
#   here, every step without a GPU (CI runs it):  bash benchmarks/gpu_check.sh --rehearse
#
# Steps run in order, each under its own time limit, and no failure stops a later step. The
# first minutes answer the big questions: the environment probe (a missing driver library is on
# record even if all else fails), install, build (all cores), then the first look (first.txt: the
# bare NVDEC decoder's PTS round trip on an edit-list clip, nvJPEG against torchvision at 512^2 x 64
# and 4K x 64 with what decoded them, the engines' image count), then the GPU tests, the nvJPEG
# probe (nvjpegDecodeBatched timed directly), the JPEG benchmark (--quick; --full: all sizes and the
# knob grid), the NVDEC benchmark and the serving job on the device (lazymedia bench --device cuda);
# --full then runs vLLM's chat render (benchmarks/bench_vllm_render.py --quick: the vllm, plugin-cpu
# and plugin-gpu columns) on vLLM 0.33's pure-Python files from .gpu/vllm.tar.xz (made by
# fetch_gpu_wheels.sh --vllm), or prints one line, "RENDER SKIP vLLM does not import: <error>".
# Each step's log goes to $OUT (8 files at most); summary.txt has each step's exit status and
# seconds, then every VERDICT / FIRST / PROBE line of the run and what is missing or failing
# among the lines the check must print (lazymedia.benchmarking.rehearsal.EXPECTED_LINES).
# The whole stays under 10 minutes.
#
# --rehearse runs the same steps, scripts and arguments on a machine without a GPU: the scripts
# get --rehearse (lazymedia.benchmarking.rehearsal's CPU stand-ins of nvJPEG, NVDEC, libnvjpeg and
# torchvision, media 8x smaller a side, every timing figure marked REHEARSAL), each step's budget is
# scaled by REHEARSAL_SCALE (10 s at least), the build step does not delete the built extensions (and only checks
# that they import where pybind11 is missing), install checks .gpu/ instead of installing it, and
# the run exits 1 when a step fails or outruns its scaled budget, or an expected line is missing,
# FAILs, or is a timing line not marked REHEARSAL. The rehearsal of the check call also runs the
# --full call's render step (CI rehearses the check call only), on the vLLM folders that
# LAZYMEDIA_VLLM_PATH names (default: those of /tmp/vllm-site, /tmp/vllm-testdeps, /tmp/vllm-cv2
# and /tmp/vllm-tv that exist; empty: none); where vLLM does not import there, the step prints the
# SKIP line, which the check then expects.
#
# Before the steps, the driver's video libraries (libnvcuvid.so.1 for NVDEC and nvJPEG's hardware
# engines, libnvidia-encode.so.1 for importing PyNvVideoCodec) are put on the loader path
# (LD_LIBRARY_PATH) when the loader does not find them; setup.txt says where they came from.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=check rehearse=0 dry=0
for arg in "$@"; do
  case "$arg" in
    --full) mode=full ;;
    --rehearse) rehearse=1 ;;
    --dry-run) dry=1 ;;
    *) echo "usage: gpu_check.sh [--full] [--rehearse] [--dry-run] (got $arg)" >&2; exit 2 ;;
  esac
done
if [ $rehearse = 1 ]; then
  out=${OUT:-bench-out/gpu-rehearsal}
  site=/tmp/lazymedia-rehearsal-site
  R=" --rehearse"
  default_vllm=$(for dir in /tmp/vllm-site /tmp/vllm-testdeps /tmp/vllm-cv2 /tmp/vllm-tv; do [ -d $dir ] && echo $dir; done \
                 | paste -sd:)
  vllm_path=${LAZYMEDIA_VLLM_PATH-$default_vllm}
else
  out=${OUT:-bench-out/gpu-check}
  site=/tmp/lazymedia-site
  R=""
  vllm_path=/tmp/lazymedia-vllm  # .gpu/vllm.tar.xz unpacked here, on PYTHONPATH for the render step alone
fi
render_args="--quick --scenarios jpeg-720p,jpeg-4k,jpeg-hits,h264-1080p"
[ $rehearse = 1 ] && render_args="--quick --rounds 2 --scenarios jpeg-720p,jpeg-4k,jpeg-hits,h264-1080p"

# A rehearsal's budget for a step: the device's times this (a machine busier than the 2-core CI
# kind at load 4-6, where the whole takes 70-80 s of its 284, may set a larger one).
REHEARSAL_SCALE=${REHEARSAL_SCALE:-0.5}
if [ $mode = check ]; then
  STEPS=(probe install build first tests nvjprobe bench nvdec serving)
  declare -A BUDGET=([probe]=15 [install]=30 [build]=80 [first]=35 [tests]=110 [nvjprobe]=35 [bench]=85 [nvdec]=80
                     [serving]=90 [render]=100)
  [ $rehearse = 1 ] && STEPS+=(render)  # the --full call's step, rehearsed here too (CI rehearses this call)
  bench_args="--quick"
  nvdec_args="--quick"
  serving_args="--quick --requests 8 --concurrency 8 --scenarios unique_720p,unique_4k,video_unique"
else  # the second call: the full tables, no tests
  STEPS=(probe install build bench nvdec serving render)
  # render's 100 s came out of bench (was 170), nvdec (130) and serving (150): the whole stays < 580 s
  declare -A BUDGET=([probe]=10 [install]=30 [build]=80 [bench]=130 [nvdec]=105 [serving]=120 [render]=100)
  bench_args="--grid"
  nvdec_args=""
  serving_args="--requests 64"  # 160 a scenario across 4 modes and 7 scenarios would not fit one call
  [ $rehearse = 1 ] && serving_args="--requests 16"  # 2 cores build and serve 7 scenarios' media: fewer
fi
if [ $rehearse = 1 ]; then
  for step in "${STEPS[@]}"; do  # at least 10 s: a short step is mostly interpreters starting
    BUDGET[$step]=$(awk -v b="${BUDGET[$step]}" -v s=$REHEARSAL_SCALE 'BEGIN { b *= s; printf "%d", b < 10 ? 10 : b }')
  done
fi
declare -A WHAT=(
  [probe]="nvidia-smi, the driver's video libraries (libnvcuvid), libcuda, nvcc, torch's view of the GPU"
  [install]="wheels from .gpu/wheels and the slimmed PyNvVideoCodec into $site (no network)"
  [build]="LAZYMEDIA_CUDA=1 setup.py build_ext --inplace on all cores (sm_80, sm_86, sm_89, sm_90, sm_100 + PTX), both extensions imported (else a serial rebuild), lazymedia info"
  [first]="nvjpeg_nvdec_probe.py B (the bare decoder's PTS round trip, per frame) and bench_gpu.py --headline (512^2 x 64 and 4K x 64 vs torchvision, decoded_by, the engines' image count, Python per call, nvJPEG's memory)"
  [tests]="pytest -p no:asyncio tests/test_gpu.py (all marked gpu) and tests/test_cuda_build.py, 60 s a test"
  [nvjprobe]="nvjpeg_nvdec_probe.py A: nvjpegDecodeBatched, HARDWARE at every size and DEFAULT at 512^2, x format x flags 0/32/36 x input, vs torchvision"
  [bench]="bench_gpu.py $bench_args --no-nvdec: nvJPEG vs torchvision (ratios, p99, decoded_by, verdicts), the A/B cells (--full: the knob grid), peers, window, lock"
  [nvdec]="bench_nvdec.py $nvdec_args: NVDEC vs the CPU path on every core, sessions and decoder reuse, memory, verdicts (into bench_gpu.json)"
  [serving]="lazymedia bench --device cuda $serving_args: every mode, a warm wave, device checks, memory, verdicts (into bench.txt)"
  [render]="bench_vllm_render.py $render_args: vLLM's chat render, columns vllm / plugin-cpu / plugin-gpu, verdicts (into bench.txt, render.json), on .gpu/vllm.tar.xz (fetch_gpu_wheels.sh --vllm); else RENDER SKIP"
)
declare -A LOG=([probe]=setup.txt [install]=setup.txt [build]=setup.txt [first]=first.txt [tests]=pytest.txt
                [nvjprobe]=nvjpeg_probe.txt [bench]=bench.txt [nvdec]=bench.txt [serving]=bench.txt [render]=bench.txt)

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

if [ $dry = 1 ]; then
  echo "mode: $mode$([ $rehearse = 1 ] && echo ", rehearsal (no GPU; budgets x $REHEARSAL_SCALE)")"
  echo "driver video libraries here:"
  video_libraries | sed 's/^/  /'
  if [ -d .gpu ]; then
    echo ".gpu/ to carry: $(du -sh .gpu | cut -f1) ($(find .gpu -type f | wc -l) files; limit 61 MiB), built for $(cat .gpu/PLATFORM 2>/dev/null || echo "an unrecorded platform")"
  else
    echo ".gpu/ missing: run bash benchmarks/fetch_gpu_wheels.sh here first"
  fi
  if [ -f .gpu/vllm.tar.xz ]; then
    echo ".gpu/vllm.tar.xz: $(du -sh .gpu/vllm.tar.xz | cut -f1), vLLM's pure-Python files for the render step"
  else
    echo ".gpu/vllm.tar.xz missing: the render step will print RENDER SKIP (bash benchmarks/fetch_gpu_wheels.sh --vllm makes it)"
  fi
  [ $rehearse = 1 ] && echo "vLLM folders for the render step (LAZYMEDIA_VLLM_PATH): ${vllm_path:-none}"

  echo "working tree that travels besides: $(git ls-files -co --exclude-standard -z | du -ch --files0-from=- 2>/dev/null | tail -1 | cut -f1)"
  printf '%-8s %7s  %-16s %s\n' step budget log what
  for step in "${STEPS[@]}"; do printf '%-8s %6ss  %-16s %s\n' "$step" "${BUDGET[$step]}" "${LOG[$step]}" "${WHAT[$step]}"; done
  echo "total budget ${total} s (< 580 s); device call: timeout_s 600, carry [\".gpu\"]; logs in \$OUT:"
  if [ $mode = check ]; then
    echo "  summary.txt setup.txt first.txt pytest.txt nvjpeg_probe.txt bench.txt bench_gpu.json serving.json (8 files)$(
      [ $rehearse = 1 ] && echo '; the rehearsal adds render.json')"
  else
    echo "  summary.txt setup.txt bench.txt bench_gpu.json serving.json render.json (6 files)"
  fi
  exit 0
fi

mkdir -p "$out" "$site"
# the steps append to their logs: a former run's lines (a rehearsal's $OUT stays) must not pass for this one's
rm -f "$out"/{setup,first,pytest,nvjpeg_probe,bench}.txt "$out"/{bench_gpu,serving,render}.json
if [ $rehearse = 1 ]; then
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the wheels in .gpu/ are the device's Python's: not here
else
  export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
[ -d .gpu/corpus ] && export LAZYMEDIA_CORPUS="$PWD/.gpu/corpus"
started=$(date +%s)
echo "$(nproc) CPUs, 1-minute load $(cut -d' ' -f1 /proc/loadavg) at the start" > "$out/summary.txt"
video_libraries | tee "$out/setup.txt"  # in this shell, before any step: its exports reach them all

run_step() {  # run_step NAME COMMAND...: time-limited, logged into LOG[NAME], never fatal
  local name=$1 log=$out/${LOG[$1]}
  shift 1
  local begin rc
  begin=$(date +%s)
  echo "== $name (budget ${BUDGET[$name]} s)" | tee -a "$log"
  timeout --kill-after=5 "${BUDGET[$name]}" bash -c "$*" >> "$log" 2>&1
  rc=$?
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then echo "$name: stopped at its ${BUDGET[$name]} s budget" >> "$log"; fi
  printf '%-8s rc=%-3s %4s s (budget %s s)\n' "$name" "$rc" "$(( $(date +%s) - begin ))" "${BUDGET[$name]}" \
    | tee -a "$out/summary.txt"
  tail -n 15 "$log"
}

run_step probe '
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader
  echo "-- driver libraries (LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-})"; ldconfig -p | grep -E "libcuda\.so|libnvcuvid|libnvidia-encode" || echo "none on the loader path"
  echo "-- platform $(uname -m); .gpu/ built for $(cat .gpu/PLATFORM 2>/dev/null || echo "an unrecorded platform")"
  echo "-- toolchain"; nvcc --version | tail -n 2; g++ --version | head -n 1
  python3 -c "import sys, torch; print(sys.version.split()[0], \"torch\", torch.__version__, torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name(0))"
  python3 -c "import numpy, PIL, aiohttp, pytest, pytest_timeout; print(\"numpy\", numpy.__version__, \"Pillow\", PIL.__version__, \"pytest\", pytest.__version__)" || echo "MISSING: a package lazymedia or its tests need is not in the image"
  nproc; df -h /tmp | tail -n 1'

if [ $rehearse = 1 ]; then  # .gpu/ holds the device Python's wheels: read them, do not install them here
  run_step install '
    if [ ! -d .gpu ]; then
      echo "install: .gpu/ is absent here (bash benchmarks/fetch_gpu_wheels.sh makes it before a device call)"
    else
      python3 - <<PY
import glob, tarfile, zipfile
wheels = sorted(glob.glob(".gpu/wheels/*.whl"))
for wheel in wheels:
    bad = zipfile.ZipFile(wheel).testzip()
    assert bad is None, f"{wheel}: {bad} is damaged"
assert any("libnvjpeg.so.13" in n for w in wheels if "nvjpeg" in w for n in zipfile.ZipFile(w).namelist())
names = tarfile.open(".gpu/pynvvideocodec.tar.xz").getnames()
assert any(n.startswith("./PyNvVideoCodec/") for n in names), "no PyNvVideoCodec in the tar"
print(f"install: {len(wheels)} wheels and PyNvVideoCodec ({len(names)} entries) read whole")
PY
    fi
    python3 -c "import av, blake3, simplejpeg, soundfile, soxr, pybase64; print(\"PyAV\", av.__version__)"'
  run_step build '
    set -eo pipefail
    if python3 -c "import pybind11" 2>/dev/null; then  # up to date: nothing is compiled again
      LAZYMEDIA_CUDA=auto python3 setup.py build_ext --inplace --parallel "$(nproc)" 2>&1 | { grep -E "lazymedia:|error" || true; } | cut -c1-300
    else
      echo "build: pybind11 is not importable here (pip built lazymedia in isolation): the built extensions are checked"
    fi
    python3 -c "import lazymedia._C; print(\"build: lazymedia._C imports\")"
    python3 -c "import lazymedia._C_cuda as c; print(\"build: lazymedia._C_cuda imports, built for\", c.arches())" || echo "build: no CUDA extension here"
    python3 -m lazymedia info'
else
  run_step install '
    set -eo pipefail
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target '"$site"' .gpu/wheels/*.whl
    tar -C '"$site"' -xJf .gpu/pynvvideocodec.tar.xz
    python3 -c "import av, blake3, simplejpeg, soundfile, soxr, pybase64; print(\"PyAV\", av.__version__)"
    python3 -c "import PyNvVideoCodec as n; print(\"PyNvVideoCodec\", n.__version__)" || echo "PyNvVideoCodec does not import here"
    ls '"$site"'/nvidia/cu13/lib/libnvjpeg.so.13'
  run_step build '
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
fi

# The first look: if the call dies after this, $OUT already answers the big questions.
# Each half has its own limit inside the step's: a hang in one (PyNvVideoCodec's import, say) leaves
# the other its time.
half=$(( ${BUDGET[first]:-0} / 2 > 10 ? ${BUDGET[first]:-0} / 2 : 10 ))
[ $mode = check ] && run_step first "timeout $half python3 benchmarks/nvjpeg_nvdec_probe.py B$R;
  python3 benchmarks/bench_gpu.py --headline$R"

[ $mode = check ] && run_step tests "
  python3 -m pytest -p no:cacheprovider -p no:asyncio -rA -s --timeout=60 \
    tests/test_gpu.py tests/test_cuda_build.py"

[ $mode = check ] && run_step nvjprobe "NVJ='$site/nvidia/cu13/lib/libnvjpeg.so.13' python3 benchmarks/nvjpeg_nvdec_probe.py A$R"

run_step bench "python3 benchmarks/bench_gpu.py $bench_args --no-nvdec$R --json '$out/bench_gpu.json'"

run_step nvdec "python3 benchmarks/bench_nvdec.py $nvdec_args$R --json '$out/bench_gpu.json' --merge"

# The serving step logs into bench.txt (the device call brings back 8 files at most); its table,
# device checks and verdict lines end that file.
run_step serving "python3 -m lazymedia bench --device cuda $serving_args$R --json '$out/serving.json' --chart ''"

# vLLM's chat render with the plugin's GPU column (issue 44), into bench.txt. On the device vLLM
# 0.33's pure-Python files (.gpu/vllm.tar.xz) go into their own folder, on PYTHONPATH for this step
# alone; vLLM without its compiled ops on the image's torch is an untested pairing, so where its
# render path does not import the script prints one line, RENDER SKIP vLLM does not import: ...,
# and exits 0.
if [[ " ${STEPS[*]} " == *" render "* ]]; then
  if [ $rehearse = 0 ]; then
    unpack="if [ ! -f .gpu/vllm.tar.xz ]; then
      echo 'RENDER SKIP vLLM does not import: .gpu/vllm.tar.xz is absent (bash benchmarks/fetch_gpu_wheels.sh --vllm makes it)'
      exit 0
    fi
    rm -rf '$vllm_path' && mkdir -p '$vllm_path' && tar -C '$vllm_path' -xJf .gpu/vllm.tar.xz
    echo \"render: .gpu/vllm.tar.xz unpacked into $vllm_path (\$(du -sh '$vllm_path' | cut -f1))\";"
  else
    unpack="echo 'render: vLLM folders: ${vllm_path:-none}';"
  fi
  run_step render "$unpack
    PYTHONPATH='$PWD${vllm_path:+:$vllm_path}':\$PYTHONPATH python3 benchmarks/bench_vllm_render.py $render_args$R \
      --json '$out/render.json'"
fi

echo "gpu_check: $(( $(date +%s) - started )) s in all (budget ${total} s), 1-minute load $(cut -d' ' -f1 /proc/loadavg) at the end" \
  | tee -a "$out/summary.txt"
{
  echo "-- the run's answers"
  grep -h -E "^(VERDICT|FIRST|PROBE B|PEERS|RENDER) " "$out/first.txt" "$out/bench.txt" 2>/dev/null | cut -c1-400
} >> "$out/summary.txt"
checked=0
# A rehearsal's render lines: the verdicts where vLLM's render path imports from its folders, else
# the SKIP line (asked of the script itself, apart from what the step printed)
render_check=""
if [ $rehearse = 1 ] && [[ " ${STEPS[*]} " == *" render "* ]]; then
  if PYTHONPATH="$PWD${vllm_path:+:$vllm_path}:$PYTHONPATH" timeout 60 python3 benchmarks/bench_vllm_render.py --probe \
       > /dev/null 2>&1; then
    render_check="--render ran"
  else
    render_check="--render skip"
  fi
fi
if [ $mode = check ] || [ $rehearse = 1 ]; then  # --full prints other lines: a rehearsal of it checks its steps
  # shellcheck disable=SC2086
  timeout 60 python3 -m lazymedia.benchmarking.rehearsal check "$out" $([ $rehearse = 1 ] && echo --rehearsal) \
    $([ $mode = full ] && echo --steps-only) $render_check | tee -a "$out/summary.txt"
  checked=${PIPESTATUS[0]}
fi
[ $rehearse = 1 ] && exit "$checked"
exit 0
