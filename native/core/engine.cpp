#include "engine.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "op_profile.h"

namespace llmd {

namespace {
double ms_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
}  // namespace

namespace {
constexpr int kMaxDraft = 32;  // drafted tokens per sequence and step, at most

KvShape kv_shape_for(const Model& model, const EngineOptions& options) {
  KvShape shape = model.kv_shape();
  if (kv_type_quantized(options.kv_type) && !model.supports_quantized_kv()) {
    throw std::invalid_argument(std::string("KV type ") + kv_type_name(options.kv_type) + " is not supported on the " +
                                model.info().backend + " backend (its KV is float16)");
  }
  // The CPU backend stores any type in the pool's blocks; a device backend keeps float KV in
  // its own compute dtype (f16 is the default, not a demand) or GGML's blocks in MLX arrays
  // (device_attention.h), whose bytes the pool then budgets.
  if (shape.host_storage || kv_type_quantized(options.kv_type)) shape.type = options.kv_type;
  return shape;
}
}  // namespace

namespace {
std::unique_ptr<ModelDrafter> make_drafter(const Model& target, std::unique_ptr<Model> draft,
                                           const EngineOptions& options) {
  if (!draft) return nullptr;
  const ModelInfo& t = target.info();
  const ModelInfo& d = draft->info();
  // Token ids are what the two models exchange: the same vocabulary is what makes a draft
  // meaningful (the worker compares the tokenizers' tokens too; this is the engine's floor).
  if (d.vocab_size != t.vocab_size) {
    throw std::invalid_argument("the draft model's vocabulary (" + std::to_string(d.vocab_size) +
                                " tokens) differs from the model's (" + std::to_string(t.vocab_size) + ")");
  }
  if (draft->has_recurrent_state() || draft->bidirectional()) {
    throw std::invalid_argument("a " + d.architecture + " model cannot draft (recurrent or bidirectional layers)");
  }
  // The draft KV gets a budget of its own, as large as the target's: blocks are allocated as
  // used, and a draft model is smaller per position than its target.
  return std::make_unique<ModelDrafter>(std::move(draft), options.kv_budget_bytes, options.kv_type);
}
}  // namespace

Engine::Engine(std::unique_ptr<Model> model, EngineOptions options, std::unique_ptr<Model> draft)
    : model_(std::move(model)),
      recurrent_(model_->has_recurrent_state()),
      bidirectional_(model_->bidirectional()),
      device_sampling_(model_->samples_on_device()),
      options_(options),
      // --context-length may go beyond the trained context (as llama-server's -c and Ollama's
      // num_ctx): positions past it are computed the same way, their quality is not guaranteed.
      context_length_(options.context_length > 0 ? options.context_length : model_->info().context_length),
      drafter_(make_drafter(*model_, std::move(draft), options)),
      // The head's KV gets a budget as large as the model's, as a draft model's does (blocks
      // are allocated as used; the head has one attention layer).
      mtp_(model_->mtp() ? std::make_unique<MtpDrafter>(*model_->mtp(), model_->info().hidden_size,
                                                        model_->info().vocab_size, options.kv_budget_bytes,
                                                        options.kv_type)
                         : nullptr),
      pool_(kv_shape_for(*model_, options), options.kv_budget_bytes),
      prefix_cache_(pool_),
      session_pins_(pool_) {
  if (options_.max_sequences < 1) options_.max_sequences = 1;
  if (options_.step_token_budget < options_.max_sequences) options_.step_token_budget = options_.max_sequences;
  step_cost_ = StepCost(options_.step_token_budget, options_.draft_row_cost);
  // Recurrent-state snapshots (one whole state each) may hold a quarter of the KV budget
  // beyond the KV itself; snapshots of running sequences and sessions are never dropped.
  prefix_cache_.set_state_budget(options_.kv_budget_bytes / 4);
  disk_off_reason_ = disk_tier_off_reason();
  if (disk_off_reason_.empty()) {
    // Everything a block's bytes depend on besides its tokens: the model file, how KV is
    // stored, and the layout of a block (a format change bumps the version; 2: quantized
    // blocks hold Hadamard-rotated keys and values, core/hadamard.h, so version 1's unrotated
    // ones must never match).
    const KvShape& shape = pool_.shape();
    std::string identity = "llmd-kv-disk-2|" + options_.model_digest + "|" + kv_type_name(shape.type) +
                           "|layers=" + std::to_string(shape.n_layers);
    for (int l = 0; l < shape.n_layers; ++l) {
      identity += "," + std::to_string(shape.kv_heads_of(l)) + "x" + std::to_string(shape.head_dim_of(l));
    }
    // A device backend's blocks are its store's rows (device_attention.h: each array's 64 rows
    // in turn), not the host pool's transposed tiles: the same model and KV type on the CPU
    // backend must never read them, nor they its.
    if (!shape.host_storage) identity += "|device-rows";
    try {
      disk_ = std::make_unique<DiskKvTier>(options_.kv_disk_dir, identity, pool_.block_bytes(),
                                           options_.kv_disk_bytes);
      if (pool_.shape().window > 0) {
        // A block's sliding-window layers live in its window part, which the pool frees once
        // no sequence's window covers it: kept apart, so a prefix loads its full-attention
        // layers for every block and window parts only for the window before its end.
        window_disk_ = std::make_unique<DiskKvTier>(options_.kv_disk_dir, identity + "|window-part",
                                                    pool_.window_part_bytes(), options_.kv_disk_bytes);
      }
      if (recurrent_) {
        // What a prefix of a recurrent model resumes from: the state after its last block, in
        // the model's own serialisation (Model::save_state), beside the blocks.
        state_disk_ = std::make_unique<DiskKvTier>(options_.kv_disk_dir, identity + "|recurrent-state",
                                                   model_->state_bytes(), options_.kv_disk_bytes);
      }
      prefix_cache_.set_evict_hook([this](uint64_t key, uint64_t parent, const int32_t* tokens, int block) {
        save_to_disk(key, parent, tokens, block);
        // A snapshot not written yet (a decode snapshot of a sequence still running) goes with
        // its block.
        if (state_disk_ && !state_disk_->contains(key)) {
          if (auto state = prefix_cache_.state_of(key)) save_state_to_disk(key, parent, tokens, *state);
        }
      });
      loader_ = std::make_unique<DiskLoader>(
          [this] {
            // Under mutex_, so the engine loop's wait cannot miss it.
            std::lock_guard<std::mutex> lock(mutex_);
            work_cv_.notify_all();
          },
          options_.kv_disk_read_delay_ms);
    } catch (const std::exception& ex) {
      disk_off_reason_ = std::string("cannot use ") + options_.kv_disk_dir + ": " + ex.what();
      // Off means every part of it: no tier half made (a second directory that failed).
      prefix_cache_.set_evict_hook(nullptr);
      loader_.reset();
      state_disk_.reset();
      window_disk_.reset();
      disk_.reset();
    }
  }
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    stats_.kv_disk_enabled = disk_ != nullptr;
    stats_.kv_disk_off_reason = disk_off_reason_;
    if (disk_) stats_.kv_disk_dir = disk_->dir();
  }
  thread_ = std::thread([this] { loop(); });
}

std::string Engine::disk_tier_off_reason() const {
  if (options_.kv_disk_bytes == 0 || options_.kv_disk_dir.empty()) return "off (--kv-disk 0)";
  if (options_.model_digest.empty()) return "no digest of the model file was given";
  const std::string& arch = model_->info().architecture;
  if (bidirectional_) return arch + " is an encoder: it has no prefix cache";
  if (recurrent_ && model_->state_bytes() == 0) return "not implemented yet for the recurrent state of " + arch;
  if (!model_->has_kv_block_io()) return "not implemented yet for KV kept on the " + model_->info().backend + " backend";
  if (pool_.block_bytes() == 0) return "every layer of " + arch + " is a sliding-window layer: not implemented yet";
  return "";
}

void Engine::save_to_disk(uint64_t key, uint64_t parent, const int32_t* tokens, int block) {
  if (!disk_) return;
  const bool full = !disk_->contains(key);
  // The window part, while the block still has it (a block is saved when it fills, so every
  // full block's part is written: any later prompt may end right after it).
  const bool window = window_disk_ && pool_.window_slot(block) >= 0 && !window_disk_->contains(key);
  if (!full && !window) return;
  // A copy, so the writer thread never reads a block the engine may reuse (~1.5 MB for the
  // test model, a memcpy, or a read of the device store's rows), while the write itself happens
  // off this thread. Device reads are MLX graphs: never beside another (forward_mutex_).
  std::lock_guard<std::recursive_mutex> lock(forward_mutex_);
  if (full) {
    std::vector<std::byte> payload(pool_.block_bytes());
    model_->read_kv_blocks(pool_, {block}, false, {payload.data()});
    disk_->put(key, parent, tokens, std::move(payload));
  }
  if (window) {
    std::vector<std::byte> payload(pool_.window_part_bytes());
    model_->read_kv_blocks(pool_, {block}, true, {payload.data()});
    window_disk_->put(key, parent, tokens, std::move(payload));
  }
}

void Engine::save_state_to_disk(uint64_t key, uint64_t parent, const int32_t* tokens, const SequenceState& state) {
  if (!state_disk_ || state_disk_->contains(key)) return;
  std::vector<std::byte> payload(model_->state_bytes());
  {
    std::lock_guard<std::recursive_mutex> lock(forward_mutex_);
    model_->save_state(state, payload.data());
  }
  state_disk_->put(key, parent, tokens, std::move(payload));
}

