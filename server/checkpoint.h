// Shard checkpoints: everything a shard needs to resume where it stopped,
// including its compression state (the replica x_hat that workers hold and
// the last pull delta), so a restart loses no error-feedback memory.
//
// File format (version 5), all numbers little-endian:
//   "PSCKPT\0\1" | u32 version | u32 shard_index | u32 num_shards |
//   u32 num_workers | u32 optimizer kind | u8 frozen | u8 preconditioned |
//   u8 has_delta | u8 worker_momentum | u64 step | u64 freeze_step |
//   u64 prev_replica_checksum | u64 replica_checksum | u32 local_steps |
//   u64 schedule_fingerprint | u64 schedule_total_steps |
//   u8 has_adam_hyper | f32 beta1 | f32 beta2 | f32 eps |
//   blob layout (pserver.v1.ModelLayout) | blob delta (pserver.v1.EncodedChunks)
//   | floats x | floats m | floats v | floats x_hat | i64s last_pushed |
//   u64 Checksum64 of every byte before it
// where blob = u64 length + bytes, floats/i64s = u64 count + values (the
// record format of common/record_io.h). freeze_step is the step at which v
// freezes (onebit_adam; 0 for the other optimizers). Version 2 files (no
// local_steps: the job pushed every step) still load, as local_steps 1;
// version 3 files (no schedule fields) load as having no schedule; version
// 4 files (no Adam hyper-parameters) as the shard's flags'.
// worker_momentum (--onebit_momentum=worker: m holds only the freeze-time
// momentum) was a zero pad byte before, which is the shard's momentum.
// Files are named ckpt-<20-digit step>.pserver and written atomically: a
// temporary file, fsync, rename, fsync of the folder.
#ifndef PSERVER_SERVER_CHECKPOINT_H_
#define PSERVER_SERVER_CHECKPOINT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/file_system.h"
#include "pserver/v1/parameter_server.pb.h"

namespace pserver {

// The largest RegisterRequest.local_steps a shard accepts and a checkpoint
// may hold.
inline constexpr uint32_t kMaxJobLocalSteps = 1u << 20;

struct ShardState {
  uint32_t shard_index = 0;
  uint32_t num_shards = 1;
  uint32_t num_workers = 1;
  uint32_t optimizer_kind = 0;  // OptimizerKind as an integer
  bool frozen = false;
  bool preconditioned = true;
  bool worker_momentum = false;  // --onebit_momentum=worker
  uint64_t step = 0;
  uint64_t freeze_step = 0;
  uint64_t prev_replica_checksum = 0;
  uint64_t replica_checksum = 0;
  v1::ModelLayout layout;
  std::vector<v1::EncodedTensor> delta;  // per chunk; empty: none
  std::vector<float> x, m, v, x_hat;
  std::vector<int64_t> last_pushed;
  // Per tensor of the shard, the rounds it had no gradient in and was not
  // stepped (Optimizer::idle_rounds; empty: none, and before version 6).
  std::vector<int64_t> idle_rounds;
  uint32_t local_steps = 1;  // the job's local steps between pushes
  // The compression schedule (common/schedule.h; 0: none) and the run
  // length its fractions were resolved against (0: none needed).
  uint64_t schedule_fingerprint = 0;
  uint64_t schedule_total_steps = 0;
  // The betas and eps the shard ran with (its flags, or the first
  // worker's optimizer's); has_adam_hyper false: not recorded (version 4).
  bool has_adam_hyper = false;
  float beta1 = 0, beta2 = 0, eps = 0;
};

// Serialises / parses the format above. Parse never crashes on any input:
// DATA_LOSS for a bad checksum or truncation, INVALID_ARGUMENT for fields
// that contradict each other (e.g. array sizes vs the layout).
std::string SerializeShardState(const ShardState& s);
absl::StatusOr<ShardState> ParseShardState(absl::string_view bytes);

// Writes `s` into `dir` atomically and keeps the newest `keep` checkpoints
// there (older ones and stray temporary files are removed). On failure the
// files already in `dir` are untouched and the error names the path. `fs`
// defaults to PosixFileSystem().
absl::Status WriteCheckpoint(const std::string& dir, const ShardState& s,
                             int keep = 2, FileSystem* fs = nullptr);

// What a checkpoint must match to be loaded by this shard.
struct CheckpointExpectation {
  uint32_t shard_index = 0;
  uint32_t num_shards = 1;
  uint32_t num_workers = 1;
  uint32_t optimizer_kind = 0;
  // onebit_adam only (ignored for the other optimizers, whose m and v do
  // not depend on them); nullopt skips the check. The space of the momentum
  // after the freeze (--onebit_mode): compared in every stage, since after
  // the freeze m is stored in that space and reading m_D as m (or the
  // reverse) is silently wrong.
  std::optional<bool> preconditioned;
  // Where the compression stage's momentum lives (--onebit_momentum): after
  // the freeze m is all of it or only its freeze-time part.
  std::optional<bool> worker_momentum;
  // The step at which this shard would freeze v (--freeze_step): compared
  // while the checkpoint is still in warmup, where it decides when v
  // freezes; a frozen checkpoint's freeze is history.
  std::optional<uint64_t> freeze_step;
  // The shard's --schedule fingerprint (0: none): the phases a checkpoint
  // was in follow from it, so another schedule is refused.
  uint64_t schedule_fingerprint = 0;
  // Betas and eps given to the shard by flag: a recorded other value is
  // refused (nullopt: the checkpoint's are taken).
  std::optional<float> beta1, beta2, eps;
};

// Why `s` may not be loaded by a shard that expects `expect` (one phrase,
// e.g. "it is shard 0/2; this shard is 1/2"); empty if it may.
std::string CheckpointMismatch(const ShardState& s,
                               const CheckpointExpectation& expect);

// Loads the newest checkpoint in `dir` that is complete, uncorrupted,
// internally consistent (x_hat matches its recorded replica checksum) and
// matches `expect`, falling back to older ones; each refused file is
// described in *refused (one line each: path, then why). NOT_FOUND when none
// is usable. FAILED_PRECONDITION, naming the file, when a file that parses
// is of another shard index, shard count, worker count or optimizer (the
// folder is another shard's or another job's). `fs` defaults to
// PosixFileSystem().
absl::StatusOr<ShardState> LoadNewestCheckpoint(
    const std::string& dir, const CheckpointExpectation& expect,
    std::vector<std::string>* refused, FileSystem* fs = nullptr);

}  // namespace pserver

#endif  // PSERVER_SERVER_CHECKPOINT_H_
