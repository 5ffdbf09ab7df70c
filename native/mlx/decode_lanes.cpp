#include "decode_lanes.h"

#include <algorithm>
#include <unordered_map>

namespace llmd {

namespace {

constexpr int BT = KvPool::kBlockTokens;

mx::array int_array(const std::vector<int32_t>& v) {
  return mx::array(v.begin(), {static_cast<int>(v.size())}, mx::int32);
}

// Blocks that hold positions [0, length).
int blocks_for(int length) { return (length + BT - 1) / BT; }

// Layers with lanes: those that store KV (a ring for a sliding-window layer).
bool has_lane(const KvShape& shape, int layer) { return shape.kv_heads_of(layer) * shape.head_dim_of(layer) > 0; }

// A bool mask [lanes, 1, 1, 1, length] with the first seen[l] positions of lane l set, or none
// when every lane sees all `length`.
std::optional<mx::array> prefix_mask(const std::vector<int>& seen, int length) {
  if (*std::min_element(seen.begin(), seen.end()) == length) return std::nullopt;
  const int lanes = static_cast<int>(seen.size());
  std::vector<uint8_t> mask(static_cast<size_t>(lanes) * length, 0);
  for (int l = 0; l < lanes; ++l) std::fill_n(mask.begin() + static_cast<size_t>(l) * length, seen[l], 1);
  return mx::astype(mx::array(mask.begin(), {lanes, 1, 1, 1, length}, mx::uint8), mx::bool_);
}

}  // namespace

DecodeLanes::DecodeLanes(const KvShape& shape, mx::Dtype dt) : shape_(shape), dt_(dt) { drop_arrays(); }

void DecodeLanes::drop_arrays() {
  keys_.assign(shape_.n_layers, mx::array(0.f));
  values_.assign(shape_.n_layers, mx::array(0.f));
  capacity_ = 0;
  array_lanes_ = 0;
  bytes_ = 0;
  if (pool_) pool_->claim_extra(0);
}

int DecodeLanes::positions_of(int layer, int capacity) const {
  return shape_.is_windowed(layer) ? std::min(capacity, shape_.window) : capacity;
}

bool DecodeLanes::ensure(int lanes, int length) {
  if (lanes <= array_lanes_ && length <= capacity_) return true;
  // Room for more lanes in powers of two and 1.5x the positions (multiples of a block), so a
  // batch that grows by one sequence or one block at a time copies the lanes rarely.
  int new_lanes = std::max(array_lanes_, 1);
  while (new_lanes < lanes) new_lanes *= 2;
  int new_capacity = capacity_;
  if (length > capacity_) new_capacity = blocks_for(std::max({length, capacity_ * 3 / 2, 2 * BT})) * BT;
  size_t bytes = 0;
  for (int l = 0; l < shape_.n_layers; ++l) {
    if (!has_lane(shape_, l)) continue;
    bytes += 2 * static_cast<size_t>(new_lanes) * shape_.kv_heads_of(l) * positions_of(l, new_capacity) *
             shape_.head_dim_of(l) * mx::size_of(dt_);
  }
  // The grown arrays are in the budget; so, while they are built, are the old ones they copy
  // (released just after).
  if (!pool_->claim_extra(bytes_ + bytes)) return false;
  std::vector<mx::array> all;
  for (int l = 0; l < shape_.n_layers; ++l) {
    if (!has_lane(shape_, l)) continue;
    const int kvh = shape_.kv_heads_of(l), hd = shape_.head_dim_of(l);
    // A ring that grows keeps its slots: it was not full (positions < its size sit at p).
    const int positions = positions_of(l, new_capacity);
    for (mx::array* a : {&keys_[l], &values_[l]}) {
      mx::array grown = mx::zeros({new_lanes, kvh, positions, hd}, dt_);
      if (capacity_ > 0) grown = mx::slice_update(grown, *a, {0, 0, 0, 0}, a->shape());
      *a = grown;
      all.push_back(*a);
    }
  }
  mx::eval(all);
  bytes_ = bytes;
  pool_->claim_extra(bytes_);
  capacity_ = new_capacity;
  array_lanes_ = new_lanes;
  return true;
}

std::vector<DecodeLanes::Group> DecodeLanes::plan(KvPool& pool, const std::vector<Run>& runs,
                                                  const std::vector<std::vector<int>>& starts,
                                                  const SlotOf& slot_of, const SlotOf& window_slot_of,
                                                  AttentionPathCounts* counts) {
  const int W = shape_.windowed_layers() > 0 ? shape_.window : 0;
  if (pool_ != &pool) {
    pool_ = &pool;
    // Blocks come first: a sequence that needs a block the lanes hold gets it, and the lanes
    // are refilled from the blocks at the next batched decode.
    pool.set_extra_release([this] {
      lanes_.clear();
      used_ = 0;
      drop_arrays();
    });
  }
  std::unordered_map<const SequenceKv*, int> start_of;
  for (size_t i = 0; i < runs.size(); ++i) {
    for (size_t r = 0; r < runs[i].size(); ++r) start_of[runs[i][r]] = starts[i][r];
  }
  // A lane keeps its sequence only if the sequence writes right after the lane's last position
  // on the blocks the lane was filled from: a sequence rolled back, rewritten (a draft
  // verified, a copied block) or a new sequence at a freed one's address refills instead.
  std::unordered_map<const SequenceKv*, int> lane_of;
  for (size_t i = 0; i < lanes_.size(); ++i) {
    Lane& lane = lanes_[i];
    if (!lane.kv) continue;
    const auto it = start_of.find(lane.kv);
    const auto& blocks = lane.kv->blocks();
    const bool same = it != start_of.end() && it->second == lane.length &&
                      blocks.size() >= lane.blocks.size() &&
                      std::equal(lane.blocks.begin(), lane.blocks.end(), blocks.begin());
    if (same) {
      lane_of[lane.kv] = static_cast<int>(i);
    } else {
      lane = Lane{};
      --used_;
    }
  }
  if (runs.empty()) {
    if (used_ == 0 && capacity_ > 0) drop_arrays();  // no batched decode now: give the memory back
    return {};
  }

  struct Fill {
    std::vector<int32_t> lane, pos, slots;
  };
  std::vector<std::vector<int32_t>> run_lanes(runs.size());
  std::vector<Fill> fills(runs.size()), ring_fills(runs.size());
  int max_lanes = 0, max_length = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    for (size_t r = 0; r < runs[i].size(); ++r) {
      const SequenceKv* kv = runs[i][r];
      const int start = starts[i][r];
      int lane;
      if (const auto it = lane_of.find(kv); it != lane_of.end()) {
        lane = it->second;
      } else {
        // The lowest free lane, so the lanes attended stay few.
        lane = 0;
        while (lane < static_cast<int>(lanes_.size()) && lanes_[lane].kv) ++lane;
        if (lane == static_cast<int>(lanes_.size())) lanes_.emplace_back();
        lanes_[lane].kv = kv;
        lane_of[kv] = lane;
        ++used_;
        for (int p = 0; p < start; ++p) {
          fills[i].lane.push_back(lane);
          fills[i].pos.push_back(p);
          fills[i].slots.push_back(slot_of(*kv, p));
        }
        // A ring gets the window the row's query sees besides itself (the store keeps those).
        for (int p = W > 0 ? std::max(0, start - W + 1) : start; p < start; ++p) {
          ring_fills[i].lane.push_back(lane);
          ring_fills[i].pos.push_back(p % W);
          ring_fills[i].slots.push_back(window_slot_of(*kv, p));
        }
        if (counts) ++counts->lane_fills;
      }
      Lane& l = lanes_[lane];
      l.length = start + 1;
      l.blocks.assign(kv->blocks().begin(), kv->blocks().begin() + blocks_for(l.length));
      run_lanes[i].push_back(lane);
      max_lanes = std::max(max_lanes, lane + 1);
      max_length = std::max(max_length, start + 1);
    }
  }
  if (!ensure(max_lanes, max_length)) {
    lanes_.clear();
    used_ = 0;
    drop_arrays();
    if (counts) ++counts->lanes_refused;
    return {};
  }