std::vector<int32_t> Engine::block_tokens(const Sequence& seq, size_t index) const {
  constexpr int BT = KvPool::kBlockTokens;
  std::vector<int32_t> tokens(BT);
  for (int i = 0; i < BT; ++i) tokens[i] = seq.token_at(static_cast<int>(index) * BT + i);
  return tokens;
}

bool Engine::start_disk_load(Sequence& seq, Admission& a) {
  constexpr int BT = KvPool::kBlockTokens;
  const auto& prompt = seq.request.prompt;
  const int limit = static_cast<int>(prompt.size()) - 1;  // one token always runs
  const bool on_host = pool_.shape().host_storage;
  PrefixCache::Match& m = a.m;
  // The chain on disk after the RAM blocks.
  uint64_t parent = m.keys.empty() ? 0 : m.keys.back();
  std::vector<uint64_t> keys;
  for (int start = m.full_tokens(); start + BT <= limit; start += BT) {
    const uint64_t key = PrefixCache::chain(parent, prompt.data() + start);
    if (!disk_->contains(key)) break;
    keys.push_back(key);
    parent = key;
  }
  const size_t ram = m.blocks.size();
  if (recurrent_) {
    // KV is reusable only with the state at exactly its end: stop the chain at the last block
    // whose snapshot is on disk, unless a longer prefix has one in RAM (then nothing is read).
    size_t end = keys.size();
    while (end > 0 && !state_disk_->contains(keys[end - 1])) --end;
    keys.resize(end);
    if (end == 0) return false;
    a.state_key = keys.back();
    a.state.resize(model_->state_bytes());
  }
  // Blocks to load into: each with one reference, so nothing evicts them meanwhile. Their
  // window part (allocate holds one for a sequence) comes only where the match's window needs
  // it, below.
  for (uint64_t key : keys) {
    const int block = pool_.allocate();
    if (block < 0) break;
    if (window_disk_) pool_.unhold_window(block, /*drop=*/true);
    a.loading.push_back(block);
    a.keys.push_back(key);
  }
  if (recurrent_ && a.loading.size() < keys.size()) {  // the snapshot's block did not fit
    for (int b : a.loading) pool_.release(b);
    a.loading.clear();
    a.keys.clear();
    a.state_key = 0;
    return false;
  }
  // The window parts the match's end reads (Gemma 3's sliding layers), where not in RAM.
  std::vector<int> all = m.blocks;
  all.insert(all.end(), a.loading.begin(), a.loading.end());
  std::vector<uint64_t> all_keys = m.keys;
  all_keys.insert(all_keys.end(), a.keys.begin(), a.keys.end());
  std::vector<size_t> window_index;
  if (window_disk_) {
    const int end = static_cast<int>(all.size());
    for (int i = pool_.first_window_block(end * BT, 0); i < end; ++i) {
      if (pool_.has_window_part(all[i]) || !window_disk_->contains(all_keys[i])) continue;
      if (!pool_.attach_window_part(all[i])) break;
      a.window_blocks.push_back(all[i]);
      window_index.push_back(static_cast<size_t>(i));
    }
  }
  if (a.loading.empty() && a.window_blocks.empty()) return false;

  auto job = std::make_shared<DiskLoad>();
  const auto read = [&](DiskKvTier* tier, size_t index, int chain, std::byte* dest) {
    DiskRead r;
    r.tier = tier;
    r.key = all_keys[index];
    r.parent = index == 0 ? 0 : all_keys[index - 1];
    std::copy(prompt.begin() + static_cast<long>(index) * BT, prompt.begin() + static_cast<long>(index + 1) * BT,
              r.tokens.begin());
    r.chain = chain;
    r.dest = dest;
    job->reads.push_back(r);
  };
  // A device backend's reads land in staging buffers, copied into its store when done.
  const size_t n_staged = on_host ? 0 : a.loading.size() + a.window_blocks.size();
  a.staging.resize(n_staged);
  // (A device pool has no host bytes: block_data and window_data are host storage only.)
  for (size_t i = 0; i < a.loading.size(); ++i) {
    std::byte* dest = nullptr;
    if (on_host) {
      dest = pool_.block_data(a.loading[i]);
    } else {
      a.staging[i].resize(pool_.block_bytes());
      dest = a.staging[i].data();
    }
    read(disk_.get(), ram + i, /*chain=*/1, dest);
  }
  for (size_t i = 0; i < a.window_blocks.size(); ++i) {
    std::byte* dest = nullptr;
    if (on_host) {
      dest = pool_.window_data(a.window_blocks[i]);
    } else {
      auto& buf = a.staging[a.loading.size() + i];
      buf.resize(pool_.window_part_bytes());
      dest = buf.data();
    }
    read(window_disk_.get(), window_index[i], 0, dest);
  }
  if (a.state_key != 0) read(state_disk_.get(), ram + a.loading.size() - 1, 0, a.state.data());
  a.job = job;
  loader_->submit(std::move(job));
  std::lock_guard<std::mutex> lock(stats_mutex_);
  stats_.kv_disk_loads += 1;
  return true;
}

void Engine::finish_disk_load(Sequence& seq) {
  Admission& a = *seq.admission;
  const auto& reads = a.job->reads;
  const bool on_host = pool_.shape().host_storage;
  const size_t n_windows = a.window_blocks.size();
  if (a.cancelled) {  // nothing is adopted: every block held or loaded goes back
    for (int b : a.window_blocks) pool_.unhold_window(b, /*drop=*/true);
    for (int b : a.loading) pool_.release(b);
    for (int b : a.held) pool_.release(b);
    if (a.partial >= 0) pool_.release(a.partial);
    seq.admission.reset();
    return;
  }
  size_t loaded = 0;
  while (loaded < a.loading.size() && reads[loaded].ok) ++loaded;
  // Device backends: the reads that verified into the store, in one graph per part.
  if (!on_host && (loaded > 0 || n_windows > 0)) {
    std::lock_guard<std::recursive_mutex> lock(forward_mutex_);
    if (loaded > 0) {
      std::vector<const std::byte*> in;
      for (size_t i = 0; i < loaded; ++i) in.push_back(a.staging[i].data());
      model_->write_kv_blocks(pool_, std::vector<int>(a.loading.begin(), a.loading.begin() + loaded), false, in);
    }
    std::vector<int> parts;
    std::vector<const std::byte*> in;
    for (size_t i = 0; i < n_windows; ++i) {
      if (!reads[a.loading.size() + i].ok) continue;
      parts.push_back(a.window_blocks[i]);
      in.push_back(a.staging[a.loading.size() + i].data());
    }
    if (!parts.empty()) model_->write_kv_blocks(pool_, parts, true, in);
  }
  // Window parts that failed go back to none (never read as loaded); a later check cuts the
  // match where a window is missing.
  for (size_t i = 0; i < n_windows; ++i) {
    if (!reads[a.loading.size() + i].ok) pool_.unhold_window(a.window_blocks[i], /*drop=*/true);
  }
  const auto& prompt = seq.request.prompt;
  constexpr int BT = KvPool::kBlockTokens;
  for (size_t i = 0; i < a.loading.size(); ++i) {
    if (i >= loaded) {
      pool_.release(a.loading[i]);  // never indexed: back to the free list
      continue;
    }
    const size_t index = a.m.blocks.size();
    const uint64_t parent = a.m.keys.empty() ? 0 : a.m.keys.back();
    prefix_cache_.insert(a.keys[i], parent, prompt.data() + index * BT, a.loading[i]);
    a.m.blocks.push_back(a.loading[i]);
    a.m.keys.push_back(a.keys[i]);
    a.held.push_back(a.loading[i]);
  }
  a.from_disk = static_cast<int>(loaded);
  if (loaded > 0) a.m.drop_partial();  // the partial candidate followed the RAM part only
  // The snapshot, where its block made it: into the prefix cache, where the match finds it.
  const DiskRead* state_read = a.state_key != 0 ? &reads.back() : nullptr;
  if (state_read && state_read->ok && loaded == a.loading.size()) {
    if (auto state = model_->load_state(a.state.data())) {
      prefix_cache_.attach_state(a.state_key, std::shared_ptr<const SequenceState>(std::move(state)));
      std::lock_guard<std::mutex> lock(stats_mutex_);
      stats_.kv_disk_state_hits += 1;
    }
  }
  a.staging.clear();
  a.state.clear();
  a.job.reset();
  complete_admit(seq, a);
  seq.admission.reset();
}

void Engine::collect_loads() {
  for (auto it = loading_.begin(); it != loading_.end();) {
    if (!(*it)->admission->job->done()) {
      ++it;
      continue;
    }
    std::unique_ptr<Sequence> seq = std::move(*it);
    it = loading_.erase(it);
    const bool cancelled = seq->admission->cancelled;
    finish_disk_load(*seq);
    if (cancelled) {
      finish(*seq, "cancelled");
      continue;
    }
    EngineEvent started;
    started.kind = EngineEvent::Kind::Started;
    started.id = seq->request.id;
    started.prompt_tokens = static_cast<int>(seq->request.prompt.size());
    started.cached_tokens = seq->cached;
    emit(std::move(started));
    active_.push_back(std::move(seq));
  }
}

