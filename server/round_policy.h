// What a round waits for and which steps workers may push and pull. The
// shard asks its policy instead of hard-coding the synchronous rule, so a
// relaxed mode (bounded staleness, asynchronous) is a new RoundPolicy, not
// a branch inside Shard.
#ifndef PSERVER_SERVER_ROUND_POLICY_H_
#define PSERVER_SERVER_ROUND_POLICY_H_

#include <cstdint>

#include "server/lease_table.h"

namespace pserver {

// Thread-compatible: the shard calls it under its mutex; implementations
// hold no mutable state of their own.
class RoundPolicy {
 public:
  virtual ~RoundPolicy() = default;
  // Whether the round in progress waits for worker w's push (otherwise a
  // worker that has not pushed is passed over).
  virtual bool WaitsFor(uint32_t w, const LeaseTable& leases) const = 0;
  // How far ahead of the shard's completed rounds a pull may ask: a pull of
  // step current + k waits for k <= this and is refused beyond.
  virtual uint64_t max_pull_ahead() const = 0;
};

// Bulk-synchronous: every round waits for every live worker; a pull may
// wait for the round in progress only.
class SynchronousPolicy final : public RoundPolicy {
 public:
  bool WaitsFor(uint32_t w, const LeaseTable& leases) const override {
    return leases.live(w);
  }
  uint64_t max_pull_ahead() const override { return 1; }
};

}  // namespace pserver

#endif  // PSERVER_SERVER_ROUND_POLICY_H_
