// Chooses the kernel table once per process from the CPU's features (never from build flags),
// with LLMD_CPU_PATH forcing a lower path (the tests use it to exercise every path).
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "qgemm.h"

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#elif defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>
#endif

namespace llmd::kernels {

#if !(defined(__x86_64__) || defined(_M_X64))
const KernelTable* avx2_table() { return nullptr; }
const KernelTable* avx512vnni_table() { return nullptr; }
#endif
#if !defined(LLMD_HAVE_NEON_KERNELS)
// Only arm64 builds compile qgemm_neon.cpp / qgemm_neondot.cpp (native/CMakeLists.txt).
const KernelTable* neondot_table() { return nullptr; }
const KernelTable* neon_table() { return nullptr; }
#endif

namespace {
bool cpu_has_avx512vnni() {
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
         __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

bool cpu_has_avx2() {
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

// ASIMD itself is part of arm64's base ISA; the dot-product extension (sdot, Armv8.2+) is not.
bool cpu_has_dotprod() {
#if defined(__aarch64__) && defined(__linux__)
#if defined(HWCAP_ASIMDDP)
  return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#else
  return (getauxval(AT_HWCAP) & (1UL << 20)) != 0;  // HWCAP_ASIMDDP in <asm/hwcap.h>
#endif
#elif defined(__aarch64__) && defined(__APPLE__)
  int has = 0;
  size_t len = sizeof(has);
  return sysctlbyname("hw.optional.arm.FEAT_DotProd", &has, &len, nullptr, 0) == 0 && has != 0;
#else
  return false;
#endif
}
}  // namespace

bool uses_superblock_activations(TensorType type) {
  return type == TensorType::Q2_K || type == TensorType::Q3_K || type == TensorType::Q4_K ||
         type == TensorType::Q5_K || type == TensorType::Q6_K;
}

QuantizeRowFn KernelTable::quantizer_for(TensorType type) const {
  return uses_superblock_activations(type) ? quantize_row_k : quantize_row;
}

GemmFn KernelTable::gemm_for(TensorType type) const {
  switch (type) {
    case TensorType::Q4_0: return q4_0;
    case TensorType::Q4_1: return q4_1;
    case TensorType::Q8_0: return q8_0;
    case TensorType::Q4_K: return q4_k;
    case TensorType::Q5_K: return q5_k;
    case TensorType::Q6_K: return q6_k;
    case TensorType::IQ4_NL: return iq4_nl;
    case TensorType::Q2_K: return q2_k;
    case TensorType::Q3_K: return q3_k;
    case TensorType::Q5_0: return q5_0;
    case TensorType::Q5_1: return q5_1;
    default: return nullptr;
  }
}

GemmFn KernelTable::packed_gemm_for(TensorType type) const {
  switch (type) {
    case TensorType::Q4_0: return q4_0_x8;
    case TensorType::Q4_1: return q4_1_x8;
    case TensorType::Q8_0: return q8_0_x8;
    case TensorType::Q4_K: return q4_k_x8;
    case TensorType::Q5_K: return q5_k_x8;
    case TensorType::Q6_K: return q6_k_x8;
    case TensorType::IQ4_NL: return iq4_nl_x8;
    case TensorType::Q5_0: return q5_0_x8;
    case TensorType::Q5_1: return q5_1_x8;
    default: return nullptr;
  }
}

std::vector<const KernelTable*> runnable_tables() {
  std::vector<const KernelTable*> tables;
  if (cpu_has_avx512vnni() && avx512vnni_table()) tables.push_back(avx512vnni_table());
  if (cpu_has_avx2() && avx2_table()) tables.push_back(avx2_table());
  if (cpu_has_dotprod() && neondot_table()) tables.push_back(neondot_table());
  if (neon_table()) tables.push_back(neon_table());
  tables.push_back(scalar_table());
  return tables;
}

const KernelTable* table_named(const std::string& isa) {
  for (const KernelTable* t : runnable_tables()) {
    if (isa == t->isa) return t;
  }
  return nullptr;
}

const KernelTable& active_table() {
  static const KernelTable* chosen = [] {
    const auto tables = runnable_tables();
    if (const char* forced = std::getenv("LLMD_CPU_PATH"); forced && *forced) {
      if (const KernelTable* t = table_named(forced)) return t;
      std::fprintf(stderr, "llmd: LLMD_CPU_PATH=%s is not runnable here; using %s\n", forced,
                   tables.front()->isa);
    }
    return tables.front();
  }();
  return *chosen;
}

}  // namespace llmd::kernels