void Engine::load_window_parts(PrefixCache::Match& m, const std::vector<int32_t>& prompt) {
  constexpr int BT = KvPool::kBlockTokens;
  for (int i = pool_.first_window_block(m.full_tokens(), 0); i < static_cast<int>(m.blocks.size()); ++i) {
    const int block = m.blocks[i];
    if (pool_.has_window_part(block)) continue;
    const uint64_t parent = i == 0 ? 0 : m.keys[i - 1];
    const int32_t* tokens = prompt.data() + static_cast<size_t>(i) * BT;
    if (window_disk_->contains(m.keys[i]) && pool_.attach_window_part(block)) {
      // Synchronous: only where an asynchronous load's chain broke early (start_disk_load
      // reads the parts of the window it expects).
      if (pool_.shape().host_storage) {
        if (window_disk_->get(m.keys[i], parent, tokens, pool_.window_data(block))) continue;
      } else {
        std::vector<std::byte> part(pool_.window_part_bytes());
        if (window_disk_->get(m.keys[i], parent, tokens, part.data())) {
          std::lock_guard<std::recursive_mutex> lock(forward_mutex_);
          model_->write_kv_blocks(pool_, {block}, true, {part.data()});
          continue;
        }
      }
      pool_.unhold_window(block, /*drop=*/true);  // back to no part: never read as loaded
    }
    // The match ends before this block; the window of that shorter prefix starts earlier.
    m.blocks.resize(i);
    m.keys.resize(i);
    m.drop_partial();
    i = pool_.first_window_block(m.full_tokens(), 0) - 1;
  }
}

Engine::~Engine() { shutdown(); }

void Engine::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // After the engine thread: no new loads; the reads in flight write into the pool and the
  // loading sequences' buffers, which must outlive them.
  if (loader_) loader_->stop();
}

int Engine::embedded_chunk(const Sequence& seq, int n) const {
  int end = seq.fed + n;
  for (const auto& e : seq.request.embeddings) {
    if (!e.bidirectional || end <= e.first || end >= e.first + e.rows) continue;
    // The chunk would end inside an image whose rows must all see one another: stop before
    // it, or, when the chunk starts inside or at it, run to its end past the budget.
    end = e.first > seq.fed ? e.first : e.first + e.rows;
  }
  return end - seq.fed;
}

void Engine::fill_embedded_rows(const Sequence& seq, StepSegment& s) const {
  const int n = static_cast<int>(s.tokens.size());
  const size_t hidden = static_cast<size_t>(model_->info().hidden_size);
  s.embeddings.assign(n, nullptr);
  s.attend_to.assign(n, 0);
  for (const auto& e : seq.request.embeddings) {
    const int lo = std::max(e.first, s.start_pos), hi = std::min(e.first + e.rows, s.start_pos + n);
    for (int p = lo; p < hi; ++p) {
      s.embeddings[p - s.start_pos] = e.values->data() + static_cast<size_t>(p - e.first) * hidden;
      if (e.bidirectional) s.attend_to[p - s.start_pos] = e.first + e.rows;
    }
  }
}

void Engine::fill_mrope_positions(const Sequence& seq, StepSegment& s) const {
  const auto& runs = seq.request.embeddings;
  if (std::none_of(runs.begin(), runs.end(), [](const auto& e) { return e.grid_h > 0; })) return;
  const int n = static_cast<int>(s.tokens.size());
  s.mrope.resize(n);
  // transformers' get_rope_index: text at its index plus the shift of the images before it;
  // an image's rows at (base, base + row, base + column) of its grid, base its first row's
  // shifted index; the text after it at base + max(grid_h, grid_w).
  size_t k = 0;
  int shift = 0;
  for (int i = 0; i < n; ++i) {
    const int p = s.start_pos + i;
    while (k < runs.size() && runs[k].first + runs[k].rows <= p) {
      const auto& e = runs[k++];
      if (e.grid_h > 0) shift += std::max(e.grid_h, e.grid_w) - e.rows;
    }
    const int32_t at = p + shift;
    if (k < runs.size() && runs[k].grid_h > 0 && p >= runs[k].first) {
      const int r = p - runs[k].first, base = runs[k].first + shift;
      s.mrope[i] = {base, base + r / runs[k].grid_w, base + r % runs[k].grid_w};
    } else {
      s.mrope[i] = {at, at, at};
    }
  }
}

std::string Engine::validate(const GenerateRequest& r, std::string& code) const {
  code = "invalid_request";
  if (r.id.empty()) return "request id is empty";
  if (r.prompt.empty()) return "prompt has no tokens";
  if (r.max_tokens < 0) return "max_tokens must be >= 0";
  if (r.max_draft < 0 || r.max_draft > kMaxDraft) return "max_draft must be 0.." + std::to_string(kMaxDraft);
  if (r.max_draft > 0 && bidirectional_) {
    code = "unsupported";
    return "speculative decoding does not apply to " + model_->info().architecture + " (an encoder)";
  }
  if (r.max_draft > 0 && r.draft_model && r.mtp) return "a request drafts with a draft model or an MTP head, not both";
  if (r.max_draft > 0 && r.draft_model && !drafter_) {
    code = "unsupported";
    return "no draft model is loaded (llmd serve --draft-model NAME)";
  }
  if (r.max_draft > 0 && r.mtp && !mtp_) {
    code = "unsupported";
    return "the model (" + model_->info().architecture + ") has no MTP head";
  }
  const int vocab = model_->info().vocab_size;
  if (r.output == GenerateRequest::Output::Embedding && !model_->supports_hidden()) {
    code = "unsupported";
    return model_->info().architecture + " models cannot compute embeddings in llmd yet";
  }
  if (bidirectional_ && r.output != GenerateRequest::Output::Embedding) {
    code = "unsupported";
    return model_->info().architecture + " is an encoder: it computes embeddings, it does not generate or score tokens";
  }
  if (!bidirectional_ && r.pooling == GenerateRequest::Pooling::Cls) {
    code = "unsupported";
    return "CLS pooling needs a bidirectional (encoder) model; " + model_->info().architecture + " is a decoder";
  }
  if (r.output != GenerateRequest::Output::Tokens && r.max_tokens != 0) {
    return "embedding and token-logits requests generate nothing: max_tokens must be 0";
  }
  if (r.output == GenerateRequest::Output::TokenLogits && r.logit_tokens.empty()) {
    return "a token-logits request names no tokens";
  }
  for (int32_t t : r.logit_tokens) {
    if (t < 0 || t >= vocab) return "logit token id " + std::to_string(t) + " is outside the vocabulary";
  }
  // Rows fed as embeddings carry surrogate ids (below 0); every other row is a token.
  std::vector<bool> embedded(r.prompt.size(), false);
  if (!r.embeddings.empty()) {
    if (!model_->accepts_embeddings()) {
      code = "unsupported";
      return model_->info().architecture + " on the " + model_->info().backend +
             " backend cannot take image (embedding) rows in llmd yet";
    }
    if (r.max_draft > 0 || r.output != GenerateRequest::Output::Tokens) {
      code = "unsupported";
      return "speculative decoding, embeddings and token logits are not implemented for prompts with images yet";
    }
    const size_t hidden = static_cast<size_t>(model_->info().hidden_size);
    int end = 0;
    for (const auto& e : r.embeddings) {
      if (e.rows <= 0 || e.first < end || e.first + e.rows > static_cast<int>(r.prompt.size())) {
        return "embedded prompt rows must be non-empty, in order, apart and inside the prompt";
      }
      if (!e.values || e.values->size() != static_cast<size_t>(e.rows) * hidden) {
        return "embedded prompt rows need rows x hidden_size (" + std::to_string(hidden) + ") values";
      }
      if (e.grid_h < 0 || e.grid_w < 0 || (e.grid_h > 0) != (e.grid_w > 0) ||
          (e.grid_h > 0 && e.grid_h * e.grid_w != e.rows)) {
        return "an embedded run's grid must be grid_h x grid_w = its rows";
      }
      if (e.grid_h > 0 && !model_->uses_mrope()) {
        code = "unsupported";
        return model_->info().architecture + " places no image rows on a grid (no multimodal rotary positions)";
      }
      for (int i = e.first; i < e.first + e.rows; ++i) {
        if (r.prompt[i] >= 0) return "an embedded prompt row must hold a surrogate id below 0";
        embedded[i] = true;
      }
      end = e.first + e.rows;
    }
  }
  for (size_t i = 0; i < r.prompt.size(); ++i) {
    const int32_t t = r.prompt[i];
    if (!embedded[i] && (t < 0 || t >= vocab)) {
      return "prompt token id " + std::to_string(t) + " is outside the vocabulary";
    }
  }
  if (static_cast<int64_t>(r.prompt.size()) + r.max_tokens > context_length_) {
    code = "context_length_exceeded";
    return "prompt (" + std::to_string(r.prompt.size()) + " tokens) + max_tokens (" + std::to_string(r.max_tokens) +
           ") exceeds the context length of " + std::to_string(context_length_);
  }
  return "";
}

void Engine::submit(GenerateRequest request) {
  std::vector<GenerateRequest> one;
  one.push_back(std::move(request));
  submit(std::move(one));
}