  std::vector<Group> groups;
  for (size_t i = 0; i < runs.size(); ++i) {
    const int b = static_cast<int>(runs[i].size());
    const std::vector<int32_t>& lanes = run_lanes[i];
    Group g;
    g.lane = int_array(lanes);
    g.pos = int_array(std::vector<int32_t>(starts[i].begin(), starts[i].end()));
    g.n_lanes = *std::max_element(lanes.begin(), lanes.end()) + 1;
    // Positions each attended lane reads: its row's, or 1 for a lane no row of this group
    // uses (its output is dropped; one unmasked position keeps its softmax finite).
    std::vector<int> seen(g.n_lanes, 1);
    std::vector<int32_t> row_of_lane(g.n_lanes, 0);
    bool in_order = g.n_lanes == b;
    for (int r = 0; r < b; ++r) {
      seen[lanes[r]] = starts[i][r] + 1;
      row_of_lane[lanes[r]] = r;
      in_order = in_order && lanes[r] == r;
    }
    g.length = *std::max_element(seen.begin(), seen.end());
    if (!in_order) {
      g.row_of_lane = int_array(row_of_lane);
      g.lane_of_row = g.lane;
    }
    g.mask = prefix_mask(seen, g.length);
    if (!fills[i].lane.empty()) {
      g.fill_lane = int_array(fills[i].lane);
      g.fill_pos = int_array(fills[i].pos);
      g.fill_slots = int_array(fills[i].slots);
    }
    if (W > 0) {
      // A ring slot holds one position of the window once written: a lane whose sequence is
      // shorter than the window sees its first positions' slots only.
      std::vector<int> ring_seen(seen.size());
      for (size_t l = 0; l < seen.size(); ++l) ring_seen[l] = std::min(seen[l], W);
      g.ring_length = *std::max_element(ring_seen.begin(), ring_seen.end());
      g.ring_mask = prefix_mask(ring_seen, g.ring_length);
      std::vector<int32_t> ring_pos(b);
      for (int r = 0; r < b; ++r) ring_pos[r] = starts[i][r] % W;
      g.ring_pos = int_array(ring_pos);
      if (!ring_fills[i].lane.empty()) {
        g.ring_fill_lane = int_array(ring_fills[i].lane);
        g.ring_fill_pos = int_array(ring_fills[i].pos);
        g.ring_fill_slots = int_array(ring_fills[i].slots);
      }
    }
    if (counts) ++counts->decode_lanes;
    groups.push_back(std::move(g));
  }
  return groups;
}

