// Shard checkpoints: everything a shard needs to resume where it stopped,
// including its compression state (the replica x_hat that workers hold and
// the last pull delta), so a restart loses no error-feedback memory.
//
// File format (version 1), all numbers little-endian:
//   "PSCKPT\0\1" | u32 version | u32 shard_index | u32 num_shards |
//   u32 num_workers | u32 optimizer kind | u8 frozen | u8 preconditioned |
//   u8 has_delta | u8 0 | u64 step | u64 freeze_step |
//   u64 prev_replica_checksum | u64 replica_checksum |
//   blob layout (pserver.v1.ModelLayout) | blob delta (pserver.v1.EncodedTensor)
//   | floats x | floats m | floats v | floats x_hat | i64s last_pushed |
//   u64 Checksum64 of every byte before it
// where blob = u64 length + bytes, floats/i64s = u64 count + values.
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
#include "pserver/v1/parameter_server.pb.h"

namespace pserver {

struct ShardState {
  uint32_t shard_index = 0;
  uint32_t num_shards = 1;
  uint32_t num_workers = 1;
  uint32_t optimizer_kind = 0;  // OptimizerKind as an integer
  bool frozen = false;
  bool preconditioned = true;
  uint64_t step = 0;
  uint64_t freeze_step = 0;
  uint64_t prev_replica_checksum = 0;
  uint64_t replica_checksum = 0;
  v1::ModelLayout layout;
  std::optional<v1::EncodedTensor> delta;
  std::vector<float> x, m, v, x_hat;
  std::vector<int64_t> last_pushed;
};

// Serialises / parses the format above. Parse never crashes on any input:
// DATA_LOSS for a bad checksum or truncation, INVALID_ARGUMENT for fields
// that contradict each other (e.g. array sizes vs the layout).
std::string SerializeShardState(const ShardState& s);
absl::StatusOr<ShardState> ParseShardState(absl::string_view bytes);

// Writes `s` into `dir` atomically and keeps the newest `keep` checkpoints
// there (older ones and stray temporary files are removed).
absl::Status WriteCheckpoint(const std::string& dir, const ShardState& s,
                             int keep = 2);

// What a checkpoint must match to be loaded by this shard.
struct CheckpointExpectation {
  uint32_t shard_index = 0;
  uint32_t num_shards = 1;
  uint32_t num_workers = 1;
  uint32_t optimizer_kind = 0;
};

// Loads the newest checkpoint in `dir` that is complete, uncorrupted and
// matches `expect`, falling back to older ones; each refused file is
// described in *refused (one line each). NOT_FOUND when none is usable.
absl::StatusOr<ShardState> LoadNewestCheckpoint(
    const std::string& dir, const CheckpointExpectation& expect,
    std::vector<std::string>* refused);

}  // namespace pserver

#endif  // PSERVER_SERVER_CHECKPOINT_H_
