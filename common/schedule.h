// Compression schedules (proto/pserver/v1/schedule.proto): per phase of a
// run, the codec of pushes and of pulls, e.g. 8-bit quantize early, 6-bit in
// the middle, 4-bit late, or bf16 until 1-bit Adam's freeze and 1-bit after.
//
// Both daemons load the same file. Phases may be bounded by fractions of the
// run, so a schedule is resolved against the run's length (the workers send
// it at Register) into the first round of every phase; the shard, which
// resolves it once for the job and checkpoints the length, announces the
// phase of each round in its answers and every worker switches codec on that
// announcement (so a rejoining worker switches at the same round as the
// others). Error-feedback residuals carry across a change of codec.
//
//   auto s = CompressionSchedule::Load("staged.json");
//   auto r = ResolvedSchedule::Make(*s, /*total_steps=*/9370);
//   const CodecChoiceSpec* push = (*s)->push(r->PhaseAt(step));
#ifndef PSERVER_COMMON_SCHEDULE_H_
#define PSERVER_COMMON_SCHEDULE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/codec.h"
#include "common/layout.h"
#include "pserver/v1/schedule.pb.h"

namespace pserver {

// The largest number of phases a schedule may have.
inline constexpr int kMaxSchedulePhases = 64;
// The largest schedule file read (a schedule is a few hundred bytes).
inline constexpr uint64_t kMaxScheduleFileBytes = 1 << 20;
// The most per-tensor entries a phase may have.
inline constexpr int kMaxTensorCodecs = 4096;

// One phase's codec, built and checked.
struct CodecChoiceSpec {
  v1::Codec codec = v1::CODEC_UNSPECIFIED;
  v1::CodecParams params;  // as given (MakeCodec fills the defaults)
  // The codec itself: immutable, shared by every user of the schedule.
  std::shared_ptr<const Codec> encoder;
  // "quantize bits=4", for log lines.
  std::string Describe() const;
};

// Immutable after Parse; thread-safe.
class CompressionSchedule {
 public:
  // Parses JSON (text starting with '{') or protobuf text format and
  // validates it: INVALID_ARGUMENT naming the phase and the field, e.g.
  // "phase 2 (\"late\") push: bits is 9; expected 2..8". `source` (a path)
  // starts every message.
  static absl::StatusOr<std::shared_ptr<const CompressionSchedule>> Parse(
      absl::string_view text, absl::string_view source);
  // Reads `path` (at most kMaxScheduleFileBytes) and parses it.
  static absl::StatusOr<std::shared_ptr<const CompressionSchedule>> Load(
      const std::string& path);

  const v1::CompressionSchedule& proto() const { return proto_; }
  size_t num_phases() const { return phases_.size(); }
  // Checksum64 of the schedule's canonical bytes: equal for the same
  // phases however the file spelled them. Never 0 (0 means no schedule).
  uint64_t fingerprint() const { return fingerprint_; }
  // Whether a bound is a fraction of the run (then resolving needs the
  // run's length).
  bool uses_fractions() const { return uses_fractions_; }
  // The phase's codecs; nullptr where the phase leaves the daemon's flags
  // in charge. REQUIRES: phase < num_phases().
  const CodecChoiceSpec* push(size_t phase) const;
  const CodecChoiceSpec* pull(size_t phase) const;
  // The phase's name, or "phase N" when it has none.
  std::string PhaseName(size_t phase) const;

  // Per-tensor codecs (SchedulePhase.tensors). Whether any phase names a
  // tensor, or gives one its own pull codec.
  bool has_tensor_codecs() const { return has_tensor_codecs_; }
  bool has_tensor_pulls() const { return has_tensor_pulls_; }
  // Checks that every tensor a phase names is in the model's layout:
  // INVALID_ARGUMENT "phase 0 (\"tuned\") tensors[2]: tensor \"fc9.w\" is
  // not in the model's layout; expected one of fc1.weight, ..." otherwise.
  absl::Status CheckTensors(const std::vector<TensorSlot>& slots) const;
  // The phase's codec for each slot of `slots` (the layout's tensors in
  // order): the tensor's own push (pull) codec, or nullptr where it has
  // none (the phase's or the daemon's codec applies). Names not in the
  // layout are ignored (CheckTensors reports them).
  std::vector<const Codec*> TensorPushCodecs(
      size_t phase, const std::vector<TensorSlot>& slots) const;
  std::vector<const Codec*> TensorPullCodecs(
      size_t phase, const std::vector<TensorSlot>& slots) const;

 private:
  struct TensorChoice {
    std::string name;
    std::unique_ptr<CodecChoiceSpec> push, pull;
  };
  struct Phase {
    std::unique_ptr<CodecChoiceSpec> push, pull;
    std::vector<TensorChoice> tensors;
  };
  std::vector<const Codec*> TensorCodecs(size_t phase,
                                         const std::vector<TensorSlot>& slots,
                                         bool pull) const;
  CompressionSchedule() = default;

  v1::CompressionSchedule proto_;
  std::vector<Phase> phases_;
  uint64_t fingerprint_ = 0;
  bool uses_fractions_ = false;
  bool has_tensor_codecs_ = false;
  bool has_tensor_pulls_ = false;
};

// A schedule resolved for a run of total_steps rounds: the first round of
// every phase. Copyable.
class ResolvedSchedule {
 public:
  // INVALID_ARGUMENT when the schedule has fractional bounds and
  // total_steps is 0, or when the bounds, in rounds, leave a phase empty,
  // overlap, or leave a gap (an end that is not the next begin).
  static absl::StatusOr<ResolvedSchedule> Make(
      std::shared_ptr<const CompressionSchedule> schedule,
      uint64_t total_steps);

  const CompressionSchedule& schedule() const { return *schedule_; }
  uint64_t total_steps() const { return total_steps_; }
  // The phase of round `step`: the last phase whose begin is <= step.
  size_t PhaseAt(uint64_t step) const;
  uint64_t begin(size_t phase) const { return begins_[phase]; }

 private:
  std::shared_ptr<const CompressionSchedule> schedule_;
  uint64_t total_steps_ = 0;
  std::vector<uint64_t> begins_;
};

}  // namespace pserver

#endif  // PSERVER_COMMON_SCHEDULE_H_
