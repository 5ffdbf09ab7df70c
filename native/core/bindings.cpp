// pybind11 module llmd._engine: the typed C++ API the worker host calls. No JSON crosses
// here; the GIL is released whenever the engine may block or compute.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <tuple>

#include "../mlx/attention_kernels.h"
#include "../mlx/device_sampler.h"
#include "../mlx/float_gemm_check.h"
#include "../mlx/kernels/pack8.h"
#include "../mlx/kernels/qgemm.h"
#include "../mlx/siglip.h"
#include "engine.h"
#include "hadamard.h"
#include "kv_disk.h"
#include "kv_quant.h"
#include "op_profile.h"
#include "thread_pool.h"
#ifdef LLMD_WITH_CUDA
#include "../cuda/cuda_model.h"
#endif

namespace py = pybind11;
using namespace llmd;

namespace {

Metadata metadata_from_dict(const py::dict& d) {
  Metadata m;
  for (auto item : d) {
    const std::string key = py::str(item.first);
    py::handle v = item.second;
    if (py::isinstance<py::bool_>(v)) {
      m.set(key, v.cast<bool>());
    } else if (py::isinstance<py::int_>(v)) {
      m.set(key, v.cast<int64_t>());
    } else if (py::isinstance<py::float_>(v)) {
      m.set(key, v.cast<double>());
    } else if (py::isinstance<py::str>(v)) {
      m.set(key, v.cast<std::string>());
    }
  }
  return m;
}

// Python objects released by the engine thread, which must not take the GIL to drop them
// (the main thread may hold it while it waits for the engine); poll() drops them.
std::mutex graveyard_mutex;
std::vector<PyObject*> graveyard;

void bury_dead_objects() {
  std::vector<PyObject*> dead;
  {
    std::lock_guard<std::mutex> lock(graveyard_mutex);
    dead.swap(graveyard);
  }
  for (PyObject* o : dead) Py_DECREF(o);
}

// A constraint implemented in Python (the worker host's llguidance matcher): an object with
// allowed_tokens() -> bytes | None (a little-endian uint32 bitmask) and accept(token).
class PyTokenConstraint final : public TokenConstraint {
 public:
  explicit PyTokenConstraint(py::object obj) : obj_(obj.release().ptr()) {}
  ~PyTokenConstraint() override {
    std::lock_guard<std::mutex> lock(graveyard_mutex);
    graveyard.push_back(obj_);
  }
  PyTokenConstraint(const PyTokenConstraint&) = delete;
  PyTokenConstraint& operator=(const PyTokenConstraint&) = delete;

  bool allowed_tokens(std::vector<uint32_t>& allowed) override {
    py::gil_scoped_acquire gil;
    py::object mask = py::reinterpret_borrow<py::object>(obj_).attr("allowed_tokens")();
    if (mask.is_none()) return false;
    const std::string bytes = mask.cast<py::bytes>();
    std::memcpy(allowed.data(), bytes.data(), std::min(bytes.size(), allowed.size() * sizeof(uint32_t)));
    return true;
  }
  void accept(int32_t token) override {
    py::gil_scoped_acquire gil;
    py::reinterpret_borrow<py::object>(obj_).attr("accept")(token);
  }

