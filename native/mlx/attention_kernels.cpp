#include "attention_kernels.h"

#include "../core/scratch.h"
#include "kernels/qgemm.h"

namespace llmd {

const AttentionKernels& attention_kernels_for(const std::string& kernel_path) {
#if defined(__x86_64__) || defined(_M_X64)
  // The matmul paths' runtime checks cover these variants' flags (AVX-512 F/BW/VL with VNNI
  // implies what attention_avx512.cpp is built with; avx2 includes FMA and F16C).
  if (kernel_path == "avx512vnni") return *attention::avx512::kernels();
  if (kernel_path == "avx2") return *attention::avx2::kernels();
#endif
  return *attention::generic::kernels();
}

AttentionTileScratch& attention_tile_scratch(int head_dim) {
  thread_local AttentionTileScratch scratch;
  grow_scratch(scratch.floats, attention_scratch_floats(head_dim));
  return scratch;
}

const AttentionKernels& attention_kernels() {
  static const AttentionKernels& chosen = attention_kernels_for(kernels::active_table().isa);
  return chosen;
}

std::string attention_path(KvType type) {
  return std::string("llmd:") + kv_type_name(type) + ":" + attention_kernels().isa;
}

}  // namespace llmd