void Engine::submit(std::vector<GenerateRequest> requests) {
  std::vector<std::unique_ptr<Sequence>> accepted;
  for (GenerateRequest& request : requests) {
    std::string code;
    const std::string problem = validate(request, code);
    if (!problem.empty()) {
      EngineEvent e;
      e.kind = EngineEvent::Kind::Error;
      e.id = request.id;
      e.code = code;
      e.message = problem;
      emit(std::move(e));
      continue;
    }
    auto seq = std::make_unique<Sequence>(std::move(request), pool_);
    if (needs_counts(seq->request.sampling)) seq->counts.add_prompt(seq->request.prompt);
    seq->submitted = Clock::now();
    accepted.push_back(std::move(seq));
  }
  if (accepted.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& seq : accepted) {
      if (seq->request.prefill_of.empty()) {
        waiting_.push_back(std::move(seq));
      } else {
        const std::string parent = seq->request.prefill_of;
        forks_[parent].push_back(std::move(seq));
      }
    }
  }
  work_cv_.notify_one();
}

void Engine::unpin(const std::string& session) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    unpins_.push_back(session);
  }
  work_cv_.notify_one();
}

void Engine::cancel(const std::string& id) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cancels_.insert(id);
  }
  work_cv_.notify_one();
}

void Engine::emit(EngineEvent event) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.push_back(std::move(event));
  }
  events_cv_.notify_all();
}

std::vector<EngineEvent> Engine::poll(int timeout_ms) {
  std::unique_lock<std::mutex> lock(mutex_);
  events_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return !events_.empty(); });
  std::vector<EngineEvent> out;
  out.swap(events_);
  return out;
}

EngineStats Engine::stats() {
  EngineStats s;
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    s = stats_;
    s.step_cost = step_cost_.measured();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    s.queued_requests = static_cast<int>(waiting_.size());
  }
  if (disk_) s.kv_disk = disk_->stats();
  if (drafter_) s.draft_cached_tokens = drafter_->cached_tokens();
  // One tier to a user: the window parts' blocks count as blocks; recurrent-state snapshots
  // count as the tier's files, not as blocks read or written.
  if (window_disk_) s.kv_disk.add(window_disk_->stats(), /*blocks=*/true);
  if (state_disk_) s.kv_disk.add(state_disk_->stats(), /*blocks=*/false);
  s.attention_paths = model_->attention_paths();  // atomic counters: no lock needed
  return s;
}

void Engine::finish(Sequence& seq, const std::string& reason, std::vector<float> values) {
  EngineEvent e;
  e.kind = EngineEvent::Kind::Done;
  e.id = seq.request.id;
  e.finish_reason = reason;
  e.values = std::move(values);
  e.prompt_tokens = static_cast<int>(seq.request.prompt.size());
  e.completion_tokens = static_cast<int>(seq.generated.size());
  e.cached_tokens = seq.cached;
  e.drafted_tokens = seq.drafted;
  e.accepted_tokens = seq.accepted;
  const auto now = Clock::now();
  const auto admitted = seq.admitted.time_since_epoch().count() ? seq.admitted : now;
  e.queued_ms = ms_between(seq.submitted, admitted);
  const bool has_first = seq.first_token.time_since_epoch().count() != 0;
  e.prefill_ms = ms_between(admitted, has_first ? seq.first_token : now);
  e.decode_ms = has_first ? ms_between(seq.first_token, now) : 0.0;
  if (state_disk_ && seq.decode_snapshot_key != 0) {
    // What the conversation's next turn (or its session) resumes from, after a restart too.
    const auto at = std::find(seq.block_keys.begin(), seq.block_keys.end(), seq.decode_snapshot_key);
    auto state = prefix_cache_.state_of(seq.decode_snapshot_key);
    if (at != seq.block_keys.end() && state) {
      const size_t index = static_cast<size_t>(at - seq.block_keys.begin());
      save_state_to_disk(seq.decode_snapshot_key, parent_of(seq, index), block_tokens(seq, index).data(), *state);
    }
  }
  if (!seq.request.session.empty()) {
    // The full blocks the prefix cache indexed for this request stay held for the session.
    const auto& blocks = seq.kv->blocks();
    const size_t n = std::min(seq.block_keys.size(), blocks.size());
    session_pins_.pin(seq.request.session, std::vector<int>(blocks.begin(), blocks.begin() + n));
  }
  index_partial_tail(seq);
  if (seq.drafting && drafter_ && seq.request.draft_model && !seq.request.mtp) {
    drafter_->finish(*seq.drafting, [&seq](int p) { return seq.token_at(p); }, seq.kv->length());
  }
  seq.kv->clear();
  if (seq.drafting) seq.drafting->kv.clear();
  publish_gauges();  // a client that saw `done` sees the KV it left behind in stats
  emit(std::move(e));
}

bool Engine::admit(Sequence& seq) {
  // Reuse cached KV for the longest cached prefix (whole blocks, then the shared head of one
  // more cached block), always leaving at least one prompt token to run so the first sampled
  // token has fresh logits.
  if (seq.fed > 0) return true;  // a forked sibling waiting for room: its KV is already there
  // Mean pooling sums the hidden state of every prompt position: none may come from the cache.
  // An encoder's positions all depend on the whole prompt: nothing is reusable.
  if (bidirectional_) return true;
  if (seq.request.output == GenerateRequest::Output::Embedding &&
      seq.request.pooling == GenerateRequest::Pooling::Mean) {
    return true;
  }
  const auto& prompt = seq.request.prompt;
  auto a = std::make_unique<Admission>();
  a->m = prefix_cache_.match(prompt.data(), static_cast<int>(prompt.size()) - 1);
  if (disk_) {
    // The blocks on disk that continue the match (a prefix evicted from RAM, or computed by an
    // earlier worker) are read off this thread. The matched RAM blocks (and the partial
    // candidate) are held meanwhile, so nothing evicts them; adopt() takes the sequence's own
    // references.
    for (int b : a->m.blocks) pool_.retain(b);
    a->held = a->m.blocks;
    a->partial = a->m.partial_block;
    if (a->partial >= 0) pool_.retain(a->partial);
    if (start_disk_load(seq, *a)) {
      seq.admission = std::move(a);
      return false;
    }
  }
  complete_admit(seq, *a);
  return true;
}

void Engine::complete_admit(Sequence& seq, Admission& a) {
  const auto& prompt = seq.request.prompt;
  PrefixCache::Match& m = a.m;
  if (window_disk_) load_window_parts(m, prompt);
  if (a.partial >= 0) pool_.release(a.partial);
  const std::vector<int>& held = a.held;  // released after adopt()
  int from_disk = a.from_disk;
  const int first_from_disk = static_cast<int>(held.size()) - from_disk;
  // Recurrent state exists only at block boundaries (snapshots): no partial block.
  if (recurrent_) m.drop_partial();
  m.fit_windows(pool_);
  std::shared_ptr<const SequenceState> state;
  if (recurrent_) {
    // KV is reusable only together with the recurrent state at exactly the same position:
    // cut the match back to the longest prefix whose last block has a snapshot.
    while (!m.blocks.empty() && !(state = prefix_cache_.state_of(m.keys.back()))) {
      m.blocks.pop_back();
      m.keys.pop_back();
    }
  }
  seq.kv->adopt(m.blocks, m.full_tokens());
  for (int b : held) pool_.release(b);
  // Blocks from disk the match still uses (a window may have cut it).
  if (from_disk > 0) from_disk = std::max(0, static_cast<int>(m.blocks.size()) - first_from_disk);
  if (m.partial_block >= 0 && !copy_into_next_block(*seq.kv, m.partial_block, m.tokens())) m.drop_partial();
  if (m.tokens() == 0) return;
  if (state) seq.kv->state = state->clone();
  seq.fed = seq.cached = m.tokens();
  seq.block_keys = std::move(m.keys);
  std::lock_guard<std::mutex> lock(stats_mutex_);
  stats_.prefix_cache_hits += 1;
  stats_.prefix_cached_tokens += seq.cached;
  if (m.partial_block >= 0) stats_.prefix_partial_tokens += m.partial_tokens;
  if (from_disk > 0) {
    stats_.kv_disk_hits += 1;
    stats_.kv_disk_hit_tokens += static_cast<uint64_t>(from_disk) * KvPool::kBlockTokens;
  }
}

bool Engine::copy_into_next_block(SequenceKv& kv, int src, int length) {
  return kv.copy_head(src, length, [this](int from, int to) { model_->copy_kv_block(pool_, from, to); });
}

void Engine::index_full_blocks(Sequence& seq) {
  // Written through at once: a worker crash or a daemon restart loses only the queue.
  prefix_cache_.index_blocks(
      *seq.kv, [&seq](int p) { return seq.token_at(p); }, seq.kv->length(), seq.block_keys,
      [this](uint64_t key, uint64_t parent, const int32_t* tokens, int block) {
        save_to_disk(key, parent, tokens, block);
      });
}

void Engine::index_partial_tail(const Sequence& seq) {
  // Recurrent state exists only at block boundaries, and an encoder's positions depend on what
  // follows them: neither can reuse a partial block.
  if (recurrent_ || bidirectional_) return;
  prefix_cache_.index_tail(*seq.kv, [&seq](int p) { return seq.token_at(p); }, seq.block_keys);
}

std::vector<int> Engine::verify_snapshots(const Sequence& seq, int start, int drafts) const {
  // Besides the kept ones: the state after the last token and after each draft but the last,
  // one of which becomes the sequence's state when verification rejects a draft.
  std::vector<int> at = snapshot_positions(seq, start, 1 + drafts);
  for (int p = start + 1; p <= start + drafts; ++p) {
    if (std::find(at.begin(), at.end(), p) == at.end()) at.push_back(p);
  }
  std::sort(at.begin(), at.end());
  return at;
}

