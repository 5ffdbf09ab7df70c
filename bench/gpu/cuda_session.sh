#!/usr/bin/env bash
# The native/cuda GPU session in ONE `device` call (a lent GPU machine has minutes, not hours):
# the GPU tests, the kernel benchmarks, and the cuda backend vs llama.cpp's CUDA build on
# random 8B-shaped Q4_0 and Q4_K_M GGUFs, alternating rounds. Everything it runs was built on
# the developer machine (bench/gpu/cuda_carry.sh) and travels as the git-ignored .dev/cuda.tar.xz,
# unpacked into .dev/cuda:
#   bin/llmd_cuda_tests*                 GPU test + benchmark binaries (native/cuda/tests); with
#                                        several (variants of a kernel), each is tested and the
#                                        first whose model test passes runs the model benchmark
#   lib/                                 libmlx + its BLAS (the CPU backend is the tests' reference)
#   llamacpp/bin, llamacpp/lib           llama-bench, llama-batched-bench (GGML_CUDA, sm_90), or
#   llamacpp-src.tar.xz                  its sources, then built here while the tests run
#   wheels/                              gguf (to write the random GGUFs here)
# Usage there: bash bench/gpu/cuda_session.sh [rounds]; at most 8 files under $OUT. KERNEL_BENCH_FILTER
# picks kernel benchmarks by name, PROFILE_SEQS the batch sizes profiled (default "1 32").
set -uo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-2}
OUT=${OUT:-/tmp/llmd-out}
C=$PWD/.dev/cuda
M=/tmp/llmd-models
LOG=$OUT/misc.log
mkdir -p "$OUT" "$M"
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }

