// Built with -mavx2 -mfma -mf16c only; selected at run time when the CPU has them.
#define LLMD_ISA_X86 1
#define LLMD_ISA_NAMESPACE avx2
#include "qgemm_impl.h"

namespace llmd::kernels {
const KernelTable* avx2_table() { return avx2::make_table("avx2"); }
}  // namespace llmd::kernels
