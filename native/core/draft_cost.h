// Whether drafting pays inside a batched step: a cost model for speculative decoding.
//
// Why: verifying k drafted tokens adds k rows to the step. Where a step is bound by reading the
// weights (a GPU, a small batch) extra rows cost about nothing, and drafting whatever the
// sequence's recent acceptance allows (DraftLength) is right. Where it is bound by compute (a
// CPU with a few cores once several rows run) every row costs real time, and drafts that are
// mostly rejected make the whole batch slower: on 2 cores, the 1B model at 4 streams ran at
// 0.92x of plain decode with n-gram drafts. So before drafting, the engine weighs what the
// extra rows cost against the tokens they are expected to save.
//
// The rule (plan_drafts): a decoding sequence whose recent drafts were kept at a rate `a` per
// position (DraftAcceptance) expects its j-th drafted token to be kept with probability a^j
// (each drafted token counts only if all before it were kept). The step's plain rows yield one
// token per decoding sequence. Candidate draft tokens, across all sequences, are taken in order
// of that expected gain, best first, and the engine verifies the D best where D maximises
//     (decoding sequences + expected kept drafts among the D best) / step cost(rows + D),
// i.e. expected tokens per second of this step; D = 0 (no drafts) when no D beats plain decode
// by kMargin (below).
// The step cost is measured (StepCost): an average of the step's wall time per row count.
// Until it is, drafting is not guessed free: a step whose plain rows are not measured verifies no
// draft (it measures them), and one with nothing measured above its plain rows verifies the single
// best draft token (it measures one extra row, from which the line extends). A figure forgotten
// after kForgetAfter steps is measured again the same way: one row, not a whole draft.
#pragma once

#include <cstdint>
#include <vector>

namespace llmd {

// The wall time of an engine step as a function of its rows (tokens fed): a moving average per
// row count, from the steps the engine ran. A row count not measured is estimated from the
// measured ones within kReach rows of it: between two, on the line joining them; beyond the largest, on the line
// through the largest and the smallest measured (flat when only one is: drafting looks free
// until measured, so it is tried once); below the smallest, on the line through the smallest
// and the largest (proportional to rows when only one is: plain decode looks cheap until
// measured, so it is tried once). A sample counts at most kMaxJump times the estimate it
// replaces (a step stalled by another process is not a cost of its rows), and a figure not
// refreshed for kForgetAfter steps is forgotten, so an outlier or a context that has grown
// since is measured again: on a box where drafts do not pay, that is one extra row in
// kForgetAfter steps (plan_drafts).
class StepCost {
 public:
  // `max_rows`: the most rows a step may have. `fixed_row_cost` >= 0 replaces the measurements
  // by cost(rows) = 1 + fixed_row_cost * (rows - 1) (tests and benchmarks: 0 makes drafting
  // free, 1 makes every row cost a whole one-row step).
  explicit StepCost(int max_rows, double fixed_row_cost = -1.0);
  void observe(int rows, double seconds);
  // The estimated cost of a step of `rows` rows; < 0 when nothing has been measured.
  double estimate(int rows) const;
  bool fixed() const { return fixed_ >= 0.0; }
  // Whether a figure above `rows` (within kReach) is measured: what drafting on top of a step of
  // `rows` rows costs is then known, not guessed.
  bool measured_above(int rows) const;
  // The measured figures still in use (rows -> seconds), for stats.
  std::vector<std::pair<int, double>> measured() const;

  // Weights of the newest step in a row count's average: a faster step counts more than a
  // slower one, since other processes only ever add time to a step.
  static constexpr double kFall = 0.5;
  static constexpr double kRise = 0.2;
  static constexpr double kMaxJump = 2.0;      // a sample is clipped to this times the estimate
  static constexpr uint64_t kForgetAfter = 64; // steps
  // Only figures this close in rows inform an estimate: a prefill chunk's cost per row says
  // nothing about a decode step's.
  static constexpr int kReach = 32;

 private:
  bool fresh(int rows) const;
  std::vector<double> seconds_;     // per row count; < 0: not measured
  std::vector<uint64_t> updated_;   // the observation count at its last update
  uint64_t observations_ = 0;
  double fixed_ = -1.0;
};

// A sequence's recent acceptance per drafted position: the chance that a drafted token is kept
// given that all before it were. A moving average over positions verified (each kept draft a
// 1, the first rejected one a 0; positions after a rejection are not evidence), starting at
// kPrior. A first draft token the cost model declined counts too, once the step shows what
// the token really was (free evidence: no row paid for it).
class DraftAcceptance {
 public:
  double rate() const { return rate_; }
  // Whether enough positions were seen to trust rate(): until then a sequence drafting with an
  // MTP head or a draft model drafts what its draft length allows, so a drafter that is often
  // right gets to show it (nothing shows what a declined draft of theirs would have been). An
  // n-gram sequence does not wait for this: its declined drafts are evidence (observe).
  bool known() const { return seen_ >= kEvidence; }
  void record(int drafted, int accepted);
  void observe(bool kept);

  static constexpr double kPrior = 0.5;
  static constexpr double kWeight = 0.15;
  static constexpr int kEvidence = 4;

 private:
  double rate_ = kPrior;
  int seen_ = 0;
};

struct DraftCandidate {
  int tokens = 0;          // drafts on offer (n-gram: found; draft model, MTP: asked for)
  double acceptance = 0;   // DraftAcceptance::rate
  // Drafted whatever the cost: a draft-model or MTP sequence whose acceptance is not known yet,
  // or one whose draws must not depend on timing (a sampled request: its seed's tokens depend
  // on how many drafts each step verified).
  bool always = false;
};

// The least gain, in expected tokens per second over plain decode, for which a step with
// measured costs verifies drafts. Why: the decision is made on estimates, and it acts on the ones
// that read favourable, so they are biased its way. On the 1B model at 4 streams (quiet, 2
// cores) a step with one draft row cost +21% over plain decode by the steps' medians while the
// moving averages it decided on read +8%, and the sequences it drafted for read acceptances of
// 0.7-0.9 while 55-58% of their drafts were kept: its drafting steps promised +10-14% and lost
// ~6% each. A fixed cost (tests, benchmarks) decides on the estimate alone: draft_row_cost 0
// verifies every draft.
inline constexpr double kMargin = 0.20;

// How many of its candidate drafts each sequence verifies this step (the rule at the top).
// `rows`: the step's rows without drafts; `tokens`: the tokens they yield (decoding sequences).
// Without a measured cost of `rows` no offer is drafted; with nothing measured above it, one.
std::vector<int> plan_drafts(const StepCost& cost, int rows, int tokens, const std::vector<DraftCandidate>& candidates);

}  // namespace llmd
