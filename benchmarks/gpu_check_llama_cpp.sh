#!/usr/bin/env bash
# The llama_cpp GPU check (benchmarks/gpu_check_llama_cpp.py) in one command on a machine with an
# NVIDIA GPU and no network: it unpacks what `python benchmarks/gpu_carry.py --engine llama_cpp`
# packed in .carry_llama/ where pip works (glmserve's requirements the machine lacks, and
# llama-cpp-python's sources with llama.cpp's converter), builds llama.cpp's libraries and
# llama-server with CUDA for this GPU's architecture only (CMAKE_CUDA_ARCHITECTURES=native),
# then runs the check's rounds with glmserve's Python over those libraries (LLAMA_CPP_LIB_PATH, MTMD_CPP_LIB).
# Where something is missing it stops with a one-line reason (exit 2).
#
#   bash benchmarks/gpu_check_llama_cpp.sh --build-only           # the build alone (about 5 min)
#   bash benchmarks/gpu_check_llama_cpp.sh --rounds 2 [CHECK FLAGS]  # the build if not done, then the check
#   bash benchmarks/gpu_check_llama_cpp.sh --cpu --hidden-size 256 --leading-layers 2 ...
#                               # no GPU: a CPU build, with this Python's own packages (a check of the script)
#
# The report goes to $OUT when set (the device tool's folder), else benchmarks/results.
# Variables: CARRY (default .carry_llama), WORK (default /root/glmserve-gpu-check, kept between
# calls while the machine is warm), PYTHON (default python3: the one that has torch),
# CUDACXX (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
carry=${CARRY:-$here/.carry_llama}
work=${WORK:-/root/glmserve-gpu-check}
python=${PYTHON:-python3}
stop() { echo "gpu_check_llama_cpp: $*" >&2; exit 2; }

cpu=0 build_only=0 args=()
for arg in "$@"; do
  case $arg in
    --cpu) cpu=1 ;;
    --build-only) build_only=1 ;;
    *) args+=("$arg") ;;
  esac
done

backend=(-DGGML_CUDA=OFF)
if [ $cpu = 0 ]; then
  command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU' ||
    stop "no NVIDIA GPU: nvidia-smi lists none (give --cpu to check the script on a CPU build)"
  nvcc=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
  [ -x "$nvcc" ] || stop "no CUDA compiler: nvcc is not on PATH nor at /usr/local/cuda/bin/nvcc (set CUDACXX)"
  backend=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=native "-DCMAKE_CUDA_COMPILER=$nvcc")
fi
[ -f "$carry/llama.tar.xz" ] && [ -f "$carry/site.tar.xz" ] ||
  stop "$carry lacks llama.tar.xz or site.tar.xz: run python benchmarks/gpu_carry.py --engine llama_cpp where pip works, and carry .carry_llama"
command -v cmake >/dev/null || stop "no cmake on PATH"
"$python" -c 'import torch, transformers' 2>/dev/null || stop "$python lacks torch or transformers (set PYTHON)"

mkdir -p "$work"
[ -d "$work/src" ] || tar -C "$work" -xJf "$carry/llama.tar.xz" || stop "cannot unpack $carry/llama.tar.xz"
if [ $cpu = 0 ] && [ ! -d "$work/site" ]; then
  tar -C "$work" -xJf "$carry/site.tar.xz" || stop "cannot unpack $carry/site.tar.xz"
fi
build=$work/build-$([ $cpu = 1 ] && echo cpu || echo cuda)
if [ ! -x "$build/bin/llama-server" ]; then
  echo "building llama.cpp ($([ $cpu = 1 ] && echo CPU || echo "CUDA, $(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader | head -1)")): $build/build.log"
  mkdir -p "$build"
  cmake -S "$work/src/vendor/llama.cpp" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
      -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_RPC=ON \
      -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON "${backend[@]}" > "$build/build.log" 2>&1 ||
    stop "cmake could not configure llama.cpp ($build/build.log): $(grep -m1 -A2 'CMake Error' "$build/build.log" | tr -s '\n ' ' ')"
  cmake --build "$build" --target llama mtmd llama-server -j "$(nproc)" >> "$build/build.log" 2>&1 ||
    stop "the llama.cpp build failed: the end of $build/build.log says: $(grep -m3 -i 'error' "$build/build.log" | tr '\n' ' ')"
fi
[ $build_only = 1 ] && { echo "built: $build/bin"; exit 0; }

site=$([ $cpu = 0 ] && echo "$work/site:")
export LLAMA_CPP_LIB_PATH=$build/bin MTMD_CPP_LIB=$build/bin PYTHONPATH="$site$work/src:$here/src:$here" PYTHONUNBUFFERED=1
"$python" -c 'import fastapi, llama_cpp' 2>/dev/null || stop "glmserve's requirements do not import with $python: $("$python" -c 'import fastapi, llama_cpp' 2>&1 | tail -1)"
exec "$python" "$here/benchmarks/gpu_check_llama_cpp.py" --llama-server "$build/bin/llama-server" \
  --converter "$work/src/vendor/llama.cpp/convert_hf_to_gguf.py" --results "${OUT:-$here/benchmarks/results}" "${args[@]}"
