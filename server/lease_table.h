// Worker leases: which workers a round waits for. A worker that makes no
// call for `timeout` while the round waits for it is dropped, so the others
// go on; one that leaves (Leave) is out at once. Either comes back through
// Register and counts again from the next round. Slots beyond the initial
// workers start out absent: a worker joins there the same way. Time comes
// from an injected Clock.
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
  // Workers 0 .. initial - 1 start live, the others absent (initial 0:
  // all of them live). timeout <= 0 disables expiry. `clock` must outlive
  // the table.
  LeaseTable(uint32_t num_workers, uint32_t initial, absl::Duration timeout,
             const Clock* clock);

  bool enabled() const { return timeout_ > absl::ZeroDuration(); }
  absl::Duration timeout() const { return timeout_; }
  bool live(uint32_t w) const { return live_[w]; }
  bool rejoining(uint32_t w) const { return rejoin_[w]; }
  // It left through Leave (and has not registered since).
  bool left(uint32_t w) const { return left_[w]; }
  // It has never been live: a slot beyond the initial workers.
  bool absent(uint32_t w) const { return absent_[w]; }
  uint32_t live_count() const;
  // Since the table was made: joins into absent slots, and leaves of a
  // worker that was live.
  uint64_t joined() const { return joined_; }
  uint64_t left_count() const { return left_count_; }

  // Any call from worker w renews its lease.
  void Touch(uint32_t w) { last_seen_[w] = clock_->Now(); }
  // Every lease starts now (a model was just installed).
  void RenewAll();

  // A dropped worker registered again: live at once when the round has not
  // started, otherwise from the next round. Returns true if it is live now.
  bool Rejoin(uint32_t w, bool round_started);
  // Takes w out of the rounds now. Returns whether it was live (or about to
  // be, rejoining).
  bool Leave(uint32_t w);
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
  std::vector<bool> left_;
  std::vector<bool> absent_;
  uint64_t joined_ = 0;
  uint64_t left_count_ = 0;
  std::vector<absl::Time> last_seen_;
};

}  // namespace pserver

#endif  // PSERVER_SERVER_LEASE_TABLE_H_
