#include "server/pull_waiters.h"

#include <utility>

namespace pserver {

uint64_t PullWaiters::Add(const v1::PullRequest& request, PullDone done,
                          absl::Time since) {
  const uint64_t id = next_id_++;
  waiters_.push_back(Waiter{id, request, std::move(done), since});
  return id;
}

PullDone PullWaiters::Remove(uint64_t id) {
  for (auto it = waiters_.begin(); it != waiters_.end(); ++it) {
    if (it->id == id) {
      PullDone done = std::move(it->done);
      waiters_.erase(it);
      return done;
    }
  }
  return PullDone();
}

std::vector<PullWaiters::Waiter> PullWaiters::TakeReady(uint64_t step) {
  std::vector<Waiter> ready;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->request.step() <= step) {
      ready.push_back(std::move(*it));
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
  return ready;
}

std::vector<PullWaiters::Waiter> PullWaiters::TakeNormParts(uint64_t step) {
  std::vector<Waiter> ready;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->request.norm_part() && it->request.step() == step) {
      ready.push_back(std::move(*it));
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
  return ready;
}

std::vector<PullWaiters::Waiter> PullWaiters::TakeAll() {
  std::vector<Waiter> all;
  for (Waiter& w : waiters_) all.push_back(std::move(w));
  waiters_.clear();
  return all;
}

bool PullWaiters::IsWaiting(uint32_t w) const {
  for (const Waiter& x : waiters_) {
    if (x.request.worker_id() == w) return true;
  }
  return false;
}

}  // namespace pserver
