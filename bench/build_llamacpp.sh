#!/usr/bin/env bash
# Build llama.cpp's reference tools (llama-bench, llama-server, llama-batched-bench,
# llama-quantize, llama-perplexity) from the
# sources vendored in the llama-cpp-python source distribution on PyPI. Nothing third-party is
# committed: the sdist is downloaded into bench/.llamacpp (git-ignored) and built there.
#   bench/build_llamacpp.sh [extra cmake args, e.g. -DGGML_CUDA=ON]
#   bench/build_llamacpp.sh --avx2   # AVX2-only build in bench/.llamacpp/build-avx2 (llama-bench,
#                                    # llama-server): the reference for llmd's LLMD_CPU_PATH=avx2
#                                    # on an AVX-512 machine (python -m bench.realistic --llamacpp-bin)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="$here/.llamacpp"
version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
build="build"
flags=(-DGGML_NATIVE=ON)
targets=(llama-bench llama-server llama-batched-bench llama-quantize llama-perplexity)
if [ "${1:-}" = "--avx2" ]; then
  shift
  build="build-avx2"
  # ggml's x86 switches (ggml/CMakeLists.txt): everything up to AVX2 on, nothing above it.
  flags=(-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
    -DGGML_BMI2=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF
    -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
  targets=(llama-bench llama-server)
fi
mkdir -p "$work"
cd "$work"
if [ ! -d "llama_cpp_python-$version" ]; then
  python3 -m pip download --no-deps --no-binary :all: "llama-cpp-python==$version" -d . -q
  tar xzf "llama_cpp_python-$version.tar.gz"
fi
src="$work/llama_cpp_python-$version/vendor/llama.cpp"
cmake -S "$src" -B "$work/$build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF "${flags[@]}" \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON "$@" > "$work/cmake${build#build}.log"
cmake --build "$work/$build" -j "$(nproc)" --target "${targets[@]}" > "$work/$build.log"
echo "$work/$build/bin"
