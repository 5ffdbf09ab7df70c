#include "thread_pool.h"

#include <algorithm>
#include <cstdlib>
#include <memory>

namespace llmd {

namespace {
std::unique_ptr<ThreadPool>& global_slot() {
  static std::unique_ptr<ThreadPool> pool;
  return pool;
}
std::mutex global_mutex;

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
    const std::function<void(int, int)>* job;
    int tasks;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      job = job_;
      tasks = job_tasks_;
    }
    int begin, end;
    split(tasks, n_threads_, worker_index, begin, end);
    if (begin < end) (*job)(begin, end);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_ == 0) work_done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int n_tasks, const std::function<void(int, int)>& fn) {
  if (n_tasks <= 0) return;
  if (n_threads_ == 1 || n_tasks == 1) {
    fn(0, n_tasks);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    job_tasks_ = n_tasks;
    pending_ = n_threads_ - 1;
    ++generation_;
  }
  work_ready_.notify_all();
  int begin, end;
  split(n_tasks, n_threads_, 0, begin, end);
  if (begin < end) fn(begin, end);
  std::unique_lock<std::mutex> lock(mutex_);
  work_done_.wait(lock, [&] { return pending_ == 0; });
  job_ = nullptr;
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
