// How the steps' attention read KV, counted for the engine's stats (`attention_paths`): the
// device path's plans (decode_lanes.h) and the CPU backend's tiles (paged_attention.h). Tests
// read them to see which path ran.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <string>

namespace llmd {

struct AttentionPathCounts {
  // Device path: one count per attention call of a plan (a group of rows read together, see
  // DeviceAttentionPlan), not per layer.
  std::atomic<uint64_t> decode_lanes{0};       // batched decode reading lanes in place
  std::atomic<uint64_t> decode_gather{0};      // batched decode gathering each sequence's KV
  std::atomic<uint64_t> sequence_in_place{0};  // one sequence's consecutive slots, a slice
  std::atomic<uint64_t> sequence_gather{0};    // one sequence's scattered slots, gathered
  std::atomic<uint64_t> lane_fills{0};         // sequences copied into a lane when they joined
  std::atomic<uint64_t> lanes_refused{0};      // steps whose lanes the KV budget had no room for
  // CPU backend: query tiles attended (a KV group's heads of a run of one sequence's rows), and
  // the span tasks tiles were split into when too few to keep the threads busy.
  std::atomic<uint64_t> cpu_tiles{0};
  std::atomic<uint64_t> cpu_span_tasks{0};

  std::map<std::string, uint64_t> snapshot() const {
    return {{"decode_lanes", decode_lanes.load()},
            {"decode_gather", decode_gather.load()},
            {"sequence_in_place", sequence_in_place.load()},
            {"sequence_gather", sequence_gather.load()},
            {"lane_fills", lane_fills.load()},
            {"lanes_refused", lanes_refused.load()},
            {"cpu_tiles", cpu_tiles.load()},
            {"cpu_span_tasks", cpu_span_tasks.load()}};
  }
};

}  // namespace llmd
