#include "kv_disk_loader.h"

#include <chrono>
#include <set>

namespace llmd {

DiskLoader::DiskLoader(std::function<void()> on_done, int read_delay_ms)
    : on_done_(std::move(on_done)), read_delay_ms_(read_delay_ms) {
  thread_ = std::thread([this] { run(); });
}

DiskLoader::~DiskLoader() { stop(); }

void DiskLoader::submit(std::shared_ptr<DiskLoad> load) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(load));
  }
  cv_.notify_one();
}

void DiskLoader::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void DiskLoader::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;
    std::shared_ptr<DiskLoad> load = std::move(queue_.front());
    queue_.pop_front();
    if (stop_) load->cancel();
    lock.unlock();
    std::set<int> broken;  // chains with a failed read
    for (DiskRead& r : load->reads) {
      if (load->cancelled() || (r.chain != 0 && broken.count(r.chain))) continue;
      if (read_delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(read_delay_ms_));
      r.ok = r.tier->get(r.key, r.parent, r.tokens.data(), r.dest);
      if (!r.ok && r.chain != 0) broken.insert(r.chain);
    }
    load->done_.store(true, std::memory_order_release);
    if (on_done_) on_done_();
    lock.lock();
  }
}

}  // namespace llmd
