#!/usr/bin/env bash
# Build llama.cpp's reference tools (llama-bench, llama-server, llama-batched-bench,
# llama-quantize, llama-perplexity) from the
# sources vendored in the llama-cpp-python source distribution on PyPI. Nothing third-party is
# committed: the sdist is downloaded into bench/.llamacpp (git-ignored) and built there.
#   bench/build_llamacpp.sh [extra cmake args, e.g. -DGGML_CUDA=ON]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="$here/.llamacpp"
version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
mkdir -p "$work"
cd "$work"
if [ ! -d "llama_cpp_python-$version" ]; then
  python3 -m pip download --no-deps --no-binary :all: "llama-cpp-python==$version" -d . -q
  tar xzf "llama_cpp_python-$version.tar.gz"
fi
src="$work/llama_cpp_python-$version/vendor/llama.cpp"
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON "$@" > "$work/cmake.log"
cmake --build "$work/build" -j "$(nproc)" --target llama-bench llama-server llama-batched-bench llama-quantize llama-perplexity > "$work/build.log"
echo "$work/build/bin"
