#!/usr/bin/env bash
# Prepares .dev/cuda (git-ignored), what bench/gpu/cuda_session.sh needs on the GPU machine, from
# builds made here (bench/gpu/cuda_carry.sh [TEST_BINARY...]): the GPU test binary (build/cuda, -DLLMD_CUDA=ON), libmlx and its BLAS (the
# tests' CPU reference), llama.cpp's CUDA tools if built (bench/.llamacpp/build-cuda) or else a
# trimmed copy of its sources for the session to build there, and the gguf wheel, packed into
# .dev/cuda.tar.xz. Prints the size: a `device` call carries at most 64 MiB with the working tree.
set -euo pipefail
cd "$(dirname "$0")/../.."
C=/tmp/llmd-cuda-carry/cuda
rm -rf "$(dirname "$C")" .dev/cuda.tar.xz && mkdir -p "$C"/{bin,lib,llamacpp/bin,llamacpp/lib,wheels} .dev
# Arguments: test binaries to carry (variants of a kernel, tested side by side there); default
# the one in build/cuda.
[ $# -gt 0 ] || set -- build/cuda/native/cuda/llmd_cuda_tests
i=0
for b in "$@"; do
  cp "$b" "$C/bin/llmd_cuda_tests_$((i++))" && strip "$C/bin/llmd_cuda_tests_$((i - 1))"
done
site=$(.venv/bin/python -c "import mlx, os; print(os.path.dirname(list(mlx.__path__)[0]))")
cp "$site/mlx/lib/libmlx.so" "$site"/mlx_cpu.libs/* "$C/lib/"
lc=bench/.llamacpp/build-cuda
if [ -x "$lc/bin/llama-bench" ] && [ -x "$lc/bin/llama-batched-bench" ]; then
  cp "$lc/bin/llama-bench" "$lc/bin/llama-batched-bench" "$C/llamacpp/bin/"
  cp -P "$lc"/bin/*.so* "$C/llamacpp/lib/" 2> /dev/null || true
  find "$lc" -name "*.so*" \( -type f -o -type l \) -exec cp -P {} "$C/llamacpp/lib/" \;
  strip "$C"/llamacpp/lib/*.so* "$C"/llamacpp/bin/* 2> /dev/null || true
else
  src=bench/.llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp
  tar cJf "$C/llamacpp-src.tar.xz" -C "$(dirname "$src")" --exclude=llama.cpp/models --exclude=llama.cpp/docs \
    --exclude=llama.cpp/tests --exclude=llama.cpp/media --exclude=llama.cpp/gguf-py --exclude=llama.cpp/.git llama.cpp
fi
.venv/bin/python -m pip download -q --no-deps gguf -d "$C/wheels"
du -sh "$C" "$C"/* "$C"/llamacpp/*
# One xz archive (the CUDA code and libmlx compress 3-4x): the session unpacks it into .dev/cuda.
tar cf - -C "$(dirname "$C")" cuda | xz -T2 -6 > .dev/cuda.tar.xz
du -sh .dev/cuda.tar.xz
