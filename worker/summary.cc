#include "worker/summary.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/codec.h"
#include "common/process_stats.h"

namespace pserver {

void WriteSummary(const std::string& path, const TrainerOptions& t,
                  const ClientOptions& c, const TrainResult& r) {
  std::ofstream out(path);
  const ClientStats& s = r.stats;
  out << absl::StrFormat(
      "{\"worker_id\": %u, \"num_workers\": %u, \"shards\": %d, "
      "\"model\": \"%s\", \"init\": \"%s\", \"seed\": %d, "
      "\"push_codec\": \"%s\", \"warmup_codec\": \"%s\", "
      "\"steps\": %d, \"wall_seconds\": %.3f, \"test_accuracy\": %.6f, "
      "\"test_loss\": %.6f, \"last_loss\": %.6f, "
      "\"push_bytes\": %d, \"pull_bytes\": %d, \"push_fp32_bytes\": %d, "
      "\"pull_fp32_bytes\": %d, \"snapshots\": %d, \"retries\": %d, "
      "\"rejoins\": %d, "
      "\"encode_seconds\": %.4f, \"push_seconds\": %.4f, "
      "\"pull_seconds\": %.4f, \"variance_bytes\": %d, "
      "\"local_steps\": %d, \"communication_share\": %.4f, ",
      c.worker_id, c.num_workers, static_cast<int>(c.server_addresses.size()),
      t.model, t.init == InitScheme::kPyTorch ? "pytorch" : "he_normal",
      t.seed, CodecName(c.push_codec), CodecName(c.warmup_codec), r.steps,
      r.wall_seconds, r.test_accuracy, r.test_loss, r.last_loss,
      s.push_payload_bytes, s.pull_payload_bytes, s.push_fp32_bytes,
      s.pull_fp32_bytes, s.snapshots, s.retries, s.rejoins, s.encode_seconds,
      s.push_seconds, s.pull_seconds, s.variance_payload_bytes,
      t.local_steps, r.communication_share);
  out << "\"diagnostics\": {"
      << absl::StrJoin(r.diagnostics, ", ",
                       [](std::string* o, const auto& kv) {
                         absl::StrAppendFormat(o, "\"%s\": %d", kv.first,
                                               kv.second);
                       })
      << "}, ";
  // Per evaluation: [step, seconds since training began, accuracy]
  // (tests/bench/straggler.sh reads the time to an accuracy from these).
  out << "\"evaluations\": ["
      << absl::StrJoin(r.evaluations, ", ",
                       [](std::string* o, const Evaluation& e) {
                         absl::StrAppendFormat(o, "[%d, %.3f, %.6f]", e.step,
                                               e.seconds, e.accuracy);
                       })
      << "], ";
  // Per step, in order (tests/bench/network.sh takes medians of these).
  out << "\"step_seconds\": ["
      << absl::StrJoin(r.step_log, ", ",
                       [](std::string* o, const StepRecord& x) {
                         absl::StrAppendFormat(o, "%.6f", x.seconds);
                       })
      << "], \"step_push_bytes\": ["
      << absl::StrJoin(r.step_log, ", ",
                       [](std::string* o, const StepRecord& x) {
                         absl::StrAppend(o, x.push_bytes);
                       })
      << "], \"step_pull_bytes\": ["
      << absl::StrJoin(r.step_log, ", ",
                       [](std::string* o, const StepRecord& x) {
                         absl::StrAppend(o, x.pull_bytes);
                       })
      << "], \"step_minor_faults\": ["
      << absl::StrJoin(r.step_log, ", ",
                       [](std::string* o, const StepRecord& x) {
                         absl::StrAppend(o, x.minor_faults);
                       })
      << "], \"step_cpu_seconds\": ["
      << absl::StrJoin(r.step_log, ", ",
                       [](std::string* o, const StepRecord& x) {
                         absl::StrAppendFormat(o, "%.6f", x.cpu_seconds);
                       })
      << "], \"malloc\": \"" << AllocatorName() << "\"}\n";
}

}  // namespace pserver
