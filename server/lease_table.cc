#include "server/lease_table.h"

namespace pserver {

LeaseTable::LeaseTable(uint32_t num_workers, uint32_t initial,
                       absl::Duration timeout, const Clock* clock)
    : timeout_(timeout),
      clock_(clock),
      live_(num_workers, true),
      rejoin_(num_workers, false),
      left_(num_workers, false),
      absent_(num_workers, false),
      last_seen_(num_workers, clock->Now()) {
  for (uint32_t w = initial; initial > 0 && w < num_workers; ++w) {
    live_[w] = false;
    absent_[w] = true;
  }
}

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
  left_[w] = false;
  if (absent_[w]) ++joined_;
  absent_[w] = false;
  if (!round_started) {
    live_[w] = true;
    return true;
  }
  rejoin_[w] = true;  // the round in progress goes on without it
  return false;
}

bool LeaseTable::Leave(uint32_t w) {
  const bool was = live_[w] || rejoin_[w];
  live_[w] = false;
  rejoin_[w] = false;
  left_[w] = true;
  if (was) ++left_count_;
  return was;
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
