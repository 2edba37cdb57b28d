// Client::SaveState / LoadState: the worker's error-feedback residuals on
// disk. Format (little-endian): "PSWKST01" | u32 worker_id | u32 num_workers
// | u32 num_shards | u64 step | u64 num_params | per shard: u64 begin |
// u64 end | u32 stage | u64 n + n floats (warmup residual) | u64 n + n
// floats (compression residual) | u64 Checksum64 of everything before.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/checksum.h"
#include "common/file_io.h"
#include "worker/client.h"

namespace pserver {
namespace {

constexpr char kMagic[8] = {'P', 'S', 'W', 'K', 'S', 'T', '0', '1'};

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

void PutFloats(std::string* out, absl::Span<const float> v) {
  Put<uint64_t>(out, v.size());
  out->append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

class Cursor {
 public:
  explicit Cursor(absl::string_view in) : in_(in) {}
  template <typename T>
  bool Get(T* v) {
    if (sizeof(T) > in_.size() - pos_) return false;
    std::memcpy(v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool GetFloats(std::vector<float>* v, uint64_t expect) {
    uint64_t n;
    if (!Get(&n) || n != expect || n > (in_.size() - pos_) / sizeof(float)) {
      return false;
    }
    v->resize(n);
    if (n) std::memcpy(v->data(), in_.data() + pos_, n * sizeof(float));
    pos_ += n * sizeof(float);
    return true;
  }
  bool done() const { return pos_ == in_.size(); }

 private:
  absl::string_view in_;
  size_t pos_ = 0;
};

}  // namespace

absl::Status Client::SaveState(const std::string& path) const {
  if (!registered_) {
    return absl::FailedPreconditionError("SaveState() before Register()");
  }
  std::string out(kMagic, sizeof(kMagic));
  Put<uint32_t>(&out, options_.worker_id);
  Put<uint32_t>(&out, options_.num_workers);
  Put<uint32_t>(&out, static_cast<uint32_t>(shards_.size()));
  Put<uint64_t>(&out, step_);
  Put<uint64_t>(&out, replica_.size());
  for (const ShardState& sh : shards_) {
    Put<uint64_t>(&out, sh.range.begin);
    Put<uint64_t>(&out, sh.range.end);
    Put<uint32_t>(&out, static_cast<uint32_t>(sh.stage));
    PutFloats(&out, sh.warmup_ef->residual());
    PutFloats(&out, sh.push_ef->residual());
  }
  Checksum64 h;
  h.Update(out.data(), out.size());
  Put<uint64_t>(&out, h.Finish());
  return WriteFileAtomically(path, out);
}

absl::Status Client::LoadState(const std::string& path) {
  if (!registered_) {
    return absl::FailedPreconditionError("LoadState() before Register()");
  }
  absl::StatusOr<std::string> read = ReadFileToString(path);
  if (!read.ok()) return read.status();
  const std::string& bytes = *read;
  if (bytes.size() < sizeof(kMagic) + 8 ||
      std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError(absl::StrCat(path, " is not a worker state file"));
  }
  uint64_t stored;
  std::memcpy(&stored, bytes.data() + bytes.size() - 8, 8);
  Checksum64 h;
  h.Update(bytes.data(), bytes.size() - 8);
  if (h.Finish() != stored) {
    return absl::DataLossError(absl::StrCat(path, " is truncated or corrupt"));
  }
  Cursor c(absl::string_view(bytes).substr(sizeof(kMagic),
                                           bytes.size() - sizeof(kMagic) - 8));
  uint32_t worker = 0, workers = 0, shards = 0;
  uint64_t step = 0, params = 0;
  if (!c.Get(&worker) || !c.Get(&workers) || !c.Get(&shards) || !c.Get(&step) ||
      !c.Get(&params)) {
    return absl::DataLossError(absl::StrCat(path, ": truncated header"));
  }
  if (worker != options_.worker_id || workers != options_.num_workers ||
      shards != shards_.size() || params != replica_.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " is for worker ", worker, "/", workers, " with ", shards,
        " shards and ", params, " parameters; this is worker ",
        options_.worker_id, "/", options_.num_workers, " with ",
        shards_.size(), " shards and ", replica_.size()));
  }
  // Parse everything before changing anything.
  std::vector<std::vector<float>> warm(shards), push(shards);
  for (size_t s = 0; s < shards; ++s) {
    uint64_t b, e;
    uint32_t stage;
    const ShardRange& r = shards_[s].range;
    if (!c.Get(&b) || !c.Get(&e) || !c.Get(&stage) || b != r.begin ||
        e != r.end || !c.GetFloats(&warm[s], r.size()) ||
        !c.GetFloats(&push[s], r.size())) {
      return absl::DataLossError(
          absl::StrCat(path, ": shard ", s, " does not match this model"));
    }
  }
  if (!c.done()) return absl::DataLossError(absl::StrCat(path, ": trailing bytes"));
  for (size_t s = 0; s < shards; ++s) {
    if (absl::Status st = shards_[s].warmup_ef->SetResidual(warm[s]); !st.ok()) {
      return st;
    }
    if (absl::Status st = shards_[s].push_ef->SetResidual(push[s]); !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

}  // namespace pserver
