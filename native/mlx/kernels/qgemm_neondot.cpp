// Built with -march=armv8.2-a+dotprod (`sdot`); selected at run time when the CPU has it.
#define LLMD_ISA_NEON 1
#define LLMD_ISA_NAMESPACE neondot
#include "qgemm_impl.h"

namespace llmd::kernels {
const KernelTable* neondot_table() { return neondot::make_table("neondot"); }
}  // namespace llmd::kernels
