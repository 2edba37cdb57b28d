#include "server/lease_table.h"

namespace pserver {

LeaseTable::LeaseTable(uint32_t num_workers, absl::Duration timeout,
                       const Clock* clock)
    : timeout_(timeout),
      clock_(clock),
      live_(num_workers, true),
      rejoin_(num_workers, false),
      last_seen_(num_workers, clock->Now()) {}

uint32_t LeaseTable::live_count() const {
  uint32_t n = 0;
  for (bool b : live_) n += b ? 1 : 0;
  return n;
}

void LeaseTable::RenewAll() {
  last_seen_.assign(last_seen_.size(), clock_->Now());
}

bool LeaseTable::Rejoin(uint32_t w, bool round_started) {
  if (live_[w]) return true;
  if (!round_started) {
    live_[w] = true;
    return true;
  }
  rejoin_[w] = true;  // the round in progress goes on without it
  return false;
}

bool LeaseTable::PromoteRejoined() {
  bool changed = false;
  const absl::Time now = clock_->Now();
  for (size_t w = 0; w < live_.size(); ++w) {
    if (rejoin_[w]) {
      rejoin_[w] = false;
      live_[w] = true;
      last_seen_[w] = now;
      changed = true;
    }
  }
  return changed;
}

std::vector<std::pair<uint32_t, absl::Duration>> LeaseTable::Expire(
    absl::FunctionRef<bool(uint32_t)> busy) {
  std::vector<std::pair<uint32_t, absl::Duration>> dropped;
  if (!enabled()) return dropped;
  const absl::Time now = clock_->Now();
  for (uint32_t w = 0; w < live_.size(); ++w) {
    if (!live_[w]) continue;
    if (busy(w)) {
      last_seen_[w] = now;  // waiting on the round counts as alive
      continue;
    }
    if (now - last_seen_[w] > timeout_) {
      live_[w] = false;
      dropped.emplace_back(w, now - last_seen_[w]);
    }
  }
  return dropped;
}

}  // namespace pserver
