#!/usr/bin/env bash
# Builds the CUDA configuration on this (GPU-less) machine and packs what bench/gpu_check.sh needs
# on a GPU machine that has the CUDA libraries but none of upipe's Debian ones (the lent H200s:
# CUDA, PyTorch and Python there; no OpenMPI, oneDNN, fmt, ..., and no package registry):
#   .gpu-pack/pack.tar.xz  bin/ (upipe and the test binaries), usr/ (OpenMPI's runtime with its
#                          plugins and help files, every non-system library the binaries and
#                          plugins load, at their Debian paths, relocated there by OPAL_PREFIX)
# CUDA's own libraries (cudart, cuBLASLt, NCCL, cuDNN) are not packed: the GPU machine's are used.
# .gpu-pack/ is ignored by git (.gitignore); the device tool carries it: carry [".gpu-pack"].
# Usage: bench/gpu_pack.sh [BUILD_DIR]   (default build-gpu)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
pack=.gpu-pack
bins=(upipe tests/test_backend_ops tests/test_cuda_gemm_desc tests/test_cuda_math
      tests/test_cuda_attention_plan tests/test_staged_comm tests/test_nccl_comm)
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DUPIPE_CUDA=ON > /dev/null
targets=()
for b in "${bins[@]}"; do targets+=(--target "$(basename "$b")"); done
cmake --build "$build" -j "$(nproc)" "${targets[@]}"

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/bin"
for b in "${bins[@]}"; do
  [ -f "$build/$b" ] && cp "$build/$b" "$root/bin/" || echo "gpu_pack: $build/$b not built, skipped"
done
# OpenMPI's runtime: every file of its packages except documentation.
for f in $(dpkg -L libopenmpi3 openmpi-bin openmpi-common libpmix2 2>/dev/null |
           grep -v -e /doc/ -e /man/ -e lintian); do
  [ -d "$f" ] && [ ! -L "$f" ] && continue
  [ -e "$f" ] || [ -L "$f" ] || continue
  mkdir -p "$root$(dirname "$f")"
  cp -a "$f" "$root$f"
done
# The libraries everything loads, except the C runtime (the GPU machine's is newer) and CUDA's.
skip='^(libc|libm|libdl|librt|libpthread|ld-linux-x86-64|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnccl|libcudnn|libnvrtc|libnvJitLink|libnv)[.-]'
objects=("$root"/bin/* $(find "$root/usr/lib" -name '*.so*' -type f) "$root"/usr/bin/*)
for o in "${objects[@]}"; do
  { ldd "$o" 2>/dev/null || true; } | awk '$3 ~ /^\// {print $3}'
done | sort -u | while read -r lib; do
  name=$(basename "$lib")
  [[ $name =~ $skip ]] && continue
  dest="$root/usr/lib/x86_64-linux-gnu/$name"
  [ -e "$dest" ] || cp -L "$lib" "$dest"
done
# mpirun is a Debian alternatives link (/etc/alternatives, not packed): the pack names it itself.
[ -e "$root/usr/bin/mpirun" ] || ln -sf orterun "$root/usr/bin/mpirun"
mkdir -p "$pack"
tar -C "$root" -cJf "$pack/pack.tar.xz" .
git describe --always --dirty > "$pack/commit"
echo "gpu_pack: $pack/pack.tar.xz $(du -h "$pack/pack.tar.xz" | cut -f1) (built in $build, commit $(cat "$pack/commit"))"
