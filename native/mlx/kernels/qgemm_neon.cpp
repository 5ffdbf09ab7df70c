// Built with -march=armv8-a only (ASIMD, no sdot); every arm64 CPU runs it.
#define LLMD_ISA_NEON 1
#define LLMD_ISA_NAMESPACE neon
#include "qgemm_impl.h"

namespace llmd::kernels {
const KernelTable* neon_table() { return neon::make_table("neon"); }
}  // namespace llmd::kernels