void Engine::restore_state(Sequence& seq, int start, int kept) {
  // Drafts were rejected: the state went on past the sequence's length. Take the snapshot at
  // the length back, and keep only the snapshots snapshot_positions() keeps of the tokens kept.
  auto& snaps = seq.kv->snapshots;
  const int length = seq.kv->length();
  if (kept < static_cast<int>(seq.draft.size())) {
    const auto at = std::find_if(snaps.begin(), snaps.end(), [&](const auto& snap) { return snap.first == length; });
    if (at == snaps.end()) throw std::logic_error("no recurrent-state snapshot at the last kept position");
    seq.kv->state = at->second->clone();
  }
  const std::vector<int> wanted = snapshot_positions(seq, start, 1 + kept);
  std::erase_if(snaps, [&](const auto& snap) {
    return std::find(wanted.begin(), wanted.end(), snap.first) == wanted.end();
  });
}

bool Engine::mtp_reads(Sequence& seq, int start) {
  // The head reads the model's hidden state at every position the sequence computes, from its
  // first segment on: position 0, or past a cached prefix, a session's history or a sibling's
  // prompt, none of which the model ran here (mtp_drafter.h, DraftSequence::start).
  if (!mtp_ || !seq.request.mtp || seq.request.max_draft <= 0) return false;
  if (!seq.drafting) {
    seq.drafting = mtp_->open(seq.request.sampling);
    seq.drafting->start = start;
  }
  return true;
}

std::vector<int> Engine::snapshot_positions(const Sequence& seq, int start, int n) const {
  // Kept: the last block boundary inside the prompt (all a repeated prompt or a shared prefix
  // of it can reuse), and every boundary from the end of the prompt on, of which the sequence
  // keeps only the latest (what its next chat turn or its session resumes from).
  constexpr int BT = KvPool::kBlockTokens;
  const int prompt = static_cast<int>(seq.request.prompt.size());
  const int in_prompt = (prompt - 1) / BT * BT;
  std::vector<int> at;
  for (int p = (start / BT + 1) * BT; p <= start + n; p += BT) {
    if ((p == in_prompt && p > 0) || p >= prompt) at.push_back(p);
  }
  return at;
}

void Engine::keep_snapshots(Sequence& seq) {
  constexpr int BT = KvPool::kBlockTokens;
  const int prompt = static_cast<int>(seq.request.prompt.size());
  for (auto& [pos, state] : seq.kv->snapshots) {
    const size_t index = static_cast<size_t>(pos / BT) - 1;
    if (pos % BT != 0 || index >= seq.block_keys.size()) continue;
    const uint64_t key = seq.block_keys[index];
    // The prompt's snapshot is written through at once (a restart resumes the prompt from
    // it); a decode snapshot only when its sequence ends or its block leaves RAM, since the
    // next one replaces it every block.
    if (pos < prompt && state_disk_) save_state_to_disk(key, parent_of(seq, index), block_tokens(seq, index).data(), *state);
    prefix_cache_.attach_state(key, std::move(state));
    if (pos >= prompt) {
      if (seq.decode_snapshot_key != 0 && seq.decode_snapshot_key != key) {
        prefix_cache_.detach_state(seq.decode_snapshot_key);
      }
      seq.decode_snapshot_key = key;
    }
  }
  seq.kv->snapshots.clear();
}

void Engine::loop() {
  const auto load_done = [&] {
    return std::any_of(loading_.begin(), loading_.end(), [](const auto& s) { return s->admission->job->done(); });
  };
  while (true) {
    bool admitted_any = false;
    collect_loads();
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_cv_.wait(lock, [&] {
        const bool room = static_cast<int>(active_.size() + loading_.size()) < options_.max_sequences;
        // Waiting requests wake the loop only when there is room: sequences loading from disk
        // hold their slots and need not step.
        return stop_ || (!waiting_.empty() && room) || !active_.empty() || !cancels_.empty() || !unpins_.empty() ||
               !forks_.empty() || load_done();
      });
      if (stop_) return;
      for (const std::string& s : unpins_) session_pins_.unpin(s);
      unpins_.clear();
      // Cancellations: waiting requests end at once; running ones at this step boundary.
      if (!cancels_.empty()) {
        for (auto it = waiting_.begin(); it != waiting_.end();) {
          if (cancels_.count((*it)->request.id)) {
            cancels_.erase((*it)->request.id);
            auto seq = std::move(*it);
            it = waiting_.erase(it);
            lock.unlock();
            finish(*seq, "cancelled");
            lock.lock();
          } else {
            ++it;
          }
        }
        std::vector<std::string> unknown;
        for (auto it = active_.begin(); it != active_.end();) {
          if (cancels_.count((*it)->request.id)) {
            cancels_.erase((*it)->request.id);
            auto seq = std::move(*it);
            it = active_.erase(it);
            lock.unlock();
            finish(*seq, "cancelled");
            lock.lock();
          } else {
            ++it;
          }
        }
        // A sequence whose prefix is loading ends when its reads are done (they write into
        // blocks it holds); the reads not started are skipped.
        for (auto& seq : loading_) {
          if (cancels_.count(seq->request.id)) {
            cancels_.erase(seq->request.id);
            seq->admission->cancelled = true;
            seq->admission->job->cancel();
          }
        }
        for (auto& [parent, children] : forks_) {
          for (auto it = children.begin(); it != children.end();) {
            if (cancels_.count((*it)->request.id)) {
              auto seq = std::move(*it);
              it = children.erase(it);
              lock.unlock();
              finish(*seq, "cancelled");
              lock.lock();
            } else {
              ++it;
            }
          }
        }
        cancels_.clear();  // ids of requests that already finished
      }
      settle_forks(lock);
      while (!waiting_.empty() && static_cast<int>(active_.size() + loading_.size()) < options_.max_sequences) {
        auto seq = std::move(waiting_.front());
        waiting_.pop_front();
        seq->admitted = Clock::now();
        if (!admit(*seq)) {  // reading its prefix from disk: Started comes when it joins
          loading_.push_back(std::move(seq));
          continue;
        }
        EngineEvent started;  // pushed under the lock admission holds; notified below
        started.kind = EngineEvent::Kind::Started;
        started.id = seq->request.id;
        started.prompt_tokens = static_cast<int>(seq->request.prompt.size());
        started.cached_tokens = seq->cached;
        events_.push_back(std::move(started));
        admitted_any = true;
        active_.push_back(std::move(seq));
      }
    }
    if (admitted_any) events_cv_.notify_all();
    publish_gauges();
    if (active_.empty()) continue;
    try {
      step_once();
    } catch (const std::exception& ex) {
      // A failed step fails the sequences in it; the engine keeps serving.
      for (auto& seq : active_) {
        EngineEvent e;
        e.kind = EngineEvent::Kind::Error;
        e.id = seq->request.id;
        e.code = "internal";
        e.message = std::string("engine step failed: ") + ex.what();
        seq->kv->clear();
        emit(std::move(e));
      }
      active_.clear();
    }
  }
}

