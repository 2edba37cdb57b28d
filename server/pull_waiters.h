// Pulls parked until their step's round completes. Each is answered exactly
// once: by the round, by a cancel (deadline) or by shutdown.
#ifndef PSERVER_SERVER_PULL_WAITERS_H_
#define PSERVER_SERVER_PULL_WAITERS_H_

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "pserver/v1/parameter_server.pb.h"
#include "server/pull_answer.h"

namespace pserver {

// Called exactly once, without the shard's lock; `answer` is null on error.
using PullDone = std::function<void(absl::Status, PullAnswer)>;

// Thread-compatible: the shard calls it under its mutex.
class PullWaiters {
 public:
  struct Waiter {
    uint64_t id = 0;
    v1::PullRequest request;
    PullDone done;
    absl::Time since;  // when it was parked
  };

  // Parks a pull; returns its id (never 0).
  uint64_t Add(const v1::PullRequest& request, PullDone done,
               absl::Time since = absl::InfinitePast());
  // Removes the waiter `id`; empty if it was already answered.
  PullDone Remove(uint64_t id);
  // Removes and returns the waiters whose step is <= `step`, oldest first.
  std::vector<Waiter> TakeReady(uint64_t step);
  // Removes and returns the norm-part pulls (PullRequest.norm_part) of
  // `step`, oldest first.
  std::vector<Waiter> TakeNormParts(uint64_t step);
  std::vector<Waiter> TakeAll();
  // Whether worker w has a pull parked (its lease counts as alive).
  bool IsWaiting(uint32_t w) const;
  size_t size() const { return waiters_.size(); }

 private:
  uint64_t next_id_ = 1;
  std::list<Waiter> waiters_;
};

}  // namespace pserver

#endif  // PSERVER_SERVER_PULL_WAITERS_H_
