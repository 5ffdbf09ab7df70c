#define LLMD_ISA_NAMESPACE scalar
#include "qgemm_impl.h"

namespace llmd::kernels {
const KernelTable* scalar_table() { return scalar::make_table("scalar"); }
}  // namespace llmd::kernels
