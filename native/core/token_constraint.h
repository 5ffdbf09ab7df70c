// A per-request constraint on which tokens may come next (grammar-constrained decoding:
// JSON schemas, tool-call markup). The engine asks it for the allowed set before sampling a
// sequence's next token and tells it the token it sampled; the grammar itself lives outside
// the engine (the worker host implements this with llguidance).
#pragma once

#include <cstdint>
#include <vector>

namespace llmd {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Fills `allowed` with one bit per token id (bit t%32 of word t/32); the engine sized it
  // to the vocabulary rounded up to 32. False when no token may follow (the constraint is
  // complete): the sequence then ends with finish reason "stop".
  virtual bool allowed_tokens(std::vector<uint32_t>& allowed) = 0;
  // The token the engine sampled from the allowed set.
  virtual void accept(int32_t token) = 0;
};

}  // namespace llmd
