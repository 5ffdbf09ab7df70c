// KV blocks held for named sessions, so the prefix cache's LRU eviction cannot take them.
//
// Why: a plain request's KV stays cached only until memory is needed; a client that names a
// session (an agent, a chat with a long history) is promised that its next turn prefills only
// the new tokens. Each session holds one reference on the full blocks of its latest request
// (prompt and output) until it is unpinned (idle TTL or DELETE, decided by the daemon); its
// blocks then go back to the cache as ordinary idle blocks. Engine thread only.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "kv_cache.h"

namespace llmd {

class SessionPins {
 public:
  explicit SessionPins(KvPool& pool) : pool_(pool) {}
  ~SessionPins();
  SessionPins(const SessionPins&) = delete;
  SessionPins& operator=(const SessionPins&) = delete;

  // Holds `blocks` for `session`, replacing what it held.
  void pin(const std::string& session, const std::vector<int>& blocks);
  void unpin(const std::string& session);

  size_t sessions() const { return held_.size(); }
  size_t blocks() const;

 private:
  KvPool& pool_;
  std::unordered_map<std::string, std::vector<int>> held_;
};

}  // namespace llmd
