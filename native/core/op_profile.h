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
  // The primitives of the last profiled forward's graph (name -> count, "total"), recorded by
  // the backend before it evaluates the step: what a decode step costs in MLX nodes, the
  // figure bench/mlx_vs_mlxlm.py compares with mlx-lm's.
  static void record_step_graph(std::map<std::string, int> primitives);
  // Whether steps record their graph: on under LLMD_PROFILE=1 or once switched on (counting
  // costs a graph export per step, so a benchmark switches it on only for the step it counts).
  static bool step_graph_recording();
  static void set_step_graph_recording(bool on);
  static std::map<std::string, int> last_step_graph();
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
