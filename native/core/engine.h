// The engine: one thread running a continuous-batching loop over all in-flight sequences.
//
// Every step packs the next token of each decoding sequence and a chunk of each prefilling
// one into a single forward pass (Step), bounded by a token budget so a long prompt never
// stalls running streams for longer than one chunk. Requests beyond max_sequences wait in a
// FIFO queue. Callers talk to it through submit/cancel and drain events with poll().
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "draft_cost.h"
#include "kv_cache.h"
#include "kv_disk.h"
#include "kv_disk_loader.h"
#include "model.h"
#include "model_drafter.h"
#include "mtp_drafter.h"
#include "ngram_draft.h"
#include "prefix_cache.h"
#include "session_pins.h"
#include "sampler.h"
#include "token_constraint.h"

namespace llmd {

struct GenerateRequest {
  std::string id;
  std::vector<int32_t> prompt;
  int max_tokens = 0;
  SamplingParams sampling;
  std::vector<int32_t> stop_tokens;
  std::string session;  // named session: its KV is pinned when it ends (session_pins.h)
  std::shared_ptr<TokenConstraint> constraint;  // grammar-constrained decoding, if any
  // Another request's id with the same prompt (a sibling choice of one `n > 1` request): this
  // one waits for that prompt's prefill and starts from a copy of its KV and its last logits,
  // so the prompt is prefilled once. If that request is gone or past its prefill, this one
  // runs as an ordinary request.
  std::string prefill_of;
  // Not every request generates: an embedding request prefills its prompt and ends with the
  // pooled final-norm hidden state (last token, or mean over the prompt), optionally
  // L2-normalised; a token-logits request (rerank: P(yes) from the logits of "yes" and "no")
  // ends with the raw next-token logits of `logit_tokens` after its prompt. Neither samples,
  // and both end with one Done event carrying `values`.
  enum class Output { Tokens, Embedding, TokenLogits };
  Output output = Output::Tokens;
  enum class Pooling { Last, Mean, Cls };  // Cls: bidirectional models only
  Pooling pooling = Pooling::Last;
  bool normalize = false;
  std::vector<int32_t> logit_tokens;
  // Speculative decoding with prompt-lookup drafts (ngram_draft.h): at most this many drafted
  // tokens verified per step (0: off). Lossless: greedy output is the same token for token,
  // sampled output follows the same distribution (Sampler::sample_draft).
  int max_draft = 0;
  // With max_draft: the drafts come from the engine's draft model (model_drafter.h) rather
  // than from prompt lookup. Sampled drafts are then verified with the draft's probabilities.
  bool draft_model = false;
  // With max_draft: the drafts come from the model's own MTP head (mtp_drafter.h, Qwen3.5's
  // `mtp.*`). A sequence drafts with it only from a prompt it prefilled itself (the head reads
  // the model's hidden state at every position: a prefix reused from the cache, or a sibling
  // of n > 1, has none, and decodes without drafts).
  bool mtp = false;
  // Runs of prompt rows fed as embeddings instead of token ids: images (Gemma 3's soft
  // tokens), encoded by the caller's vision tower. The prompt holds a surrogate id below 0 at
  // each such row, derived by the caller from the image's content hash (and the row's place
  // in the image), so the prefix cache, whose keys and checks are the prompt's ids, reuses
  // an image's KV for the same image and never for another behind the same placeholders.
  struct PromptEmbeddings {
    int first = 0;  // first prompt row
    int rows = 0;
    std::shared_ptr<const std::vector<float>> values;  // [rows, hidden_size]
    // The rows attend to one another whatever their order (Gemma 3's images): the engine
    // then never splits them across prefill chunks.
    bool bidirectional = false;
    // The image's merged patch grid (rows = grid_h * grid_w), for models whose rotary places
    // image rows in 2-D (Qwen3.5's M-RoPE: row r at (base, base + r / grid_w, base + r % grid_w),
    // the text after it moved on by max(grid_h, grid_w) positions rather than rows); 0: none.
    int grid_h = 0, grid_w = 0;
  };
  std::vector<PromptEmbeddings> embeddings;
};

struct EngineEvent {
  // Started: the request was admitted and its prompt matched against the prefix cache
  // (`prompt_tokens`, `cached_tokens` set), before any of it is prefilled. Protocols whose
  // first event reports the cache split (Anthropic's message_start) wait for it.
  enum class Kind { Started, Tokens, Done, Error };
  Kind kind = Kind::Tokens;
  std::string id;
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> logprobs;  // one per token when the request asked for them
  // Done (prompt_tokens and cached_tokens: Started too)
  std::string finish_reason;
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;
  double queued_ms = 0, prefill_ms = 0, decode_ms = 0;
  // Speculative decoding: tokens drafted and how many were kept, in Done; in Tokens too (the
  // running totals, `speculative` set) when the request drafts.
  bool speculative = false;
  int drafted_tokens = 0, accepted_tokens = 0;
  std::vector<float> values;  // Done of an Embedding or TokenLogits request (GenerateRequest::Output)
  // Error
  std::string code;
  std::string message;
};

struct EngineOptions {
  int max_sequences = 8;
  int step_token_budget = 512;  // tokens per forward pass (decode rows + prefill chunk)
  size_t kv_budget_bytes = size_t{1} << 30;
  int context_length = 0;       // 0: the model's trained context; may exceed it (positions computed alike)
  // Element type of the KV blocks (--kv-type; a device backend keeps its own float dtype
  // unless Q8_0/Q4_0 is asked for). F32 is for checks against float32 references.
  KvType kv_type = KvType::F16;
  // The disk tier of the prefix cache (kv_disk.h): full blocks written under kv_disk_dir, at
  // most kv_disk_bytes there (0: off). model_digest names the model file's bytes (the store's
  // sha256); without it blocks could not be told apart from another model's, so the tier is off.
  std::string kv_disk_dir;
  size_t kv_disk_bytes = 0;
  std::string model_digest;
  // Tests only: every disk read waits this long first (a slow disk), so a load lasts long
  // enough for a test to see other sequences step meanwhile.
  int kv_disk_read_delay_ms = 0;
  // Speculative decoding's cost model (draft_cost.h): < 0 measures what a step's rows cost;
  // >= 0 fixes it at 1 + draft_row_cost * (rows - 1) one-row steps (tests, benchmarks: 0 makes
  // drafting free, as before the cost model).
  double draft_row_cost = -1.0;
};

struct EngineStats {
  int active_sequences = 0;
  int queued_requests = 0;
  uint64_t steps = 0;
  uint64_t tokens_generated = 0;
  uint64_t prompt_tokens_processed = 0;
  size_t kv_bytes = 0;       // blocks, window parts and lane bytes (KvPool::allocated_bytes)
  size_t kv_lane_bytes = 0;
  uint64_t device_sampled_tokens = 0;  // tokens the model's device picked (device_sampler.h)
  uint64_t host_sampled_tokens = 0;    // tokens sampled on the host from a logits row  // of kv_bytes, the device path's decode lanes (KvPool::claim_extra)
  size_t kv_blocks_used = 0;
  size_t kv_window_parts = 0;  // sliding-window layers' parts of blocks still kept
  int max_rows_sampled_in_a_step = 0;
  uint64_t prefix_cache_hits = 0;       // requests that reused cached KV
  uint64_t prefix_cached_tokens = 0;    // prompt tokens not prefilled thanks to the cache
  uint64_t prefix_partial_tokens = 0;   // of the reused tokens, those copied from partly shared blocks
  uint64_t forked_sequences = 0;        // sequences started from a sibling's prefill
  size_t prefix_cache_blocks = 0;       // blocks indexed by the cache
  size_t pinned_sessions = 0;           // named sessions holding KV
  size_t pinned_blocks = 0;             // blocks they hold (shared blocks counted per session)
  size_t kv_idle_cached_blocks = 0;     // cached blocks no running sequence uses
  // How many steps sampled k sequences at once (k -> steps): proves steps are batched.
  std::map<int, uint64_t> sampled_rows_histogram;
  uint64_t embedding_requests = 0;   // Embedding and TokenLogits requests that completed
  // How many steps finished k such requests at once (k -> steps): proves embeddings batch.
  std::map<int, uint64_t> pooled_rows_histogram;
  // Speculative decoding: drafted tokens verified and accepted, steps that verified drafts,
  // and how many steps verified the drafts of k sequences in their one forward (k -> steps):
  // proves drafts are verified batched, not looped per sequence.
  uint64_t draft_tokens = 0;
  uint64_t draft_accepted_tokens = 0;
  uint64_t speculative_steps = 0;
  std::map<int, uint64_t> drafting_rows_histogram;
  // Draft tokens on offer (found by the n-gram lookup, or allowed by a sequence's draft length
  // for a draft model or MTP head) that the cost model declined to verify: their rows were
  // expected to cost more than they would save (draft_cost.h). And the step cost it works
  // from: the measured wall time of a step by its rows (rows -> seconds).
  uint64_t draft_declined_tokens = 0;
  // Prompt positions draft-model sequences took from the draft model's own prefix cache
  // instead of prefilling them in the draft model (model_drafter.h).
  uint64_t draft_cached_tokens = 0;
  std::vector<std::pair<int, double>> step_cost;
  // The disk tier: whether it runs (else why not: kv_disk_off_reason), requests that loaded
  // blocks from it and the prompt tokens those blocks held, and its own counters.
  bool kv_disk_enabled = false;
  std::string kv_disk_off_reason;
  std::string kv_disk_dir;  // this model's directory of block files
  uint64_t kv_disk_hits = 0;
  uint64_t kv_disk_hit_tokens = 0;
  // Loads run off the engine thread (kv_disk_loader.h): how many were started, and how many
  // steps ran while at least one was in flight (other sequences kept decoding meanwhile).
  uint64_t kv_disk_loads = 0;
  uint64_t kv_disk_load_steps = 0;
  // Recurrent models: state snapshots read from disk and served with their prefix.
  uint64_t kv_disk_state_hits = 0;
  DiskTierStats kv_disk;
  // Attention calls by the path that read KV (Model::attention_paths).
  std::map<std::string, uint64_t> attention_paths;
};

class Engine {
 public:
  // `draft`: a draft model for speculative decoding (requests with draft_model), loaded
  // beside the target; it must have the target's vocabulary (std::invalid_argument if not).
  Engine(std::unique_ptr<Model> model, EngineOptions options, std::unique_ptr<Model> draft = nullptr);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  void submit(GenerateRequest request);
  // Several requests queued at once, so they are admitted into the same step (the many
  // inputs of one embedding request); each is validated and answered on its own.
  void submit(std::vector<GenerateRequest> requests);
  // Stops the engine thread (idempotent; the destructor calls it). Callers that may hold a
  // lock the engine thread needs (a Python GIL for constraints) call it after releasing it.
  void shutdown();
  void cancel(const std::string& id);
  // Lets a named session's KV go back to the cache (evictable); unknown names are ignored.
  void unpin(const std::string& session);
  // Waits up to timeout_ms for events, then returns all pending ones.
  std::vector<EngineEvent> poll(int timeout_ms);
  EngineStats stats();
  const ModelInfo& info() const { return model_->info(); }
  int context_length() const { return context_length_; }
  // Every model verifies drafts (a model with recurrent layers sets its state back to the
  // snapshot at the last kept position).
  bool supports_speculation() const { return !bidirectional_; }
  // Whether the model ships an MTP head that drafts (requests with mtp).
  bool has_mtp() const { return mtp_ != nullptr; }
  // Whether requests may carry prompt rows fed as embeddings (images).
  bool accepts_embeddings() const { return model_->accepts_embeddings(); }
  // The draft model's facts, or null when none is loaded.
  const ModelInfo* draft_info() const { return drafter_ ? &drafter_->info() : nullptr; }
  const EngineOptions& options() const { return options_; }
  std::map<std::string, std::string> matmul_paths() const { return model_->matmul_paths(); }
  // The KV pool's fixed facts (element type, bytes per position, capacity of the budget).
  const KvPool& kv_pool() const { return pool_; }
  // Waits until every block queued for the disk tier is written (tests, benchmarks).
  void flush_kv_disk() {
    if (disk_) disk_->flush();
    if (window_disk_) window_disk_->flush();
    if (state_disk_) state_disk_->flush();
  }

