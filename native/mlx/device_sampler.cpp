#include "device_sampler.h"

#include <limits>

#include <mlx/mlx.h>

namespace llmd {

namespace mx = mlx::core;

mx::array sample_on_device(const mx::array& logits, const std::vector<StepSegment::DeviceSample>& params) {
  const int rows = logits.shape(0), vocab = logits.shape(1);
  const mx::array greedy = mx::astype(mx::argmax(logits, -1), mx::int32);
  std::vector<float> temperature(rows, 1.f), top_p(rows, 1.f), min_p(rows, 0.f), unit(rows, 0.f);
  std::vector<int32_t> top_k(rows, vocab);
  std::vector<uint8_t> random(rows, 0);
  bool any_random = false;
  for (int r = 0; r < rows; ++r) {
    const auto& p = params[r];
    if (p.temperature <= 0.f || p.top_k == 1) continue;  // greedy, as Sampler::sample
    random[r] = 1;
    any_random = true;
    temperature[r] = p.temperature;
    top_k[r] = p.top_k > 0 && p.top_k < vocab ? p.top_k : vocab;
    top_p[r] = p.top_p;
    min_p[r] = p.min_p;
    unit[r] = static_cast<float>(p.unit);
  }
  if (!any_random) return greedy;
  auto column = [rows](const auto& v, mx::Dtype dt) { return mx::array(v.begin(), {rows, 1}, dt); };
  const mx::array x = mx::divide(logits, column(temperature, mx::float32));
  // Largest first (MLX's sorts are stable: equal logits keep the host's order, lower id first).
  const mx::array order = mx::argsort(mx::negative(x), -1);
  const mx::array sorted = mx::take_along_axis(x, order, -1);
  const mx::array rank = mx::reshape(mx::arange(vocab, mx::int32), {1, vocab});
  mx::array keep = mx::less(rank, column(top_k, mx::int32));
  const mx::array neg_inf(-std::numeric_limits<float>::infinity());
  const mx::array probs = mx::softmax(mx::where(keep, sorted, neg_inf), -1, /*precise=*/true);
  // min_p: probabilities at least min_p times the largest (a prefix of the sorted list).
  const mx::array first = mx::slice(probs, {0, 0}, {rows, 1});
  keep = mx::logical_and(keep, mx::greater_equal(probs, mx::multiply(column(min_p, mx::float32), first)));
  // top_p: the shortest prefix whose mass reaches top_p, i.e. each entry whose preceding mass
  // is still short of it (the first always stays); off at 1, as on the host.
  const mx::array kept = mx::where(keep, probs, mx::array(0.f));
  const mx::array before = mx::subtract(mx::cumsum(kept, -1), kept);
  const mx::array p_col = column(top_p, mx::float32);
  keep = mx::logical_and(keep, mx::logical_or(mx::greater_equal(p_col, mx::array(1.f)), mx::less(before, p_col)));
  const mx::array q = mx::where(keep, probs, mx::array(0.f));
  const mx::array running = mx::cumsum(q, -1);
  const mx::array mass = mx::slice(running, {0, vocab - 1}, {rows, vocab});
  const mx::array target = mx::multiply(column(unit, mx::float32), mass);
  // The first entry whose running sum reaches the target: the count of those short of it,
  // kept inside the kept prefix (rounding at the very end).
  mx::array at = mx::sum(mx::astype(mx::less(running, target), mx::int32), -1, true);
  const mx::array n_kept = mx::sum(mx::astype(keep, mx::int32), -1, true);
  at = mx::minimum(at, mx::subtract(n_kept, mx::array(1, mx::int32)));
  const mx::array token = mx::reshape(mx::astype(mx::take_along_axis(order, at, -1), mx::int32), {rows});
  return mx::where(mx::astype(mx::array(random.begin(), {rows}, mx::uint8), mx::bool_), token, greedy);
}

std::vector<int32_t> sample_row_on_device(const std::vector<float>& logits,
                                          const std::vector<StepSegment::DeviceSample>& params) {
  const int rows = static_cast<int>(params.size()), vocab = static_cast<int>(logits.size());
  const mx::array row(logits.begin(), {1, vocab}, mx::float32);
  mx::array tokens = sample_on_device(mx::broadcast_to(row, {rows, vocab}), params);
  mx::eval(tokens);
  return {tokens.data<int32_t>(), tokens.data<int32_t>() + rows};
}

}  // namespace llmd
