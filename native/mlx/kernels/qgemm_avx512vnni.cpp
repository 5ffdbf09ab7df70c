// Built with AVX-512 (F, BW, VL) + VNNI flags; selected at run time when the CPU has them.
#define LLMD_ISA_X86 1
#define LLMD_ISA_VNNI 1
#define LLMD_ISA_NAMESPACE avx512vnni
#include "qgemm_impl.h"

namespace llmd::kernels {
const KernelTable* avx512vnni_table() { return avx512vnni::make_table("avx512vnni"); }
}  // namespace llmd::kernels
