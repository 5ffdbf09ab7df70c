// Built with AVX2 + FMA + F16C; selected with the avx2 matmul path.
#define LLMD_ATTN_NS avx2
#define LLMD_ATTN_NAME "avx2"
#define LLMD_ATTN_F16C 1
#include "attention_impl.h"
