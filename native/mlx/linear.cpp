#include "linear.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "../core/dequantize.h"
#include "../core/huge_pages.h"
#include "compiled_ops.h"
#include "encoder_ops.h"
#include "float_gemm.h"
#include "kernels/pack8.h"
#include "quantized_matmul.h"

namespace llmd {

mx::array owned_bytes(size_t n) {
  // MLX-owned buffer so the weights live as long as any graph that uses them. Filled on the
  // CPU whatever the default device: the host writes it next. Weights are read whole every
  // decode step, so the buffer asks for 2 MiB pages before its first write (huge_pages.h):
  // a large malloc is fresh, untouched memory; a reused one just keeps its pages.
  mx::allocator::Data data = mx::allocator::malloc(n);
  void* p = data.buffer().raw_ptr();
  advise_huge_pages(p, n);
  if (n > 0) std::memset(p, 0, n);
  return mx::array(std::move(data), {static_cast<int>(n)}, mx::uint8);
}

namespace {
thread_local bool skip_weight_bytes = false;
}  // namespace

SkipWeightBytes::SkipWeightBytes() : previous_(skip_weight_bytes) { skip_weight_bytes = true; }
SkipWeightBytes::~SkipWeightBytes() { skip_weight_bytes = previous_; }
bool SkipWeightBytes::active() { return skip_weight_bytes; }

namespace {
std::string device_name() { return mx::default_device() == mx::Device::gpu ? "gpu" : "cpu"; }

// silu(gate) * up of y [rows, 2 * half]: gate and up in the two halves, or in adjacent
// columns when `interleaved`.
mx::array swiglu(const mx::array& y, bool interleaved) {
  const int rows = y.shape(0);
  const int half = y.shape(1) / 2;
  mx::array g{0.f}, u{0.f};
  if (interleaved) {
    mx::array pairs = mx::reshape(y, {rows, half, 2});
    g = mx::squeeze(mx::slice(pairs, {0, 0, 0}, {rows, half, 1}), 2);
    u = mx::squeeze(mx::slice(pairs, {0, 0, 1}, {rows, half, 2}), 2);
  } else {
    g = mx::slice(y, {0, 0}, {rows, half});
    u = mx::slice(y, {0, half}, {rows, 2 * half});
  }
  return silu_mul(g, u);
}
}  // namespace

Linear Linear::from_gguf(const std::vector<const TensorView*>& parts, bool interleave_pairs, bool on_device) {
  if (parts.empty()) throw std::invalid_argument("Linear needs at least one tensor");
  Linear lin;
  lin.type_ = parts[0]->type;
  lin.k_ = static_cast<int>(parts[0]->shape[0]);
  bool one_type = true;
  for (const TensorView* p : parts) {
    if (p->shape.size() != 2 || p->shape[0] != lin.k_) {
      throw std::invalid_argument("cannot stack " + p->name + " with " + parts[0]->name);
    }
    one_type = one_type && p->type == lin.type_;
    lin.n_ += static_cast<int>(p->shape[1]);
  }
  if (!one_type) {
    // One Linear per run of same-typed parts; gate and up (interleave_pairs) are two runs, so
    // their outputs come as the halves a SwiGLU over the concatenation expects.
    std::vector<Linear> pieces;
    for (auto run = parts.begin(); run != parts.end();) {
      auto end = std::find_if(run, parts.end(), [&](const TensorView* p) { return p->type != (*run)->type; });
      pieces.push_back(from_gguf({run, end}, false, on_device));
      run = end;
    }
    return concatenated(std::move(pieces));
  }
  if (interleave_pairs && (parts.size() != 2 || parts[0]->shape[1] != parts[1]->shape[1])) {
    throw std::invalid_argument("interleaving needs two tensors of equal shape");
  }
  if (on_device) {
    if (SkipWeightBytes::active()) {
      lin.quantized_ = is_quantized(lin.type_);
      return lin;  // the device backend re-quantizes every block type it reads
    }
    std::vector<RowRef> rows;
    rows.reserve(lin.n_);
    if (interleave_pairs) {
      for (int64_t r = 0; r < parts[0]->shape[1]; ++r) {
        for (const TensorView* p : parts) rows.push_back({p, r});
      }
    } else {
      for (const TensorView* p : parts) {
        for (int64_t r = 0; r < p->shape[1]; ++r) rows.push_back({p, r});
      }
    }
    lin.interleaved_ = interleave_pairs;
    lin.quantized_ = is_quantized(lin.type_);
    lin.device_ = device_weight_from_rows(rows, lin.type_, lin.k_);
    lin.device_name_ = device_name();
    return lin;
  }
  const kernels::KernelTable& table = kernels::active_table();
  if (is_quantized(lin.type_)) {
    if (!table.gemm_for(lin.type_)) {
      throw std::runtime_error("tensor " + parts[0]->name + " is " + type_name(lin.type_) +
                               ", which this build of llmd cannot run natively yet");
    }
    lin.quantized_ = true;
    const size_t rb = row_bytes(lin.type_, lin.k_);
    if (SkipWeightBytes::active()) return lin;
    mx::array bytes = owned_bytes(rb * lin.n_);
    uint8_t* dst = bytes.data<uint8_t>();
    if (interleave_pairs) {
      for (int64_t r = 0; r < parts[0]->shape[1]; ++r) {
        for (const TensorView* p : parts) {
          std::memcpy(dst, p->data + r * rb, rb);
          dst += rb;
        }
      }
      lin.interleaved_ = true;
    } else {
      for (const TensorView* p : parts) {
        std::memcpy(dst, p->data, p->n_bytes);
        dst += p->n_bytes;
      }
    }
    lin.weight_ = mx::reshape(bytes, {lin.n_, static_cast<int>(rb)});
    lin.weight_.eval();
    lin.pack_for_kernels();
  } else if (!SkipWeightBytes::active()) {
    std::vector<float> f(static_cast<size_t>(lin.n_) * lin.k_);
    size_t row = 0;
    for (const TensorView* p : parts) {
      for (int64_t r = 0; r < p->shape[1]; ++r, ++row) {
        dequantize_row(p->type, p->data + r * row_bytes(p->type, lin.k_), f.data() + row * lin.k_, lin.k_);
      }
    }
    lin.weight_ = mx::array(f.begin(), {lin.n_, lin.k_}, mx::float32);
    lin.weight_.eval();
  }
  return lin;
}

Linear Linear::concatenated(std::vector<Linear> pieces) {
  if (pieces.empty()) throw std::invalid_argument("Linear needs at least one piece");
  if (pieces.size() == 1) return std::move(pieces.front());
  Linear lin;
  lin.type_ = pieces.front().type_;
  lin.k_ = pieces.front().k_;
  for (const Linear& piece : pieces) {
    if (piece.k_ != lin.k_) throw std::invalid_argument("cannot concatenate Linears of different input widths");
    lin.n_ += piece.n_;
    lin.quantized_ = lin.quantized_ || piece.quantized_;
  }
  lin.pieces_ = std::move(pieces);
  return lin;
}

Linear Linear::from_float(mx::array weight, bool on_device) {
  Linear lin;
  lin.type_ = TensorType::F32;
  lin.n_ = weight.shape(0);
  lin.k_ = weight.shape(1);
  if (on_device) {
    lin.device_ = device_weight_from_float(weight);
    lin.device_name_ = device_name();
    return lin;
  }
  lin.weight_ = mx::astype(weight, mx::float32);
  lin.weight_.eval();
  return lin;
}

namespace {

// Float32 host copy of a float tensor (scales, biases) on the CPU stream.
mx::array host_f32(const mx::array& a) {
  mx::array f = mx::contiguous(mx::astype(a, mx::float32, mx::default_stream(mx::Device::cpu)), false,
                               mx::default_stream(mx::Device::cpu));
  f.eval();
  return f;
}

// MLX 4-bit affine rows (element 2j in the low nibble of byte j) as GGUF Q4_1 blocks
// (d, m as float16, qs[i] = q[i] | q[i + 16] << 4). Empty when a scale or bias is not a
// float16 value (the repack would not be exact).
std::optional<mx::array> repack_q4_1(const std::vector<Linear::MlxQuantized>& parts, int group, int k,
                                     bool interleave) {
  const auto cpu = mx::default_stream(mx::Device::cpu);
  struct Part {
    mx::array q, s, b;
    int rows;
  };
  std::vector<Part> ps;
  int n = 0;
  for (const auto& p : parts) {
    mx::array q = mx::contiguous(p.w, false, cpu);
    q.eval();
    mx::array sf = host_f32(p.scales), bf = host_f32(p.biases);
    // The float16 values of the scales and biases, and whether they are exact.
    mx::array sh = mx::astype(sf, mx::float16, cpu), bh = mx::astype(bf, mx::float16, cpu);
    mx::array exact = mx::logical_and(mx::all(mx::equal(mx::astype(sh, mx::float32, cpu), sf, cpu), cpu),
                                      mx::all(mx::equal(mx::astype(bh, mx::float32, cpu), bf, cpu), cpu), cpu);
    if (!exact.item<bool>()) return std::nullopt;
    mx::array s16 = mx::contiguous(mx::view(sh, mx::uint16, cpu), false, cpu);
    mx::array b16 = mx::contiguous(mx::view(bh, mx::uint16, cpu), false, cpu);
    mx::eval({s16, b16});
    ps.push_back({q, s16, b16, p.w.shape(0)});
    n += p.w.shape(0);
  }
  const size_t rb = row_bytes(TensorType::Q4_1, k);
  mx::array bytes = owned_bytes(rb * n);
  uint8_t* dst = bytes.data<uint8_t>();
  const int gpr = k / group;  // groups per row
  auto write_row = [&](const Part& p, int r) {
    const uint8_t* q = reinterpret_cast<const uint8_t*>(p.q.data<uint32_t>()) + static_cast<size_t>(r) * k / 2;
    const uint16_t* sc = p.s.data<uint16_t>() + static_cast<size_t>(r) * gpr;
    const uint16_t* bi = p.b.data<uint16_t>() + static_cast<size_t>(r) * gpr;
    for (int blk = 0; blk < k / 32; ++blk) {
      const int g = blk * 32 / group;
      std::memcpy(dst, &sc[g], 2);
      std::memcpy(dst + 2, &bi[g], 2);
      const uint8_t* src = q + blk * 16;  // 32 nibbles
      auto nib = [&](int j) { return static_cast<uint8_t>(j & 1 ? src[j / 2] >> 4 : src[j / 2] & 0x0f); };
      for (int i = 0; i < 16; ++i) dst[4 + i] = static_cast<uint8_t>(nib(i) | (nib(i + 16) << 4));
      dst += 20;
    }
  };
  if (interleave) {
    for (int r = 0; r < ps[0].rows; ++r) {
      for (const Part& p : ps) write_row(p, r);
    }
  } else {
    for (const Part& p : ps) {
      for (int r = 0; r < p.rows; ++r) write_row(p, r);
    }
  }
  mx::array w = mx::reshape(bytes, {n, static_cast<int>(rb)});
  w.eval();
  return w;
}

}  // namespace

Linear Linear::from_mlx_quantized(const std::vector<MlxQuantized>& parts, int bits, int group, bool on_device,
                                  bool interleave_pairs) {
  if (parts.empty()) throw std::invalid_argument("Linear needs at least one tensor");
  if (bits != 4 && bits != 8) {
    throw std::runtime_error("MLX-quantized weights of " + std::to_string(bits) + " bits are not supported (4 or 8)");
  }
  if (group != 32 && group != 64 && group != 128) {
    throw std::runtime_error("MLX quantization group size " + std::to_string(group) +
                             " is not supported (32, 64 or 128)");
  }
  Linear lin;
  lin.k_ = parts[0].w.shape(1) * 32 / bits;
  for (const auto& p : parts) {
    if (p.w.ndim() != 2 || p.w.dtype() != mx::uint32 || p.w.shape(1) * 32 / bits != lin.k_ ||
        p.scales.shape() != mx::Shape{p.w.shape(0), lin.k_ / group} || p.biases.shape() != p.scales.shape()) {
      throw std::runtime_error("MLX-quantized weight parts do not match " + std::to_string(bits) + "-bit groups of " +
                               std::to_string(group));
    }
    lin.n_ += p.w.shape(0);
  }
  if (interleave_pairs && (parts.size() != 2 || parts[0].w.shape(0) != parts[1].w.shape(0))) {
    throw std::invalid_argument("interleaving needs two tensors of equal shape");
  }
  lin.quantized_ = true;
  lin.mlx_format_ = "affine" + std::to_string(bits) + "g" + std::to_string(group);
  if (!on_device && bits == 4 && kernels::active_table().gemm_for(TensorType::Q4_1)) {
    if (auto q = repack_q4_1(parts, group, lin.k_, interleave_pairs)) {
      lin.type_ = TensorType::Q4_1;
      lin.weight_ = *q;
      lin.interleaved_ = interleave_pairs;
      lin.pack_for_kernels();
      return lin;
    }
  }
  std::vector<mx::array> w, s, b;
  for (const auto& p : parts) {
    w.push_back(p.w);
    s.push_back(p.scales);
    b.push_back(p.biases);
  }
  lin.device_ = device_weight_from_mlx(w, s, b, bits, group);
  lin.device_name_ = device_name();
  lin.host_mlx_ = !on_device;
  return lin;
}

mx::array Linear::device_forward(const mx::array& x, const Fused& fused) const {
  // The product runs in the compute dtype and the result comes back in x's: an architecture
  // whose residual stream is already in the compute dtype (llama.cpp on the device backend)
  // pays no cast here; one that keeps a float32 stream pays one cast in and one out.
  mx::array h = fused.rms_norm_weight ? rms_norm(x, *fused.rms_norm_weight, fused.eps) : x;  // compiled_ops.h
  mx::array y = device_->matmul(mx::astype(h, device_compute_dtype()));
  if (y.dtype() != x.dtype()) y = mx::astype(y, x.dtype());
  if (fused.swiglu) y = swiglu(y, interleaved_);
  if (fused.residual) y = mx::add(*fused.residual, y);
  return y;
}

mx::array Linear::split_forward(const mx::array& x, const Fused& fused) const {
  // The device backend's norm compiled (compiled_ops.h); the host backend's as MLX's op.
  mx::array h = !fused.rms_norm_weight ? x
                : on_device()          ? rms_norm(x, *fused.rms_norm_weight, fused.eps)
                                       : mx::fast::rms_norm(x, *fused.rms_norm_weight, fused.eps);
  std::vector<mx::array> ys;
  ys.reserve(pieces_.size());
  for (const Linear& piece : pieces_) ys.push_back(piece(h));
  mx::array y = mx::concatenate(ys, -1);
  if (fused.swiglu) y = swiglu(y, false);
  if (fused.residual) y = mx::add(*fused.residual, y);
  return y;
}

void Linear::pack_for_kernels() {
  const kernels::KernelTable& table = kernels::active_table();
  if (n_ % kernels::kPackRows != 0 || !table.packed_gemm_for(type_)) return;
  kernels::pack8_in_place(type_, weight_.data<uint8_t>(), n_, k_, table.pack_layout);
  packed_ = true;
}

mx::array Linear::operator()(const mx::array& x, const Fused& fused) const {
  if (!pieces_.empty()) return split_forward(x, fused);
  if (device_) return device_forward(x, fused);
  if (quantized_) {
    if (fused.swiglu && !interleaved_) throw std::logic_error("fused SwiGLU needs interleaved gate/up rows");
    QuantizedMatmulSpec spec;
    spec.type = type_;
    spec.n = n_;
    spec.k = k_;
    spec.packed = packed_;
    spec.rms_norm = fused.rms_norm_weight.has_value();
    spec.eps = fused.eps;
    spec.epilogue = fused.swiglu ? Epilogue::SwiGLU : fused.residual ? Epilogue::AddResidual : Epilogue::None;
    return quantized_matmul(x, weight_, spec, fused.rms_norm_weight, fused.residual);
  }
  // Float weights: the same maths as separate MLX ops.
  mx::array h = fused.rms_norm_weight ? mx::fast::rms_norm(x, *fused.rms_norm_weight, fused.eps) : x;
  mx::array y = float_panels_ ? float_gemm(h, weight_, n_, k_) : mx::matmul(h, mx::transpose(weight_));
  if (fused.swiglu) y = swiglu(y, false);
  if (fused.residual) y = mx::add(*fused.residual, y);
  return y;
}

mx::array Linear::with_epilogue(const mx::array& x, const FloatGemmEpilogue& e) const {
  if (float_panels_) return float_gemm(x, weight_, n_, k_, e);
  mx::array y = (*this)(x);
  if (e.gelu_tanh) {
    if (on_device()) {
      if (e.bias) y = mx::add(y, *e.bias);
      const float c = std::sqrt(2.f / static_cast<float>(M_PI));
      mx::array cube = mx::multiply(mx::multiply(y, y), y);
      mx::array inner = mx::multiply(mx::array(c), mx::add(y, mx::multiply(mx::array(0.044715f), cube)));
      y = mx::multiply(mx::multiply(mx::array(0.5f), y), mx::add(mx::array(1.f), mx::tanh(inner)));
    } else {
      y = bias_gelu(y, e.bias, true);  // MLX's CPU tanh runs one float at a time
    }
  } else if (e.bias) {
    y = mx::add(y, *e.bias);
  }
  if (e.residual) y = mx::add(*e.residual, y);
  return y;
}

size_t Linear::resident_bytes() const {
  if (!pieces_.empty()) {
    size_t n = 0;
    for (const Linear& piece : pieces_) n += piece.resident_bytes();
    return n;
  }
  if (device_) return device_->w.nbytes() + (device_->bits ? device_->scales.nbytes() + device_->biases.nbytes() : 0);
  return weight_.nbytes();
}

std::string Linear::path() const {
  if (!pieces_.empty()) {
    std::string paths;
    for (const Linear& piece : pieces_) paths += (paths.empty() ? "" : "+") + piece.path();
    return paths;
  }
  std::string t = type_name(type_);
  for (auto& c : t) c = static_cast<char>(std::tolower(c));
  if (device_ && !mlx_format_.empty()) return "mlx:qmm:" + mlx_format_ + ":" + device_name_;
  if (device_) {
    return (device_->bits ? "mlx:qmm:" : "mlx:matmul:") + t + "->" + device_->format() + ":" + device_name_;
  }
  if (quantized_) {
    return std::string("llmd:") + t + ":" + kernels::active_table().isa + (packed_ ? ":x8" : "");
  }
  if (float_panels_) return weight_.dtype() == mx::float16 ? "llmd:f16:gemm" : "llmd:f32:gemm";
  return "mlx:matmul:f32";
}

void Linear::use_host_float_gemm() {
  if (!pieces_.empty() || device_ || quantized_ || float_panels_ || SkipWeightBytes::active()) return;
  // An F16 tensor's float32 copy holds float16 values only: the float16 panels are exact.
  weight_ = type_ == TensorType::F16 && float16_panels_supported() ? pack_float16_panels(weight_)
                                                                   : pack_float_panels(weight_);
  float_panels_ = true;
}

mx::array dequantize_tensor(const TensorView& t) {
  const int64_t n = t.n_elements();
  std::vector<float> f(n);
  const int64_t row = t.shape[0];
  for (int64_t r = 0; r < n / row; ++r) {
    dequantize_row(t.type, t.data + r * row_bytes(t.type, row), f.data() + r * row, row);
  }
  mx::Shape shape;
  for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) shape.push_back(static_cast<int>(*it));
  mx::array a(f.begin(), shape, mx::float32);
  a.eval();
  return a;
}

}  // namespace llmd
