// Where a step's time goes: wall time per kind of op, accumulated when LLMD_PROFILE=1
// (zero cost otherwise beyond one branch). The worker reports it in its stats.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>

namespace llmd {

enum class OpKind : int { QuantizedMatmul = 0, Attention, Forward, GraphBuild, Embedding, Count };

class OpProfile {
 public:
  static bool enabled();
  static void add(OpKind kind, int64_t ns);
  static std::map<std::string, double> snapshot_ms();  // kind -> total ms, plus call counts
  static void reset();
};

class ScopedOpTimer {
 public:
  explicit ScopedOpTimer(OpKind kind) : kind_(kind), on_(OpProfile::enabled()) {
    if (on_) start_ = std::chrono::steady_clock::now();
  }
  ~ScopedOpTimer() {
    if (on_) {
      OpProfile::add(kind_, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::steady_clock::now() - start_)
                                .count());
    }
  }
  ScopedOpTimer(const ScopedOpTimer&) = delete;
  ScopedOpTimer& operator=(const ScopedOpTimer&) = delete;

 private:
  OpKind kind_;
  bool on_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace llmd
