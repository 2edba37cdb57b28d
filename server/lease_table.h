// Worker leases: which workers a round waits for. A worker that makes no
// call for `timeout` while the round waits for it is dropped, so the others
// go on; it rejoins through Register and counts again from the next round.
// Time comes from an injected Clock.
#ifndef PSERVER_SERVER_LEASE_TABLE_H_
#define PSERVER_SERVER_LEASE_TABLE_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace pserver {

// Thread-compatible: the shard calls it under its mutex.
class LeaseTable {
 public:
  // Every worker starts live. timeout <= 0 disables expiry. `clock` must
  // outlive the table.
  LeaseTable(uint32_t num_workers, absl::Duration timeout, const Clock* clock);

  bool enabled() const { return timeout_ > absl::ZeroDuration(); }
  absl::Duration timeout() const { return timeout_; }
  bool live(uint32_t w) const { return live_[w]; }
  bool rejoining(uint32_t w) const { return rejoin_[w]; }
  uint32_t live_count() const;

  // Any call from worker w renews its lease.
  void Touch(uint32_t w) { last_seen_[w] = clock_->Now(); }
  // Every lease starts now (a model was just installed).
  void RenewAll();

  // A dropped worker registered again: live at once when the round has not
  // started, otherwise from the next round. Returns true if it is live now.
  bool Rejoin(uint32_t w, bool round_started);
  // At the end of a round: rejoining workers become live. Returns whether
  // any did.
  bool PromoteRejoined();

  // Drops every live worker that has not called within the timeout, except
  // those `busy` says the round is already holding (pushed, or waiting in a
  // pull), whose leases are renewed. Returns the dropped workers and how
  // long each was silent.
  std::vector<std::pair<uint32_t, absl::Duration>> Expire(
      absl::FunctionRef<bool(uint32_t)> busy);

 private:
  const absl::Duration timeout_;
  const Clock* const clock_;
  std::vector<bool> live_;
  std::vector<bool> rejoin_;
  std::vector<absl::Time> last_seen_;
};

}  // namespace pserver

#endif  // PSERVER_SERVER_LEASE_TABLE_H_
