#include "kv_disk.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include <unistd.h>

namespace llmd {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'L', 'L', 'M', 'D', 'K', 'V', '0', '1'};
constexpr const char* kSuffix = ".kvb";
// Past the bound, delete down to this fraction of it, so the next few writes do not each pay a
// recount of the tree.
constexpr double kEvictTo = 0.9;
// A temporary file this old is left over from a crash (a live write takes milliseconds).
constexpr auto kStaleTemp = std::chrono::minutes(10);

// What precedes the identity string and the payload in a block file (native byte order: the
// files are a cache of this machine, never exchanged).
struct Header {
  char magic[8];
  uint64_t identity_hash;
  uint32_t identity_len;
  uint32_t token_count;
  uint64_t key;
  uint64_t parent;
  uint64_t payload_bytes;
  int32_t tokens[DiskKvTier::kBlockTokens];
};

constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kP3 = 0x165667B19E3779F9ULL;

uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
uint64_t lane(uint64_t acc, uint64_t v) { return rotl(acc + v * kP2, 31) * kP1; }
uint64_t load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Files (size, mtime) of every block file under root; removes stale temporary files.
struct FileInfo {
  fs::path path;
  size_t size;
  fs::file_time_type mtime;
};
std::vector<FileInfo> list_blocks(const std::string& root) {
  std::vector<FileInfo> out;
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    std::error_code e2;
    if (!it->is_regular_file(e2)) continue;
    const fs::path& p = it->path();
    const auto mtime = it->last_write_time(e2);
    if (e2) continue;
    if (p.extension() == kSuffix) {
      out.push_back({p, static_cast<size_t>(it->file_size(e2)), mtime});
    } else if (p.filename().string().find(".tmp") != std::string::npos && now - mtime > kStaleTemp) {
      fs::remove(p, e2);
    }
  }
  return out;
}

bool parse_key(const fs::path& p, uint64_t& key) {
  const std::string stem = p.stem().string();
  if (stem.size() != 16) return false;
  char* end = nullptr;
  key = std::strtoull(stem.c_str(), &end, 16);
  return end == stem.c_str() + 16;
}

}  // namespace

uint64_t DiskKvTier::checksum(const void* data, size_t n, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t a = seed + kP1 + kP2, b = seed + kP2, c = seed, d = seed - kP1;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a = lane(a, load64(p + i));
    b = lane(b, load64(p + i + 8));
    c = lane(c, load64(p + i + 16));
    d = lane(d, load64(p + i + 24));
  }
  uint64_t h = rotl(a, 1) + rotl(b, 7) + rotl(c, 12) + rotl(d, 18);
  h = (h ^ lane(0, a)) * kP1 + kP3;
  h = (h ^ lane(0, b)) * kP1 + kP3;
  h = (h ^ lane(0, c)) * kP1 + kP3;
  h = (h ^ lane(0, d)) * kP1 + kP3;
  h += n;
  for (; i + 8 <= n; i += 8) h = rotl(h ^ lane(0, load64(p + i)), 27) * kP1 + kP3;
  for (; i < n; ++i) h = rotl(h ^ (p[i] * kP3), 11) * kP1;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

DiskKvTier::DiskKvTier(std::string root, std::string identity, size_t block_bytes, size_t max_bytes,
                       size_t queue_bytes)
    : root_(std::move(root)),
      identity_(std::move(identity)),
      block_bytes_(block_bytes),
      max_bytes_(max_bytes),
      queue_bytes_(queue_bytes) {
  dir_ = (fs::path(root_) / hex16(checksum(identity_.data(), identity_.size()))).string();
  fs::create_directories(dir_);
  scan();
  writer_ = std::thread([this] { run(); });
}

DiskKvTier::~DiskKvTier() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  if (writer_.joinable()) writer_.join();
}

std::string DiskKvTier::path_of(uint64_t key) const { return (fs::path(dir_) / (hex16(key) + kSuffix)).string(); }

void DiskKvTier::scan() {
  bool over = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    total_bytes_ = 0;
    for (const FileInfo& f : list_blocks(root_)) {
      total_bytes_ += f.size;
      uint64_t key;
      if (f.path.parent_path() == fs::path(dir_) && parse_key(f.path, key)) known_.insert(key);
    }
    over = total_bytes_ > max_bytes_;
  }
  if (over) enforce_bound();  // the bound may have been lowered since the files were written
}

bool DiskKvTier::contains(uint64_t key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return known_.count(key) > 0;
}

bool DiskKvTier::put(uint64_t key, uint64_t parent, const int32_t* tokens, std::vector<std::byte> payload) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (known_.count(key)) return true;
    if (stop_ || payload.size() != block_bytes_ || queued_bytes_ + payload.size() > queue_bytes_ ||
        payload.size() > max_bytes_) {
      ++stats_.dropped_blocks;
      return false;
    }
    queued_bytes_ += payload.size();
    known_.insert(key);
    queue_.push_back({key, parent, std::vector<int32_t>(tokens, tokens + kBlockTokens), std::move(payload)});
  }
  work_cv_.notify_one();
  return true;
}

void DiskKvTier::flush() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_cv_.wait(lock, [&] { return queue_.empty() && !writing_; });
}

DiskTierStats DiskKvTier::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  DiskTierStats s = stats_;
  s.bytes = total_bytes_;
  s.files = known_.size();
  return s;
}

