// pserver_worker's --summary file: one JSON object with the run's settings,
// its result and counters, and per-step records (tests/bench/network.sh and
// straggler.sh read it).
#ifndef PSERVER_WORKER_SUMMARY_H_
#define PSERVER_WORKER_SUMMARY_H_

#include <string>

#include "worker/client.h"
#include "worker/trainer.h"

namespace pserver {

// Writes the summary of run `r` (trained with `t` through a client with
// `c`) to `path`, replacing it.
void WriteSummary(const std::string& path, const TrainerOptions& t,
                  const ClientOptions& c, const TrainResult& r);

}  // namespace pserver

#endif  // PSERVER_WORKER_SUMMARY_H_
