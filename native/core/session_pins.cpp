#include "session_pins.h"

namespace llmd {

SessionPins::~SessionPins() {
  for (auto& [_, blocks] : held_) {
    for (int b : blocks) pool_.release(b);
  }
}

void SessionPins::pin(const std::string& session, const std::vector<int>& blocks) {
  for (int b : blocks) pool_.retain(b);  // before releasing: shared blocks stay held
  unpin(session);
  if (!blocks.empty()) held_[session] = blocks;
}

void SessionPins::unpin(const std::string& session) {
  auto it = held_.find(session);
  if (it == held_.end()) return;
  for (int b : it->second) pool_.release(b);
  held_.erase(it);
}

size_t SessionPins::blocks() const {
  size_t n = 0;
  for (const auto& [_, blocks] : held_) n += blocks.size();
  return n;
}

}  // namespace llmd
