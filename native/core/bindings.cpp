// pybind11 module llmd._engine: the typed C++ API the worker host calls. No JSON crosses
// here; the GIL is released whenever the engine may block or compute.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <mutex>
#include <stdexcept>

#include "../mlx/kernels/pack8.h"
#include "../mlx/kernels/qgemm.h"
#include "engine.h"
#include "op_profile.h"
#include "thread_pool.h"

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
      break;
    case EngineEvent::Kind::Done:
      d["type"] = "done";
      d["finish_reason"] = e.finish_reason;
      d["prompt_tokens"] = e.prompt_tokens;
      d["completion_tokens"] = e.completion_tokens;
      d["cached_tokens"] = e.cached_tokens;
      d["timings"] = py::dict(py::arg("queued_ms") = e.queued_ms, py::arg("prefill_ms") = e.prefill_ms,
                              py::arg("decode_ms") = e.decode_ms);
      break;
    case EngineEvent::Kind::Error:
      d["type"] = "error";
      d["code"] = e.code;
      d["message"] = e.message;
      break;
  }
  return d;
}

std::unique_ptr<Engine> make_engine(const std::string& path, int context_length, int max_sequences,
                                    int step_token_budget, size_t kv_budget_bytes, const py::dict& hf_config,
                                    const std::string& backend) {
  Metadata hf = metadata_from_dict(hf_config);
  py::gil_scoped_release release;
  LoadOptions load;
  load.context_length = context_length;
  load.backend = backend;
  auto model = load_model(path, load, hf);
  EngineOptions opts;
  opts.max_sequences = max_sequences;
  opts.step_token_budget = step_token_budget;
  opts.kv_budget_bytes = kv_budget_bytes;
  opts.context_length = context_length;
  return std::make_unique<Engine>(std::move(model), opts);
}

py::array_t<float> kernel_gemm(const std::string& type, py::array_t<uint8_t, py::array::c_style> w, int n, int k,
                               py::array_t<float, py::array::c_style> x, const std::string& isa, bool packed) {
  const kernels::KernelTable* table = isa.empty() ? &kernels::active_table() : kernels::table_named(isa);
  if (!table) throw std::invalid_argument("kernel path '" + isa + "' is not runnable on this CPU");
  TensorType tt = TensorType::F32;
  bool known = false;
  for (TensorType t : {TensorType::Q4_0, TensorType::Q4_1, TensorType::Q8_0, TensorType::Q4_K, TensorType::Q6_K}) {
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
  for (int r = 0; r < rows; ++r) table->quantize_row(x.data() + static_cast<size_t>(r) * k, act.data() + static_cast<size_t>(r) * (k / kernels::kBlock), k);
  if (packed) {
    // The layout the engine packs weights into at load time, packed by the same function.
    std::vector<uint8_t> bytes(w.data(), w.data() + w.size());
    kernels::pack8_in_place(tt, bytes.data(), n, k);
    table->packed_gemm_for(tt)(bytes.data(), rb, act.data(), k, rows, 0, n, out.mutable_data(), n);
  } else {
    table->gemm_for(tt)(w.data(), rb, act.data(), k, rows, 0, n, out.mutable_data(), n);
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(_engine, m) {
  m.doc() = "llmd native engine (C++ on MLX)";

  py::class_<Engine>(m, "Engine")
      .def(py::init(&make_engine), py::arg("model_path"), py::arg("context_length") = 0,
           py::arg("max_sequences") = 8, py::arg("step_token_budget") = 512,
           py::arg("kv_budget_bytes") = size_t{1} << 30, py::arg("hf_config") = py::dict(),
           py::arg("backend") = "auto")
      .def(
          "submit",
          [](Engine& e, const std::string& id, std::vector<int32_t> prompt, int max_tokens, float temperature,
             int top_k, float top_p, float min_p, uint64_t seed, std::vector<int32_t> stop_tokens,
             std::string session, float frequency_penalty, float presence_penalty, float repetition_penalty,
             std::vector<std::pair<int32_t, float>> logit_bias, int top_logprobs, py::object constraint,
             std::string prefill_of, int repetition_window) {
            GenerateRequest r;
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
          py::arg("repetition_window") = 0)
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
             py::dict hist;
             for (const auto& [k, v] : s.sampled_rows_histogram) hist[py::str(std::to_string(k))] = v;
             d["sampled_rows_histogram"] = hist;
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
             return d;
           })
      .def_property_readonly("context_length", &Engine::context_length)
      .def_property_readonly("max_sequences", [](Engine& e) { return e.options().max_sequences; })
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
      }, py::arg("tokens"), py::arg("first_scored") = 1);

  m.def("set_threads", &ThreadPool::configure_global, py::arg("n_threads"),
        "Size llmd's kernel thread pool (0: all cores / LLMD_THREADS).");
  m.def("profile", [] { return OpProfile::snapshot_ms(); },
        "Wall ms and calls per op kind since start (LLMD_PROFILE=1 enables it).");
  m.def("profile_reset", [] { OpProfile::reset(); });
  m.def("last_step_graph", [] { return OpProfile::last_step_graph(); },
        "MLX primitives of the last forward's graph by name, plus 'total' (LLMD_PROFILE=1; "
        "device backend and MLX ops of the cpu backend alike).");
  m.def("thread_count", [] { return ThreadPool::global().size(); });
  m.def("active_kernel_path", [] { return std::string(kernels::active_table().isa); });
  m.def("runnable_kernel_paths", [] {
    std::vector<std::string> names;
    for (const auto* t : kernels::runnable_tables()) names.emplace_back(t->isa);
    return names;
  });
  m.def("kernel_gemm", &kernel_gemm, py::arg("type"), py::arg("weight"), py::arg("n"), py::arg("k"),
        py::arg("x"), py::arg("isa") = "", py::arg("packed") = false,
        "out[r, j] = dot(weight row j, x row r) with llmd's kernel for `type` on path `isa` "
        "(with `packed`, the kernel for the 8-row packed layout the engine loads weights into).");
  m.def("packed_kernel_types", [](const std::string& isa) {
    const kernels::KernelTable* table = isa.empty() ? &kernels::active_table() : kernels::table_named(isa);
    if (!table) throw std::invalid_argument("kernel path '" + isa + "' is not runnable on this CPU");
    std::vector<std::string> types;
    for (TensorType t : {TensorType::Q4_0, TensorType::Q4_1, TensorType::Q8_0}) {
      if (table->packed_gemm_for(t)) types.push_back(type_name(t));
    }
    return types;
  }, py::arg("isa") = "", "Weight types that path `isa` runs in the 8-row packed layout.");
}
