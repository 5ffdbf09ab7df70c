// A fixed pool of worker threads for llmd's own kernels.
//
// Why not MLX's pool or OpenMP: MLX's CPU stream runs one op at a time on one thread, and
// BLAS keeps its own threads. llmd's kernels split each op across all cores with this pool
// and block until done, so at any moment only one of {llmd pool, BLAS} is busy: no
// oversubscription.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace llmd {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Runs fn(task_index) for task_index in [0, n_tasks); the calling thread takes part.
  // Tasks are handed out in contiguous chunks of index space per thread (static split), so
  // a given output is always computed by the same code whatever the thread count.
  void parallel_for(int n_tasks, const std::function<void(int begin, int end)>& fn);
  // Same contract, but threads take one task at a time from a shared counter: for tasks of
  // very different cost (causal attention tiles late in a prompt cost more than early ones),
  // where a static split leaves one core idle. Each task must compute its outputs the same
  // way whichever thread runs it.
  void parallel_for_dynamic(int n_tasks, const std::function<void(int begin, int end)>& fn);

  // The process-wide pool used by kernels; sized once from LLMD_THREADS or the core count.
  static ThreadPool& global();
  static void configure_global(int n_threads);

 private:
  void worker_loop(int worker_index);
  void run(int n_tasks, const std::function<void(int, int)>& fn, bool dynamic);
  void run_share(int worker_index);

  int n_threads_;
  std::vector<std::thread> workers_;
  // Workers spin briefly on `generation_` before sleeping: a decode step issues ~150 small
  // parallel ops, and a futex wake-up per op (~10-20 us) would cost more than the op itself.
  std::mutex mutex_;
  std::condition_variable work_ready_;
  const std::function<void(int, int)>* job_ = nullptr;
  int job_tasks_ = 0;
  bool job_dynamic_ = false;
  std::atomic<int> next_task_{0};
  std::atomic<unsigned long> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stopping_{false};
};

int default_thread_count();

}  // namespace llmd
