#include "thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define LLMD_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define LLMD_PAUSE() asm volatile("yield")
#else
#define LLMD_PAUSE() ((void)0)
#endif

namespace llmd {

namespace {
std::unique_ptr<ThreadPool>& global_slot() {
  static std::unique_ptr<ThreadPool> pool;
  return pool;
}
std::mutex global_mutex;

// How long an idle worker spins before sleeping: covers the gap between the ops of one step.
const std::chrono::microseconds kSpin{[] {
  const char* v = std::getenv("LLMD_SPIN_US");
  return v ? std::atoi(v) : 300;
}()};

void split(int n_tasks, int n_parts, int part, int& begin, int& end) {
  const int base = n_tasks / n_parts;
  const int extra = n_tasks % n_parts;
  begin = part * base + std::min(part, extra);
  end = begin + base + (part < extra ? 1 : 0);
}
}  // namespace

int default_thread_count() {
  if (const char* env = std::getenv("LLMD_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  for (int i = 1; i < n_threads_; ++i) {
    workers_.emplace_back([this, i] { worker_loop(i); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop(int worker_index) {
  unsigned long seen = 0;
  while (true) {
    // Spin, then sleep, until a new generation of work is published.
    const auto spin_until = std::chrono::steady_clock::now() + kSpin;
    int polls = 0;
    while (generation_.load(std::memory_order_acquire) == seen && !stopping_.load()) {
      LLMD_PAUSE();
      if (++polls % 64 == 0 && std::chrono::steady_clock::now() > spin_until) {
        std::unique_lock<std::mutex> lock(mutex_);
        sleepers_.fetch_add(1);
        work_ready_.wait(lock, [&] { return stopping_.load() || generation_.load() != seen; });
        sleepers_.fetch_sub(1);
        break;
      }
    }
    if (stopping_.load()) return;
    seen = generation_.load(std::memory_order_acquire);
    run_share(worker_index);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run_share(int worker_index) {
  const std::function<void(int, int)>& job = *job_;
  if (job_dynamic_) {
    for (int t = next_task_.fetch_add(1, std::memory_order_relaxed); t < job_tasks_;
         t = next_task_.fetch_add(1, std::memory_order_relaxed)) {
      job(t, t + 1);
    }
    return;
  }
  int begin, end;
  split(job_tasks_, n_threads_, worker_index, begin, end);
  if (begin < end) job(begin, end);
}

void ThreadPool::run(int n_tasks, const std::function<void(int, int)>& fn, bool dynamic) {
  if (n_tasks <= 0) return;
  if (n_threads_ == 1 || n_tasks == 1) {
    fn(0, n_tasks);
    return;
  }
  job_ = &fn;
  job_tasks_ = n_tasks;
  job_dynamic_ = dynamic;
  next_task_.store(0, std::memory_order_relaxed);
  pending_.store(n_threads_ - 1, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  if (sleepers_.load() > 0) work_ready_.notify_all();
  run_share(0);
  while (pending_.load(std::memory_order_acquire) != 0) LLMD_PAUSE();
  job_ = nullptr;
}

void ThreadPool::parallel_for(int n_tasks, const std::function<void(int, int)>& fn) { run(n_tasks, fn, false); }

void ThreadPool::parallel_for_dynamic(int n_tasks, const std::function<void(int, int)>& fn) {
  run(n_tasks, fn, true);
}

ThreadPool& ThreadPool::global() {
  std::lock_guard<std::mutex> lock(global_mutex);
  auto& slot = global_slot();
  if (!slot) slot = std::make_unique<ThreadPool>(default_thread_count());
  return *slot;
}

void ThreadPool::configure_global(int n_threads) {
  std::lock_guard<std::mutex> lock(global_mutex);
  global_slot() = std::make_unique<ThreadPool>(n_threads > 0 ? n_threads : default_thread_count());
}

}  // namespace llmd
