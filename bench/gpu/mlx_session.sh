#!/usr/bin/env bash
# Issue 22 on MLX's CUDA device: llmd's MLX device path (backend "gpu") against mlx-lm on the
# same MLX 4-bit weights (`bench/mlx_vs_mlxlm.py --backend gpu`), on a lent NVIDIA machine.
# mlx-cuda-13's wheel (90 MB) is over one call's 64 MiB carry, so this takes two `device` calls
# back to back (the machine is given back 30 s after a call):
#   .dev/m1/  the wheel's first part (`split -b 44900000`, the count in NAME.parts), the small
#             wheels the machine lacks (mlx, mlx-lm, gguf, llguidance, platformdirs, pydantic and
#             its needs) and tok/ (SmolLM2's tokenizer: `python -m bench.mlx_vs_mlxlm
#             --write-tokenizer .dev/m1/tok`; the 98 MB GGUF does not travel, so the GPU run
#             measures the random 1B-shaped model only)
#   .dev/m2/  the wheel's second part
# There:  bash bench/gpu/mlx_session.sh stash   (carrying .dev/m1)
#         bash bench/gpu/mlx_session.sh run     (carrying .dev/m2): installs, builds llmd against
#         MLX's CUDA build, a 3-sequence smoke, then the benchmark; files under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
STASH=/root/llmd-mlx
OUT=${OUT:-/tmp/llmd-out}
WHEEL=mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl
mkdir -p "$STASH" "$OUT"
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }
for d in .dev/m*/; do [ -d "$d" ] && cp -r "$d". "$STASH/"; done

case "${1:-}" in
  stash)
    ls -la "$STASH"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    ;;
  run)
    if [ ! -f "$STASH/$WHEEL" ]; then
      [ "$(ls "$STASH/$WHEEL".part?? | wc -l)" = "$(cat "$STASH/$WHEEL.parts")" ] || {
        echo "parts missing"
        ls -la "$STASH"
        exit 1
      }
      cat "$STASH/$WHEEL".part?? > "$STASH/$WHEEL" && rm "$STASH/$WHEEL".part??
    fi
    python3 -m pip install -q --no-index --no-deps --upgrade "$STASH"/*.whl 2>&1 | tail -5
    python3 -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device(), mx.device_info(mx.gpu))" || exit 1
    stamp "wheels installed"
    # MLX's CMake config looks for cuDNN; it came with pip here.
    cudnn=$(python3 -c "import nvidia.cudnn as c; print(list(c.__path__)[0])" 2> /dev/null)
    [ -n "$cudnn" ] && export CMAKE_ARGS="-DCUDNN_INCLUDE_PATH=$cudnn/include -DCUDNN_LIBRARY_PATH=$cudnn/lib"
    CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install -q --no-index --no-deps --no-build-isolation . \
      > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
    # The benchmark runs llmd from the checkout's daemon/ (bench.servers.llmd_env): the built
    # engine and the generated package data go there.
    pkg=$(cd /tmp && python3 -c "import llmd, os; print(os.path.dirname(llmd.__file__))")
    cp "$pkg"/_engine*.so daemon/llmd/ && cp -r "$pkg"/catalog "$pkg"/service_templates daemon/llmd/
    stamp "llmd built"
    python3 bench/gpu/make_random_gguf.py --preset tiny --out /tmp/tiny.gguf > /dev/null
    PYTHONPATH=daemon timeout 60 python3 -X faulthandler bench/gpu/gpu_smoke.py /tmp/tiny.gguf 2>&1 | tail -20
    stamp "smoke done"
    export PYTHONUNBUFFERED=1
    timeout "${BENCH_TIMEOUT:-420}" python3 -m bench.mlx_vs_mlxlm --backend gpu --mlx-lm-python python3 \
      --models random-1b --tokenizer-dir "$STASH/tok" --work-dir /root/mlx-work \
      --rounds "${ROUNDS:-3}" --server-rounds "${SERVER_ROUNDS:-2}" --stream-duration "${STREAM_SECONDS:-20}" \
      --out "$OUT/mlx_gpu.json" 2>&1 | grep -v "it/s\]$" | tee "$OUT/mlx_gpu.txt"
    stamp "done"
    ;;
  *)
    echo "usage: $0 stash|run" >&2
    exit 2
    ;;
esac