 private:
  PyObject* obj_;  // owned reference, handed to the graveyard on destruction
};

py::list logprobs_to_list(const std::vector<TokenLogprob>& lps) {
  py::list out;
  for (const auto& lp : lps) {
    py::list top;
    for (const auto& [t, l] : lp.top) top.append(py::make_tuple(t, l));
    out.append(py::dict(py::arg("logprob") = lp.logprob, py::arg("top") = top));
  }
  return out;
}

// A histogram of the engine's stats (rows per step -> steps) with string keys, as JSON has them.
py::dict histogram_dict(const std::map<int, uint64_t>& histogram) {
  py::dict out;
  for (const auto& [rows, steps] : histogram) out[py::str(std::to_string(rows))] = steps;
  return out;
}

py::dict event_to_dict(const EngineEvent& e) {
  py::dict d;
  d["id"] = e.id;
  switch (e.kind) {
    case EngineEvent::Kind::Started:
      d["type"] = "started";
      d["prompt_tokens"] = e.prompt_tokens;
      d["cached_tokens"] = e.cached_tokens;
      break;
    case EngineEvent::Kind::Tokens:
      d["type"] = "tokens";
      d["tokens"] = e.tokens;
      if (!e.logprobs.empty()) d["logprobs"] = logprobs_to_list(e.logprobs);
      if (e.speculative) d["speculative"] = py::make_tuple(e.drafted_tokens, e.accepted_tokens);
      break;
    case EngineEvent::Kind::Done:
      d["type"] = "done";
      d["finish_reason"] = e.finish_reason;
      d["prompt_tokens"] = e.prompt_tokens;
      d["completion_tokens"] = e.completion_tokens;
      d["cached_tokens"] = e.cached_tokens;
      if (!e.values.empty()) d["values"] = e.values;
      d["timings"] = py::dict(py::arg("queued_ms") = e.queued_ms, py::arg("prefill_ms") = e.prefill_ms,
                              py::arg("decode_ms") = e.decode_ms);
      d["drafted_tokens"] = e.drafted_tokens;
      d["accepted_tokens"] = e.accepted_tokens;
      break;
    case EngineEvent::Kind::Error:
      d["type"] = "error";
      d["code"] = e.code;
      d["message"] = e.message;
      break;
  }
  return d;
}

// What attention over the KV runs: "llmd:f16:avx512" (llmd's kernels over the pool's float16
// blocks) or "mlx:sdpa:f16" (the device backend's own KV arrays).
std::string attention_report(const KvShape& kv) {
  return kv.host_storage ? attention_path(kv.type) : std::string("mlx:sdpa:") + kv_type_name(kv.type);
}

std::unique_ptr<Engine> make_engine(const std::string& path, int context_length, int max_sequences,
                                    int step_token_budget, size_t kv_budget_bytes, const py::dict& hf_config,
                                    const std::string& backend, const std::string& kv_type,
                                    const std::string& kv_disk_dir, size_t kv_disk_bytes,
                                    const std::string& model_digest, const std::string& draft_model_path,
                                    const py::dict& draft_hf_config, int kv_disk_read_delay_ms,
                                    double draft_row_cost) {
  const KvType type = kv_type_named(kv_type);
  Metadata hf = metadata_from_dict(hf_config);
  Metadata draft_hf = metadata_from_dict(draft_hf_config);
  py::gil_scoped_release release;
  LoadOptions load;
  load.context_length = context_length;
  load.backend = backend;
  auto model = load_model(path, load, hf);
  // The draft runs on the same backend, with the target's context length (it drafts for the
  // same sequences).
  std::unique_ptr<Model> draft;
  if (!draft_model_path.empty()) {
    LoadOptions draft_load = load;
    if (draft_load.context_length == 0) draft_load.context_length = model->info().context_length;
    draft = load_model(draft_model_path, draft_load, draft_hf);
  }
  EngineOptions opts;
  opts.max_sequences = max_sequences;
  opts.step_token_budget = step_token_budget;
  opts.kv_budget_bytes = kv_budget_bytes;
  opts.context_length = context_length;
  opts.kv_type = type;
  opts.kv_disk_dir = kv_disk_dir;
  opts.kv_disk_bytes = kv_disk_bytes;
  opts.model_digest = model_digest;
  opts.kv_disk_read_delay_ms = kv_disk_read_delay_ms;
  opts.draft_row_cost = draft_row_cost;
  return std::make_unique<Engine>(std::move(model), opts, std::move(draft));
}

// The pull-time support check (LoadOptions::validate_only): throws what a load would throw.
py::dict check_model(const std::string& path, const py::dict& hf_config, const std::string& backend) {
  Metadata hf = metadata_from_dict(hf_config);
  std::unique_ptr<Model> model;
  {
    py::gil_scoped_release release;
    LoadOptions load;
    load.backend = backend;
    load.validate_only = true;
    model = load_model(path, load, hf);
  }
  const ModelInfo& i = model->info();
  py::dict d;
  d["architecture"] = i.architecture;
  d["backend"] = i.backend;
  d["weight_format"] = i.weight_format;
  d["context_length"] = i.context_length;
  // Only the CPU backend decides its kernels at load; a device backend's weights are not built.
  if (i.backend == "cpu" || i.backend == "cuda") d["matmul_paths"] = model->matmul_paths();
  return d;
}

// The block types llmd's CPU kernels multiply by (some paths may lack one: gemm_for says).
constexpr TensorType kKernelTypes[] = {TensorType::Q4_0, TensorType::Q4_1, TensorType::Q8_0,
                                       TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K, TensorType::IQ4_NL,
                                       TensorType::Q2_K, TensorType::Q3_K, TensorType::Q5_0, TensorType::Q5_1};

TensorType kernel_type_named(const std::string& type) {
  for (TensorType t : kKernelTypes) {
    if (type_name(t) == type) return t;
  }
  throw std::invalid_argument("no kernel weight type " + type);
}

// The engine's load-time packing and its inverse (the embedding lookup of a tied head), for
// tests: pack8(rows) -> bytes in the 8-row layout; unpack8_row(packed, row) -> GGUF blocks.
const kernels::KernelTable& table_for(const std::string& isa) {
  const kernels::KernelTable* table = isa.empty() ? &kernels::active_table() : kernels::table_named(isa);
  if (!table) throw std::invalid_argument("kernel path '" + isa + "' is not runnable on this CPU");
  return *table;
}

py::array_t<uint8_t> pack8_bytes(const std::string& type, py::array_t<uint8_t, py::array::c_style> w, int n, int k,
                                 const std::string& isa) {
  const TensorType tt = kernel_type_named(type);
  const kernels::PackLayout layout = table_for(isa).pack_layout;
  if (!kernels::has_pack8_layout(tt)) throw std::invalid_argument("no packed layout for " + type);
  if (static_cast<size_t>(w.size()) != row_bytes(tt, k) * n) throw std::invalid_argument("weight bytes do not match n x k");
  py::array_t<uint8_t> out(w.size());
  std::memcpy(out.mutable_data(), w.data(), w.size());
  kernels::pack8_in_place(tt, out.mutable_data(), n, k, layout);
  return out;
}

py::array_t<uint8_t> unpack8_bytes(const std::string& type, py::array_t<uint8_t, py::array::c_style> packed, int n,
                                   int k, int row, const std::string& isa) {
  const TensorType tt = kernel_type_named(type);
  const kernels::PackLayout layout = table_for(isa).pack_layout;
  const size_t rb = row_bytes(tt, k);
  if (static_cast<size_t>(packed.size()) != rb * n || n % kernels::kPackRows != 0 || row < 0 || row >= n) {
    throw std::invalid_argument("unpack8_row: bad shape or row");
  }
  py::array_t<uint8_t> out(static_cast<py::ssize_t>(rb));
  kernels::unpack8_row(tt, packed.data(), row, k, out.mutable_data(), layout);
  return out;
}

// Attention of each query row over keys/values laid out exactly as the KV pool lays them out
// (64-position blocks, keys transposed), stored as `kv_type` through the write path's own
// conversion, on the attention variant of kernel path `isa`. Rows go in tiles of `tile_rows`
// (as PagedAttention groups decode heads or prefill rows) so tests can check tile invariance.
py::array_t<float> kernel_attention(py::array_t<float, py::array::c_style> q, py::array_t<float, py::array::c_style> k,
                                    py::array_t<float, py::array::c_style> v, std::vector<int> n_pos,
                                    std::vector<int> first_pos, const std::string& kv_type, const std::string& isa,
                                    int tile_rows, bool rotate, bool span_tasks) {
  if (!isa.empty() && !kernels::table_named(isa)) {
    throw std::invalid_argument("kernel path '" + isa + "' is not runnable on this CPU");
  }
  const AttentionKernels& ak = isa.empty() ? attention_kernels() : attention_kernels_for(isa);
  const KvType type = kv_type_named(kv_type);
  if (q.ndim() != 2 || k.ndim() != 2 || v.ndim() != 2) throw std::invalid_argument("q, k, v must be 2-D");
  const int rows = static_cast<int>(q.shape(0));
  const int hd = static_cast<int>(q.shape(1));
  const int n = static_cast<int>(k.shape(0));
  const int multiple = kv_type_quantized(type) ? 32 : 16;
  if (hd % multiple != 0 || k.shape(1) != hd || v.shape(0) != n || v.shape(1) != hd) {
    throw std::invalid_argument("q [rows, d], k and v [n, d] with d a multiple of " + std::to_string(multiple));
  }
  if (static_cast<int>(n_pos.size()) != rows || static_cast<int>(first_pos.size()) != rows) {
    throw std::invalid_argument("n_pos and first_pos need one entry per row");
  }
  for (int r = 0; r < rows; ++r) {
    if (n_pos[r] < 1 || n_pos[r] > n || first_pos[r] < 0 || first_pos[r] >= n_pos[r]) {
      throw std::invalid_argument("each row needs 0 <= first_pos < n_pos <= n");
    }
  }
  if (tile_rows < 1 || tile_rows > kMaxTileRows) throw std::invalid_argument("tile_rows must be 1.." + std::to_string(kMaxTileRows));
  // With `rotate`, what PagedAttention does around a quantized pool (hadamard.h): q and k
  // rotated by the key-size Hadamard transform, v by the value-size one, the output back.
  const int k_rot = hadamard::key_block(hd), v_rot = hadamard::value_block(hd);
  std::vector<float> qr, kr, vr;
  if (rotate) {
    if ((k_rot & (k_rot - 1)) != 0 || hd % 32 != 0) throw std::invalid_argument("rotate needs d a multiple of 32");
    qr.assign(q.data(), q.data() + static_cast<size_t>(rows) * hd);
    kr.assign(k.data(), k.data() + static_cast<size_t>(n) * hd);
    vr.assign(v.data(), v.data() + static_cast<size_t>(n) * hd);
    for (int r = 0; r < rows; ++r) hadamard::rotate(qr.data() + static_cast<size_t>(r) * hd, hd, k_rot);
    for (int j = 0; j < n; ++j) {
      hadamard::rotate(kr.data() + static_cast<size_t>(j) * hd, hd, k_rot);
      hadamard::rotate(vr.data() + static_cast<size_t>(j) * hd, hd, v_rot);
    }
  }
  const float* q_data = rotate ? qr.data() : q.data();
  const float* k_data = rotate ? kr.data() : k.data();
  const float* v_data = rotate ? vr.data() : v.data();
  // One KV head's parts of `nb` pool blocks, written by the engine's own write path.
  constexpr int BT = KvPool::kBlockTokens;
  const int nb = (n + BT - 1) / BT;
  const size_t elems = static_cast<size_t>(BT) * hd;
  KvShape shape;
  shape.type = type;
  const size_t part = shape.bytes_of(elems);
  std::vector<std::byte> kbytes(nb * part), vbytes(nb * part);
  std::vector<uint16_t> row(hd);
  for (int j = 0; j < n; ++j) {
    std::byte* kp = kbytes.data() + static_cast<size_t>(j / BT) * part;
    std::byte* vp = vbytes.data() + static_cast<size_t>(j / BT) * part;
    const int off = j % BT;
    const float* kj = k_data + static_cast<size_t>(j) * hd;
    const float* vj = v_data + static_cast<size_t>(j) * hd;
    if (kv_type_quantized(type)) {
      kv_quant::write_key(type, kp, off, kj, hd, BT);
      kv_quant::write_value(type, vp, off, vj, hd, BT);
    } else if (type == KvType::F16) {
      ak.floats_to_halves(kj, row.data(), hd);
      for (int d = 0; d < hd; ++d) reinterpret_cast<uint16_t*>(kp)[static_cast<size_t>(d) * BT + off] = row[d];
      ak.floats_to_halves(vj, reinterpret_cast<uint16_t*>(vp) + static_cast<size_t>(off) * hd, hd);
    } else {
      for (int d = 0; d < hd; ++d) reinterpret_cast<float*>(kp)[static_cast<size_t>(d) * BT + off] = kj[d];
      std::memcpy(reinterpret_cast<float*>(vp) + static_cast<size_t>(off) * hd, vj, hd * sizeof(float));
    }
  }
  std::vector<const void*> kb(nb), vb(nb);
  for (int b = 0; b < nb; ++b) {
    kb[b] = kbytes.data() + b * part;
    vb[b] = vbytes.data() + b * part;
  }
  py::array_t<float> out({rows, hd});
  std::vector<float> scratch(attention_scratch_floats(hd));
  const AttendTileFn attend = ak.attend(type);
  for (int r0 = 0; r0 < rows; r0 += tile_rows) {
    AttentionTile tile;
    tile.rows = std::min(tile_rows, rows - r0);
    for (int i = 0; i < tile.rows; ++i) {
      tile.q[i] = q_data + static_cast<size_t>(r0 + i) * hd;
      tile.n_pos[i] = n_pos[r0 + i];
      tile.first_pos[i] = first_pos[r0 + i];
      tile.out[i] = out.mutable_data() + static_cast<size_t>(r0 + i) * hd;
    }
    const auto [first_span, last_span] = tile_spans(tile);
    if (!span_tasks || last_span == first_span) {
      attend(tile, kb.data(), vb.data(), hd, BT, scratch.data());
      continue;
    }
    // As PagedAttention splits a tile too few to keep its threads busy: one task per span,
    // folded in span order.
    const int spans = last_span - first_span + 1;
    const size_t per_span = span_part_floats(tile.rows, hd);
    std::vector<float> parts(spans * per_span);
    for (int k = 0; k < spans; ++k) {
      attend(span_task(tile, first_span + k, parts.data() + k * per_span, hd), kb.data(), vb.data(), hd, BT,
             scratch.data());
    }
    fold_span_tasks(ak, tile, parts.data(), spans, hd);
  }
  if (rotate) {
    for (int r = 0; r < rows; ++r) hadamard::rotate(out.mutable_data() + static_cast<size_t>(r) * hd, hd, v_rot);
  }
  return out;
}

// Keys and values [n, d] as a pool of `kv_type` stores them and attention reads them back
// (the write path's rounding, then exact dequantization): what tests compare attention with.
std::pair<py::array_t<float>, py::array_t<float>> kv_roundtrip(py::array_t<float, py::array::c_style> k,
                                                               py::array_t<float, py::array::c_style> v,
                                                               const std::string& kv_type) {
  const KvType type = kv_type_named(kv_type);
  if (!kv_type_quantized(type)) throw std::invalid_argument("kv_roundtrip is for quantized KV types");
  if (k.ndim() != 2 || v.ndim() != 2 || k.shape(0) != v.shape(0) || k.shape(1) != v.shape(1) || k.shape(1) % 32 != 0) {
    throw std::invalid_argument("k and v must both be [n, d] with d a multiple of 32");
  }
  const int n = static_cast<int>(k.shape(0));
  const int hd = static_cast<int>(k.shape(1));
  constexpr int BT = KvPool::kBlockTokens;
  KvShape shape;
  shape.type = type;
  std::vector<std::byte> kp(shape.bytes_of(static_cast<size_t>(BT) * hd)), vp(kp.size());
  py::array_t<float> ko({n, hd}), vo({n, hd});
  for (int j = 0; j < n; ++j) {
    const size_t at = static_cast<size_t>(j) * hd;
    kv_quant::write_key(type, kp.data(), j % BT, k.data() + at, hd, BT);
    kv_quant::write_value(type, vp.data(), j % BT, v.data() + at, hd, BT);
    kv_quant::read_position(type, kp.data(), vp.data(), j % BT, hd, BT, ko.mutable_data() + at, vo.mutable_data() + at);
  }
  return {ko, vo};
}

// float_gemm.h on numpy arrays (tests): x [rows, k] @ w [n, k]^T with the epilogue, the weight
// packed in float16 panels when `half` (its values must be float16 values), else float32.
using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;
py::array_t<float> float_gemm_numpy(FloatArray x, FloatArray w, bool half, std::optional<FloatArray> bias,
                                    bool gelu_tanh, std::optional<FloatArray> residual) {
  if (x.ndim() != 2 || w.ndim() != 2 || x.shape(1) != w.shape(1)) throw std::invalid_argument("x [rows, k], w [n, k]");
  const int rows = static_cast<int>(x.shape(0)), k = static_cast<int>(x.shape(1)), n = static_cast<int>(w.shape(0));
  if (bias && bias->size() != n) throw std::invalid_argument("bias must be [n]");
  if (residual && residual->size() != static_cast<py::ssize_t>(rows) * n) {
    throw std::invalid_argument("residual must be [rows, n]");
  }
  std::vector<float> result;
  {
    py::gil_scoped_release release;
    result = float_gemm_check(x.data(), rows, k, w.data(), n, half, bias ? bias->data() : nullptr, gelu_tanh,
                              residual ? residual->data() : nullptr);
  }
  py::array_t<float> out({rows, n});
  std::memcpy(out.mutable_data(), result.data(), result.size() * sizeof(float));
  return out;
}

py::array_t<float> kernel_gemm(const std::string& type, py::array_t<uint8_t, py::array::c_style> w, int n, int k,
                               py::array_t<float, py::array::c_style> x, const std::string& isa, bool packed) {
  const kernels::KernelTable* table = isa.empty() ? &kernels::active_table() : kernels::table_named(isa);
  if (!table) throw std::invalid_argument("kernel path '" + isa + "' is not runnable on this CPU");
  TensorType tt = TensorType::F32;
  bool known = false;
  for (TensorType t : kKernelTypes) {
    if (type_name(t) == type) {
      tt = t;
      known = true;
    }
  }
  if (!known || !table->gemm_for(tt)) throw std::invalid_argument("no kernel for type " + type + " on " + table->isa);
  if (packed && (!table->packed_gemm_for(tt) || n % kernels::kPackRows != 0)) {
    throw std::invalid_argument("no packed kernel for type " + type + " on " + table->isa + " with n = " +
                                std::to_string(n));
  }
  const size_t rb = row_bytes(tt, k);
  if (static_cast<size_t>(w.size()) != rb * n) throw std::invalid_argument("weight bytes do not match n x k");
  if (x.ndim() != 2 || x.shape(1) != k) throw std::invalid_argument("x must be [rows, k]");
  const int rows = static_cast<int>(x.shape(0));
  py::array_t<float> out({rows, n});
  std::vector<kernels::ActBlock> act(static_cast<size_t>(rows) * (k / kernels::kBlock));
  for (int r = 0; r < rows; ++r) table->quantizer_for(tt)(x.data() + static_cast<size_t>(r) * k, act.data() + static_cast<size_t>(r) * (k / kernels::kBlock), k);
  if (packed) {
    // The layout the engine packs weights into at load time, packed by the same function.
    std::vector<uint8_t> bytes(w.data(), w.data() + w.size());
    kernels::pack8_in_place(tt, bytes.data(), n, k, table->pack_layout);
    table->packed_gemm_for(tt)(bytes.data(), rb, act.data(), k, rows, 0, n, out.mutable_data(), n);
  } else {
    table->gemm_for(tt)(w.data(), rb, act.data(), k, rows, 0, n, out.mutable_data(), n);
  }
  return out;
}

// A request's `output`: tokens (only where generating is allowed), a pooled embedding, or
// the logits of chosen tokens.
GenerateRequest::Output parse_output(const std::string& output, bool tokens_allowed) {
  if (output == "embedding") return GenerateRequest::Output::Embedding;
  if (output == "token_logits") return GenerateRequest::Output::TokenLogits;
  if (tokens_allowed && output == "tokens") return GenerateRequest::Output::Tokens;
  throw std::invalid_argument(std::string("output must be ") + (tokens_allowed ? "tokens, " : "") +
                              "embedding or token_logits, not " + output);
}

GenerateRequest::Pooling parse_pooling(const std::string& pooling) {
  if (pooling == "mean") return GenerateRequest::Pooling::Mean;
  if (pooling == "cls") return GenerateRequest::Pooling::Cls;
  if (pooling == "last") return GenerateRequest::Pooling::Last;
  throw std::invalid_argument("pooling must be last, mean or cls, not " + pooling);
}

}  // namespace

