#!/usr/bin/env bash
# Run HERE (where PyPI is reachable) before a GPU check: prepares .gpu/, the one ignored folder the
# device machine needs beside the working tree (carry: [".gpu"]), under 61 MiB, for the machine
# that will run it:
#
#   bash benchmarks/fetch_gpu_wheels.sh [--vllm] [x86_64|aarch64]    # x86_64 (H200, default), aarch64 (GB200)
#
#   .gpu/PLATFORM       the platform it was built for (gpu_check.sh reports it beside uname -m)
#   .gpu/wheels/        Python 3.12 wheels the device image lacks (PyAV, nvidia-nvjpeg, ...)
#   .gpu/pynvvideocodec.tar.xz   PyNvVideoCodec installed and slimmed: no FFmpeg source tarball,
#                       samples or benchmarks, one copy of each bundled libav (the others links)
#   .gpu/corpus/        the corpus files tests/test_gpu.py reads, with their MANIFEST.tsv rows
#   .gpu/vllm.tar.xz    only with --vllm: what benchmarks/bench_vllm_render.py needs on the device
#                       that its image lacks (gpu_check.sh --full's render step unpacks it): vLLM
#                       0.33's pure-Python files (every vllm/**/*.py, its chat templates and its
#                       dist-info; none of its compiled ops), the pure-Python packages its render
#                       path imports that the image lacks, copied from the vLLM install here
#                       (LAZYMEDIA_VLLM_PATH, default /tmp/vllm-site:/tmp/vllm-testdeps, and this
#                       Python's site-packages), and the binary ones as the device Python's wheels,
#                       unpacked. Found by importing the render path here with only these on the path.
# imagecodecs (PNG/WebP, 28 MB) and DALI (~200 MB) stay behind: the GPU tests decode JPEG and
# video, and the DALI test and benchmark column skip, saying so.
set -euo pipefail
cd "$(dirname "$0")/.."
vllm=0 arch=x86_64 platforms_named=0
for arg in "$@"; do
  case "$arg" in
    --vllm) vllm=1 ;;
    x86_64|aarch64) arch=$arg; platforms_named=$((platforms_named + 1)) ;;
    *) platforms_named=9 ;;
  esac
  if [ $platforms_named -gt 1 ]; then
    echo "usage: fetch_gpu_wheels.sh [--vllm] [x86_64|aarch64] (got $*)" >&2
    exit 2
  fi
done
# 60 MiB before --vllm's tarball (14 MiB): 61 leaves the working tree (2.4 MiB) room in the device
# tool's 64 MiB carry
limit_mib=61
corpus=${LAZYMEDIA_CORPUS:-../shared/corpus}
git check-ignore -q .gpu/ || { echo "fetch_gpu_wheels: .gpu/ is not ignored by git" >&2; exit 1; }
rm -rf .gpu
mkdir -p .gpu/wheels .gpu/corpus/images
echo "$arch" > .gpu/PLATFORM
platforms=()
for n in 17 24 26 27 28 31 34 35; do platforms+=(--platform "manylinux_2_${n}_${arch}"); done
platforms+=(--platform "manylinux2014_${arch}")
[ "$arch" = x86_64 ] && platforms+=(--platform manylinux_2_5_x86_64 --platform manylinux1_x86_64)
target=(--only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}")
python3 -m pip download -q --no-deps "${target[@]}" -d .gpu/wheels \
  av==18.1.0 "nvidia-nvjpeg==13.*" blake3 simplejpeg pybase64 soxr soundfile cffi pycparser pytest-asyncio \
  pytest-timeout nvtx redis

