#include "server/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/checksum.h"
#include "common/file_io.h"
#include "common/layout.h"
#include "common/record_io.h"
#include "server/optimizer.h"

namespace pserver {
namespace {

constexpr char kMagic[8] = {'P', 'S', 'C', 'K', 'P', 'T', '\0', '\1'};
absl::string_view Magic() { return absl::string_view(kMagic, sizeof(kMagic)); }
constexpr uint32_t kVersion = 6;
// Version 2 had no local_steps; it loads as local_steps 1. Version 3 had no
// schedule; it loads as none. Version 6 added the tensors' idle rounds;
// older ones load as none.
constexpr uint32_t kOldestVersion = 2;
constexpr char kPrefix[] = "ckpt-";
constexpr char kSuffix[] = ".pserver";

std::string FileName(uint64_t step) {
  return absl::StrFormat("%s%020d%s", kPrefix, step, kSuffix);
}

bool IsCheckpointName(const std::string& name) {
  return absl::StartsWith(name, kPrefix) && absl::EndsWith(name, kSuffix) &&
         name.size() == FileName(0).size();
}

// Checkpoint file names in `dir`, newest first; none if it cannot be listed.
std::vector<std::string> ListCheckpoints(FileSystem& fs, const std::string& dir) {
  absl::StatusOr<std::vector<std::string>> all = fs.ListDir(dir);
  std::vector<std::string> names;
  if (!all.ok()) return names;
  for (std::string& name : *all) {
    if (IsCheckpointName(name)) names.push_back(std::move(name));
  }
  std::sort(names.rbegin(), names.rend());
  return names;
}

// Whether `s` is of the shard and job `expect` describes (shard index and
// count, worker count, optimizer); a file that is not cannot be this
// shard's own, whatever else is wrong with it.
bool SameJob(const ShardState& s, const CheckpointExpectation& expect) {
  return s.shard_index == expect.shard_index &&
         s.num_shards == expect.num_shards &&
         s.num_workers == expect.num_workers &&
         s.optimizer_kind == expect.optimizer_kind;
}

}  // namespace

std::string CheckpointMismatch(const ShardState& s,
                               const CheckpointExpectation& expect) {
  if (s.shard_index != expect.shard_index ||
      s.num_shards != expect.num_shards) {
    return absl::StrCat("it is shard ", s.shard_index, "/", s.num_shards,
                        "; this shard is ", expect.shard_index, "/",
                        expect.num_shards);
  }
  if (s.num_workers != expect.num_workers) {
    return absl::StrCat("it has ", s.num_workers, " workers; expected ",
                        expect.num_workers);
  }
  if (s.optimizer_kind != expect.optimizer_kind) {
    return "it was written by another optimizer";
  }
  if (s.optimizer_kind == static_cast<uint32_t>(OptimizerKind::kOneBitAdam)) {
    if (expect.preconditioned && s.preconditioned != *expect.preconditioned) {
      return absl::StrCat("it was written with preconditioned=",
                          s.preconditioned ? 1 : 0, "; this shard has ",
                          *expect.preconditioned ? 1 : 0, " (--onebit_mode)");
    }
    if (expect.worker_momentum &&
        s.worker_momentum != *expect.worker_momentum) {
      return absl::StrCat("it was written with --onebit_momentum=",
                          s.worker_momentum ? "worker" : "server",
                          "; this shard has --onebit_momentum=",
                          *expect.worker_momentum ? "worker" : "server");
    }
    if (expect.freeze_step && !s.frozen &&
        s.freeze_step != *expect.freeze_step) {
      return absl::StrCat("it is in warmup with freeze_step=", s.freeze_step,
                          "; this shard has ", *expect.freeze_step,
                          " (--freeze_step)");
    }
  }
  if (s.has_adam_hyper) {
    for (const auto& [name, saved, flag] :
         {std::tuple{"beta1", s.beta1, expect.beta1},
          std::tuple{"beta2", s.beta2, expect.beta2},
          std::tuple{"eps", s.eps, expect.eps}}) {
      if (flag.has_value() && *flag != saved) {
        return absl::StrCat("it was written with ", name, " ", saved,
                            "; this shard has --", name, "=", *flag);
      }
    }
  }
  if (s.schedule_fingerprint != expect.schedule_fingerprint) {
    return absl::StrFormat(
        "it was written with compression schedule %016x; this shard has "
        "%016x (--schedule; 0: none)",
        s.schedule_fingerprint, expect.schedule_fingerprint);
  }
  // Last: the only check that reads every element.
  const uint64_t replica = ChecksumOf(s.x_hat);
  if (replica != s.replica_checksum) {
    return absl::StrFormat(
        "its replica x_hat has checksum %016x; the checkpoint records %016x",
        replica, s.replica_checksum);
  }
  return "";
}

std::string SerializeShardState(const ShardState& s) {
  RecordWriter w(Magic());
  w.Num<uint32_t>(kVersion);
  w.Num<uint32_t>(s.shard_index);
  w.Num<uint32_t>(s.num_shards);
  w.Num<uint32_t>(s.num_workers);
  w.Num<uint32_t>(s.optimizer_kind);
  w.Num<uint8_t>(s.frozen ? 1 : 0);
  w.Num<uint8_t>(s.preconditioned ? 1 : 0);
  w.Num<uint8_t>(s.delta.empty() ? 0 : 1);
  w.Num<uint8_t>(s.worker_momentum ? 1 : 0);
  w.Num<uint64_t>(s.step);
  w.Num<uint64_t>(s.freeze_step);
  w.Num<uint64_t>(s.prev_replica_checksum);
  w.Num<uint64_t>(s.replica_checksum);
  w.Num<uint32_t>(s.local_steps);
  w.Num<uint64_t>(s.schedule_fingerprint);
  w.Num<uint64_t>(s.schedule_total_steps);
  w.Num<uint8_t>(s.has_adam_hyper ? 1 : 0);
  w.Num<float>(s.beta1);
  w.Num<float>(s.beta2);
  w.Num<float>(s.eps);
  w.Blob(s.layout.SerializeAsString());
  {
    v1::EncodedChunks chunks;
    for (const v1::EncodedTensor& t : s.delta) *chunks.add_chunks() = t;
    w.Blob(s.delta.empty() ? std::string() : chunks.SerializeAsString());
  }
  w.Floats(s.x);
  w.Floats(s.m);
  w.Floats(s.v);
  w.Floats(s.x_hat);
  w.Int64s(s.last_pushed);
  w.Int64s(s.idle_rounds);
  return std::move(w).Finish();
}

absl::StatusOr<ShardState> ParseShardState(absl::string_view bytes) {
  absl::StatusOr<RecordReader> opened =
      RecordReader::Open(bytes, Magic(), "pserver checkpoint");
  if (!opened.ok()) return opened.status();
  RecordReader& r = *opened;
  uint32_t version = 0;
  ShardState s;
  uint8_t frozen = 0, preconditioned = 0, has_delta = 0, worker_momentum = 0;
  uint8_t has_adam = 0;
  std::string layout, delta;
  if (!r.Num(&version)) return absl::DataLossError("truncated header");
  if (version < kOldestVersion || version > kVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint format version is ", version, "; expected ",
                     kOldestVersion, "..", kVersion));
  }
  bool ok = r.Num(&s.shard_index) && r.Num(&s.num_shards) &&
            r.Num(&s.num_workers) && r.Num(&s.optimizer_kind) &&
            r.Num(&frozen) && r.Num(&preconditioned) && r.Num(&has_delta) &&
            r.Num(&worker_momentum) && r.Num(&s.step) && r.Num(&s.freeze_step) &&
            r.Num(&s.prev_replica_checksum) && r.Num(&s.replica_checksum) &&
            (version < 3 || r.Num(&s.local_steps)) &&
            (version < 4 || (r.Num(&s.schedule_fingerprint) &&
                             r.Num(&s.schedule_total_steps))) &&
            (version < 5 || (r.Num(&has_adam) && r.Num(&s.beta1) &&
                             r.Num(&s.beta2) && r.Num(&s.eps))) &&
            r.Blob(&layout) && r.Blob(&delta) && r.Floats(&s.x) &&
            r.Floats(&s.m) && r.Floats(&s.v) && r.Floats(&s.x_hat) &&
            r.Int64s(&s.last_pushed) &&
            (version < 6 || r.Int64s(&s.idle_rounds));
  if (!ok) return absl::DataLossError("checkpoint is truncated");
  if (r.remaining() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint has ", r.remaining(), " trailing bytes"));
  }
  s.frozen = frozen != 0;
  s.preconditioned = preconditioned != 0;
  if (has_adam > 1 || (has_adam == 1 && !(s.beta1 >= 0 && s.beta1 < 1 &&
                                          s.beta2 >= 0 && s.beta2 < 1 &&
                                          s.eps > 0 && std::isfinite(s.eps)))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint betas/eps are ", s.beta1, ", ", s.beta2, ", ", s.eps,
        "; expected betas in [0, 1) and eps > 0"));
  }
  s.has_adam_hyper = has_adam != 0;
  if (worker_momentum > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint worker_momentum is ", static_cast<int>(worker_momentum),
        "; expected 0 or 1"));
  }
  s.worker_momentum = worker_momentum != 0;
  if (s.local_steps == 0 || s.local_steps > kMaxJobLocalSteps) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint local_steps is ", s.local_steps,
                     "; expected 1..", kMaxJobLocalSteps));
  }
  if (!s.layout.ParseFromString(layout)) {
    return absl::InvalidArgumentError("checkpoint layout does not parse");
  }
  if (absl::Status st = ValidateLayout(s.layout).status(); !st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint layout: ", st.message()));
  }
  if (has_delta) {
    v1::EncodedChunks t;
    if (!t.ParseFromString(delta)) {
      return absl::InvalidArgumentError("checkpoint delta does not parse");
    }
    s.delta.assign(t.chunks().begin(), t.chunks().end());
  }
  if (s.num_shards == 0 || s.shard_index >= s.num_shards ||
      s.num_workers == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint shard ", s.shard_index, "/", s.num_shards, " with ",
        s.num_workers, " workers is not a valid configuration"));
  }
  const ShardRange range = ShardRangeFor(TotalElements(s.layout),
                                        s.num_shards, s.shard_index);
  const uint64_t n = range.size();
  if (!s.idle_rounds.empty()) {
    // One entry per tensor with elements in the shard (the optimizer's
    // segments), each at most the step.
    size_t tensors = 0;
    const absl::StatusOr<std::vector<TensorSlot>> slots =
        ValidateLayout(s.layout);
    for (const TensorSlot& t : *slots) {
      tensors += std::max(t.offset, range.begin) <
                         std::min(t.offset + t.size, range.end)
                     ? 1
                     : 0;
    }
    if (s.idle_rounds.size() != tensors) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint idle_rounds has ", s.idle_rounds.size(),
          " entries; expected 0 or ", tensors, " (the shard's tensors)"));
    }
    for (size_t i = 0; i < tensors; ++i) {
      if (s.idle_rounds[i] < 0 ||
          static_cast<uint64_t>(s.idle_rounds[i]) > s.step) {
        return absl::InvalidArgumentError(absl::StrCat(
            "checkpoint idle_rounds[", i, "] is ", s.idle_rounds[i],
            "; expected 0..", s.step, " (the step)"));
      }
    }
  }
  if (s.x.size() != n || s.x_hat.size() != n || s.m.size() != n ||
      (s.v.size() != n && !s.v.empty())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint arrays hold ", s.x.size(), "/", s.m.size(), "/",
        s.v.size(), "/", s.x_hat.size(), " elements; the layout gives ", n));
  }
  // Adam variants keep v; SGD has none (its v is empty). Anything else would
  // leave the optimizer reading past an empty array.
  const bool wants_v = s.optimizer_kind != static_cast<uint32_t>(OptimizerKind::kSgd);
  if (s.optimizer_kind > static_cast<uint32_t>(OptimizerKind::kSgd)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint optimizer kind is ", s.optimizer_kind, "; expected 0..2"));
  }
  // A shard whose range is empty (a model smaller than a block per shard)
  // holds no v either way.
  if (n > 0 && wants_v != !s.v.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint v holds ", s.v.size(), " elements; expected ",
        wants_v ? n : 0, " for optimizer kind ", s.optimizer_kind));
  }
  if (s.last_pushed.size() != s.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint last_pushed has ", s.last_pushed.size(),
        " entries; expected ", s.num_workers));
  }
  return s;
}

