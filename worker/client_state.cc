// Client::SerializeState / RestoreState (and SaveState / LoadState, the same
// record in a file): the worker's error-feedback residuals, in the record
// format of common/record_io.h. Format (little-endian):
// "PSWKST02" | u32 worker_id | u32 num_workers | u32 num_shards | u64 step |
// u64 num_params | per shard: u64 begin | u64 end | u32 stage | u64 n + n
// floats (warmup residual) | u64 n + n floats (compression residual) | u64 n
// + n floats (the compression stage's worker momentum; n = 0 without one) |
// u64 Checksum64 of everything before. "PSWKST01" (before worker momentum) is
// the same without the momentum and still loads.
#include <cstring>

#include "absl/base/internal/raw_logging.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/error_feedback.h"
#include "common/file_io.h"
#include "common/record_io.h"
#include "worker/client.h"

namespace pserver {
namespace {

constexpr absl::string_view kMagic("PSWKST02", 8);
constexpr absl::string_view kMagicV1("PSWKST01", 8);

}  // namespace

absl::StatusOr<std::string> Client::SerializeState() const {
  if (!registered_) {
    return absl::FailedPreconditionError("SerializeState() before Register()");
  }
  RecordWriter w(kMagic);
  w.Num<uint32_t>(options_.worker_id);
  w.Num<uint32_t>(options_.num_workers);
  w.Num<uint32_t>(static_cast<uint32_t>(encoders_.size()));
  w.Num<uint64_t>(replica_.step());
  w.Num<uint64_t>(num_params());
  for (size_t s = 0; s < encoders_.size(); ++s) {
    const PushEncoder& e = *encoders_[s];
    w.Num<uint64_t>(replica_.range(s).begin);
    w.Num<uint64_t>(replica_.range(s).end);
    w.Num<uint32_t>(static_cast<uint32_t>(e.stage()));
    w.Floats(e.warmup_ef().residual());
    w.Floats(e.push_ef().residual());
    w.Floats(e.momentum());
  }
  return std::move(w).Finish();
}

absl::Status Client::SaveState(const std::string& path) const {
  absl::StatusOr<std::string> record = SerializeState();
  if (!record.ok()) return record.status();
  return WriteFileAtomically(path, *std::move(record));
}

absl::Status Client::LoadState(const std::string& path) {
  if (!registered_) {
    return absl::FailedPreconditionError("LoadState() before Register()");
  }
  absl::StatusOr<std::string> read = ReadFileToString(path);
  if (!read.ok()) return read.status();
  return RestoreState(*read, path);
}

absl::Status Client::RestoreState(absl::string_view record,
                                  absl::string_view source) {
  if (!registered_) {
    return absl::FailedPreconditionError("RestoreState() before Register()");
  }
  const std::string path(source);
  const bool v1 = absl::StartsWith(record, kMagicV1);
  absl::StatusOr<RecordReader> opened = RecordReader::Open(
      record, v1 ? kMagicV1 : kMagic, "worker state file");
  if (!opened.ok()) {
    return absl::DataLossError(
        absl::StrCat(path, ": ", opened.status().message()));
  }
  RecordReader& c = *opened;
  uint32_t worker = 0, workers = 0, shards = 0;
  uint64_t step = 0, params = 0;
  if (!c.Num(&worker) || !c.Num(&workers) || !c.Num(&shards) || !c.Num(&step) ||
      !c.Num(&params)) {
    return absl::DataLossError(absl::StrCat(path, ": truncated header"));
  }
  if (worker != options_.worker_id || workers != options_.num_workers ||
      shards != encoders_.size() || params != num_params()) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " is for worker ", worker, "/", workers, " with ", shards,
        " shards and ", params, " parameters; this is worker ",
        options_.worker_id, "/", options_.num_workers, " with ",
        encoders_.size(), " shards and ", num_params(), " parameters"));
  }
  // All-or-nothing (hole 7): parse and validate every shard before changing
  // any, so that the commit below has no failure path.
  std::vector<std::vector<float>> warm(shards), push(shards), mom(shards);
  for (size_t s = 0; s < shards; ++s) {
    uint64_t b, e;
    uint32_t stage;
    const PushEncoder& enc = *encoders_[s];
    const ShardRange& r = replica_.range(s);
    if (!c.Num(&b) || !c.Num(&e) || !c.Num(&stage) || b != r.begin ||
        e != r.end || !c.Floats(&warm[s]) || !c.Floats(&push[s]) ||
        (!v1 && !c.Floats(&mom[s])) ||
        // An empty residual is all zeros (error_feedback.h).
        (!warm[s].empty() && warm[s].size() != enc.warmup_ef().size()) ||
        (!push[s].empty() && push[s].size() != enc.push_ef().size()) ||
        (!mom[s].empty() && mom[s].size() != enc.push_ef().size())) {
      return absl::DataLossError(
          absl::StrCat(path, ": shard ", s, " does not match this model"));
    }
    for (absl::Status st :
         {CheckAllFinite(warm[s], absl::StrCat("shard ", s, " warmup residual")),
          CheckAllFinite(push[s], absl::StrCat("shard ", s, " push residual")),
          CheckAllFinite(mom[s], absl::StrCat("shard ", s, " momentum"))}) {
      if (!st.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": ", st.message()));
      }
    }
  }
  if (!c.done()) return absl::DataLossError(absl::StrCat(path, ": trailing bytes"));
  for (size_t s = 0; s < shards; ++s) {
    // Sizes and finiteness were checked above: SetResidual cannot refuse.
    const bool set = encoders_[s]->warmup_ef().SetResidual(warm[s]).ok() &&
                     encoders_[s]->push_ef().SetResidual(push[s]).ok() &&
                     encoders_[s]->SetMomentum(mom[s]).ok();
    ABSL_RAW_CHECK(set, "LoadState: a validated residual was refused");
  }
  return absl::OkStatus();
}

}  // namespace pserver
