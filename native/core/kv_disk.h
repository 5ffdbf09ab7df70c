// The disk tier of the prefix cache: full KV blocks written to files under the llmd home, so a
// prefix hit after eviction, a model unload, a worker crash or a daemon restart loads the
// blocks from disk instead of prefilling them again (agents resend the same 10-30k-token
// system prompt and tool list every turn).
//
// Keys: a block file is named by the prefix cache's chain key (PrefixCache::chain: the hash of
// the parent's key and the block's 64 tokens) inside a directory per identity (the model
// file's digest, the KV type, the KV shape and this file format's version). The file repeats
// the identity, the key, the parent key and the tokens; a read checks all of them against what
// the caller expects, so neither a hash collision nor another model's file can ever be served.
//
// What a block file holds is the backend's own bytes of the block (the pool's tiles on the CPU
// backend, the device store's rows on the MLX backend: Model::read_kv_blocks), named apart by the
// identity; the engine keeps sliding-window parts and recurrent-state snapshots (models with
// recurrent layers) in tiers of their own beside it, under the same keys and bound. Reads run on
// a loader thread (kv_disk_loader.h), never on the engine's.
//
// Writes never block a decode step: the engine thread hands over a copy of the block and a
// writer thread writes it (to a temporary name, then renamed); the queue is bounded in bytes
// and a block that does not fit is dropped (counted). A torn or corrupt file (a crash
// mid-write, a full disk, bit rot) fails its checksum and is deleted, never served.
//
// The bound covers every identity under the root (all models and KV types share one budget):
// past it, files are deleted least recently used first, by modification time, which a read
// refreshes. Several workers may share the root; each recounts the whole tree when it passes
// the bound, so the bound holds up to one block per concurrent writer.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

namespace llmd {

struct DiskTierStats {
  uint64_t read_blocks = 0;     // blocks loaded from disk
  uint64_t read_bytes = 0;
  uint64_t written_blocks = 0;  // blocks written
  uint64_t written_bytes = 0;
  uint64_t dropped_blocks = 0;  // not written: the write queue was full, or the disk failed
  uint64_t corrupt_files = 0;   // files that failed verification (deleted)
  uint64_t evicted_files = 0;   // files deleted to keep the bound
  size_t bytes = 0;             // bytes on disk under the root (this worker's count)
  size_t files = 0;             // block files of this identity

  // Adds another directory's counts (the window parts' and recurrent states' tiers are one
  // tier to a user). `blocks`: whether its files are blocks (counted as blocks read and
  // written) or snapshots (only as files and bytes).
  void add(const DiskTierStats& o, bool blocks) {
    if (blocks) {
      read_blocks += o.read_blocks;
      written_blocks += o.written_blocks;
    }
    read_bytes += o.read_bytes;
    written_bytes += o.written_bytes;
    dropped_blocks += o.dropped_blocks;
    corrupt_files += o.corrupt_files;
    evicted_files += o.evicted_files;
    files += o.files;
  }
};

class DiskKvTier {
 public:
  static constexpr int kBlockTokens = 64;
  // root: the directory shared by every model; identity: what a block's bytes depend on
  // besides its tokens; block_bytes: the size of every block's payload; max_bytes: the bound.
  DiskKvTier(std::string root, std::string identity, size_t block_bytes, size_t max_bytes,
             size_t queue_bytes = size_t{256} << 20);
  ~DiskKvTier();  // writes what is queued, then stops the writer
  DiskKvTier(const DiskKvTier&) = delete;
  DiskKvTier& operator=(const DiskKvTier&) = delete;

  size_t block_bytes() const { return block_bytes_; }
  // Whether a file for `key` exists or is queued (a read may still fail verification).
  bool contains(uint64_t key) const;
  // Queues a block for writing (engine thread; the payload is a copy). False when dropped.
  bool put(uint64_t key, uint64_t parent, const int32_t* tokens, std::vector<std::byte> payload);
  // Reads the block of `key` into `out` (block_bytes) if its file exists and verifies against
  // the identity, key, parent and tokens; marks it recently used. False otherwise (a corrupt
  // file is deleted).
  bool get(uint64_t key, uint64_t parent, const int32_t* tokens, std::byte* out);
  // Waits until the queue is written (tests and benchmarks).
  void flush();
  DiskTierStats stats() const;
  const std::string& dir() const { return dir_; }

  // A 64-bit checksum over bytes (four independent multiply-rotate lanes, so it runs at memory
  // speed: a 16k-token prompt's blocks are hundreds of MB).
  static uint64_t checksum(const void* data, size_t n, uint64_t seed = 0);

 private:
  struct Pending {
    uint64_t key, parent;
    std::vector<int32_t> tokens;
    std::vector<std::byte> payload;
  };
  std::string path_of(uint64_t key) const;
  void scan();
  void run();
  void write(const Pending& p);
  void enforce_bound();  // writer thread (and the constructor)
  void forget(uint64_t key);

  std::string root_;
  std::string identity_;
  std::string dir_;
  size_t block_bytes_;
  size_t max_bytes_;
  size_t queue_bytes_;

  mutable std::mutex mutex_;  // guards everything below
  std::condition_variable work_cv_, idle_cv_;
  std::deque<Pending> queue_;
  size_t queued_bytes_ = 0;
  bool writing_ = false;
  bool stop_ = false;
  std::unordered_set<uint64_t> known_;  // on disk or queued
  size_t total_bytes_ = 0;              // under root_, as last counted plus writes since
  uint64_t temp_serial_ = 0;            // writer thread only
  DiskTierStats stats_;
  std::thread writer_;
};

}  // namespace llmd
