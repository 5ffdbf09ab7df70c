#include "draft_cost.h"

#include <algorithm>
#include <cmath>

namespace llmd {

StepCost::StepCost(int max_rows, double fixed_row_cost)
    : seconds_(static_cast<size_t>(std::max(max_rows, 1)) + 1, -1.0),
      updated_(seconds_.size(), 0),
      fixed_(fixed_row_cost) {}

bool StepCost::fresh(int rows) const {
  return seconds_[rows] >= 0.0 && observations_ - updated_[rows] <= kForgetAfter;
}

void StepCost::observe(int rows, double seconds) {
  if (rows <= 0 || seconds <= 0.0) return;
  rows = std::min(rows, static_cast<int>(seconds_.size()) - 1);
  // A sample counts at most kMaxJump times what was expected of it: one step stalled by
  // another process must not make drafting look ruinous until its figure is forgotten.
  const double expected = fixed() ? -1.0 : estimate(rows);
  if (expected > 0.0) seconds = std::min(seconds, kMaxJump * expected);
  double& s = seconds_[rows];
  // Falls fast, rises slowly: other processes only ever add time to a step.
  s = !fresh(rows) ? seconds : s + (seconds < s ? kFall : kRise) * (seconds - s);
  updated_[rows] = ++observations_;
}

double StepCost::estimate(int rows) const {
  if (fixed_ >= 0.0) return 1.0 + fixed_ * std::max(rows - 1, 0);
  const int n = static_cast<int>(seconds_.size());
  rows = std::clamp(rows, 1, n - 1);
  if (fresh(rows)) return seconds_[rows];
  int below = -1, above = -1, lowest = -1, highest = -1;
  for (int r = std::max(1, rows - kReach); r < std::min(n, rows + kReach + 1); ++r) {
    if (!fresh(r)) continue;
    if (lowest < 0) lowest = r;
    highest = r;
    if (r < rows) below = r;
    if (r > rows && above < 0) above = r;
  }
  if (lowest < 0) return -1.0;
  const auto line = [&](int a, int b) {  // through the figures at a and b, at `rows`
    const double slope = std::max(0.0, (seconds_[b] - seconds_[a]) / (b - a));
    return seconds_[a] + slope * (rows - a);
  };
  if (below >= 0 && above >= 0) return line(below, above);
  if (above < 0) return below == lowest ? seconds_[below] : line(lowest, below);
  // Below every figure: never less than nothing.
  if (above == highest) return seconds_[above] * rows / above;
  return std::max(0.0, line(above, highest));
}

bool StepCost::measured_above(int rows) const {
  if (fixed()) return true;
  const int n = static_cast<int>(seconds_.size());
  for (int r = std::max(rows + 1, 1); r < std::min(n, rows + kReach + 1); ++r) {
    if (fresh(r)) return true;
  }
  return false;
}

std::vector<std::pair<int, double>> StepCost::measured() const {
  std::vector<std::pair<int, double>> out;
  for (int r = 1; r < static_cast<int>(seconds_.size()); ++r) {
    if (fresh(r)) out.emplace_back(r, seconds_[r]);
  }
  return out;
}

void DraftAcceptance::record(int drafted, int accepted) {
  for (int i = 0; i < accepted; ++i) observe(true);
  if (accepted < drafted) observe(false);
}

void DraftAcceptance::observe(bool kept) {
  rate_ += kWeight * ((kept ? 1.0 : 0.0) - rate_);
  ++seen_;
}

std::vector<int> plan_drafts(const StepCost& cost, int rows, int tokens,
                             const std::vector<DraftCandidate>& candidates) {
  std::vector<int> plan(candidates.size(), 0);
  struct Offer {
    double gain;  // expected kept tokens: acceptance^position
    int position;
    size_t sequence;
  };
  std::vector<Offer> offers;
  double expected = tokens;
  for (size_t i = 0; i < candidates.size(); ++i) {
    double gain = 1.0;
    for (int j = 1; j <= candidates[i].tokens; ++j) {
      gain *= std::clamp(candidates[i].acceptance, 0.0, 1.0);
      if (candidates[i].always) {  // part of the step whatever the plan
        expected += gain;
        ++rows;
        ++plan[i];
      } else {
        offers.push_back({gain, j, i});
      }
    }
  }
  // Nothing measured at this step's rows: decode plainly and measure them. Drafting is never
  // guessed free: on a compute-bound box a whole unmeasured draft costs more than it can save.
  if (offers.empty() || cost.estimate(rows) < 0.0) return plan;
  // Best first; a sequence's earlier positions first among equals, so each sequence's chosen
  // offers are always its first ones.
  std::stable_sort(offers.begin(), offers.end(), [](const Offer& a, const Offer& b) {
    return a.gain != b.gain ? a.gain > b.gain : a.position < b.position;
  });
  // Nothing measured above: the best offer alone, whose extra row measures what a row costs.
  if (!cost.measured_above(rows)) {
    plan[offers[0].sequence] += 1;
    return plan;
  }
  const double plain_step = cost.estimate(rows);
  const double plain = expected / plain_step;
  double best = plain;
  size_t chosen = 0;
  for (size_t d = 1; d <= offers.size(); ++d) {
    expected += offers[d - 1].gain;
    const double step = cost.estimate(rows + static_cast<int>(d));
    const double rate = expected / step;
    // Ties draft more only where the extra rows cost nothing (a bandwidth-bound step: every
    // draft is verified, even one that shows no promise). Where a row costs time, a draft that
    // merely breaks even (acceptance 1 at a row priced like a whole step) is not verified.
    if (rate > best || (rate == best && step <= plain_step)) {
      best = rate;
      chosen = d;
    }
  }
  // With measured costs, drafts must promise kMargin (20%) more tokens per second than plain decode.
  if (!cost.fixed() && best < (1.0 + kMargin) * plain) chosen = 0;
  for (size_t d = 0; d < chosen; ++d) plan[offers[d].sequence] += 1;
  return plan;
}

}  // namespace llmd
