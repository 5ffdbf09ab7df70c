// K-quant kernels (Q4_K, Q6_K: 256-element super-blocks). Included by qgemm_impl.h inside
// each ISA's translation unit. Not implemented yet: weights of these types are refused at load.
#pragma once

namespace llmd::kernels::LLMD_ISA_NAMESPACE {

constexpr GemmFn gemm_q4_k = nullptr;
constexpr GemmFn gemm_q6_k = nullptr;

}  // namespace llmd::kernels::LLMD_ISA_NAMESPACE