[ -f .dev/cuda.tar.xz ] && { rm -rf "$C"; xz -dc .dev/cuda.tar.xz | tar xf - -C .dev; }
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem --format=csv,noheader
cublas=$(python3 -c "import nvidia.cu13, os; print(os.path.join(list(nvidia.cu13.__path__)[0], 'lib'))" 2> /dev/null)
[ -f "$cublas/libcublas.so.13" ] || cublas=$(dirname "$(find /opt /usr -name 'libcublas.so.13*' 2> /dev/null | head -1)")
export LD_LIBRARY_PATH="$C/lib:$C/llamacpp/lib:$cublas:${LD_LIBRARY_PATH:-}"
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$C"/wheels/*.whl >> "$LOG" 2>&1
export PYTHONPATH=/tmp/site
chmod +x "$C"/bin/* "$C"/llamacpp/bin/* 2> /dev/null
LCBIN=$C/llamacpp/bin
if [ ! -x "$LCBIN/llama-bench" ] && [ -f "$C/llamacpp-src.tar.xz" ]; then
  # No prebuilt llama.cpp came: build it here, on 12 cores, while the tests run.
  tar xJf "$C/llamacpp-src.tar.xz" -C /tmp
  LCBIN=/tmp/lcb/bin
  setsid nohup bash -c "cmake -S /tmp/llama.cpp -B /tmp/lcb -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF && cmake --build /tmp/lcb -j 12 --target llama-bench \
    llama-batched-bench" > /tmp/llamacpp-build.log 2>&1 < /dev/null &
fi

# The 8B files take a minute to write: in the background while the tests run.
for q in q4_0 q4_k_m; do
  (setsid python3 bench/gpu/make_random_gguf.py --preset ${BIG_PRESET:-llama3-8b} --dtype $q --out $M/llama3-8b-$q.gguf.tmp \
    > /tmp/gen-$q.log 2>&1 < /dev/null && mv $M/llama3-8b-$q.gguf.tmp $M/llama3-8b-$q.gguf) &
done
tiny=""
for spec in tiny-gqa3:q4_0 tiny-gqa3:q8_0 tiny-gqa3:f16 tiny-hd128:q4_k_m tiny-hd128:q5_k_m tiny-hd128:q6_k \
  tiny-qwen3:q4_k_m tiny-qwen2:q8_0; do
  python3 bench/gpu/make_random_gguf.py --preset ${spec%%:*} --dtype ${spec##*:} --out $M/${spec/:/-}.gguf >> "$LOG" 2>&1
  tiny="$tiny${tiny:+:}$M/${spec/:/-}.gguf"
done
stamp "tiny models written"

best=""
for b in "$C"/bin/llmd_cuda_tests*; do
  v=$(basename "$b")
  stamp "GPU tests: $v"
  # Each case in its own process: a kernel fault leaves its CUDA context unusable.
  for t in $("$b" --list); do
    # MLX_DISABLE_COMPILE: the CPU reference's MLX would JIT-compile fused kernels with the
    # machine's g++, which failed there (a `_Float128` redeclaration in MLX's generated source).
    MLX_DISABLE_COMPILE=1 LLMD_CUDA_TEST_MODELS="$tiny" timeout 60 "$b" "=$t" 2>&1 | grep -v "^device:\|of 1 tests passed"
  done > "$OUT/tests-$v.txt"
  echo "$(grep -c '^  ok ' "$OUT/tests-$v.txt") passed, $(grep -c '^  FAILED' "$OUT/tests-$v.txt") failed" | tee -a "$OUT/tests-$v.txt"
  grep -A3 "FAILED" "$OUT/tests-$v.txt" | cut -c1-300 | head -30
  if [ -z "$best" ] && grep -q "ok model_matches_cpu_backend_batched" "$OUT/tests-$v.txt"; then best=$b; fi
done
[ -n "$best" ] || best=$(ls "$C"/bin/llmd_cuda_tests* | head -1)
stamp "kernel benchmarks: $(basename "$best") in full, the other variants' matmul"
for b in "$C"/bin/llmd_cuda_tests*; do
  filter=${KERNEL_BENCH_FILTER:-}
  [ "$b" = "$best" ] || filter=matmul
  timeout 100 "$b" --bench $filter > "$OUT/kernels-$(basename "$b").txt" 2>&1
  grep -E "GB/s|TFLOP|FAILED|us " "$OUT/kernels-$(basename "$b").txt" | cut -c1-160 | head -60
done

for _ in $(seq 1 60); do [ -f $M/llama3-8b-q4_0.gguf ] && [ -f $M/llama3-8b-q4_k_m.gguf ] && break; sleep 2; done
cat /tmp/gen-*.log >> "$LOG"
for _ in $(seq 1 90); do [ -x "$LCBIN/llama-batched-bench" ] && break; sleep 2; done
[ -f /tmp/llamacpp-build.log ] && tail -5 /tmp/llamacpp-build.log >> "$LOG"
[ -x "$LCBIN/llama-batched-bench" ] || echo "llama.cpp is not built: see misc.log"
llamacpp() {  # llamacpp FILE: llama-bench (pp512, pp4096, tg128) and llama-batched-bench (8, 32)
  "$LCBIN/llama-bench" -m "$1" -ngl 99 -r 2 -p 512,4096 -n 128 -o json 2>> "$LOG" |
    python3 -c "import json,sys
for t in json.load(sys.stdin):
    k = f\"pp{t['n_prompt']}\" if t['n_gen'] == 0 else f\"tg{t['n_gen']}\"
    print(f\"LLAMACPP file=$1 test={k} tok_s={t['avg_ts']:.2f}\")"
  "$LCBIN/llama-batched-bench" -m "$1" -ngl 99 -c 9000 -b 2048 -npp 128 -ntg 128 -npl 8,32 \
    --output-format jsonl 2>&1 | python3 -c "import json,sys
for line in sys.stdin:
    if line.startswith('{') and 'speed_tg' in line:
        r = json.loads(line); print(f\"LLAMACPP file=$1 test=batch{r['pl']} tok_s={r['speed_tg']:.2f}\")"
}
ours() { LLMD_BENCH_GGUF="$1" LLMD_BENCH_REPS=1 timeout 150 "$best" --bench model_step_rates 2>&1 | grep -v "^BENCH\|passed"; }
for r in $(seq 1 "$ROUNDS"); do
  for q in q4_0 q4_k_m; do
    f=$M/llama3-8b-$q.gguf
    [ -f "$f" ] || { echo "missing $f"; continue; }
    stamp "round $r $q"
    if [ $((r % 2)) = 1 ]; then ours "$f"; llamacpp "$f"; else llamacpp "$f"; ours "$f"; fi
  done
done 2>&1 | tee "$OUT/model_bench.txt"
# Per-kernel profile of a decode step at batch 1 and 32 (Nsight Compute, where it can read the counters).
NCU=$(command -v ncu || find /opt/nvidia /usr/local -name ncu -type f 2> /dev/null | head -1)
if [ -n "$NCU" ] && [ -f $M/llama3-8b-q4_0.gguf ]; then
  for n in ${PROFILE_SEQS:-1 32}; do
    LLMD_BENCH_GGUF=$M/llama3-8b-q4_0.gguf LLMD_PROFILE_SEQS=$n timeout 150 "$NCU" --clock-control none --nvtx \
      --nvtx-include "decode/" --metrics gpu__time_duration.sum --print-units base --csv "$best" --bench \
      =model_profile_step > /tmp/ncu-$n.csv 2>> "$LOG"
    python3 bench/gpu/cuda_profile.py /tmp/ncu-$n.csv --steps 3 --label "8B Q4_0 decode, batch $n" | tee -a "$OUT/profile.md"
  done
fi
python3 bench/gpu/cuda_summary.py "$OUT/model_bench.txt" "$OUT/kernels-$(basename "$best").txt" | tee "$OUT/summary.md"
stamp "done"
