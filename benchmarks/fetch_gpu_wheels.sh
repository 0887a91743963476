#!/usr/bin/env bash
# Run HERE (where PyPI is reachable) before a GPU check: prepares .gpu/, the one ignored folder the
# device machine needs beside the working tree (carry: [".gpu"]), under 60 MiB, for the machine
# that will run it:
#
#   bash benchmarks/fetch_gpu_wheels.sh [x86_64|aarch64]    # x86_64 (H200, default), aarch64 (GB200)
#
#   .gpu/PLATFORM       the platform it was built for (gpu_check.sh reports it beside uname -m)
#   .gpu/wheels/        Python 3.12 wheels the device image lacks (PyAV, nvidia-nvjpeg, ...)
#   .gpu/pynvvideocodec.tar.xz   PyNvVideoCodec installed and slimmed: no FFmpeg source tarball,
#                       samples or benchmarks, one copy of each bundled libav (the others links)
#   .gpu/corpus/        the corpus files tests/test_gpu.py reads, with their MANIFEST.tsv rows
# imagecodecs (PNG/WebP, 28 MB) and DALI (~200 MB) stay behind: the GPU tests decode JPEG and
# video, and the DALI test and benchmark column skip, saying so.
set -euo pipefail
cd "$(dirname "$0")/.."
arch=${1:-x86_64}
case "$arch" in
  x86_64|aarch64) ;;
  *) echo "usage: fetch_gpu_wheels.sh [x86_64|aarch64] (got $arch)" >&2; exit 2 ;;
esac
limit_mib=60
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

size_kib=$(du -sk .gpu | cut -f1)
echo ".gpu/ for $arch: $((size_kib / 1024)) MiB (limit ${limit_mib} MiB; the device tool carries 64 MiB with the tree)"
ls .gpu/wheels
du -sh .gpu/wheels .gpu/pynvvideocodec.tar.xz .gpu/corpus
if [ "$size_kib" -gt $((limit_mib * 1024)) ]; then
  echo "fetch_gpu_wheels: .gpu/ is over ${limit_mib} MiB" >&2
  exit 1
fi
