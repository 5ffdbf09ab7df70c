#!/usr/bin/env bash
# The native/cuda GPU session in ONE `device` call (a lent GPU machine has minutes, not hours):
# the GPU tests, the kernel benchmarks, and the cuda backend vs llama.cpp's CUDA build on
# random 8B-shaped Q4_0 and Q4_K_M GGUFs, alternating rounds. Everything it runs was built on
# the developer machine (bench/gpu/cuda_carry.sh) and travels in the git-ignored .dev/cuda:
#   bin/llmd_cuda_tests                  the GPU test + benchmark binary (native/cuda/tests)
#   lib/                                 libmlx + its BLAS (the CPU backend is the tests' reference)
#   llamacpp/bin, llamacpp/lib           llama-bench, llama-batched-bench (GGML_CUDA, sm_90)
#   wheels/                              gguf (to write the random GGUFs there)
# Usage there: bash bench/gpu/cuda_session.sh [rounds]; figures under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-2}
OUT=${OUT:-/tmp/llmd-out}
C=$PWD/.dev/cuda
M=/tmp/llmd-models
mkdir -p "$OUT" "$M"
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }

nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem --format=csv,noheader
cublas=$(python3 -c "import nvidia.cu13, os; print(os.path.join(list(nvidia.cu13.__path__)[0], 'lib'))" 2> /dev/null)
[ -f "$cublas/libcublas.so.13" ] || cublas=$(dirname "$(find / -name 'libcublas.so.13' 2> /dev/null | head -1)")
export LD_LIBRARY_PATH="$C/lib:$C/llamacpp/lib:$cublas:${LD_LIBRARY_PATH:-}"
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$C"/wheels/*.whl && export PYTHONPATH=/tmp/site
chmod +x "$C"/bin/* "$C"/llamacpp/bin/* 2> /dev/null
LCBIN=$C/llamacpp/bin
if [ ! -x "$LCBIN/llama-bench" ] && [ -f "$C/llamacpp-src.tar.xz" ]; then
  # No prebuilt llama.cpp came: build it here, on 14 cores, while the tests run.
  tar xJf "$C/llamacpp-src.tar.xz" -C /tmp
  LCBIN=/tmp/lcb/bin
  setsid nohup bash -c "cmake -S /tmp/llama.cpp -B /tmp/lcb -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF && cmake --build /tmp/lcb -j 14 --target llama-bench \
    llama-batched-bench" > "$OUT/llamacpp-build.log" 2>&1 < /dev/null &
fi

# The 8B files take a minute to write: in the background while the tests run.
for q in q4_0 q4_k_m; do
  setsid nohup python3 bench/gpu/make_random_gguf.py --preset llama3-8b --dtype $q --out $M/llama3-8b-$q.gguf.tmp \
    > "$OUT/gen-$q.log" 2>&1 < /dev/null && mv $M/llama3-8b-$q.gguf.tmp $M/llama3-8b-$q.gguf &
done
tiny=""
for spec in tiny-gqa3:q4_0 tiny-gqa3:q8_0 tiny-gqa3:f16 tiny-hd128:q4_k_m tiny-hd128:q5_k_m tiny-hd128:q6_k \
  tiny-qwen3:q4_k_m tiny-qwen2:q8_0; do
  python3 bench/gpu/make_random_gguf.py --preset ${spec%%:*} --dtype ${spec##*:} --out $M/${spec/:/-}.gguf > /dev/null
  tiny="$tiny${tiny:+:}$M/${spec/:/-}.gguf"
done
stamp "tiny models written"

stamp "GPU tests"
LLMD_CUDA_TEST_MODELS="$tiny" timeout 180 "$C/bin/llmd_cuda_tests" 2>&1 | tee "$OUT/tests.txt" | grep -v "^  ok "
stamp "kernel benchmarks"
timeout 150 "$C/bin/llmd_cuda_tests" --bench 2>&1 | tee "$OUT/kernel_bench.txt"

for _ in $(seq 1 90); do [ -f $M/llama3-8b-q4_0.gguf ] && [ -f $M/llama3-8b-q4_k_m.gguf ] && break; sleep 2; done
cat "$OUT"/gen-*.log
for _ in $(seq 1 120); do [ -x "$LCBIN/llama-batched-bench" ] && break; sleep 2; done
[ -x "$LCBIN/llama-batched-bench" ] || { echo "llama.cpp did not build:"; tail -20 "$OUT/llamacpp-build.log"; }
llamacpp() {  # llamacpp FILE: llama-bench (pp512, pp4096, tg128) and llama-batched-bench (8, 32)
  "$LCBIN/llama-bench" -m "$1" -ngl 99 -r 2 -p 512,4096 -n 128 -o json 2> "$OUT/llama-bench.err" |
    python3 -c "import json,sys
for t in json.load(sys.stdin):
    k = f\"pp{t['n_prompt']}\" if t['n_gen'] == 0 else f\"tg{t['n_gen']}\"
    print(f\"LLAMACPP file=$1 test={k} tok_s={t['avg_ts']:.2f}\")" || tail -5 "$OUT/llama-bench.err"
  "$LCBIN/llama-batched-bench" -m "$1" -ngl 99 -c 9000 -b 2048 -npp 128 -ntg 128 -npl 8,32 \
    --output-format jsonl 2>&1 | python3 -c "import json,sys
for line in sys.stdin:
    if line.startswith('{') and 'speed_tg' in line:
        r = json.loads(line); print(f\"LLAMACPP file=$1 test=batch{r['pl']} tok_s={r['speed_tg']:.2f}\")"
}
ours() { LLMD_BENCH_GGUF="$1" LLMD_BENCH_REPS=1 timeout 200 "$C/bin/llmd_cuda_tests" --bench model_step_rates 2>&1 | grep -v "^BENCH\|passed"; }
for r in $(seq 1 "$ROUNDS"); do
  for q in q4_0 q4_k_m; do
    f=$M/llama3-8b-$q.gguf
    [ -f "$f" ] || { echo "missing $f"; continue; }
    stamp "round $r $q"
    if [ $((r % 2)) = 1 ]; then ours "$f"; llamacpp "$f"; else llamacpp "$f"; ours "$f"; fi
  done
done 2>&1 | tee "$OUT/model_bench.txt"
python3 bench/gpu/cuda_summary.py "$OUT/model_bench.txt" "$OUT/kernel_bench.txt" | tee "$OUT/summary.md"
stamp "done"