  // Synchronous helper for tests and parity scripts (teacher forcing): runs `tokens` as one
  // fresh sequence and returns the logits after each position p >= first_scored - 1, i.e. the
  // predictions of tokens[first_scored..n] and of the next token: [n - first_scored + 1, vocab].
  std::vector<float> score(const std::vector<int32_t>& tokens, int first_scored);
  // The MTP head's guesses over `tokens` (tests against a reference): the model runs them as
  // one fresh sequence, the head reads its hidden state at positions 0..n-2 with tokens 1..n-1
  // (row i guesses token i + 2), then chains `chain` greedy guesses after the last. Returns
  // [n - 1 + chain, vocab] logits; `chained` gets the chained tokens.
  std::vector<float> mtp_probe(const std::vector<int32_t>& tokens, int chain, std::vector<int32_t>& chained);

  // Runs fn() between forward passes, never during one: other MLX work of the process (a
  // vision tower encoding a request's images) must not build or evaluate graphs while the
  // engine thread does.
  template <class F>
  auto between_steps(F&& fn) {
    std::lock_guard<std::recursive_mutex> lock(forward_mutex_);
    return fn();
  }

 private:
  using Clock = std::chrono::steady_clock;
  // A sequence's admission while its prefix loads from disk (admit, finish_disk_load): the
  // match so far, the blocks it holds meanwhile, and the reads in flight.
  struct Admission {
    PrefixCache::Match m;
    std::vector<int> held;     // matched RAM blocks, retained (then loaded ones too)
    int partial = -1;          // the partial candidate, retained
    int from_disk = 0;         // of `held`, the blocks loaded from disk (its tail)
    std::vector<int> loading;  // blocks allocated for the disk chain, one reference each
    std::vector<uint64_t> keys;
    std::vector<int> window_blocks;  // blocks whose window part is read (attached already)
    uint64_t state_key = 0;          // recurrent models: the snapshot read, 0: none
    std::vector<std::byte> state;
    std::vector<std::vector<std::byte>> staging;  // device backends: the reads' buffers
    std::shared_ptr<DiskLoad> job;
    bool cancelled = false;
  };
  struct Sequence {
    GenerateRequest request;
    std::unique_ptr<SequenceKv> kv;
    Sampler sampler;
    int fed = 0;                  // prompt tokens already in the KV
    int cached = 0;               // of which reused from the prefix cache
    std::vector<uint64_t> block_keys;  // prefix-cache keys of this sequence's full blocks
    uint64_t decode_snapshot_key = 0;  // recurrent models: latest snapshot past the prompt (0: none)
    std::vector<int32_t> generated;
    std::vector<double> hidden_sum;  // mean pooling: sum of the final-norm hidden rows so far
    TokenCounts counts;  // only filled when a penalty needs it
    DraftLength draft_length;       // speculative decoding: tokens to draft next
    DraftAcceptance acceptance;     // and how its drafts fare, for the cost model
    int32_t declined_first = -1;    // the first draft token the cost model declined this step
    std::vector<int32_t> draft;     // the tokens drafted for the step being run
    std::unique_ptr<DraftSequence> drafting;  // draft-model and MTP requests: draft KV, q rows
    std::unique_ptr<Admission> admission;     // while its prefix loads from disk
    int drafted = 0, accepted = 0;  // totals, for the Done event
    Clock::time_point submitted, admitted, first_token;
    explicit Sequence(GenerateRequest r, KvPool& pool)
        : request(std::move(r)),
          kv(std::make_unique<SequenceKv>(pool)),
          sampler(request.sampling),
          counts(request.sampling.repetition_window),
          draft_length(request.max_draft) {}
    bool prefilling() const { return fed < static_cast<int>(request.prompt.size()); }
    int32_t token_at(int pos) const {
      const int n = static_cast<int>(request.prompt.size());
      return pos < n ? request.prompt[pos] : generated[pos - n];
    }
  };

