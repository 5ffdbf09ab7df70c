#include "op_profile.h"

#include <cstdlib>
#include <cstring>
#include <mutex>

namespace llmd {

namespace {
std::array<std::atomic<int64_t>, static_cast<int>(OpKind::Count)> g_ns{};
std::array<std::atomic<int64_t>, static_cast<int>(OpKind::Count)> g_calls{};
const char* kNames[] = {"quantized_matmul", "attention", "forward", "graph_build", "embedding"};
std::mutex g_graph_mutex;
std::map<std::string, int> g_last_graph;
}  // namespace

bool OpProfile::enabled() {
  static const bool on = [] {
    const char* v = std::getenv("LLMD_PROFILE");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return on;
}

void OpProfile::add(OpKind kind, int64_t ns) {
  g_ns[static_cast<int>(kind)] += ns;
  g_calls[static_cast<int>(kind)] += 1;
}

std::map<std::string, double> OpProfile::snapshot_ms() {
  std::map<std::string, double> out;
  for (int i = 0; i < static_cast<int>(OpKind::Count); ++i) {
    out[std::string(kNames[i]) + "_ms"] = g_ns[i].load() / 1e6;
    out[std::string(kNames[i]) + "_calls"] = static_cast<double>(g_calls[i].load());
  }
  return out;
}

void OpProfile::reset() {
  for (auto& v : g_ns) v = 0;
  for (auto& v : g_calls) v = 0;
}

void OpProfile::record_step_graph(std::map<std::string, int> primitives) {
  std::lock_guard lock(g_graph_mutex);
  g_last_graph = std::move(primitives);
}

namespace {
std::atomic<int> g_graph_recording{-1};  // -1: not set, follow LLMD_PROFILE
}  // namespace

bool OpProfile::step_graph_recording() {
  const int v = g_graph_recording.load(std::memory_order_relaxed);
  return v < 0 ? enabled() : v != 0;
}

void OpProfile::set_step_graph_recording(bool on) { g_graph_recording = on ? 1 : 0; }

std::map<std::string, int> OpProfile::last_step_graph() {
  std::lock_guard lock(g_graph_mutex);
  return g_last_graph;
}

}  // namespace llmd