void Engine::step_once() {
  const auto step_started = Clock::now();
  Step step;
  std::vector<Sequence*> in_step;
  int budget = options_.step_token_budget;
  // Drafted tokens only take budget left after every decoding sequence's own row.
  int draft_room = budget;
  for (auto& seq : active_) draft_room -= seq->prefilling() ? 0 : 1;
  // Decode rows first: running streams never wait behind a prefill. A sequence that
  // speculates feeds its drafts after its last token, as extra rows of its segment, and gets
  // the logits of every one of them: all drafts are verified in this one forward. Drafts are
  // made first for all of them (a draft model drafts every sequence in one batched forward
  // per position), within the room each was given.
  std::vector<Sequence*> decoding;
  std::vector<int> wants;
  {
    int left = budget;
    for (auto& seq : active_) {
      if (seq->prefilling() || left <= 0) continue;
      const int want = draft_want(*seq, std::min(draft_room, left - 1));
      draft_room -= want;
      left -= 1 + want;
      decoding.push_back(seq.get());
      wants.push_back(want);
    }
  }
  {
    // The step's rows without drafts: the decode rows and the prefill it will take.
    int prefill = 0;
    for (auto& seq : active_) {
      if (seq->prefilling()) prefill += static_cast<int>(seq->request.prompt.size()) - seq->fed;
    }
    const int plain = static_cast<int>(decoding.size());
    plan_drafts_of(decoding, wants, plain + std::min(prefill, std::max(0, budget - plain)));
  }
  draft_all(decoding, wants);
  for (Sequence* seq : decoding) {
    StepSegment s;
    s.kv = seq->kv.get();
    s.tokens = {seq->generated.back()};
    s.tokens.insert(s.tokens.end(), seq->draft.begin(), seq->draft.end());
    s.start_pos = seq->kv->length();
    s.want_logits = true;
    s.logits_tail = static_cast<int>(s.tokens.size());
    if (!seq->request.embeddings.empty()) fill_mrope_positions(*seq, s);
    if (recurrent_) s.snapshot_at = verify_snapshots(*seq, s.start_pos, static_cast<int>(seq->draft.size()));
    if (mtp_reads(*seq, s.start_pos)) s.hidden = HiddenOut::All;
    budget -= static_cast<int>(s.tokens.size());
    step.segments.push_back(std::move(s));
    in_step.push_back(seq);
  }
  for (auto& seq : active_) {
    if (!seq->prefilling() || budget <= 0) continue;
    const int remaining = static_cast<int>(seq->request.prompt.size()) - seq->fed;
    // An encoder's prompt runs whole: it waits for a step with room, or runs alone past the
    // budget when it is the step's first (a prompt longer than the budget still runs).
    if (bidirectional_ && remaining > budget && !step.segments.empty()) continue;
    int n = bidirectional_ ? remaining : std::min(remaining, budget);
    if (!seq->request.embeddings.empty()) n = embedded_chunk(*seq, n);
    StepSegment s;
    s.kv = seq->kv.get();
    s.tokens.assign(seq->request.prompt.begin() + seq->fed, seq->request.prompt.begin() + seq->fed + n);
    s.start_pos = seq->fed;
    if (!seq->request.embeddings.empty()) {
      fill_embedded_rows(*seq, s);
      fill_mrope_positions(*seq, s);
    }
    if (seq->request.output != GenerateRequest::Output::Embedding) {
      s.want_logits = (n == remaining);
    } else if (seq->request.pooling == GenerateRequest::Pooling::Mean) {
      s.hidden = HiddenOut::Sum;
    } else if (seq->request.pooling == GenerateRequest::Pooling::Cls) {
      s.hidden = HiddenOut::First;  // whole prompts only (validate): its first row is the CLS token
    } else if (n == remaining) {
      s.hidden = HiddenOut::Last;
    }
    if (recurrent_) s.snapshot_at = snapshot_positions(*seq, s.start_pos, n);
    if (seq->request.output == GenerateRequest::Output::Tokens && mtp_reads(*seq, s.start_pos)) {
      s.hidden = HiddenOut::All;
    }
    step.segments.push_back(std::move(s));
    in_step.push_back(seq.get());
    budget -= n;
  }
  // Reserve KV; a sequence that cannot get memory fails alone.
  for (size_t i = 0; i < step.segments.size();) {
    StepSegment& s = step.segments[i];
    if (!in_step[i]->draft.empty() && !s.kv->reserve(s.start_pos + static_cast<int>(s.tokens.size()))) {
      // No room for the drafts' KV: this step decodes the one token without them.
      in_step[i]->draft.clear();
      s.tokens.resize(1);
      s.logits_tail = 1;
      if (recurrent_) s.snapshot_at = snapshot_positions(*in_step[i], s.start_pos, 1);
    }
    if (!s.kv->reserve(s.start_pos + static_cast<int>(s.tokens.size()))) {
      Sequence* seq = in_step[i];
      EngineEvent e;
      e.kind = EngineEvent::Kind::Error;
      e.id = seq->request.id;
      e.code = "kv_cache_exhausted";
      e.message = "the KV cache budget is exhausted; retry later or raise --kv-budget";
      seq->kv->clear();
      emit(std::move(e));
      active_.erase(std::find_if(active_.begin(), active_.end(), [&](auto& p) { return p.get() == seq; }));
      step.segments.erase(step.segments.begin() + i);
      in_step.erase(in_step.begin() + i);
    } else {
      ++i;
    }
  }
  if (step.segments.empty()) return;
  if (device_sampling_) {
    for (size_t i = 0; i < step.segments.size(); ++i) {
      StepSegment& s = step.segments[i];
      if (!device_samples(*in_step[i], s)) continue;
      const SamplingParams& p = in_step[i]->request.sampling;
      StepSegment::DeviceSample d;
      d.temperature = p.temperature;
      d.top_k = p.top_k;
      d.top_p = p.top_p;
      d.min_p = p.min_p;
      // The draw Sampler::sample makes for this token, so a seed's tokens do not depend on
      // where they are sampled.
      if (p.temperature > 0.f && p.top_k != 1) d.unit = in_step[i]->sampler.draw_unit();
      s.device_sample = d;
    }
  }
  int drafting = 0;  // sequences whose drafts this one forward verifies
  for (Sequence* seq : in_step) drafting += seq->draft.empty() ? 0 : 1;

  std::vector<float>& logits = step_logits_;
  std::vector<float>& hidden = step_hidden_;
  {
    std::lock_guard<std::recursive_mutex> lock(forward_mutex_);
    ScopedOpTimer timer(OpKind::Forward);
    if (step.hidden_rows() > 0) {
      model_->forward(step, pool_, logits, hidden);
    } else {
      hidden.clear();  // the last step's rows: none are read, none may be mistaken for this step's
      model_->forward(step, pool_, logits);
    }
  }
  const int vocab = model_->info().vocab_size;
  const int width = model_->info().hidden_size;
  // Each segment's first row in `hidden` (HiddenOut::All segments have one per fed token).
  std::vector<size_t> hidden_at(step.segments.size());
  for (size_t i = 0, at = 0; i < step.segments.size(); ++i) {
    const StepSegment& s = step.segments[i];
    hidden_at[i] = at * width;
    at += s.hidden == HiddenOut::All ? s.tokens.size() : s.hidden != HiddenOut::None ? 1 : 0;
  }
  // The MTP head reads the model's hidden state at every position a sequence keeps.
  const auto keep_hidden = [&](size_t i, int rows) {
    if (step.segments[i].hidden != HiddenOut::All) return;
    std::vector<float>& pending = in_step[i]->drafting->hidden;
    const float* from = hidden.data() + hidden_at[i];
    pending.insert(pending.end(), from, from + static_cast<size_t>(rows) * width);
  };
  int row = 0;
  // The logits of output row `r`, or null when the device sampled it (its token then in
  // `device_token`). `logits` holds only the rows not sampled on the device; a row's place
  // there is the count of those before it (rows of rejected drafts are skipped, not read).
  int device_token = -1;
  uint64_t on_device = 0, on_host = 0;
  // host_rows_before[r]: output rows before r whose logits came back (a prefix count, so
  // finding a row's place is O(1) however many rows the step samples).
  const auto& sampled_on_device = step.device_tokens;
  std::vector<int32_t> host_rows_before;
  if (!sampled_on_device.empty()) {
    host_rows_before.resize(sampled_on_device.size() + 1, 0);
    for (size_t r = 0; r < sampled_on_device.size(); ++r) {
      host_rows_before[r + 1] = host_rows_before[r] + (sampled_on_device[r] < 0 ? 1 : 0);
    }
  }
  auto logits_of = [&](int r) -> float* {
    device_token = sampled_on_device.empty() ? -1 : sampled_on_device[r];
    if (device_token >= 0) return nullptr;
    const int host_row = sampled_on_device.empty() ? r : host_rows_before[r];
    return logits.data() + static_cast<size_t>(host_row) * vocab;
  };
  int sampled = 0;
  int taken = 0;
  uint64_t drafted = 0, accepted = 0;
  int pooled = 0;
  int prompt_tokens = 0;
  std::vector<Sequence*> finished;
  std::vector<std::string> reasons;
  std::vector<std::vector<float>> results;
  for (size_t i = 0; i < step.segments.size(); ++i) {
    Sequence* seq = in_step[i];
    const StepSegment& s = step.segments[i];
    if (!seq->draft.empty()) {
      // Verify the drafts left to right: position j's logits give the token after the last
      // token and drafts [0, j); a draft is kept while the token taken there equals it. The
      // KV then holds the last token and the kept drafts; a rejected draft's KV lies past the
      // sequence's length (overwritten by later steps, never indexed by the prefix cache).
      const int k = static_cast<int>(seq->draft.size());
      seq->drafted += k;  // before the tokens' events, which report the running totals
      std::string reason;
      int kept = 0;
      const bool with_q = seq->drafting && seq->drafting->q.size() == static_cast<size_t>(k);
      for (int j = 0; j <= k; ++j) {
        float* row_logits = logits_of(row + j);
        int token = -1;
        ++on_host;
        const std::vector<float>* q = with_q && j < k ? &seq->drafting->q[j] : nullptr;
        reason = take_token(*seq, row_logits, vocab, j < k ? seq->draft[j] : -1, &token, q);
        if (token >= 0) ++taken;
        if (j == k || token != seq->draft[j]) break;
        ++kept;
        if (!reason.empty()) break;
      }
      row += k + 1;
      ++sampled;
      seq->kv->set_length(s.start_pos + 1 + kept);
      if (recurrent_) restore_state(*seq, s.start_pos, kept);
      keep_hidden(i, 1 + kept);
      if (seq->drafting) ModelDrafter::keep(*seq->drafting, seq->kv->length());
      index_full_blocks(*seq);
      if (recurrent_) keep_snapshots(*seq);
      seq->draft_length.record(k, kept);
      seq->acceptance.record(k, kept);
      drafted += k;
      accepted += kept;
      seq->draft.clear();
      if (!reason.empty()) {
        finished.push_back(seq);
        reasons.push_back(reason);
        results.emplace_back();
      }
      continue;
    }
    seq->kv->set_length(s.start_pos + static_cast<int>(s.tokens.size()));
    keep_hidden(i, static_cast<int>(s.tokens.size()));
    // Drafts dropped for want of KV room were still fed to the draft model: forget them.
    if (seq->drafting && !seq->request.mtp) ModelDrafter::keep(*seq->drafting, seq->kv->length());
    if (seq->prefilling()) {
      seq->fed += static_cast<int>(s.tokens.size());
      prompt_tokens += static_cast<int>(s.tokens.size());
    }
    if (!bidirectional_) index_full_blocks(*seq);
    if (recurrent_) keep_snapshots(*seq);
    const float* hidden_out = nullptr;
    if (s.hidden != HiddenOut::None && s.hidden != HiddenOut::All) hidden_out = hidden.data() + hidden_at[i];
    if (seq->request.output != GenerateRequest::Output::Tokens) {
      if (s.hidden == HiddenOut::Sum) {
        seq->hidden_sum.resize(width, 0.0);
        for (int j = 0; j < width; ++j) seq->hidden_sum[j] += hidden_out[j];
      }
      const float* logits_out = nullptr;
      if (s.want_logits) logits_out = logits_of(row++);
      if (!seq->prefilling()) {
        if (seq->generated.empty()) seq->first_token = Clock::now();
        ++pooled;
        finished.push_back(seq);
        reasons.push_back("stop");
        results.push_back(pooled_values(*seq, hidden_out, logits_out));
      }
      continue;
    }
    if (!s.want_logits) continue;
    ++sampled;
    float* row_logits = logits_of(row);
    const int token_on_device = device_token;
    ++row;
    ++(row_logits ? on_host : on_device);
    // Siblings waiting for this prompt start now, from copies of the unprocessed logits.
    std::vector<std::unique_ptr<Sequence>> forks;
    if (seq->generated.empty()) forks = take_forks(seq->request.id);
    for (auto& child : forks) start_fork(*seq, std::move(child), row_logits, vocab);
    int token = -1;
    const std::string reason = take_token(*seq, row_logits, vocab, -1, &token, nullptr, token_on_device);
    if (token >= 0) ++taken;
    // A declined draft's first token against the token the step took: free evidence of how
    // the sequence's drafts would fare, so declining does not blind the cost model.
    if (seq->declined_first >= 0 && token >= 0) seq->acceptance.observe(token == seq->declined_first);
    seq->declined_first = -1;
    if (!reason.empty()) {
      finished.push_back(seq);
      reasons.push_back(reason);
      results.emplace_back();
    }
  }
  int rows = 0;
  for (const StepSegment& seg : step.segments) rows += static_cast<int>(seg.tokens.size());
  const double step_seconds = std::chrono::duration<double>(Clock::now() - step_started).count();
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    // Under the stats lock: stats() reads the measured costs when asked, not every step.
    step_cost_.observe(rows, step_seconds);
    stats_.steps += 1;
    if (!loading_.empty()) stats_.kv_disk_load_steps += 1;
    stats_.tokens_generated += taken;
    stats_.device_sampled_tokens += on_device;
    stats_.host_sampled_tokens += on_host;
    stats_.draft_tokens += drafted;
    stats_.draft_accepted_tokens += accepted;
    if (drafting > 0) {
      stats_.speculative_steps += 1;
      stats_.drafting_rows_histogram[drafting] += 1;
    }
    stats_.prompt_tokens_processed += prompt_tokens;
    if (sampled > 0) stats_.sampled_rows_histogram[sampled] += 1;
    stats_.max_rows_sampled_in_a_step = std::max(stats_.max_rows_sampled_in_a_step, sampled);
    stats_.embedding_requests += pooled;
    if (pooled > 0) stats_.pooled_rows_histogram[pooled] += 1;
  }
  for (size_t i = 0; i < finished.size(); ++i) {
    finish(*finished[i], reasons[i], std::move(results[i]));
    active_.erase(std::find_if(active_.begin(), active_.end(), [&](auto& p) { return p.get() == finished[i]; }));
  }
  publish_gauges();
}