void DiskKvTier::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything queued is written
    Pending p = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    lock.unlock();
    write(p);
    lock.lock();
    queued_bytes_ -= p.payload.size();
    writing_ = false;
    if (queue_.empty()) idle_cv_.notify_all();
  }
}

void DiskKvTier::write(const Pending& p) {
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.identity_hash = checksum(identity_.data(), identity_.size());
  h.identity_len = static_cast<uint32_t>(identity_.size());
  h.token_count = kBlockTokens;
  h.key = p.key;
  h.parent = p.parent;
  h.payload_bytes = p.payload.size();
  std::copy(p.tokens.begin(), p.tokens.end(), h.tokens);
  uint64_t sum = checksum(&h, sizeof h);
  sum = checksum(identity_.data(), identity_.size(), sum);
  sum = checksum(p.payload.data(), p.payload.size(), sum);

  const std::string final_path = path_of(p.key);
  // Unique per process and write: workers of two names of one model file share the directory.
  const std::string tmp = final_path + ".tmp" + std::to_string(::getpid()) + "-" + std::to_string(++temp_serial_);
  bool ok = false;
  if (std::FILE* f = std::fopen(tmp.c_str(), "wb")) {
    ok = std::fwrite(&h, sizeof h, 1, f) == 1 &&
         std::fwrite(identity_.data(), 1, identity_.size(), f) == identity_.size() &&
         std::fwrite(p.payload.data(), 1, p.payload.size(), f) == p.payload.size() &&
         std::fwrite(&sum, sizeof sum, 1, f) == 1;
    ok = (std::fclose(f) == 0) && ok;
  }
  std::error_code ec;
  if (ok) {
    fs::rename(tmp, final_path, ec);
    ok = !ec;
  }
  const size_t file_bytes = sizeof h + identity_.size() + p.payload.size() + sizeof sum;
  bool over = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (ok) {
      ++stats_.written_blocks;
      stats_.written_bytes += file_bytes;
      total_bytes_ += file_bytes;
      over = total_bytes_ > max_bytes_;
    } else {
      ++stats_.dropped_blocks;  // a full or failing disk: the block stays in RAM only
      known_.erase(p.key);
    }
  }
  if (!ok) fs::remove(tmp, ec);
  if (over) enforce_bound();
}

void DiskKvTier::forget(uint64_t key) {
  std::lock_guard<std::mutex> lock(mutex_);
  known_.erase(key);
}

void DiskKvTier::enforce_bound() {
  std::vector<FileInfo> files = list_blocks(root_);
  size_t total = 0;
  for (const FileInfo& f : files) total += f.size;
  if (total > max_bytes_) {
    std::sort(files.begin(), files.end(), [](const FileInfo& a, const FileInfo& b) { return a.mtime < b.mtime; });
    const auto target = static_cast<size_t>(static_cast<double>(max_bytes_) * kEvictTo);
    for (const FileInfo& f : files) {
      if (total <= target) break;
      std::error_code ec;
      if (!fs::remove(f.path, ec) || ec) continue;
      total -= f.size;
      uint64_t key;
      const bool ours = f.path.parent_path() == fs::path(dir_) && parse_key(f.path, key);
      std::lock_guard<std::mutex> lock(mutex_);
      ++stats_.evicted_files;
      if (ours) known_.erase(key);
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  total_bytes_ = total;
}

bool DiskKvTier::get(uint64_t key, uint64_t parent, const int32_t* tokens, std::byte* out) {
  if (!contains(key)) return false;
  const std::string path = path_of(key);
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) {  // deleted by another worker's bound
    forget(key);
    return false;
  }
  Header h{};
  std::string identity;
  uint64_t stored = 0;
  bool readable = std::fread(&h, sizeof h, 1, f) == 1 && std::memcmp(h.magic, kMagic, sizeof kMagic) == 0 &&
                  h.identity_len == identity_.size() && h.payload_bytes == block_bytes_;
  if (readable) {
    identity.resize(h.identity_len);
    readable = std::fread(identity.data(), 1, identity.size(), f) == identity.size() &&
               std::fread(out, 1, block_bytes_, f) == block_bytes_ && std::fread(&stored, sizeof stored, 1, f) == 1 &&
               std::fgetc(f) == EOF;
  }
  std::fclose(f);
  bool valid = false;
  if (readable) {
    uint64_t sum = checksum(&h, sizeof h);
    sum = checksum(identity.data(), identity.size(), sum);
    sum = checksum(out, block_bytes_, sum);
    valid = sum == stored;
  }
  std::error_code ec;
  if (!valid) {
    // Torn, truncated, bit-flipped or of another format: never served, and gone.
    fs::remove(path, ec);
    std::lock_guard<std::mutex> lock(mutex_);
    known_.erase(key);
    ++stats_.corrupt_files;
    return false;
  }
  // Intact: it is served only if it is the block asked for (a key collision, or the same
  // directory name for another identity, is a miss, not an error).
  if (identity != identity_ || h.key != key || h.parent != parent || h.token_count != kBlockTokens ||
      !std::equal(tokens, tokens + kBlockTokens, h.tokens)) {
    return false;
  }
  fs::last_write_time(path, fs::file_time_type::clock::now(), ec);  // recently used
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.read_blocks;
  stats_.read_bytes += block_bytes_;
  return true;
}

}  // namespace llmd
