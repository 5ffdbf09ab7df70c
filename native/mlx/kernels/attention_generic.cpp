// Portable vectors, no -m flags: SSE2 on x86-64 (the scalar matmul path), NEON on arm64.
#define LLMD_ATTN_NS generic
#define LLMD_ATTN_NAME "generic"
#include "attention_impl.h"