std::vector<float> Engine::pooled_values(Sequence& seq, const float* hidden, const float* logits) const {
  const GenerateRequest& r = seq.request;
  std::vector<float> out;
  if (r.output == GenerateRequest::Output::TokenLogits) {
    for (int32_t t : r.logit_tokens) out.push_back(logits[t]);
    return out;
  }
  const int width = model_->info().hidden_size;
  if (r.pooling == GenerateRequest::Pooling::Mean) {
    const double n = static_cast<double>(r.prompt.size());
    out.resize(width);
    for (int j = 0; j < width; ++j) out[j] = static_cast<float>(seq.hidden_sum[j] / n);
  } else {
    out.assign(hidden, hidden + width);
  }
  model_->project_pooled(out);
  if (r.normalize) {
    double norm = 0.0;
    for (float v : out) norm += static_cast<double>(v) * v;
    // As torch.nn.functional.normalize: a zero vector stays zero.
    const double scale = 1.0 / std::max(std::sqrt(norm), 1e-12);
    for (float& v : out) v = static_cast<float>(v * scale);
  }
  return out;
}

int Engine::draft_want(Sequence& seq, int room) {
  if (seq.request.max_draft <= 0) return 0;
  const int left = draft_room_left(seq.request.max_tokens, static_cast<int>(seq.generated.size()));
  return std::max(0, std::min({seq.draft_length.next(), room, left}));
}

void Engine::plan_drafts_of(const std::vector<Sequence*>& decoding, std::vector<int>& wants, int rows) {
  std::vector<DraftCandidate> candidates(decoding.size());
  bool any = false;
  for (size_t i = 0; i < decoding.size(); ++i) {
    Sequence& seq = *decoding[i];
    seq.draft.clear();
    seq.declined_first = -1;
    if (wants[i] <= 0) continue;
    if (!seq.request.draft_model && !seq.request.mtp) {
      const int length = static_cast<int>(seq.request.prompt.size() + seq.generated.size());
      seq.draft = ngram_draft([&seq](int p) { return seq.token_at(p); }, length, wants[i]);
      wants[i] = static_cast<int>(seq.draft.size());
    }
    candidates[i].tokens = wants[i];
    candidates[i].acceptance = seq.acceptance.rate();
    const SamplingParams& p = seq.request.sampling;
    // A draft model's or MTP head's drafts are verified until their acceptance is known: a
    // declined draft of theirs shows nothing. An n-gram draft needs no such start, as a declined
    // one still teaches its acceptance (declined_first), so it is verified only when it pays.
    const bool needs_evidence = (seq.request.draft_model || seq.request.mtp) && !seq.acceptance.known();
    candidates[i].always = needs_evidence || (p.temperature > 0.f && p.top_k != 1);
    any = any || wants[i] > 0;
  }
  if (!any) return;
  const std::vector<int> plan = plan_drafts(step_cost_, rows, static_cast<int>(decoding.size()), candidates);
  uint64_t declined = 0;
  for (size_t i = 0; i < decoding.size(); ++i) {
    if (plan[i] >= wants[i]) continue;
    Sequence& seq = *decoding[i];
    declined += wants[i] - plan[i];
    if (!seq.draft.empty()) {
      if (plan[i] == 0) seq.declined_first = seq.draft[0];
      seq.draft.resize(plan[i]);
    }
    wants[i] = plan[i];
  }
  if (declined > 0) {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    stats_.draft_declined_tokens += declined;
  }
}

void Engine::draft_all(const std::vector<Sequence*>& decoding, const std::vector<int>& wants) {
  std::vector<ModelDrafter::Job> jobs;
  for (size_t i = 0; i < decoding.size(); ++i) {
    Sequence& seq = *decoding[i];
    // MTP below; n-gram drafts were made (and cut), and every draft cleared, by plan_drafts_of.
    if (seq.request.mtp || !seq.request.draft_model || wants[i] <= 0) continue;
    const int length = static_cast<int>(seq.request.prompt.size() + seq.generated.size());
    const auto token_at = [&seq](int p) { return seq.token_at(p); };
    if (!seq.drafting) seq.drafting = drafter_->open(seq.request.sampling);
    ModelDrafter::Job job;
    job.state = seq.drafting.get();
    job.token_at = token_at;
    job.length = length;
    job.want = wants[i];
    jobs.push_back(std::move(job));
  }
  if (!jobs.empty()) {
    // The draft model's catch-up (a prompt it has not seen) takes at most one step's budget.
    // Its forwards build and evaluate MLX graphs as the target's do: under the same mutex, so
    // never beside score(), the MTP probe or an image encoder (between_steps) on another thread.
    {
      std::lock_guard<std::recursive_mutex> lock(forward_mutex_);
      drafter_->propose(jobs, options_.step_token_budget);
    }
    size_t j = 0;
    for (size_t i = 0; i < decoding.size(); ++i) {
      Sequence& seq = *decoding[i];
      if (wants[i] <= 0 || !seq.request.draft_model) continue;
      seq.draft = std::move(jobs[j++].tokens);
    }
  }
  // MTP: every sequence the head follows reads its new positions, even one not drafting now
  // (so its head stays current); those that want drafts get them.
  std::vector<MtpDrafter::Job> heads;
  std::vector<Sequence*> of;
  for (size_t i = 0; i < decoding.size(); ++i) {
    Sequence& seq = *decoding[i];
    if (!seq.request.mtp || !seq.drafting) continue;
    MtpDrafter::Job job;
    job.state = seq.drafting.get();
    job.token_at = [&seq](int p) { return seq.token_at(p); };
    job.want = wants[i];
    heads.push_back(std::move(job));
    of.push_back(&seq);
  }
  if (heads.empty()) return;
  {
    // The head builds and evaluates MLX graphs: never beside other MLX work (between_steps).
    std::lock_guard<std::recursive_mutex> lock(forward_mutex_);
    mtp_->propose(heads, options_.step_token_budget);
  }
  for (size_t j = 0; j < heads.size(); ++j) of[j]->draft = std::move(heads[j].tokens);
}

