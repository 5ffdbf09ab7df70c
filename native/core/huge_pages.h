// Long-lived weight buffers in 2 MiB pages where the kernel allows it.
//
// Why: decode streams every weight byte once per token. With 4 KiB pages the stream crosses a
// page every 4 KiB, where the cores' hardware prefetchers stop and a TLB entry must be walked
// in. On the 2-core Zen 5 box, one thread's single-row Q4_0 matvecs over a 1B model's weights
// (a throwaway harness over the engine's packed kernels) read 29 GB/s from 4 KiB pages and
// 35 GB/s from 2 MiB pages, against 40 / 42 GB/s for a plain read of the same bytes.
// The pages must be asked for before the buffer is first written: Linux backs a fault in a
// MADV_HUGEPAGE range with a huge page, while MADV_COLLAPSE of pages already written failed
// there (EINVAL) and khugepaged merges only ~16 MB every 10 s.
#pragma once

#include <cstddef>

namespace llmd {

// Asks for huge pages on the 2 MiB-aligned part of [p, p + n), memory not yet written
// (transparent huge pages in "madvise" or "always" mode). Best effort: false where the range
// holds no whole huge page, the kernel refused, or LLMD_HUGE_PAGES=0 (to measure the
// difference); the memory is usable either way.
bool advise_huge_pages(void* p, size_t n);

}  // namespace llmd