  void loop();
  void step_once();
  void finish(Sequence& seq, const std::string& reason, std::vector<float> values = {});
  // An Embedding / TokenLogits sequence's result from its last chunk's outputs.
  std::vector<float> pooled_values(Sequence& seq, const float* hidden, const float* logits) const;
  // Matches the prompt against the prefix cache and adopts what it may reuse; false when part
  // of it must come from disk first (the sequence then waits in loading_ until its reads are
  // done: finish_disk_load completes the admission).
  bool admit(Sequence& seq);
  void complete_admit(Sequence& seq, Admission& a);
  // Plans and starts the reads of the blocks (window parts, state snapshot) on disk that
  // continue a's match; false when there is nothing to read.
  bool start_disk_load(Sequence& seq, Admission& a);
  void finish_disk_load(Sequence& seq);
  // Loads whose reads are done: their sequences join active_ (or end, when cancelled).
  void collect_loads();
  // Gives kv (on whole blocks, up to the one holding position length - 1) its own copy of
  // block src as that block, and length positions: a cached block's shared head, a forking
  // parent's partly filled last block. False when the KV budget has no room for it.
  bool copy_into_next_block(SequenceKv& kv, int src, int length);
  void index_full_blocks(Sequence& seq);
  // The disk tier (kv_disk.h): why it cannot run for this model and options ("" when it can);
  // queueing a copy of a cached block; extending a match with the blocks on disk that follow it
  // (each loaded into a newly allocated block with one reference, which the caller releases).
  std::string disk_tier_off_reason() const;
  void save_to_disk(uint64_t key, uint64_t parent, const int32_t* tokens, int block);
  // Recurrent models: a snapshot (the state after the block of `key`) queued for the disk tier.
  void save_state_to_disk(uint64_t key, uint64_t parent, const int32_t* tokens, const SequenceState& state);
  // A sequence's block `index`: its parent key and its tokens.
  uint64_t parent_of(const Sequence& seq, size_t index) const { return index == 0 ? 0 : seq.block_keys[index - 1]; }
  std::vector<int32_t> block_tokens(const Sequence& seq, size_t index) const;
  // Sliding-window models: the window parts the match's end reads, loaded from the window tier
  // into the blocks that have none; the match ends before the first block whose part is on
  // neither (its blocks stay referenced by the caller, who held them).
  void load_window_parts(PrefixCache::Match& m, const std::vector<int32_t>& prompt);
  // A finished sequence's partly filled last block, into the prefix cache as a reusable head
  // (PrefixCache::insert_partial).
  void index_partial_tail(const Sequence& seq);
  // Recurrent models: the block boundaries of this segment where a state snapshot is kept,
  // and publishing the snapshots the model recorded there into the prefix cache.
  std::vector<int> snapshot_positions(const Sequence& seq, int start, int n) const;
  // Recurrent models, a step verifying `drafts` drafts from `start`: snapshot_positions'
  // positions and the state after every fed token but the last.
  std::vector<int> verify_snapshots(const Sequence& seq, int start, int drafts) const;
  // After verifying `kept` of the drafts fed from `start`: the sequence's state back at its
  // length (the snapshot there), and only snapshot_positions' snapshots left.
  void restore_state(Sequence& seq, int start, int kept);
  // Whether this segment (fed from `start`) gives the MTP head its hidden states; opens the
  // sequence's head state on its first segment.
  bool mtp_reads(Sequence& seq, int start);
  void keep_snapshots(Sequence& seq);
  // Samples seq's next token from `logits` (modified) and emits it; the finish reason when
  // the sequence ends with it, else "". With a `draft` (>= 0) the token is sampled
  // speculatively (Sampler::sample_draft); `token` gets what was taken (-1: nothing).
  // `draft_q`: the draft model's distribution the draft was drawn from (empty: deterministic).
  // With `logits` null, `device_token` is the token (sampled on the device).
  std::string take_token(Sequence& seq, float* logits, int vocab, int draft = -1, int* token = nullptr,
                         const std::vector<float>* draft_q = nullptr, int device_token = -1);
  // Whether a segment's token may be sampled on the device (samples_on_device): a decode row
  // of a request that needs nothing of the logits on the host.
  bool device_samples(const Sequence& seq, const StepSegment& s) const;
  // How many tokens a decoding sequence drafts this step, at most `room`.
  int draft_want(Sequence& seq, int room);
  // Fills the draft-model and MTP drafts of this step's decoding sequences (`wants`: what
  // plan_drafts_of left of draft_want's) in the draft model's and the head's batched forwards;
  // the n-gram ones were made by plan_drafts_of.
  void draft_all(const std::vector<Sequence*>& decoding, const std::vector<int>& wants);
  // Before draft_all: the n-gram drafts (cheap lookups, made here so the cost model sees what
  // was found), then the cost model's cut of every sequence's drafts (`wants` lowered, n-gram
  // drafts shortened). `rows`: the step's rows without drafts.
  void plan_drafts_of(const std::vector<Sequence*>& decoding, std::vector<int>& wants, int rows);
  // Siblings waiting for `parent`'s prefill (mutex_ taken inside).
  std::vector<std::unique_ptr<Sequence>> take_forks(const std::string& parent);
  // Starts a sibling from parent's just-prefilled prompt: shared full blocks, a copy of the
  // partial last one, its first token sampled from the parent's last logits.
  void start_fork(Sequence& parent, std::unique_ptr<Sequence> child, const float* logits, int vocab);
  // Under mutex_: siblings whose parent is cancelled, failed or already past its prefill run
  // as ordinary requests; cancelled siblings end.
  void settle_forks(std::unique_lock<std::mutex>& lock);
  void publish_gauges();  // engine thread: occupancy figures for stats()
  void emit(EngineEvent event);
  // Processors, constraint and sampler on one row of logits (modified in place); -1 when the
  // constraint admits no token. Fills `lp` when the request asked for logprobs.
  int sample_row(Sequence& seq, float* logits, int vocab, TokenLogprob& lp, int draft = -1,
                 const std::vector<float>* draft_q = nullptr);
  std::string validate(const GenerateRequest& r, std::string& code) const;
  // Prompts with embedded rows: the prefill chunk of `n` rows from seq.fed shortened or
  // lengthened so no bidirectional run is split; and the segment's embeddings and attend_to.
  int embedded_chunk(const Sequence& seq, int n) const;
  void fill_embedded_rows(const Sequence& seq, StepSegment& s) const;
  // Prompts with an image on a grid (PromptEmbeddings::grid_h): each fed row's M-RoPE
  // (t, h, w) position, decode rows included (StepSegment::mrope).
  void fill_mrope_positions(const Sequence& seq, StepSegment& s) const;

