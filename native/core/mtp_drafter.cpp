#include "mtp_drafter.h"

#include <algorithm>
#include <stdexcept>

namespace llmd {

namespace {
KvShape head_shape(const MtpHead& head, KvType kv_type) {
  KvShape shape = head.kv_shape();
  if (shape.host_storage || kv_type_quantized(kv_type)) shape.type = kv_type;
  return shape;
}

int best_token(const float* row, int n) { return static_cast<int>(std::max_element(row, row + n) - row); }
}  // namespace

MtpDrafter::MtpDrafter(MtpHead& head, int hidden_size, int vocab_size, size_t kv_budget_bytes, KvType kv_type)
    : head_(head), hidden_size_(hidden_size), vocab_(vocab_size), pool_(head_shape(head, kv_type), kv_budget_bytes) {}

void MtpDrafter::propose(std::vector<Job>& jobs, int catch_up_budget) {
  const int H = hidden_size_;
  struct Live {
    Job* job;
    int base;                // the head's KV length made from the model's hidden states
    std::vector<float> out;  // the head's output of the last entry: the next entry's hidden state
  };
  std::vector<Live> live;
  std::vector<Live> catching;
  for (Job& job : jobs) {
    job.tokens.clear();
    job.state->q.clear();
  }
  // Catch-up: every position the head has not read, the last giving the first guess.
  {
    Step step;
    std::vector<Job*> in_step;
    std::vector<float> hidden_in;
    for (Job& job : jobs) {
      DraftSequence& st = *job.state;
      const int lag = static_cast<int>(st.hidden.size() / H);
      const int chunk = std::min(lag, std::max(catch_up_budget, 0));
      if (chunk == 0) continue;
      StepSegment s;
      s.kv = &st.kv;
      s.start_pos = st.kv.length();
      for (int i = 0; i < chunk; ++i) s.tokens.push_back(job.token_at(st.start + s.start_pos + 1 + i));
      s.want_logits = chunk == lag && job.want > 0;
      if (!st.kv.reserve(s.start_pos + chunk)) continue;  // no room: it reads them another step
      catch_up_budget -= chunk;
      hidden_in.insert(hidden_in.end(), st.hidden.begin(), st.hidden.begin() + static_cast<size_t>(chunk) * H);
      step.segments.push_back(std::move(s));
      in_step.push_back(&job);
    }
    if (step.segments.empty()) return;
    std::vector<float> logits, hidden_out;
    head_.forward(step, pool_, hidden_in, logits, hidden_out);
    int row = 0;
    for (size_t i = 0; i < step.segments.size(); ++i) {
      const StepSegment& s = step.segments[i];
      Job* job = in_step[i];
      DraftSequence& st = *job->state;
      const int chunk = static_cast<int>(s.tokens.size());
      st.kv.set_length(s.start_pos + chunk);
      st.hidden.erase(st.hidden.begin(), st.hidden.begin() + static_cast<size_t>(chunk) * H);
      if (!s.want_logits) continue;
      const float* row_logits = logits.data() + static_cast<size_t>(row) * vocab_;
      std::vector<float> q;
      job->tokens.push_back(st.sampler.propose(row_logits, vocab_, q));
      st.q.push_back(std::move(q));
      Live l{job, st.kv.length(), std::vector<float>(hidden_out.begin() + static_cast<size_t>(row) * H,
                                                     hidden_out.begin() + static_cast<size_t>(row + 1) * H)};
      ++row;
      if (static_cast<int>(job->tokens.size()) < job->want) {
        live.push_back(std::move(l));
      } else {
        catching.push_back(std::move(l));
      }
    }
  }
  // Chained guesses: one batched forward per drafted position.
  while (!live.empty()) {
    Step step;
    std::vector<float> hidden_in;
    std::vector<Live*> in_step;
    for (Live& l : live) {
      SequenceKv& kv = l.job->state->kv;
      StepSegment s;
      s.kv = &kv;
      s.start_pos = kv.length();
      s.tokens = {l.job->tokens.back()};
      s.want_logits = true;
      if (!kv.reserve(s.start_pos + 1)) continue;  // no room: the proposal stops here
      hidden_in.insert(hidden_in.end(), l.out.begin(), l.out.end());
      step.segments.push_back(std::move(s));
      in_step.push_back(&l);
    }
    if (step.segments.empty()) break;
    std::vector<float> logits, hidden_out;
    head_.forward(step, pool_, hidden_in, logits, hidden_out);
    std::vector<Live> next;
    for (size_t i = 0; i < in_step.size(); ++i) {
      Live& l = *in_step[i];
      DraftSequence& st = *l.job->state;
      st.kv.set_length(step.segments[i].start_pos + 1);
      std::vector<float> q;
      l.job->tokens.push_back(st.sampler.propose(logits.data() + i * vocab_, vocab_, q));
      st.q.push_back(std::move(q));
      l.out.assign(hidden_out.begin() + i * H, hidden_out.begin() + (i + 1) * H);
      if (static_cast<int>(l.job->tokens.size()) < l.job->want) {
        next.push_back(std::move(l));
      } else {
        catching.push_back(std::move(l));
      }
    }
    for (Live& l : live) {  // those that found no room
      if (std::find(in_step.begin(), in_step.end(), &l) == in_step.end()) catching.push_back(std::move(l));
    }
    live.swap(next);
  }
  // The chained entries were made from the head's own outputs: drop their KV.
  for (Live& l : catching) l.job->state->kv.set_length(l.base);
}

std::vector<float> MtpDrafter::probe(const std::vector<float>& hidden, const std::vector<int32_t>& tokens, int chain,
                                     std::vector<int32_t>& chained) {
  const int n = static_cast<int>(tokens.size());
  if (hidden.size() != static_cast<size_t>(n) * hidden_size_ || n == 0) {
    throw std::invalid_argument("MTP probe: one hidden state per token expected");
  }
  SequenceKv kv(pool_);
  if (!kv.reserve(n + chain)) throw std::runtime_error("KV budget exhausted while probing the MTP head");
  std::vector<float> all, logits, out;
  Step step;
  StepSegment s;
  s.kv = &kv;
  s.tokens = tokens;
  s.want_logits = true;
  s.logits_tail = n;
  step.segments.push_back(s);
  head_.forward(step, pool_, hidden, logits, out);
  kv.set_length(n);
  all = logits;
  chained.clear();
  for (int c = 0; c < chain; ++c) {
    const size_t last = all.size() / vocab_ - 1;
    chained.push_back(best_token(all.data() + last * vocab_, vocab_));
    std::vector<float> h(out.end() - hidden_size_, out.end());
    Step next;
    StepSegment t;
    t.kv = &kv;
    t.start_pos = n + c;
    t.tokens = {chained.back()};
    t.want_logits = true;
    next.segments.push_back(t);
    head_.forward(next, pool_, h, logits, out);
    kv.set_length(n + c + 1);
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

}  // namespace llmd
