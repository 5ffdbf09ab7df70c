#include "model_drafter.h"

#include <algorithm>

namespace llmd {

namespace {
// The proposals' generator is seeded apart from the request's own (which the verifier draws
// from), so that drafting changes no verification draw's stream but the two stay repeatable.
SamplingParams draft_params(SamplingParams p) {
  p.seed ^= 0x9E3779B97F4A7C15ull;
  return p;
}

KvShape draft_shape(const Model& model, KvType kv_type) {
  KvShape shape = model.kv_shape();
  if (shape.host_storage || kv_type_quantized(kv_type)) shape.type = kv_type;
  return shape;
}
}  // namespace

DraftSequence::DraftSequence(KvPool& pool, const SamplingParams& params) : kv(pool), sampler(draft_params(params)) {}

ModelDrafter::ModelDrafter(std::unique_ptr<Model> model, size_t kv_budget_bytes, KvType kv_type)
    : model_(std::move(model)),
      pool_(draft_shape(*model_, kv_type), kv_budget_bytes),
      cacheable_(!model_->has_recurrent_state()) {}

void ModelDrafter::admit(Job& job) {
  DraftSequence& state = *job.state;
  state.admitted = true;
  if (!cacheable_ || state.kv.length() > 0 || job.length < 2) return;
  std::vector<int32_t> tokens(job.length);
  for (int i = 0; i < job.length; ++i) tokens[i] = job.token_at(i);
  PrefixCache::Match m = cache_.match(tokens.data(), job.length - 1);
  m.fit_windows(pool_);
  state.kv.adopt(m.blocks, m.full_tokens());
  state.block_keys = std::move(m.keys);
  // The head of a cached block is copied into the sequence's own block, never shared: the
  // sequence writes the rest of it.
  if (m.partial_block >= 0) {
    state.kv.copy_head(m.partial_block, m.tokens(),
                       [this](int from, int to) { model_->copy_kv_block(pool_, from, to); });
  }
  cached_tokens_.fetch_add(static_cast<uint64_t>(state.kv.length()), std::memory_order_relaxed);
}

void ModelDrafter::index_full_blocks(DraftSequence& state, const std::function<int32_t(int)>& token_at, int limit) {
  if (cacheable_) cache_.index_blocks(state.kv, token_at, limit, state.block_keys);
}

void ModelDrafter::finish(DraftSequence& state, const std::function<int32_t(int)>& token_at, int length) {
  keep(state, length);
  index_full_blocks(state, token_at, length);
  if (cacheable_) cache_.index_tail(state.kv, token_at, state.block_keys);
  state.kv.clear();
}

void ModelDrafter::propose(std::vector<Job>& jobs, int catch_up_budget) {
  const int vocab = model_->info().vocab_size;
  // Jobs still drafting, and the token each feeds next (after its catch-up).
  std::vector<Job*> live;
  for (Job& job : jobs) {
    job.tokens.clear();
    job.state->q.clear();
    if (job.want <= 0) continue;
    if (!job.state->admitted) admit(job);
    live.push_back(&job);
  }
  bool first = true;
  std::vector<float> logits;
  std::vector<float> q;
  while (!live.empty()) {
    Step step;
    std::vector<Job*> in_step;
    for (Job* job : live) {
      SequenceKv& kv = job->state->kv;
      StepSegment s;
      s.kv = &kv;
      s.start_pos = kv.length();
      if (first) {
        // Catch up: everything the draft KV lacks, up to and including the sequence's last
        // token (positions [kv.length(), length)).
        const int lag = job->length - kv.length();
        const int chunk = std::min(lag, std::max(catch_up_budget, 0));
        for (int i = 0; i < chunk; ++i) s.tokens.push_back(job->token_at(kv.length() + i));
        catch_up_budget -= chunk;
        s.want_logits = chunk == lag && chunk > 0;
        if (chunk == 0) continue;
      } else {
        s.tokens = {job->tokens.back()};
        s.want_logits = true;
      }
      if (!kv.reserve(s.start_pos + static_cast<int>(s.tokens.size()))) continue;  // no room: no draft
      step.segments.push_back(std::move(s));
      in_step.push_back(job);
    }
    const bool first_pass = first;
    first = false;
    if (step.segments.empty()) break;
    model_->forward(step, pool_, logits);
    std::vector<Job*> next;
    int row = 0;
    for (size_t i = 0; i < step.segments.size(); ++i) {
      const StepSegment& s = step.segments[i];
      Job* job = in_step[i];
      job->state->kv.set_length(s.start_pos + static_cast<int>(s.tokens.size()));
      // Catch-up positions hold the sequence's own tokens: cacheable. Drafted ones never are.
      if (first_pass) index_full_blocks(*job->state, job->token_at, job->length);
      if (!s.want_logits) continue;  // a partial catch-up: drafts start next step
      const float* row_logits = logits.data() + static_cast<size_t>(row++) * vocab;
      const int token = job->state->sampler.propose(row_logits, vocab, q);
      job->tokens.push_back(token);
      job->state->q.push_back(q);
      if (static_cast<int>(job->tokens.size()) < job->want) next.push_back(job);
    }
    live.swap(next);
  }
}

}  // namespace llmd