  std::unique_ptr<Model> model_;
  bool recurrent_;  // model_->has_recurrent_state()
  bool bidirectional_;  // model_->bidirectional(): whole prompts per step, no prefix cache
  bool device_sampling_;  // model_->samples_on_device()
  EngineOptions options_;
  int context_length_;
  StepCost step_cost_{1};  // engine thread only: what a step costs by its rows
  // Before every member that holds sequences: their draft KV lives in its pool.
  std::unique_ptr<ModelDrafter> drafter_;
  std::unique_ptr<MtpDrafter> mtp_;  // the model's MTP head, where it has one
  KvPool pool_;
  PrefixCache prefix_cache_;
  SessionPins session_pins_;  // after pool_: released before it
  std::unique_ptr<DiskKvTier> disk_;  // null when off (disk_off_reason_ says why)
  // Sliding-window models: every full block's window part too, in a directory of its own
  // (the same chain keys, the same bound over the whole root). Null without windows.
  std::unique_ptr<DiskKvTier> window_disk_;
  // Recurrent models: state snapshots at block boundaries, keyed by their block's chain key.
  std::unique_ptr<DiskKvTier> state_disk_;
  std::string disk_off_reason_;
  std::unique_ptr<DiskLoader> loader_;  // reads for admissions, off the engine thread

