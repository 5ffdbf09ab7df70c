// Decode lanes: each decoding sequence's keys and values laid out contiguously, one lane per
// sequence, so a batched decode step's attention reads every sequence's KV in place.
//
// Why: the device KV store is indexed by the engine's block ids (device_attention.h), and a
// sequence's blocks lie wherever the pool handed them out. Reading many sequences in one
// attention call from there needs a gather, a copy of every sequence's KV per layer per step
// (8.6 ms of a 20.8 ms step at batch 32 on an H100). mlx-lm's batch cache instead keeps one
// [batch, kv_heads, length, head_dim] array per layer that each step writes one column of and
// attention reads through a mask. Lanes are that array beside the block store: a decode row
// writes its key and value to both (the block store stays the truth the prefix cache, sessions
// and forks use), and the batched attention reads a slice of the lanes, a view. A sequence is
// copied into a lane once, when it joins a batched decode (as mlx-lm copies a prompt's cache
// into its batch cache), and keeps its lane while it decodes in every step; a step without it
// (it finished, or ran a prefill chunk, single decode or draft verification instead) frees the
// lane, and a lane is reused only after a check that its content is the sequence's KV.
//
// Sliding-window layers get a ring instead of a whole lane: `window` positions per lane, position
// p at p % window. The ring holds exactly the positions a decode row sees (its window), in
// rotated order; attention is a sum over keys with their own values, so the order does not
// matter (keys are stored already rotated by RoPE), and the read masks only the ring slots a
// short sequence has not written yet.
//
// Quantized KV types (q8_0 / q4_0): the lanes hold the dequantized rows in the compute dtype,
// beside the block store of codes. Why not the codes: attention would then dequantize every
// lane's whole KV each step (what the gather path does after its copy), while a float lane
// dequantizes each position once, when it is written or filled; a lane row is bit for bit the
// row the gather path dequantizes, so both paths attend over the same numbers. The price is
// memory: a float lane costs 2-4x the codes it mirrors, which the KV budget counts.
//
// The cost is memory: lanes hold a second copy of the decoding sequences' KV, freed when no
// batched decode runs. It counts in the KV budget (KvPool::claim_extra): growing the lanes
// evicts idle cached blocks as a new block would, and where the blocks in use leave no room the
// lanes are refused for the step, which then gathers (`lanes_refused` in attention_paths); a
// block wanted while the lanes hold the room drops them (KvPool::set_extra_release).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "../core/kv_cache.h"
#include "attention_path_counts.h"

namespace llmd {

namespace mx = mlx::core;

class DecodeLanes {
 public:
  // Lanes for every layer of `shape` that stores KV (rings for sliding-window layers), in
  // dtype `dt`.
  DecodeLanes(const KvShape& shape, mx::Dtype dt);

  // One batched decode group's reads and writes, shared by every layer of the step.
  struct Group {
    mx::array lane{0};  // [b] int32: the lane of each row
    mx::array pos{0};   // [b] int32: the position each row writes
    int n_lanes = 0;    // lanes attended, 0 .. n_lanes - 1 (a lane not in the group is masked)
    int length = 0;     // positions attended (the longest lane's, this step's row included)
    // Queries of each lane (lane -> row, a free lane any row) and outputs of each row
    // (row -> lane), when the lanes are not rows 0 .. b-1 in order.
    std::optional<mx::array> row_of_lane;
    std::optional<mx::array> lane_of_row;
    // Bool [n_lanes, 1, 1, 1, length], broadcast over the scores [lanes, kv_heads, group,
    // queries, keys]: when lengths differ or lanes are free.
    std::optional<mx::array> mask;
    // Positions copied from the block store into the lanes of sequences that joined this step:
    // lane, position and store slot of each ([n] int32 each).
    std::optional<mx::array> fill_lane, fill_pos, fill_slots;
    // The same for sliding-window layers' rings: the ring slot each row writes, the slots
    // attended (the longest window's) and the mask; the joiners' window positions to copy, by
    // ring slot and window-store row.
    mx::array ring_pos{0};
    int ring_length = 0;
    std::optional<mx::array> ring_mask;
    std::optional<mx::array> ring_fill_lane, ring_fill_pos, ring_fill_slots;
  };

  // A run of single-token decode segments read together; slot_of(kv, pos) is the block-store
  // row of a position, window_slot_of(kv, pos) its row in the sliding-window layers' store.
  using Run = std::vector<const SequenceKv*>;
  using SlotOf = std::function<int(const SequenceKv&, int)>;
  // Rows [n, width] of a layer's block store (keys or values) in the lanes' dtype, picked by
  // store rows `slots` (a quantized store dequantizes them).
  using StoreRows = std::function<mx::array(bool of_keys, const mx::array& slots)>;
  // Host bookkeeping of one step: `starts[i][r]` is the position run i's row r writes. Frees
  // the lanes of sequences not in `runs`, keeps the lanes whose content still is their
  // sequence's KV, gives the others a free lane (filled from the store), grows the arrays
  // within `pool`'s budget. Empty when `runs` is, or when the budget has no room for the lanes
  // (every lane is then dropped: the step gathers).
  std::vector<Group> plan(KvPool& pool, const std::vector<Run>& runs, const std::vector<std::vector<int>>& starts,
                          const SlotOf& slot_of, const SlotOf& window_slot_of, AttentionPathCounts* counts);

  // One layer: copies the joiners' rows from the block store, writes the group's new rows k, v
  // ([b, width], in the lanes' dtype) at their positions, and returns the keys and values
  // attention reads, [n_lanes, kv_heads, length, head_dim] views of the lanes (ring_length
  // for a sliding-window layer).
  std::pair<mx::array, mx::array> write_and_read(int layer, const Group& g, const mx::array& k, const mx::array& v,
                                                 const StoreRows& store_rows);
  // The same views without writing (a layer reading an earlier layer's KV: KV sharing).
  std::pair<mx::array, mx::array> read(int layer, const Group& g) const;
  // The mask a layer's read needs (the ring's for a sliding-window layer).
  const std::optional<mx::array>& mask(int layer, const Group& g) const;

  bool empty() const { return used_ == 0; }
  // Bytes the lane arrays hold now (free lanes and spare positions included).
  size_t bytes() const { return bytes_; }

 private:
  struct Lane {
    const SequenceKv* kv = nullptr;  // null: free
    int length = 0;                  // positions written
    std::vector<int> blocks;         // the sequence's blocks holding them, when written
  };
  // Grows the arrays to hold `lanes` x `length`; false (nothing changed) if the budget refuses.
  bool ensure(int lanes, int length);
  void drop_arrays();
  // Positions layer `layer`'s lane array holds when lanes hold `capacity` positions.
  int positions_of(int layer, int capacity) const;

  KvShape shape_;
  mx::Dtype dt_;
  KvPool* pool_ = nullptr;  // the pool the lanes' bytes are claimed from
  std::vector<Lane> lanes_;
  int used_ = 0;      // lanes holding a sequence
  int capacity_ = 0;     // positions each lane array holds
  int array_lanes_ = 0;  // lanes each array holds (free ones included)
  size_t bytes_ = 0;
  std::vector<mx::array> keys_;  // per layer [lanes, kv_heads, capacity, head_dim], or empty
  std::vector<mx::array> values_;
};

}  // namespace llmd
