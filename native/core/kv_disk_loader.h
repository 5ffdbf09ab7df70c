// Reads the disk tier's files (kv_disk.h) on a thread of their own, so a prefix hit that needs
// hundreds of megabytes from disk never stalls the other sequences' decode steps: the engine
// plans a sequence's reads (where each block's bytes go: its pool memory, or a staging buffer
// for a backend that keeps KV on the device), hands them over, keeps stepping, and admits the
// sequence once its reads are done (engine.cpp, admit / finish_disk_load).
//
// Reads of one load run in order. A read in a chain is skipped once an earlier read of the same
// chain failed (a prefix's later blocks are useless without the earlier ones); chain 0 means an
// independent read (window parts, recurrent-state snapshots).
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kv_disk.h"

namespace llmd {

struct DiskRead {
  DiskKvTier* tier = nullptr;
  uint64_t key = 0, parent = 0;
  std::array<int32_t, DiskKvTier::kBlockTokens> tokens{};
  std::byte* dest = nullptr;  // tier->block_bytes() bytes, untouched by anyone else until done()
  int chain = 0;
  bool ok = false;  // set by the loader (read after done())
};

class DiskLoad {
 public:
  std::vector<DiskRead> reads;
  bool done() const { return done_.load(std::memory_order_acquire); }
  // The reads not started yet are skipped (a cancelled request); done() still comes.
  void cancel() { cancelled_.store(true, std::memory_order_relaxed); }
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }

 private:
  friend class DiskLoader;
  std::atomic<bool> done_{false};
  std::atomic<bool> cancelled_{false};
};

class DiskLoader {
 public:
  // on_done: called on the loader thread after each load's done() turns true (the engine
  // wakes its loop). read_delay_ms: a pause before every read, standing in for a slow disk
  // (tests that need a load to last; 0 otherwise).
  explicit DiskLoader(std::function<void()> on_done, int read_delay_ms = 0);
  ~DiskLoader();  // stop()
  DiskLoader(const DiskLoader&) = delete;
  DiskLoader& operator=(const DiskLoader&) = delete;

  void submit(std::shared_ptr<DiskLoad> load);
  // Finishes the read in progress, skips the rest of every queued load and joins the thread.
  // The owner calls it before freeing what the reads write into.
  void stop();

 private:
  void run();

  std::function<void()> on_done_;
  int read_delay_ms_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<DiskLoad>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace llmd
