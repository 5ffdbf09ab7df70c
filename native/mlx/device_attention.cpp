#include "device_attention.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "../core/hadamard.h"
#include "compiled_ops.h"
#include "decoder.h"
#include "device_weight.h"

namespace llmd {

namespace {

constexpr int BT = KvPool::kBlockTokens;

// Row of position `pos` in a layer's store: by block id, or by window slot for the
// sliding-window layers of a pool that keeps windows apart.
int store_row(const SequenceKv& kv, int pos, const KvPool* windows) {
  const int block = kv.blocks()[pos / BT];
  return (windows ? windows->window_slot(block) : block) * BT + pos % BT;
}

mx::array int_array(const std::vector<int32_t>& v, mx::Shape shape) {
  return mx::array(v.begin(), std::move(shape), mx::int32);
}

// Attention of q [B, H, Lq, hd] over k, v [B, KVH, L, hd]. MLX's fused kernel serves one
// unmasked query row per sequence (its vector kernel); causal prefill chunks and decode batches
// of unequal lengths run as explicit ops. Why: MLX's other fused path is cuDNN's, which crashes
// when first used from a thread other than the process's main one (MLX 0.32.4 with cuDNN 9 on
// an H100; reproduced with a plain Python thread), and the engine steps on its own thread.
mx::array attend(const mx::array& q, const mx::array& k, const mx::array& v, float scale,
                 const std::optional<mx::array>& mask, bool causal) {
  const int b = q.shape(0), h = q.shape(1), lq = q.shape(2), hd = q.shape(3);
  const int kvh = k.shape(1), len = k.shape(2), rep = h / kvh;
  if (lq == 1 && !mask && !causal && (hd == 64 || hd == 96 || hd == 128)) {
    return mx::fast::scaled_dot_product_attention(q, k, v, scale);
  }
  mx::array s = mx::matmul(mx::reshape(q, {b, kvh, rep * lq, hd}), mx::swapaxes(k, -1, -2));
  s = mx::reshape(mx::multiply(mx::astype(s, mx::float32), mx::array(scale)), {b, kvh, rep, lq, len});
  const mx::array neg_inf(-std::numeric_limits<float>::infinity());
  if (causal) {  // row i sees positions <= (len - lq) + i
    mx::array rows = mx::add(mx::expand_dims(mx::arange(lq), 1), mx::array(len - lq));
    s = mx::where(mx::greater_equal(rows, mx::expand_dims(mx::arange(len), 0)), s, neg_inf);
  }
  if (mask) s = mx::where(*mask, s, neg_inf);
  mx::array p = mx::astype(mx::softmax(s, -1, /*precise=*/true), v.dtype());
  mx::array o = mx::matmul(mx::reshape(p, {b, kvh, rep * lq, len}), v);
  return mx::reshape(o, {b, h, lq, hd});
}

// Rows x [rows, width] with each run of n numbers rotated by the Hadamard matrix h [n, n], in
// float32 (quantized KV: keys and values before they are stored, queries before they meet the
// rotated keys, outputs back from the rotated values). h is symmetric, so x h is h x per run.
mx::array hadamard_rows(const mx::array& x, const mx::array& h) {
  const int rows = x.shape(0), width = x.shape(1), n = h.shape(0);
  const mx::array runs = mx::reshape(mx::astype(x, mx::float32), {rows, width / n, n});
  return mx::reshape(mx::matmul(runs, h), {rows, width});
}

// Width in elements of a layer's code array for `type` (two 4-bit codes a byte).
int code_width(KvType type, int width) { return type == KvType::Q4_0 ? width / 2 : width; }

}  // namespace

void DeviceKvStore::copy_block(const KvPool& pool, int src, int dst) {
  ensure(pool);
  std::vector<mx::array> all;
  for (int l = 0; l < shape_.n_layers; ++l) {
    const int width = shape_.kv_heads_of(l) * shape_.head_dim_of(l);
    if (width == 0) continue;
    const bool windowed = shape_.is_windowed(l);
    const int from = windowed ? pool.window_slot(src) : src;
    const int to = windowed ? pool.window_slot(dst) : dst;
    std::vector<mx::array*> arrays{&keys_[l], &values_[l]};
    if (kv_type_quantized(shape_.type)) arrays.insert(arrays.end(), {&key_scales_[l], &value_scales_[l]});
    for (mx::array* a : arrays) {
      const int w = a->shape(1);
      mx::array block = mx::slice(*a, mx::Shape{from * BT, 0}, mx::Shape{(from + 1) * BT, w});
      *a = mx::slice_update(*a, block, mx::Shape{to * BT, 0}, mx::Shape{(to + 1) * BT, w});
      all.push_back(*a);
    }
  }
  mx::eval(all);
}

std::vector<mx::array*> DeviceKvStore::part_arrays(bool windowed) {
  std::vector<mx::array*> arrays;
  for (int l = 0; l < shape_.n_layers; ++l) {
    if (shape_.is_windowed(l) != windowed || shape_.kv_heads_of(l) * shape_.head_dim_of(l) == 0) continue;
    arrays.insert(arrays.end(), {&keys_[l], &values_[l]});
    if (kv_type_quantized(shape_.type)) arrays.insert(arrays.end(), {&key_scales_[l], &value_scales_[l]});
  }
  return arrays;
}

mx::array DeviceKvStore::part_rows(const KvPool& pool, const std::vector<int>& blocks, bool windowed) const {
  std::vector<int32_t> rows;
  rows.reserve(blocks.size() * BT);
  for (int b : blocks) {
    const int at = windowed ? pool.window_slot(b) : b;
    if (at < 0) throw std::logic_error("KV disk tier: a block without the part asked for");
    for (int i = 0; i < BT; ++i) rows.push_back(at * BT + i);
  }
  return int_array(rows, {static_cast<int>(rows.size())});
}

void DeviceKvStore::check_part_bytes(const KvPool& pool, bool windowed) {
  size_t bytes = 0;
  for (mx::array* a : part_arrays(windowed)) bytes += static_cast<size_t>(BT) * a->shape(1) * a->itemsize();
  if (bytes != (windowed ? pool.window_part_bytes() : pool.block_bytes())) {
    throw std::logic_error("KV disk tier: the device store's rows (" + std::to_string(bytes) +
                           " bytes a block) are not the bytes the pool counts");
  }
}

void DeviceKvStore::read_blocks(const KvPool& pool, const std::vector<int>& blocks, bool windowed,
                                const std::vector<std::byte*>& out) {
  ensure(pool);
  if (blocks.empty()) return;
  check_part_bytes(pool, windowed);
  const mx::array rows = part_rows(pool, blocks, windowed);
  std::vector<mx::array> got;
  for (mx::array* a : part_arrays(windowed)) got.push_back(mx::contiguous(mx::take(*a, rows, 0)));
  mx::eval(got);
  size_t offset = 0;  // of each array's rows inside a block
  for (const mx::array& g : got) {
    const size_t bytes = static_cast<size_t>(BT) * g.shape(1) * g.itemsize();
    const auto* from = g.data<std::byte>();
    for (size_t j = 0; j < blocks.size(); ++j) std::memcpy(out[j] + offset, from + j * bytes, bytes);
    offset += bytes;
  }
}

void DeviceKvStore::write_blocks(const KvPool& pool, const std::vector<int>& blocks, bool windowed,
                                 const std::vector<const std::byte*>& in) {
  ensure(pool);
  if (blocks.empty()) return;
  check_part_bytes(pool, windowed);
  const mx::array rows = part_rows(pool, blocks, windowed);
  const int n = static_cast<int>(blocks.size()) * BT;
  std::vector<mx::array> all;
  size_t offset = 0;
  for (mx::array* a : part_arrays(windowed)) {
    const int width = a->shape(1);
    const size_t bytes = static_cast<size_t>(BT) * width * a->itemsize();
    // Each array's rows of every block gathered into one buffer MLX takes over (no copy on a
    // CPU device), then scattered into the store as a step's writes are.
    auto* buf = static_cast<std::byte*>(std::malloc(bytes * blocks.size()));
    if (!buf) throw std::bad_alloc();
    for (size_t j = 0; j < blocks.size(); ++j) std::memcpy(buf + j * bytes, in[j] + offset, bytes);
    mx::array update(buf, {n, width}, a->dtype(), [](void* p) { std::free(p); });
    *a = mx::scatter(*a, {rows}, mx::expand_dims(update, 1), {0});
    all.push_back(*a);
    offset += bytes;
  }
  mx::eval(all);
}

DecodeLanes* DeviceKvStore::lanes() {
  if (keys_.empty()) return nullptr;
  if (!lanes_) lanes_ = std::make_unique<DecodeLanes>(shape_, device_compute_dtype());
  return lanes_.get();
}

const mx::array& DeviceKvStore::hadamard(int n) {
  auto it = hadamard_.find(n);
  if (it == hadamard_.end()) {
    std::vector<float> m(static_cast<size_t>(n) * n, 0.f);
    for (int i = 0; i < n; ++i) {  // row i: H e_i (H is symmetric)
      m[static_cast<size_t>(i) * n + i] = 1.f;
      hadamard::transform(m.data() + static_cast<size_t>(i) * n, n);
    }
    it = hadamard_.emplace(n, mx::array(m.begin(), {n, n}, mx::float32)).first;
  }
  return it->second;
}

void DeviceKvStore::ensure(const KvPool& pool) {
  if (keys_.empty()) {
    // The pool's type is the engine's --kv-type (the model's own shape only names its float
    // dtype).
    shape_.type = pool.shape().type;
    keys_.assign(shape_.n_layers, mx::array(0.f));
    values_.assign(shape_.n_layers, mx::array(0.f));
    key_scales_.assign(shape_.n_layers, mx::array(0.f));
    value_scales_.assign(shape_.n_layers, mx::array(0.f));
  }
  grow(false, blocks_, pool.created_blocks(), pool.capacity_blocks());
  if (shape_.windowed_layers() > 0) {
    grow(true, window_slots_, pool.created_window_slots(), pool.capacity_window_slots());
  }
}

void DeviceKvStore::grow(bool windowed, size_t& have, size_t need, size_t max) {
  if (need <= have) return;
  const size_t grown = std::min(std::max(need, have * 2), std::max(max, need));
  const int extra = static_cast<int>((grown - have) * BT);
  std::vector<mx::array> all;
  for (int l = 0; l < shape_.n_layers; ++l) {
    if (shape_.is_windowed(l) != windowed) continue;
    const int width = shape_.kv_heads_of(l) * shape_.head_dim_of(l);
    if (width == 0) continue;
    const KvType t = shape_.type;
    std::vector<std::pair<mx::array*, mx::array>> arrays;
    if (kv_type_quantized(t)) {
      const mx::Dtype codes = t == KvType::Q8_0 ? mx::int8 : mx::uint8;
      for (mx::array* a : {&keys_[l], &values_[l]}) arrays.emplace_back(a, mx::zeros({extra, code_width(t, width)}, codes));
      for (mx::array* a : {&key_scales_[l], &value_scales_[l]}) {
        arrays.emplace_back(a, mx::zeros({extra, width / 32}, mx::float16));
      }
    } else {
      for (mx::array* a : {&keys_[l], &values_[l]}) arrays.emplace_back(a, mx::zeros({extra, width}, device_compute_dtype()));
    }
    for (auto& [a, more] : arrays) {
      *a = have == 0 ? more : mx::concatenate({*a, more}, 0);
      all.push_back(*a);
    }
  }
  mx::eval(all);
  have = grown;
}

DeviceAttentionPlan DeviceAttentionPlan::build(const AttentionBatch& batch, const Rope& rope, DeviceKvStore* kv,
                                               const DeviceAttentionPlan* lanes_of) {
  DeviceAttentionPlan plan;
  int rows = 0;
  for (const auto& seg : batch.segments) rows += seg.n_rows;
  // A windowed batch's layers keep their KV by window slot when the pool keeps windows apart.
  const KvPool* windows = batch.window > 0 && batch.pool->shape().window > 0 ? batch.pool : nullptr;
  auto slot_of = [windows](const SequenceKv& kv, int pos) { return store_row(kv, pos, windows); };
  std::vector<int32_t> slots;
  slots.reserve(rows);
  for (const auto& seg : batch.segments) {
    for (int i = 0; i < seg.n_rows; ++i) slots.push_back(slot_of(*seg.kv, seg.start_pos + i));
  }
  plan.write_slots = int_array(slots, {rows});
  std::vector<int32_t> positions;
  positions.reserve(rows);
  for (const auto& seg : batch.segments) {
    for (int i = 0; i < seg.n_rows; ++i) positions.push_back(seg.start_pos + i);
  }
  plan.positions = int_array(positions, {rows});
  std::vector<float> periods(rope.inv_freq.size());
  for (size_t i = 0; i < periods.size(); ++i) periods[i] = 1.f / rope.inv_freq[i];
  plan.rope_freqs = mx::array(periods.begin(), {static_cast<int>(periods.size())}, mx::float32);
  // First position a query at `pos` sees: 0, or the start of its sliding window.
  auto first_seen = [w = batch.window](int pos) { return w > 0 ? std::max(0, pos - w + 1) : 0; };

  const auto& segs = batch.segments;
  // Runs of single-token segments in consecutive rows, [first, end): one batched decode call
  // each.
  std::vector<std::pair<size_t, size_t>> runs;
  for (size_t i = 0; i < segs.size();) {
    size_t j = i;
    while (j < segs.size() && segs[j].n_rows == 1 && (j == i || segs[j].row0 == segs[j - 1].row0 + 1)) ++j;
    if (j - i >= 2) runs.emplace_back(i, j);
    i = std::max(j, i + 1);
  }
  // The step's lanes are planned once, by the full-attention layers' plan; a sliding-window
  // plan reads the rings of the same lanes (`lanes_of`), or gathers without one.
  DecodeLanes* lanes = kv && (batch.window == 0 || lanes_of) ? kv->lanes() : nullptr;
  AttentionPathCounts* counts = kv ? kv->counts() : nullptr;
  if (lanes && lanes_of) {
    plan.lane_groups = lanes_of->lane_groups;
    if (plan.lane_groups.size() != runs.size()) lanes = nullptr;  // not the same rows: gather
  } else if (lanes) {
    // Rows of the windowed layers' store, for the rings (the pool's window parts when it keeps
    // them apart, else the blocks' own rows).
    const KvPool* window_pool = batch.pool->shape().window > 0 ? batch.pool : nullptr;
    auto window_slot_of = [window_pool](const SequenceKv& kv, int pos) { return store_row(kv, pos, window_pool); };
    std::vector<DecodeLanes::Run> seqs(runs.size());
    std::vector<std::vector<int>> starts(runs.size());
    for (size_t r = 0; r < runs.size(); ++r) {
      for (size_t s = runs[r].first; s < runs[r].second; ++s) {
        seqs[r].push_back(segs[s].kv);
        starts[r].push_back(segs[s].start_pos);
      }
    }
    plan.lane_groups = lanes->plan(*batch.pool, seqs, starts, slot_of, window_slot_of, counts);
    if (plan.lane_groups.empty()) lanes = nullptr;  // refused by the KV budget: gather
  }
  size_t i = 0;
  size_t next_run = 0;
  while (i < segs.size()) {
    if (next_run < runs.size() && runs[next_run].first == i) {
      const size_t j = runs[next_run].second;
      const int b = static_cast<int>(j - i);
      if (lanes) {
        Group g;
        g.row0 = segs[i].row0;
        g.n_rows = b;
        g.batched_decode = true;
        g.lanes = static_cast<int>(next_run);
        plan.groups.push_back(std::move(g));
        i = j;
        ++next_run;
        continue;
      }
      if (counts) ++counts->decode_gather;
      int lmax = 0, lmin = 1 << 30;
      for (size_t s = i; s < j; ++s) {
        const int n = segs[s].start_pos + 1 - first_seen(segs[s].start_pos);
        lmax = std::max(lmax, n);
        lmin = std::min(lmin, n);
      }
      std::vector<int32_t> gather(static_cast<size_t>(b) * lmax, 0);
      std::vector<uint8_t> mask(static_cast<size_t>(b) * lmax, 0);
      for (int r = 0; r < b; ++r) {
        const auto& seg = segs[i + r];
        const int lo = first_seen(seg.start_pos);
        for (int p = lo; p <= seg.start_pos; ++p) {
          gather[static_cast<size_t>(r) * lmax + (p - lo)] = slot_of(*seg.kv, p);
          mask[static_cast<size_t>(r) * lmax + (p - lo)] = 1;
        }
      }
      Group g;
      g.row0 = segs[i].row0;
      g.n_rows = b;
      g.batched_decode = true;
      g.gather = int_array(gather, {b, lmax});
      if (lmin != lmax) {
        g.mask = mx::astype(mx::array(mask.begin(), {b, 1, 1, 1, lmax}, mx::uint8), mx::bool_);
      }
      plan.groups.push_back(std::move(g));
      i = j;
      ++next_run;
      continue;
    }
    const auto& seg = segs[i];
    const int lo = first_seen(seg.start_pos);
    const int len = seg.start_pos + seg.n_rows - lo;
    std::vector<int32_t> gather(len);
    for (int p = 0; p < len; ++p) gather[p] = slot_of(*seg.kv, lo + p);
    Group g;
    bool consecutive = true;
    for (int p = 1; p < len && consecutive; ++p) consecutive = gather[p] == gather[0] + p;
    if (consecutive) g.first_slot = gather[0];
    if (counts) ++(consecutive ? counts->sequence_in_place : counts->sequence_gather);
    g.row0 = seg.row0;
    g.n_rows = seg.n_rows;
    g.gather = int_array(gather, {len});
    const bool sees_ahead = !seg.attend_to.empty();  // an image's rows see the whole image
    if ((batch.window > 0 || sees_ahead) && seg.n_rows > 1) {
      // Causal and windowed: row r (position start + r) sees first_seen(start + r) .. start + r,
      // or on to attend_to[r] - 1 (within this chunk) when that lies further.
      std::vector<uint8_t> mask(static_cast<size_t>(seg.n_rows) * len, 0);
      for (int r = 0; r < seg.n_rows; ++r) {
        const int pos = seg.start_pos + r;
        const int last = sees_ahead ? std::min(std::max(pos, seg.attend_to[r] - 1), seg.start_pos + seg.n_rows - 1)
                                    : pos;
        for (int p = first_seen(pos); p <= last; ++p) mask[static_cast<size_t>(r) * len + (p - lo)] = 1;
      }
      g.mask = mx::astype(mx::array(mask.begin(), {1, 1, 1, seg.n_rows, len}, mx::uint8), mx::bool_);
    }
    plan.groups.push_back(std::move(g));
    ++i;
  }
  return plan;
}

mx::array device_attention(const mx::array& qkv, const DeviceAttentionPlan& plan, int layer,
                           const AttentionShape& shape, const Rope& rope, DeviceKvStore& kv,
                           bool write_kv) {
  const int rows = qkv.shape(0);
  const int H = shape.n_heads, KVH = shape.n_kv_heads, hd = shape.head_dim;
  const int qw = H * hd, kw = KVH * hd;
  const mx::Dtype dt = device_compute_dtype();
  // Cast (none when the caller's stream is already in the compute dtype): a float32 qkv from
  // a caller that keeps float32 activations; KV is stored in the compute dtype.
  const mx::array x = mx::astype(qkv, dt);
  // Queries and keys rotated together, each row at its own position (q [rows, heads, 1, hd]),
  // and the step's keys and values split off, as one compiled function (compiled_ops.h).
  RopedRows roped = rope_rows(x, plan.positions, plan.rope_freqs, rope, H, KVH, hd, write_kv);
  mx::array q = roped.q;
  const bool quantized = kv_type_quantized(kv.type());
  // Quantized KV holds rotated keys and values (core/hadamard.h): queries turn as keys do.
  const int k_rot = hadamard::key_block(hd), v_rot = hadamard::value_block(hd);
  if (quantized) {
    q = mx::reshape(mx::astype(hadamard_rows(mx::reshape(q, {rows, qw}), kv.hadamard(k_rot)), dt), {rows, H, 1, hd});
  }
  // The store's arrays are replaced by the scattered ones, so MLX updates them in place.
  mx::array& keys = kv.keys(layer);
  mx::array& values = kv.values(layer);
  const KvType type = kv.type();
  // This step's keys and values, [rows, kw] (written to the store, and to lanes: with a
  // quantized store, the rows its codes dequantize to (in the rotated basis, as queries are),
  // which is what every later read sees).
  mx::array new_k(0.f), new_v(0.f);
  if (write_kv) {
    new_k = roped.k;
    new_v = roped.v;
    const mx::array& k = new_k;
    const mx::array& v = new_v;
    auto put = [&](mx::array& store, const mx::array& r) {
      store = mx::scatter(store, {plan.write_slots}, mx::expand_dims(r, 1), {0});
    };
    if (quantized) {
      auto [kq, ks] = quantize_kv_rows(hadamard_rows(k, kv.hadamard(k_rot)), type);
      auto [vq, vs] = quantize_kv_rows(hadamard_rows(v, kv.hadamard(v_rot)), type);
      put(keys, kq);
      put(values, vq);
      put(kv.key_scales(layer), ks);
      put(kv.value_scales(layer), vs);
      if (!plan.lane_groups.empty()) {
        new_k = dequantize_kv_rows(kq, ks, type, dt);
        new_v = dequantize_kv_rows(vq, vs, type, dt);
      }
    } else {
      put(keys, k);
      put(values, v);
    }
  }
  // Rows of a layer's keys or values picked by `pick` (a slice or a gather of the store),
  // [n, kw] in the compute dtype: quantized rows are dequantized here, only those read.
  auto kv_rows = [&](bool of_keys, const auto& pick) {
    mx::array& store = of_keys ? keys : values;
    if (!quantized) return pick(store);
    return dequantize_kv_rows(pick(store), pick(of_keys ? kv.key_scales(layer) : kv.value_scales(layer)), type, dt);
  };

  std::vector<mx::array> outs;
  outs.reserve(plan.groups.size());
  for (const auto& g : plan.groups) {
    mx::array qg = plan.groups.size() == 1 ? q : mx::slice(q, {g.row0, 0, 0, 0}, {g.row0 + g.n_rows, H, 1, hd});
    if (g.lanes >= 0) {
      // Every sequence's KV read in place from its lane: [lanes, KVH, length, hd] views.
      const DecodeLanes::Group& lg = plan.lane_groups[g.lanes];
      DecodeLanes& lanes = *kv.lanes();
      auto group_rows = [&](const mx::array& a) { return mx::slice(a, {g.row0, 0}, {g.row0 + g.n_rows, kw}); };
      auto store_rows = [&](bool of_keys, const mx::array& slots) {
        return kv_rows(of_keys, [&](const mx::array& a) { return mx::take(a, slots, 0); });
      };
      auto [k, v] = write_kv ? lanes.write_and_read(layer, lg, group_rows(new_k), group_rows(new_v), store_rows)
                             : lanes.read(layer, lg);
      // Queries by lane and outputs back by row (small takes of the rows, not of KV), when
      // the lanes are not the rows in order.
      mx::array ql = lg.row_of_lane ? mx::take(qg, *lg.row_of_lane, 0) : qg;
      mx::array o = attend(ql, k, v, shape.scale, lanes.mask(layer, lg), false);
      if (lg.lane_of_row) o = mx::take(o, *lg.lane_of_row, 0);
      outs.push_back(mx::reshape(o, {g.n_rows, qw}));
    } else if (g.batched_decode) {
      const int b = g.n_rows, lmax = g.gather.shape(1);
      auto gathered = [&](bool of_keys) {
        const mx::array flat = mx::reshape(g.gather, {b * lmax});
        mx::array r = kv_rows(of_keys, [&](const mx::array& a) { return mx::take(a, flat, 0); });
        return mx::transpose(mx::reshape(r, {b, lmax, KVH, hd}), {0, 2, 1, 3});
      };
      mx::array o = attend(qg, gathered(true), gathered(false), shape.scale, g.mask, false);
      outs.push_back(mx::reshape(o, {b, qw}));
    } else {
      const int len = g.gather.shape(0);
      // [1, KVH, len, hd]: a view of the store when the slots are consecutive, else a gather.
      auto read = [&](bool of_keys) {
        mx::array r = kv_rows(of_keys, [&](const mx::array& a) {
          return g.first_slot >= 0 ? mx::slice(a, {g.first_slot, 0}, {g.first_slot + len, a.shape(1)})
                                   : mx::take(a, g.gather, 0);
        });
        return mx::expand_dims(mx::transpose(mx::reshape(r, {len, KVH, hd}), {1, 0, 2}), 0);
      };
      // [n_rows, H, 1, hd] -> [1, H, n_rows, hd]
      mx::array qt = mx::transpose(qg, {2, 1, 0, 3});
      mx::array o = attend(qt, read(true), read(false), shape.scale, g.mask, g.n_rows > 1 && !g.mask);
      outs.push_back(mx::reshape(mx::transpose(o, {2, 1, 0, 3}), {g.n_rows, qw}));
    }
  }
  // The block store's copy of this step's keys and values: read by no group when every one
  // read lanes, yet what the prefix cache, sessions and later prefills read.
  if (write_kv && !plan.lane_groups.empty()) {
    std::vector<mx::array> writes{keys, values};
    if (quantized) writes.insert(writes.end(), {kv.key_scales(layer), kv.value_scales(layer)});
    start_writes(writes);
  }
  mx::array out = outs.size() == 1 ? outs[0] : mx::concatenate(outs, 0);
  if (quantized) out = mx::astype(hadamard_rows(out, kv.hadamard(v_rot)), dt);  // back from rotated values
  return qkv.dtype() == dt ? out : mx::astype(out, qkv.dtype());  // back to the caller's stream dtype
}

}  // namespace llmd