  std::mutex mutex_;  // guards waiting_, cancels_, stop_, events_
  std::condition_variable work_cv_;
  std::condition_variable events_cv_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::map<std::string, std::vector<std::unique_ptr<Sequence>>> forks_;  // parent id -> siblings
  std::unordered_set<std::string> cancels_;
  std::vector<std::string> unpins_;  // guarded by mutex_; applied on the engine thread
  std::vector<EngineEvent> events_;
  bool stop_ = false;

  std::vector<std::unique_ptr<Sequence>> active_;  // engine thread only
  std::vector<std::unique_ptr<Sequence>> loading_;  // engine thread only: admitted, reading from disk
  // A step's logits and hidden rows (engine thread only), kept from step to step: a fresh
  // vector per step cost a 1.5 MB allocation and zero-fill at 8 decode rows of a 49k vocabulary.
  std::vector<float> step_logits_;
  std::vector<float> step_hidden_;
  std::mutex stats_mutex_;
  EngineStats stats_;
  // Serialises forward passes and every other MLX graph of the process (engine thread vs
  // score(), a vision tower); recursive because a block evicted inside a forward (the device
  // path's decode lanes claiming room) is copied out of the device store for the disk tier.
  std::recursive_mutex forward_mutex_;
  std::thread thread_;
};

}  // namespace llmd