nvvc=$(mktemp -d)
python3 -m pip install -q --no-deps --no-compile "${target[@]}" --target "$nvvc/site" pynvvideocodec==2.2.4
rm -rf "$nvvc/site"/*.data "$nvvc/site/samples" "$nvvc/site/benchmarks" "$nvvc/site/external"
(
  cd "$nvvc/site/PyNvVideoCodec"
  for lib in libav*.so.*.*.*; do  # libavformat.so.63.1.101 -> keep the soname file, link the rest
    soname=${lib%.*.*}
    [ -f "$soname" ] || continue
    rm -f "$lib" "${soname%.*}"
    ln -s "$soname" "$lib"
    ln -s "$soname" "${soname%.*}"
  done
)
tar -C "$nvvc/site" -cJf .gpu/pynvvideocodec.tar.xz .
rm -rf "$nvvc"

if [ -f "$corpus/MANIFEST.tsv" ]; then
  names="hopper_orientation_2.jpg hopper_orientation_3.jpg hopper_orientation_4.jpg hopper_orientation_5.jpg
         hopper_orientation_6.jpg hopper_orientation_7.jpg hopper_orientation_8.jpg orientation_rectangle.jpg
         3.jpg cat.jpg pil_sample_cmyk.jpg hopper_gray.jpg"
  head -n 1 "$corpus/MANIFEST.tsv" > .gpu/corpus/MANIFEST.tsv
  for name in $names; do
    cp "$corpus/images/$name" .gpu/corpus/images/
    grep -P "^images/$name\t" "$corpus/MANIFEST.tsv" >> .gpu/corpus/MANIFEST.tsv || true
  done
else
  echo "fetch_gpu_wheels: $corpus not found; the corpus test will skip on the device" >&2
fi

if [ $vllm = 1 ]; then
  # The render path's imports, measured (vLLM 0.33, on the device image that KINDS.md lists): pure
  # Python the image lacks, copied; binary ones the image lacks, as cp312 wheels unpacked. The image
  # has torch, torchvision, transformers, jinja2, anyio, httpx, requests, psutil, uvloop, cloudpickle,
  # einops, py-cpuinfo, annotated-doc, prometheus-client, opencv: those are not packed.
  pure="vllm cachetools openai sniffio fastapi starlette opentelemetry partial_json_parser pydantic
        annotated_types typing_inspection httpx2 httpcore2"
  binary="cbor2==6.3.0 msgspec==0.23.0 pyzmq==27.3.0 openai-harmony==0.0.8 llguidance==1.6.1 xgrammar==0.2.9
          apache-tvm-ffi==0.1.15.post2 pydantic-core==$(python3 -c 'import pydantic_core; print(pydantic_core.__version__)')"
  here_site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  vllm_path=${LAZYMEDIA_VLLM_PATH:-/tmp/vllm-site:/tmp/vllm-testdeps}
  stage=$(mktemp -d)
  for name in $pure; do
    found=""
    for dir in ${vllm_path//:/ } "$here_site"; do
      [ -d "$dir/$name" ] || continue
      found=$dir
      break
    done
    [ -n "$found" ] || { echo "fetch_gpu_wheels: $name not found in $vllm_path or $here_site" >&2; exit 1; }
    # .py files and the package data the render path reads (chat templates), no compiled files;
    # not vLLM's wrappers of compiled kernels whose libraries stay behind anyway (third_party,
    # vllm_flash_attn), its benchmarks CLI, nor vllm/models/*/ (per-architecture packages named
    # by string, e.g. DeepSeek V4's attention backends; Qwen2-VL is model_executor/models'):
    # 17 MiB of the 55 MiB of .py files
    (cd "$found" && find "$name" \( -path vllm/third_party -o -path vllm/vllm_flash_attn -o -path vllm/benchmarks \
        -o -path 'vllm/models/*' -type d \) -prune -o \( -name '*.py' -o -name '*.pyi' -o -name py.typed \
        -o -path 'vllm/transformers_utils/chat_templates/*' \) -type f -print0 | tar --null -T - -cf -) \
      | tar -C "$stage" -xf -
    for info in "$found"/*.dist-info; do  # importlib.metadata.version(...) reads these
      case "$(basename "$info")" in
        "$name"-[0-9]*|"${name//_/-}"-[0-9]*|opentelemetry_*|partial_json_parser-*) mkdir -p "$stage/$(basename "$info")"
          cp "$info/METADATA" "$stage/$(basename "$info")/" ;;
      esac
    done
  done
  wheels=$(mktemp -d)
  # shellcheck disable=SC2086
  python3 -m pip download -q --no-deps "${target[@]}" -d "$wheels" $binary
  for wheel in "$wheels"/*.whl; do python3 -m zipfile -e "$wheel" "$stage"; done
  # the FFI's own test functions, and its headers and sources for building extensions (0.75 MB packed)
  rm -rf "$stage"/tvm_ffi/lib/libtvm_ffi_testing.so "$stage"/tvm_ffi/{3rdparty,include,src,cython}
  find "$stage" -name '*.so*' -type f -exec strip --strip-unneeded {} + 2>/dev/null || true  # 2 ship symbols
  tar -C "$stage" -cf - . | xz -T2 -9 > .gpu/vllm.tar.xz
  rm -rf "$stage" "$wheels"
fi

size_kib=$(du -sk .gpu | cut -f1)
echo ".gpu/ for $arch: $((size_kib / 1024)) MiB (limit ${limit_mib} MiB; the device tool carries 64 MiB with the tree)"
ls .gpu/wheels
du -sh .gpu/wheels .gpu/pynvvideocodec.tar.xz .gpu/corpus $([ $vllm = 1 ] && echo .gpu/vllm.tar.xz)
if [ "$size_kib" -gt $((limit_mib * 1024)) ]; then
  echo "fetch_gpu_wheels: .gpu/ is over ${limit_mib} MiB" >&2
  exit 1
fi
