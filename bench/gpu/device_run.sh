#!/usr/bin/env bash
# llmd's GPU session on a machine reached through a 64 MiB-per-call carry (see README.md here).
# Each step is one call; files too large for one carry arrive in parts (NAME.partaa, ...,
# with NAME.parts holding the count) under .dev/cN/ and are stashed until every part is there. Steps, in order:
#   stash    keep the carried files; start llama.cpp's CUDA build in the background
#   install  install mlx + mlx-cuda-13 and the other carried wheels, build llmd against them
#            (pip install --no-build-isolation ., the offline form of `pip install ".[cuda]"`),
#            and start writing the random 8B-shaped Q4_0 GGUF in the background
#   tests    the GPU test suite on the test model (parity, isolation, prefix cache, device path)
#   bench    llmd vs llama.cpp (gpu_bench.py) and the per-op profile (op_profile.py)
set -uo pipefail
cd "$(dirname "$0")/../.."
STASH=/root/llmd-stash
OUT=${OUT:-/tmp/llmd-out}
PY=python3
mkdir -p "$STASH" "$OUT"
BIG_MODEL=$STASH/llama3-8b-q4_0.gguf
TEST_MODEL=$STASH/SmolLM2-135M-Instruct.Q4_1.gguf

stash_carried() {  # every carried folder .dev/c*/ (one per call) is copied aside
  for d in .dev/c*/; do [ -d "$d" ] && cp -r "$d". "$STASH/"; done
  return 0
}

join_parts() {  # join_parts NAME: NAME.part* -> NAME once all parts are stashed
  if [ ! -f "$STASH/$1" ] && ls "$STASH/$1".part* > /dev/null 2>&1 && [ -f "$STASH/$1.parts" ]; then
    if [ "$(ls "$STASH/$1".part?? | wc -l)" = "$(cat "$STASH/$1.parts")" ]; then
      cat "$STASH/$1".part?? > "$STASH/$1" && rm "$STASH/$1".part??
    fi
  fi
}

case "$1" in
  stash)
    stash_carried && ls -la "$STASH"
    if [ -f "$STASH/llamacpp-src.tar.xz" ] && [ ! -d "$STASH/llama.cpp" ]; then
      tar xJf "$STASH/llamacpp-src.tar.xz" -C "$STASH"
      setsid nohup bash -c "cmake -S $STASH/llama.cpp -B $STASH/lcb -DCMAKE_BUILD_TYPE=Release \
        -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        > $STASH/lc-cmake.log 2>&1 && cmake --build $STASH/lcb -j 15 --target llama-bench \
        llama-batched-bench > $STASH/lc-build.log 2>&1; echo \$? > $STASH/lc-done" \
        > /dev/null 2>&1 < /dev/null &
      echo "llama.cpp CUDA build started"
    fi
    ;;
  install)
    stash_carried
    join_parts mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl
    $PY -m pip install -q --no-index --no-deps "$STASH"/*.whl || exit 1
    $PY -c "import mlx.core as mx; print('gpu', mx.is_available(mx.gpu), mx.device_info(mx.gpu))"
    # MLX's CMake config looks for cuDNN; on a box where it came with pip, point CMake at it.
    cudnn=$($PY -c "import nvidia.cudnn as c; print(list(c.__path__)[0])" 2> /dev/null)
    [ -n "$cudnn" ] && export CMAKE_ARGS="-DCUDNN_INCLUDE_PATH=$cudnn/include -DCUDNN_LIBRARY_PATH=$cudnn/lib"
    $PY -m pip install -q --no-index --no-deps --no-build-isolation . 2>&1 | tail -30
    $PY -c "import llmd._engine as e; print('engine ok', e.active_kernel_path())" || exit 1
    # Smoke: three sequences decoded together on the GPU (a backtrace if it crashes).
    $PY bench/gpu/make_random_gguf.py --preset tiny --out /tmp/tiny.gguf > /dev/null
    smoke=(bench/gpu/gpu_smoke.py /tmp/tiny.gguf)
    if ! timeout 60 $PY -X faulthandler "${smoke[@]}"; then
      timeout 120 cuda-gdb -batch -ex run -ex bt --args $PY "${smoke[@]}" 2>&1 | grep -v "^\[" | tail -40
    fi
    if [ ! -f "$BIG_MODEL" ]; then
      setsid nohup bash -c "$PY bench/gpu/make_random_gguf.py --out $BIG_MODEL.tmp > $STASH/gen.log 2>&1 \
        && mv $BIG_MODEL.tmp $BIG_MODEL" > /dev/null 2>&1 < /dev/null &
      echo "8B model generation started"
    fi
    ;;
  tests)
    stash_carried
    join_parts SmolLM2-135M-Instruct.Q4_1.gguf
    [ -f "$TEST_MODEL" ] || { echo "test model parts missing"; ls "$STASH"; exit 1; }
    export LLMD_TEST_MODEL=$TEST_MODEL LLMD_TEST_BACKEND=gpu PYTHONUNBUFFERED=1
    $PY -m pytest -q -p no:cacheprovider tests/native/test_device_backend.py \
      tests/native/test_parity_llamacpp.py tests/native/test_engine.py tests/native/test_prefix_cache.py \
      -k "not memory and not llmd_kernels and not tight_kv_budget and not tokenizer" 2>&1 | tee "$OUT/gpu_tests.txt" | tail -40
    ;;
  bench)
    for _ in $(seq 1 60); do [ -f "$STASH/lc-done" ] && [ -f "$BIG_MODEL" ] && break; sleep 5; done
    tail -3 "$STASH/lc-build.log"; cat "$STASH/gen.log"
    export PYTHONUNBUFFERED=1
    $PY bench/gpu/gpu_bench.py --model "$BIG_MODEL" --llamacpp-bin "$STASH/lcb/bin" --rounds "${ROUNDS:-3}" \
      --json "$OUT/gpu_bench.json" 2>&1 | tee "$OUT/gpu_bench.txt"
    bw=$($PY -c "import json; print(json.load(open('$OUT/gpu_bench.json'))['bandwidth_gb_s'])" 2> /dev/null || echo 0)
    timeout 240 $PY bench/gpu/op_profile.py --bandwidth "$bw" 2>&1 | tee "$OUT/op_profile.txt"
    ;;
  *)
    echo "usage: $0 stash|install|tests|bench" >&2
    exit 2
    ;;
esac