std::pair<mx::array, mx::array> DecodeLanes::write_and_read(int layer, const Group& g, const mx::array& k,
                                                            const mx::array& v, const StoreRows& store_rows) {
  const int kvh = shape_.kv_heads_of(layer), hd = shape_.head_dim_of(layer);
  // Rows [n, kv_heads * head_dim] to (lane, position) of the lanes [lanes, kv_heads, capacity,
  // head_dim]: MLX updates the lane array in place (this store holds its only reference).
  auto put = [&](mx::array& lanes, const mx::array& lane, const mx::array& pos, const mx::array& rows) {
    const int n = rows.shape(0);
    lanes = mx::scatter(lanes, {lane, pos}, mx::reshape(mx::astype(rows, dt_), {n, 1, kvh, 1, hd}), {0, 2});
  };
  const bool ring = shape_.is_windowed(layer);
  const auto& fill_lane = ring ? g.ring_fill_lane : g.fill_lane;
  if (fill_lane) {  // the one copy of a joining sequence's KV
    const mx::array& pos = ring ? *g.ring_fill_pos : *g.fill_pos;
    const mx::array& slots = ring ? *g.ring_fill_slots : *g.fill_slots;
    put(keys_[layer], *fill_lane, pos, store_rows(true, slots));
    put(values_[layer], *fill_lane, pos, store_rows(false, slots));
  }
  put(keys_[layer], g.lane, ring ? g.ring_pos : g.pos, k);
  put(values_[layer], g.lane, ring ? g.ring_pos : g.pos, v);
  return read(layer, g);
}

std::pair<mx::array, mx::array> DecodeLanes::read(int layer, const Group& g) const {
  const int kvh = shape_.kv_heads_of(layer), hd = shape_.head_dim_of(layer);
  const int length = shape_.is_windowed(layer) ? g.ring_length : g.length;
  // A slice: a view of the lanes, each lane's [length, head_dim] rows contiguous, which MLX's
  // matmul and SDPA read without a copy.
  auto view = [&](const mx::array& a) { return mx::slice(a, {0, 0, 0, 0}, {g.n_lanes, kvh, length, hd}); };
  return {view(keys_[layer]), view(values_[layer])};
}

const std::optional<mx::array>& DecodeLanes::mask(int layer, const Group& g) const {
  return shape_.is_windowed(layer) ? g.ring_mask : g.mask;
}

}  // namespace llmd