absl::Status WriteCheckpoint(const std::string& dir, const ShardState& s,
                             int keep, FileSystem* fs) {
  if (fs == nullptr) fs = PosixFileSystem();
  if (absl::Status st = fs->MakeDir(dir); !st.ok()) return st;
  if (absl::Status st = WriteFileAtomically(*fs, dir + "/" + FileName(s.step),
                                            SerializeShardState(s));
      !st.ok()) {
    return st;
  }
  // Retention: the newest `keep` complete files; stray temporaries go too.
  // Best effort: a file that cannot be removed now is removed next time.
  std::vector<std::string> names = ListCheckpoints(*fs, dir);
  for (size_t i = static_cast<size_t>(std::max(keep, 1)); i < names.size();
       ++i) {
    (void)fs->Remove(dir + "/" + names[i]);
  }
  if (absl::StatusOr<std::vector<std::string>> all = fs->ListDir(dir); all.ok()) {
    for (const std::string& name : *all) {
      if (absl::StartsWith(name, kPrefix) && absl::EndsWith(name, ".tmp")) {
        (void)fs->Remove(dir + "/" + name);
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ShardState> LoadNewestCheckpoint(
    const std::string& dir, const CheckpointExpectation& expect,
    std::vector<std::string>* refused, FileSystem* fs) {
  if (fs == nullptr) fs = PosixFileSystem();
  for (const std::string& name : ListCheckpoints(*fs, dir)) {
    const std::string path = dir + "/" + name;
    absl::StatusOr<std::string> bytes = fs->ReadFile(path);
    absl::StatusOr<ShardState> s =
        bytes.ok() ? ParseShardState(*bytes) : bytes.status();
    std::string why = s.ok() ? CheckpointMismatch(*s, expect)
                             : std::string(s.status().message());
    if (why.empty()) return s;
    if (s.ok() && !SameJob(*s, expect)) {
      // A whole file of another shard or job: the folder is the wrong one,
      // and starting empty would silently drop this shard's own state.
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint_dir ", dir, " holds ", name, " of another shard or job (",
          why, "); expected this shard's own folder: give each shard its own "
          "--checkpoint_dir, or move these files away"));
    }
    if (refused) refused->push_back(absl::StrCat(path, ": ", why));
  }
  return absl::NotFoundError(absl::StrCat("no usable checkpoint in ", dir));
}

}  // namespace pserver