bool Engine::device_samples(const Sequence& seq, const StepSegment& s) const {
  const SamplingParams& p = seq.request.sampling;
  return s.want_logits && s.tokens.size() == 1 && seq.draft.empty() && !seq.generated.empty() &&
         !seq.prefilling() && seq.request.output == GenerateRequest::Output::Tokens && p.top_logprobs < 0 &&
         !needs_counts(p) && p.logit_bias.empty() && !seq.request.constraint;
}

std::string Engine::take_token(Sequence& seq, float* logits, int vocab, int draft, int* taken,
                               const std::vector<float>* draft_q, int device_token) {
  TokenLogprob lp;
  const int token = logits ? sample_row(seq, logits, vocab, lp, draft, draft_q) : device_token;
  if (taken) *taken = -1;
  if (seq.generated.empty()) seq.first_token = Clock::now();
  if (token < 0) return "stop";  // the constraint is complete: nothing may follow
  if (seq.request.max_tokens == 0) return "length";
  if (taken) *taken = token;
  if (draft >= 0 && token == draft) ++seq.accepted;
  const bool is_stop = std::find(seq.request.stop_tokens.begin(), seq.request.stop_tokens.end(), token) !=
                       seq.request.stop_tokens.end();
  seq.generated.push_back(token);
  if (needs_counts(seq.request.sampling)) seq.counts.add_generated(token);
  if (is_stop) return "stop";
  EngineEvent e;
  e.kind = EngineEvent::Kind::Tokens;
  e.id = seq.request.id;
  e.tokens = {token};
  if (seq.request.sampling.top_logprobs >= 0) e.logprobs.push_back(std::move(lp));
  if (seq.request.max_draft > 0) {
    e.speculative = true;
    e.drafted_tokens = seq.drafted;
    e.accepted_tokens = seq.accepted;
  }
  emit(std::move(e));
  if (static_cast<int>(seq.generated.size()) >= seq.request.max_tokens) return "length";
  return "";
}

std::vector<std::unique_ptr<Engine::Sequence>> Engine::take_forks(const std::string& parent) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = forks_.find(parent);
  if (it == forks_.end()) return {};
  auto children = std::move(it->second);
  forks_.erase(it);
  return children;
}

void Engine::start_fork(Sequence& parent, std::unique_ptr<Sequence> child, const float* logits, int vocab) {
  constexpr int BT = KvPool::kBlockTokens;
  const int length = parent.kv->length();
  if (child->request.prompt != parent.request.prompt) {  // not a sibling after all
    std::lock_guard<std::mutex> lock(mutex_);
    waiting_.push_back(std::move(child));
    return;
  }
  const auto& blocks = parent.kv->blocks();
  const int full = length / BT;
  child->admitted = Clock::now();
  child->kv->adopt(std::vector<int>(blocks.begin(), blocks.begin() + full), full * BT);
  if (length % BT != 0 && !copy_into_next_block(*child->kv, blocks[full], length)) {
    child->kv->clear();  // no room for its own partial block: it prefills alone later
    std::lock_guard<std::mutex> lock(mutex_);
    waiting_.push_back(std::move(child));
    return;
  }
  if (parent.kv->state) child->kv->state = parent.kv->state->clone();
  child->kv->set_length(length);
  child->fed = child->cached = length;
  child->block_keys.assign(parent.block_keys.begin(),
                           parent.block_keys.begin() + std::min<size_t>(full, parent.block_keys.size()));
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    stats_.forked_sequences += 1;
  }
  std::vector<float> row(logits, logits + vocab);
  const std::string reason = take_token(*child, row.data(), vocab);
  if (!reason.empty()) {
    finish(*child, reason);
    return;
  }
  if (static_cast<int>(active_.size()) < options_.max_sequences) {
    active_.push_back(std::move(child));
  } else {
    std::lock_guard<std::mutex> lock(mutex_);
    waiting_.push_front(std::move(child));  // decodes as soon as a slot frees
  }
}

void Engine::settle_forks(std::unique_lock<std::mutex>& lock) {
  for (auto it = forks_.begin(); it != forks_.end();) {
    const std::string& parent = it->first;
    const auto same = [&](const std::unique_ptr<Sequence>& s) { return s->request.id == parent; };
    const bool waiting = std::any_of(waiting_.begin(), waiting_.end(), same);
    const auto active = std::find_if(active_.begin(), active_.end(), same);
    const bool prefilling = active != active_.end() && (*active)->generated.empty();
    if ((waiting || prefilling) && !it->second.empty()) {
      ++it;
      continue;
    }
    for (auto& child : it->second) waiting_.push_back(std::move(child));
    it = forks_.erase(it);
  }
  (void)lock;
}

int Engine::sample_row(Sequence& seq, float* logits, int vocab, TokenLogprob& lp, int draft,
                       const std::vector<float>* draft_q) {
  const SamplingParams& p = seq.request.sampling;
  float log_z = 0.f;
  std::vector<float> raw;
  if (p.top_logprobs >= 0) {
    log_z = log_normaliser(logits, vocab);
    lp.top = top_logprobs(logits, vocab, log_z, p.top_logprobs);
    raw.assign(logits, logits + vocab);
  }
  if (needs_counts(p) || !p.logit_bias.empty()) apply_logit_processors(p, seq.counts, logits, vocab);
  if (seq.request.constraint) {
    std::vector<uint32_t> allowed((static_cast<size_t>(vocab) + 31) / 32, 0u);
    if (!seq.request.constraint->allowed_tokens(allowed)) return -1;
    bool any = false;
    for (int t = 0; t < vocab; ++t) {
      if ((allowed[t >> 5] >> (t & 31)) & 1u) {
        any = true;
      } else {
        logits[t] = -std::numeric_limits<float>::infinity();
      }
    }
    if (!any) return -1;
  }
  int token;
  if (draft < 0) {
    token = seq.sampler.sample(logits, vocab);
  } else if (draft_q) {
    token = seq.sampler.sample_draft(logits, vocab, draft, *draft_q);
  } else {
    token = seq.sampler.sample_draft(logits, vocab, draft);
  }
  if (seq.request.constraint) seq.request.constraint->accept(token);
  if (p.top_logprobs >= 0) lp.logprob = raw[token] - log_z;
  return token;
}

void Engine::publish_gauges() {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  stats_.active_sequences = static_cast<int>(active_.size());
  stats_.kv_blocks_used = pool_.used_blocks();
  stats_.kv_bytes = pool_.allocated_bytes();
  stats_.kv_lane_bytes = pool_.extra_bytes();
  stats_.kv_window_parts = pool_.live_window_parts();
  stats_.prefix_cache_blocks = prefix_cache_.entries();
  stats_.kv_idle_cached_blocks = pool_.cached_idle_blocks();
  stats_.pinned_sessions = session_pins_.sessions();
  stats_.pinned_blocks = session_pins_.blocks();
}

std::vector<float> Engine::mtp_probe(const std::vector<int32_t>& tokens, int chain, std::vector<int32_t>& chained) {
  if (!mtp_) throw std::invalid_argument("the model has no MTP head");
  if (tokens.size() < 2) throw std::invalid_argument("the MTP probe needs at least two tokens");
  std::lock_guard<std::recursive_mutex> lock(forward_mutex_);
  SequenceKv kv(pool_);
  const int n = static_cast<int>(tokens.size()) - 1;  // the model runs tokens 0..n-1
  if (!kv.reserve(n)) throw std::runtime_error("KV budget exhausted while probing");
  Step step;
  StepSegment s;
  s.kv = &kv;
  s.tokens.assign(tokens.begin(), tokens.begin() + n);
  s.hidden = HiddenOut::All;
  step.segments.push_back(std::move(s));
  std::vector<float> unused, hidden;
  model_->forward(step, pool_, unused, hidden);
  return mtp_->probe(hidden, std::vector<int32_t>(tokens.begin() + 1, tokens.end()), chain, chained);
}

std::vector<float> Engine::score(const std::vector<int32_t>& tokens, int first_scored) {
  std::lock_guard<std::recursive_mutex> lock(forward_mutex_);
  SequenceKv kv(pool_);
  std::vector<float> all;
  const int vocab = model_->info().vocab_size;
  const int n = static_cast<int>(tokens.size());
  first_scored = std::clamp(first_scored, 1, n);
  if (!kv.reserve(n)) throw std::runtime_error("KV budget exhausted while scoring");
  // Unscored prefix in prefill chunks, then one position per pass so each keeps its logits.
  for (int pos = 0; pos < first_scored - 1;) {
    const int chunk = std::min(options_.step_token_budget, first_scored - 1 - pos);
    Step step;
    StepSegment s;
    s.kv = &kv;
    s.tokens.assign(tokens.begin() + pos, tokens.begin() + pos + chunk);
    s.start_pos = pos;
    step.segments.push_back(std::move(s));
    std::vector<float> unused;
    model_->forward(step, pool_, unused);
    pos += chunk;
    kv.set_length(pos);
  }
  for (int i = first_scored - 1; i < n; ++i) {
    Step step;
    StepSegment s;
    s.kv = &kv;
    s.tokens = {tokens[i]};
    s.start_pos = i;
    s.want_logits = true;
    step.segments.push_back(std::move(s));
    std::vector<float> logits;
    model_->forward(step, pool_, logits);
    kv.set_length(i + 1);
    all.insert(all.end(), logits.begin(), logits.begin() + vocab);
  }
  return all;
}

}  // namespace llmd