PYBIND11_MODULE(_engine, m) {
  m.doc() = "llmd native engine (C++ on MLX)";

  py::class_<Engine>(m, "Engine")
      .def(py::init(&make_engine), py::arg("model_path"), py::arg("context_length") = 0,
           py::arg("max_sequences") = 8, py::arg("step_token_budget") = 512,
           py::arg("kv_budget_bytes") = size_t{1} << 30, py::arg("hf_config") = py::dict(),
           py::arg("backend") = "auto", py::arg("kv_type") = "f16", py::arg("kv_disk_dir") = "",
           py::arg("kv_disk_bytes") = 0, py::arg("model_digest") = "", py::arg("draft_model_path") = "",
           py::arg("draft_hf_config") = py::dict(), py::arg("kv_disk_read_delay_ms") = 0,
           py::arg("draft_row_cost") = -1.0)
      .def(
          "submit",
          [](Engine& e, const std::string& id, std::vector<int32_t> prompt, int max_tokens, float temperature,
             int top_k, float top_p, float min_p, uint64_t seed, std::vector<int32_t> stop_tokens,
             std::string session, float frequency_penalty, float presence_penalty, float repetition_penalty,
             std::vector<std::pair<int32_t, float>> logit_bias, int top_logprobs, py::object constraint,
             std::string prefill_of, int repetition_window, const std::string& output, const std::string& pooling,
             bool normalize, std::vector<int32_t> logit_tokens, int max_draft, bool draft_model,
             const py::list& embedded, bool mtp) {
            GenerateRequest r;
            // (first row, float32 [rows, hidden] embeddings, bidirectional[, (grid_h, grid_w)])
            // per embedded run; the grid places an image's rows for M-RoPE (Qwen3.5).
            for (py::handle item : embedded) {
              auto t = item.cast<py::tuple>();
              if (t.size() != 3 && t.size() != 4) {
                throw std::invalid_argument("embedded runs are (first, rows, bidirectional[, (grid_h, grid_w)])");
              }
              auto values = t[1].cast<py::array_t<float, py::array::c_style | py::array::forcecast>>();
              if (values.ndim() != 2) throw std::invalid_argument("embedded rows must be [rows, hidden]");
              GenerateRequest::PromptEmbeddings e;
              e.first = t[0].cast<int>();
              e.rows = static_cast<int>(values.shape(0));
              e.values = std::make_shared<const std::vector<float>>(values.data(), values.data() + values.size());
              e.bidirectional = t[2].cast<bool>();
              if (t.size() == 4 && !t[3].is_none()) {
                auto grid = t[3].cast<std::pair<int, int>>();
                e.grid_h = grid.first;
                e.grid_w = grid.second;
              }
              r.embeddings.push_back(std::move(e));
            }
            r.max_draft = max_draft;
            r.draft_model = draft_model;
            r.mtp = mtp;
            r.output = parse_output(output, /*tokens_allowed=*/true);
            r.pooling = parse_pooling(pooling);
            r.normalize = normalize;
            r.logit_tokens = std::move(logit_tokens);
            r.id = id;
            r.prompt = std::move(prompt);
            r.max_tokens = max_tokens;
            r.sampling.temperature = temperature;
            r.sampling.top_k = top_k;
            r.sampling.top_p = top_p;
            r.sampling.min_p = min_p;
            r.sampling.seed = seed;
            r.sampling.frequency_penalty = frequency_penalty;
            r.sampling.presence_penalty = presence_penalty;
            r.sampling.repetition_penalty = repetition_penalty;
            r.sampling.repetition_window = repetition_window;
            r.sampling.logit_bias = std::move(logit_bias);
            r.sampling.top_logprobs = top_logprobs;
            r.stop_tokens = std::move(stop_tokens);
            r.session = std::move(session);
            r.prefill_of = std::move(prefill_of);
            if (!constraint.is_none()) r.constraint = std::make_shared<PyTokenConstraint>(constraint);
            e.submit(std::move(r));
          },
          py::arg("id"), py::arg("prompt"), py::arg("max_tokens"), py::arg("temperature") = 0.f,
          py::arg("top_k") = 0, py::arg("top_p") = 1.f, py::arg("min_p") = 0.f, py::arg("seed") = 0,
          py::arg("stop_tokens") = std::vector<int32_t>{}, py::arg("session") = "",
          py::arg("frequency_penalty") = 0.f, py::arg("presence_penalty") = 0.f,
          py::arg("repetition_penalty") = 1.f,
          py::arg("logit_bias") = std::vector<std::pair<int32_t, float>>{}, py::arg("top_logprobs") = -1,
          py::arg("constraint") = py::none(), py::arg("prefill_of") = "",
          py::arg("repetition_window") = 0, py::arg("output") = "tokens", py::arg("pooling") = "last",
          py::arg("normalize") = false, py::arg("logit_tokens") = std::vector<int32_t>{},
          py::arg("max_draft") = 0, py::arg("draft_model") = false, py::arg("embedded") = py::list(),
          py::arg("mtp") = false)
      .def(
          "submit_pooled",
          [](Engine& e, const std::vector<std::string>& ids, std::vector<std::vector<int32_t>> prompts,
             const std::string& output, const std::string& pooling, bool normalize,
             const std::vector<int32_t>& logit_tokens) {
            if (ids.size() != prompts.size()) throw std::invalid_argument("one id per prompt");
            GenerateRequest base;
            base.output = parse_output(output, /*tokens_allowed=*/false);
            base.pooling = parse_pooling(pooling);
            base.normalize = normalize;
            base.logit_tokens = logit_tokens;
            std::vector<GenerateRequest> batch;
            for (size_t i = 0; i < ids.size(); ++i) {
              GenerateRequest r = base;
              r.id = ids[i];
              r.prompt = std::move(prompts[i]);
              batch.push_back(std::move(r));
            }
            e.submit(std::move(batch));
          },
          py::arg("ids"), py::arg("prompts"), py::arg("output") = "embedding", py::arg("pooling") = "last",
          py::arg("normalize") = false, py::arg("logit_tokens") = std::vector<int32_t>{},
          "Embedding or token-logits requests (no sampling), queued together so they are admitted "
          "into the same steps; each ends with its own done (`values`) or error.")
      .def("shutdown",
           [](Engine& e) {
             py::gil_scoped_release release;
             e.shutdown();
           })
      .def("cancel", &Engine::cancel)
      .def("unpin", &Engine::unpin)
      .def(
          "poll",
          [](Engine& e, int timeout_ms, bool started) {
            std::vector<EngineEvent> events;
            {
              py::gil_scoped_release release;
              events = e.poll(timeout_ms);
            }
            bury_dead_objects();
            py::list out;
            for (const auto& ev : events) {
              if (ev.kind == EngineEvent::Kind::Started && !started) continue;
              out.append(event_to_dict(ev));
            }
            return out;
          },
          py::arg("timeout_ms"), py::arg("started") = false,
          "Events since the last poll; `started` (admission, with the cached-prefix count) only "
          "when asked: the worker host relays it, scripts that count tokens need not skip it.")
      .def("stats",
           [](Engine& e) {
             const EngineStats s = e.stats();
             py::dict d;
             d["active_sequences"] = s.active_sequences;
             d["queued_requests"] = s.queued_requests;
             d["steps"] = s.steps;
             d["tokens_generated"] = s.tokens_generated;
             d["prompt_tokens_processed"] = s.prompt_tokens_processed;
             d["kv_bytes"] = s.kv_bytes;
             d["kv_lane_bytes"] = s.kv_lane_bytes;
             d["sampler"] = py::dict(py::arg("device") = s.device_sampled_tokens, py::arg("host") = s.host_sampled_tokens);
             d["kv_blocks_used"] = s.kv_blocks_used;
             d["kv_window_parts"] = s.kv_window_parts;
             d["max_rows_sampled_in_a_step"] = s.max_rows_sampled_in_a_step;
             d["prefix_cache_hits"] = s.prefix_cache_hits;
             d["forked_sequences"] = s.forked_sequences;
             d["prefix_cached_tokens"] = s.prefix_cached_tokens;
             d["prefix_partial_tokens"] = s.prefix_partial_tokens;
             d["prefix_cache_blocks"] = s.prefix_cache_blocks;
             d["kv_idle_cached_blocks"] = s.kv_idle_cached_blocks;
             d["pinned_sessions"] = s.pinned_sessions;
             d["pinned_blocks"] = s.pinned_blocks;
             d["sampled_rows_histogram"] = histogram_dict(s.sampled_rows_histogram);
             d["embedding_requests"] = s.embedding_requests;
             d["pooled_rows_histogram"] = histogram_dict(s.pooled_rows_histogram);
             d["draft_tokens"] = s.draft_tokens;
             d["draft_accepted_tokens"] = s.draft_accepted_tokens;
             d["speculative_steps"] = s.speculative_steps;
             d["drafting_rows_histogram"] = histogram_dict(s.drafting_rows_histogram);
             d["draft_declined_tokens"] = s.draft_declined_tokens;
             d["draft_cached_tokens"] = s.draft_cached_tokens;
             py::dict step_cost;  // rows -> milliseconds, as the cost model has measured them
             for (const auto& [rows, seconds] : s.step_cost) step_cost[py::str(std::to_string(rows))] = seconds * 1e3;
             d["step_cost_ms"] = step_cost;
             py::dict disk;
             disk["enabled"] = s.kv_disk_enabled;
             if (!s.kv_disk_enabled) disk["off_reason"] = s.kv_disk_off_reason;
             if (s.kv_disk_enabled) disk["dir"] = s.kv_disk_dir;
             disk["hits"] = s.kv_disk_hits;
             disk["hit_tokens"] = s.kv_disk_hit_tokens;
             disk["loads"] = s.kv_disk_loads;
             disk["steps_during_loads"] = s.kv_disk_load_steps;
             disk["state_hits"] = s.kv_disk_state_hits;
             disk["read_blocks"] = s.kv_disk.read_blocks;
             disk["read_bytes"] = s.kv_disk.read_bytes;
             disk["written_blocks"] = s.kv_disk.written_blocks;
             disk["written_bytes"] = s.kv_disk.written_bytes;
             disk["dropped_blocks"] = s.kv_disk.dropped_blocks;
             disk["corrupt_files"] = s.kv_disk.corrupt_files;
             disk["evicted_files"] = s.kv_disk.evicted_files;
             disk["bytes"] = s.kv_disk.bytes;
             disk["files"] = s.kv_disk.files;
             d["kv_disk"] = disk;
             d["attention_paths"] = s.attention_paths;
             return d;
           })
      .def("info",
           [](Engine& e) {
             const ModelInfo& i = e.info();
             py::dict d;
             d["architecture"] = i.architecture;
             d["vocab_size"] = i.vocab_size;
             d["context_length"] = i.context_length;
             d["n_layers"] = i.n_layers;
             d["n_heads"] = i.n_heads;
             d["n_kv_heads"] = i.n_kv_heads;
             d["hidden_size"] = i.hidden_size;
             d["weight_format"] = i.weight_format;
             d["weight_bytes"] = i.weight_bytes;
             d["backend"] = i.backend;
             d["device_name"] = i.device_name;
             d["device_memory_bytes"] = i.device_memory_bytes;
             d["attention"] = attention_report(e.kv_pool().shape());
             return d;
           })
      .def(
          "kv_cache",
          [](Engine& e) {
            const KvPool& pool = e.kv_pool();
            py::dict d;
            d["type"] = kv_type_name(pool.shape().type);
            d["bytes_per_token"] = pool.bytes_per_token();
            d["capacity_tokens"] = pool.capacity_tokens();
            d["block_tokens"] = KvPool::kBlockTokens;
            d["attention"] = attention_report(pool.shape());
            return d;
          },
          "The KV cache's element type, bytes per position (all layers), how many positions the "
          "budget holds, and the attention path that reads it.")
      .def(
          "flush_kv_disk", [](Engine& e) { e.flush_kv_disk(); }, py::call_guard<py::gil_scoped_release>(),
          "Waits until every KV block queued for the disk tier is written.")
      .def_property_readonly("context_length", &Engine::context_length)
      .def_property_readonly("accepts_embeddings", [](Engine& e) { return e.accepts_embeddings(); },
                             "Whether requests may carry `embedded` prompt rows (images).")
      .def_property_readonly("supports_speculation", [](Engine& e) { return e.supports_speculation(); },
                             "Whether requests may set max_draft (not on encoders).")
      .def_property_readonly("has_mtp", [](Engine& e) { return e.has_mtp(); },
                             "Whether the model ships an MTP head that drafts (requests with mtp).")
      .def_property_readonly("max_sequences", [](Engine& e) { return e.options().max_sequences; })
      .def_property_readonly(
          "draft_model",
          [](Engine& e) -> py::object {
            const ModelInfo* d = e.draft_info();
            if (!d) return py::none();
            py::dict out;
            out["architecture"] = d->architecture;
            out["vocab_size"] = d->vocab_size;
            out["n_layers"] = d->n_layers;
            out["hidden_size"] = d->hidden_size;
            out["weight_bytes"] = d->weight_bytes;
            return out;
          },
          "The draft model's facts (speculative decoding with draft_model requests), or None.")
      .def("matmul_paths", &Engine::matmul_paths)
      .def("score", [](Engine& e, const std::vector<int32_t>& tokens, int first_scored) {
        std::vector<float> logits;
        {
          py::gil_scoped_release release;
          logits = e.score(tokens, first_scored);
        }
        const int vocab = e.info().vocab_size;
        py::array_t<float> out({static_cast<py::ssize_t>(logits.size() / vocab), static_cast<py::ssize_t>(vocab)});
        std::memcpy(out.mutable_data(), logits.data(), logits.size() * sizeof(float));
        return out;
      }, py::arg("tokens"), py::arg("first_scored") = 1)
      .def(
          "mtp_probe",
          [](Engine& e, const std::vector<int32_t>& tokens, int chain) {
            std::vector<float> logits;
            std::vector<int32_t> chained;
            {
              py::gil_scoped_release release;
              logits = e.mtp_probe(tokens, chain, chained);
            }
            const int vocab = e.info().vocab_size;
            py::array_t<float> out({static_cast<py::ssize_t>(logits.size() / vocab), static_cast<py::ssize_t>(vocab)});
            std::memcpy(out.mutable_data(), logits.data(), logits.size() * sizeof(float));
            return py::make_tuple(out, chained);
          },
          py::arg("tokens"), py::arg("chain") = 0,
          "The MTP head's logits over `tokens` (row i guesses token i + 2), then `chain` greedy "
          "chained guesses: (logits [n - 1 + chain, vocab], chained tokens).");

  // The vision half of a multimodal checkpoint (siglip.h), beside the Engine that runs its
  // decoder: the worker encodes a request's images with it and hands the rows to the engine.
  py::class_<VisionTower>(m, "VisionTower")
      .def(py::init([](const std::string& path, const py::dict& config, const std::string& backend) {
             Metadata meta = metadata_from_dict(config);
             py::gil_scoped_release release;
             LoadOptions load;
             load.backend = backend;
             return load_vision_tower(path, meta, load);
           }),
           py::arg("path"), py::arg("config"), py::arg("backend") = "cpu")
      .def_property_readonly("architecture", [](const VisionTower& t) { return t.info().architecture; })
      .def_property_readonly("image_size", [](const VisionTower& t) { return t.info().image_size; })
      .def_property_readonly("tokens_per_image", [](const VisionTower& t) { return t.info().tokens_per_image; })
      .def_property_readonly("hidden_size", [](const VisionTower& t) { return t.info().hidden_size; })
      .def_property_readonly("patch_values", [](const VisionTower& t) { return t.info().patch_values; })
      .def_property_readonly("merge_size", [](const VisionTower& t) { return t.info().merge_size; })
      .def(
          "encode_patches",
          [](const VisionTower& t, py::array_t<float, py::array::c_style | py::array::forcecast> patches,
             const std::vector<std::array<int, 3>>& grids, Engine* engine) {
            const VisionInfo& i = t.info();
            int64_t n = 0;
            for (const auto& g : grids) n += static_cast<int64_t>(g[0]) * g[1] * g[2];
            if (patches.ndim() != 2 || patches.shape(0) != n || patches.shape(1) != i.patch_values) {
              throw std::invalid_argument("patches must be [" + std::to_string(n) + " (the grids' patches), " +
                                          std::to_string(i.patch_values) + "]");
            }
            std::vector<float> rows;
            {
              py::gil_scoped_release release;
              if (engine) {
                rows = engine->between_steps([&] { return t.encode_patches(patches.data(), grids); });
              } else {
                rows = t.encode_patches(patches.data(), grids);
              }
            }
            py::list out;
            size_t at = 0;
            const int per = i.merge_size * i.merge_size;
            for (const auto& g : grids) {
              const py::ssize_t tokens = static_cast<py::ssize_t>(g[0]) * g[1] * g[2] / per;
              py::array_t<float> a({tokens, static_cast<py::ssize_t>(i.hidden_size)});
              std::memcpy(a.mutable_data(), rows.data() + at, static_cast<size_t>(a.size()) * sizeof(float));
              at += static_cast<size_t>(a.size());
              out.append(a);
            }
            return out;
          },
          py::arg("patches"), py::arg("grids"), py::arg("engine") = nullptr,
          "Towers of any image size (Qwen3.5): float32 [patches, patch_values] of several images with "
          "each image's grid (t, h, w) -> one float32 [h * w / merge_size^2, hidden_size] per image, in one "
          "pass; with `engine`, between its forward passes.")
      .def(
          "encode",
          [](const VisionTower& t, py::array_t<float, py::array::c_style | py::array::forcecast> pixels,
             Engine* engine) {
            const VisionInfo& i = t.info();
            if (i.image_size == 0) {
              throw std::invalid_argument(i.architecture + " vision towers read images of any size as patches "
                                          "(encode_patches)");
            }
            if (pixels.ndim() != 4 || pixels.shape(1) != i.channels || pixels.shape(2) != i.image_size ||
                pixels.shape(3) != i.image_size) {
              throw std::invalid_argument("pixels must be [n, " + std::to_string(i.channels) + ", " +
                                          std::to_string(i.image_size) + ", " + std::to_string(i.image_size) + "]");
            }
            const int n = static_cast<int>(pixels.shape(0));
            std::vector<float> rows;
            {
              py::gil_scoped_release release;
              if (engine) {
                rows = engine->between_steps([&] { return t.encode(pixels.data(), n); });
              } else {
                rows = t.encode(pixels.data(), n);
              }
            }
            py::array_t<float> out({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(i.tokens_per_image),
                                    static_cast<py::ssize_t>(i.hidden_size)});
            std::memcpy(out.mutable_data(), rows.data(), rows.size() * sizeof(float));
            return out;
          },
          py::arg("pixels"), py::arg("engine") = nullptr,
          "float32 [n, channels, image_size, image_size] preprocessed images -> float32 "
          "[n, tokens_per_image, hidden_size] embeddings, in one batched pass; with `engine`, "
          "between its forward passes (one process's MLX work at a time).");

  m.def(
      "device_sample_counts",
      [](std::vector<float> logits, int draws, float temperature, int top_k, float top_p, float min_p,
         uint64_t seed) {
        SamplingParams p;
        p.temperature = temperature;
        p.seed = seed;
        Sampler sampler(p);  // the uniform draws, as the engine makes them
        const int vocab = static_cast<int>(logits.size());
        std::vector<StepSegment::DeviceSample> params(draws);
        for (auto& d : params) {
          d = {temperature, top_k, top_p, min_p, 0.0};
          if (temperature > 0.f && top_k != 1) d.unit = sampler.draw_unit();
        }
        std::vector<int64_t> counts(vocab, 0);
        py::gil_scoped_release release;
        for (const int32_t t : sample_row_on_device(logits, params)) ++counts[t];
        return counts;
      },
      py::arg("logits"), py::arg("draws"), py::arg("temperature") = 1.f, py::arg("top_k") = 0,
      py::arg("top_p") = 1.f, py::arg("min_p") = 0.f, py::arg("seed") = 0,
      "sample_counts for the device sampler (native/mlx/device_sampler.h): `draws` rows of the "
      "same logits sampled in one batch, with the uniform numbers a seeded host sampler draws.");
  m.def(
      "sample_counts",
      [](std::vector<float> logits, int draft, int draws, float temperature, int top_k, float top_p, float min_p,
         uint64_t seed) {
        SamplingParams p;
        p.temperature = temperature;
        p.top_k = top_k;
        p.top_p = top_p;
        p.min_p = min_p;
        p.seed = seed;
        Sampler sampler(p);
        const int vocab = static_cast<int>(logits.size());
        std::vector<int64_t> counts(vocab, 0);
        py::gil_scoped_release release;
        for (int i = 0; i < draws; ++i) {
          ++counts[draft >= 0 ? sampler.sample_draft(logits.data(), vocab, draft) : sampler.sample(logits.data(), vocab)];
        }
        return counts;
      },
      py::arg("logits"), py::arg("draft"), py::arg("draws"), py::arg("temperature") = 1.f, py::arg("top_k") = 0,
      py::arg("top_p") = 1.f, py::arg("min_p") = 0.f, py::arg("seed") = 0,
      "How often each token comes out of `draws` draws of the sampler on one row of logits: "
      "speculatively against drafted token `draft` (Sampler::sample_draft), or plainly (draft < 0).");
  m.def(
      "sample_counts_q",
      [](std::vector<float> logits, std::vector<float> draft_logits, int draws, float temperature, int top_k,
         float top_p, float min_p, uint64_t seed) {
        SamplingParams p;
        p.temperature = temperature;
        p.top_k = top_k;
        p.top_p = top_p;
        p.min_p = min_p;
        p.seed = seed;
        Sampler target(p);
        p.seed = seed + 1;
        Sampler drafter(p);
        const int vocab = static_cast<int>(logits.size());
        if (static_cast<int>(draft_logits.size()) != vocab) throw std::invalid_argument("one draft logit per token");
        std::vector<int64_t> counts(vocab, 0);
        int64_t accepted = 0;
        std::vector<float> q;
        py::gil_scoped_release release;
        for (int i = 0; i < draws; ++i) {
          const int draft = drafter.propose(draft_logits.data(), vocab, q);
          const int token = target.sample_draft(logits.data(), vocab, draft, q);
          ++counts[token];
          accepted += token == draft ? 1 : 0;
        }
        return std::make_pair(counts, accepted);
      },
      py::arg("logits"), py::arg("draft_logits"), py::arg("draws"), py::arg("temperature") = 1.f, py::arg("top_k") = 0,
      py::arg("top_p") = 1.f, py::arg("min_p") = 0.f, py::arg("seed") = 0,
      "`draws` rounds of draft-model speculative sampling on one position: a draft drawn from "
      "the draft logits' distribution q (Sampler::propose), then verified against the target "
      "logits with q (Sampler::sample_draft). Returns how often each token came out and how "
      "many drafts were kept.");
  m.def(
      "argmax",
      [](py::array_t<float, py::array::c_style | py::array::forcecast> logits) {
        return argmax(logits.data(), static_cast<int>(logits.size()));
      },
      py::arg("logits"), "The greedy sampler's pick: the first index of the largest logit (a NaN never wins).");
  m.def("ngram_draft", [](const std::vector<int32_t>& tokens, int max_tokens) {
    return ngram_draft([&tokens](int i) { return tokens[i]; }, static_cast<int>(tokens.size()), max_tokens);
  }, py::arg("tokens"), py::arg("max_tokens"), "The prompt-lookup drafter's proposal after `tokens`.");
  m.def(
      "ngram_replay",
      [](const std::vector<int32_t>& prompt, const std::vector<int32_t>& tokens, int max_draft, int max_tokens) {
        // The first token comes from the prompt's last row; each later step drafts what the
        // lookup and DraftLength offer (never past max_tokens) and keeps the drafts that equal
        // the tokens generated.
        std::vector<int32_t> seen(prompt);
        if (!tokens.empty()) seen.push_back(tokens[0]);
        DraftLength length(max_draft);
        int drafted = 0, kept_total = 0;
        size_t i = 1;
        while (i < tokens.size()) {
          const int want = std::max(0, std::min(length.next(), draft_room_left(max_tokens, static_cast<int>(i))));
          const std::vector<int32_t> draft =
              ngram_draft([&seen](int p) { return seen[p]; }, static_cast<int>(seen.size()), want);
          int kept = 0;
          while (kept < static_cast<int>(draft.size()) && i + kept < tokens.size() && draft[kept] == tokens[i + kept])
            ++kept;
          length.record(static_cast<int>(draft.size()), kept);
          drafted += static_cast<int>(draft.size());
          kept_total += kept;
          const size_t next = std::min(tokens.size(), i + kept + 1);
          seen.insert(seen.end(), tokens.begin() + i, tokens.begin() + next);
          i = next;
        }
        return std::make_pair(drafted, kept_total);
      },
      py::arg("prompt"), py::arg("tokens"), py::arg("max_draft"), py::arg("max_tokens"),
      "(drafted, kept): what prompt-lookup speculation with free rows drafts and keeps while "
      "a sequence after `prompt` generates `tokens` greedily; the engine must report the same, "
      "whatever the kernels' rounding made `tokens`.");
  m.def(
      "plan_drafts",
      [](const std::vector<std::pair<int, double>>& steps, int rows, int tokens,
         const std::vector<std::tuple<int, double, bool>>& offers, int max_rows) {
        StepCost cost(max_rows);
        for (const auto& [r, seconds] : steps) cost.observe(r, seconds);
        std::vector<DraftCandidate> candidates;
        for (const auto& [n, acceptance, always] : offers) candidates.push_back({n, acceptance, always});
        return plan_drafts(cost, rows, tokens, candidates);
      },
      py::arg("steps"), py::arg("rows"), py::arg("tokens"), py::arg("candidates"), py::arg("max_rows") = 512,
      "The cost model's decision (draft_cost.h) after the engine measured `steps` ((rows, seconds) "
      "in order): how many of each candidate's (tokens, acceptance, always) drafts a step of "
      "`rows` plain rows yielding `tokens` tokens verifies.");
  m.def("check_model", &check_model, py::arg("model_path"), py::arg("hf_config") = py::dict(),
        py::arg("backend") = "auto",
        "Runs every check a load makes without reading weights; raises RuntimeError naming what "
        "the engine cannot run.");
  m.def("set_threads", &ThreadPool::configure_global, py::arg("n_threads"),
        "Size llmd's kernel thread pool (0: all cores / LLMD_THREADS).");
  m.def("profile", [] { return OpProfile::snapshot_ms(); },
        "Wall ms and calls per op kind since start (LLMD_PROFILE=1 enables it).");
  m.def("profile_reset", [] { OpProfile::reset(); });
  m.def("last_step_graph", [] { return OpProfile::last_step_graph(); },
        "MLX primitives of the last forward's graph by name, plus 'total' (LLMD_PROFILE=1; "
        "device backend and MLX ops of the cpu backend alike).");
  m.def("record_step_graphs", &OpProfile::set_step_graph_recording, py::arg("on"),
        "Record each step's graph for last_step_graph() without LLMD_PROFILE's timers.");
  m.def("thread_count", [] { return ThreadPool::global().size(); });
  m.def("active_kernel_path", [] { return std::string(kernels::active_table().isa); });
  // The cuda backend (native/cuda): whether this build has it and a device is present, and the
  // device's memory for the KV budget's default (worker/host.py: auto_kv_budget).
#ifdef LLMD_WITH_CUDA
  m.def("cuda_available", [] { return cuda::cuda_available(); });
  m.def("cuda_memory_info", [] {
    const auto [free_bytes, total_bytes] = cuda::device_memory_info();
    py::dict d;
    d["free"] = free_bytes;
    d["total"] = total_bytes;
    return d;
  });
#else
  m.def("cuda_available", [] { return false; });
#endif
  m.def("runnable_kernel_paths", [] {
    std::vector<std::string> names;
    for (const auto* t : kernels::runnable_tables()) names.emplace_back(t->isa);
    return names;
  });
  m.def("float_gemm", &float_gemm_numpy, py::arg("x"), py::arg("w"), py::arg("half") = false,
        py::arg("bias") = std::nullopt, py::arg("gelu_tanh") = false, py::arg("residual") = std::nullopt,
        "llmd's float GEMM (float_gemm.h): x [rows, k] @ w [n, k]^T, + bias, GELU-tanh, + residual; the "
        "weight in float16 panels with half (float16_panels_supported()).");
  m.def("float16_panels_supported", &float16_panels_supported);
  m.def("kernel_gemm", &kernel_gemm, py::arg("type"), py::arg("weight"), py::arg("n"), py::arg("k"),
        py::arg("x"), py::arg("isa") = "", py::arg("packed") = false,
        "out[r, j] = dot(weight row j, x row r) with llmd's kernel for `type` on path `isa` "
        "(with `packed`, the kernel for the 8-row packed layout the engine loads weights into).");
  m.def("pack8", &pack8_bytes, py::arg("type"), py::arg("weight"), py::arg("n"), py::arg("k"), py::arg("isa") = "",
        "Rows of `type` (n x k, GGUF layout) in the 8-row packed layout the engine loads them into on "
        "kernel path `isa` (default: the active one).");
  m.def("unpack8_row", &unpack8_bytes, py::arg("type"), py::arg("packed"), py::arg("n"), py::arg("k"),
        py::arg("row"), py::arg("isa") = "", "Row `row` of a pack8 matrix (packed for path `isa`) back in GGUF's block layout.");
  m.def("kernel_attention", &kernel_attention, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("n_pos"),
        py::arg("first_pos"), py::arg("kv_type") = "f16", py::arg("isa") = "", py::arg("tile_rows") = 1,
        py::arg("rotate") = false, py::arg("span_tasks") = false,
        "out[r] = softmax(q[r] . k[first_pos[r]:n_pos[r]]) v[...] with llmd's attention kernel over "
        "pool-layout KV stored as kv_type (f32, f16, q8_0, q4_0; q pre-scaled), on the variant of kernel "
        "path `isa`; with `rotate`, q, k and v Hadamard-rotated first and the output rotated back, as "
        "the engine does around quantized KV; with `span_tasks`, each tile that reads more than one "
        "span run as one task per span and folded, as the engine runs a decode of few sequences.");
  m.def("hadamard_rotate", [](py::array_t<float, py::array::c_style> x, int block) {
    if (x.ndim() != 2 || block < 1 || (block & (block - 1)) != 0 || x.shape(1) % block != 0) {
      throw std::invalid_argument("x [rows, d] with d a multiple of block, a power of two");
    }
    py::array_t<float> out({x.shape(0), x.shape(1)});
    std::memcpy(out.mutable_data(), x.data(), x.nbytes());
    for (py::ssize_t r = 0; r < x.shape(0); ++r) {
      hadamard::rotate(out.mutable_data() + r * x.shape(1), static_cast<int>(x.shape(1)), block);
    }
    return out;
  }, py::arg("x"), py::arg("block"),
        "Each row's runs of `block` numbers times the orthonormal Hadamard matrix (core/hadamard.h).");
  m.def("kv_disk_checksum", [](py::bytes data, uint64_t seed) {
    const std::string_view bytes = data;
    return DiskKvTier::checksum(bytes.data(), bytes.size(), seed);
  }, py::arg("data"), py::arg("seed") = 0, "The disk tier's checksum of `data` (tests forge and check block files).");
  m.def("hadamard_blocks", [](int head_dim) {
    return std::make_pair(hadamard::key_block(head_dim), hadamard::value_block(head_dim));
  }, py::arg("head_dim"), "(key, value) rotation sizes the engine uses around quantized KV of this head size.");
  m.def("kv_roundtrip", &kv_roundtrip, py::arg("k"), py::arg("v"), py::arg("kv_type"),
        "(k, v) [n, d] as a KV pool of quantized kv_type stores and reads them back.");
  m.def("attention_kernel_path", [](const std::string& isa) {
    if (!isa.empty() && !kernels::table_named(isa)) {
      throw std::invalid_argument("kernel path '" + isa + "' is not runnable on this CPU");
    }
    return std::string((isa.empty() ? attention_kernels() : attention_kernels_for(isa)).isa);
  }, py::arg("isa") = "", "The attention variant that runs with matmul kernel path `isa` (default: the active one).");
  m.def("packed_kernel_types", [](const std::string& isa) {
    const kernels::KernelTable* table = isa.empty() ? &kernels::active_table() : kernels::table_named(isa);
    if (!table) throw std::invalid_argument("kernel path '" + isa + "' is not runnable on this CPU");
    std::vector<std::string> types;
    for (TensorType t : kKernelTypes) {
      if (table->packed_gemm_for(t)) types.push_back(type_name(t));
    }
    return types;
  }, py::arg("isa") = "", "Weight types that path `isa` runs in the 8-row packed layout.");
}
