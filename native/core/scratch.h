// Grow-only per-thread scratch buffers.
//
// Why: std::vector::resize value-initializes every element it adds, even inside the capacity
// it already holds. A thread_local buffer resized to each call's size therefore memsets again
// whenever sizes alternate (a 2048-wide projection, then the 8192-wide one; a shrinking
// dynamic task, then the next layer's wide first task). On a Zen 1 decode step the SwiGLU
// buffer alone was 4.4% of the time in memset. A scratch buffer only grows: its contents are
// written before they are read, so the extra elements never need zeros.
#pragma once

#include <cstddef>
#include <vector>

namespace llmd {

// At least n elements of v, for the caller to overwrite; grows v (never shrinks it).
template <class T>
T* grow_scratch(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

}  // namespace llmd
