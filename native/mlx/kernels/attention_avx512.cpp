// Built with AVX-512 (F, BW, VL) + F16C; selected with the avx512vnni matmul path (32 vector
// registers and EVEX encodings for the same 8-lane kernel, which holds twice the accumulators).
#define LLMD_ATTN_NS avx512
#define LLMD_ATTN_NAME "avx512"
#define LLMD_ATTN_F16C 1
#define LLMD_ATTN_WIDE 1
#include "attention_impl.h"
