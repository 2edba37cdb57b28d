#include "server/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/checksum.h"
#include "common/file_io.h"
#include "common/layout.h"
#include "server/optimizer.h"

namespace pserver {
namespace {

constexpr char kMagic[8] = {'P', 'S', 'C', 'K', 'P', 'T', '\0', '\1'};
constexpr uint32_t kVersion = 1;
constexpr char kPrefix[] = "ckpt-";
constexpr char kSuffix[] = ".pserver";

class Writer {
 public:
  void Bytes(const void* p, size_t n) {
    out_.append(static_cast<const char*>(p), n);
  }
  template <typename T>
  void Num(T v) {
    Bytes(&v, sizeof(v));  // little-endian hosts only
  }
  void Blob(const std::string& s) {
    Num<uint64_t>(s.size());
    out_ += s;
  }
  template <typename T>
  void Array(const std::vector<T>& v) {
    Num<uint64_t>(v.size());
    if (!v.empty()) Bytes(v.data(), v.size() * sizeof(T));
  }
  std::string Finish() {
    Checksum64 h;
    h.Update(out_.data(), out_.size());
    Num<uint64_t>(h.Finish());
    return std::move(out_);
  }

 private:
  std::string out_;
};

// Bounds-checked reading of untrusted bytes.
class Reader {
 public:
  explicit Reader(absl::string_view in) : in_(in) {}
  bool Bytes(void* p, size_t n) {
    if (n > in_.size() - pos_) return false;
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  template <typename T>
  bool Num(T* v) {
    return Bytes(v, sizeof(T));
  }
  bool Blob(std::string* s) {
    uint64_t n;
    if (!Num(&n) || n > in_.size() - pos_) return false;
    s->assign(in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  template <typename T>
  bool Array(std::vector<T>* v) {
    uint64_t n;
    if (!Num(&n) || n > (in_.size() - pos_) / sizeof(T)) return false;
    v->resize(n);
    return n == 0 || Bytes(v->data(), n * sizeof(T));
  }
  size_t remaining() const { return in_.size() - pos_; }

 private:
  absl::string_view in_;
  size_t pos_ = 0;
};

std::string FileName(uint64_t step) {
  return absl::StrFormat("%s%020d%s", kPrefix, step, kSuffix);
}

// Checkpoint file names in `dir`, newest first.
std::vector<std::string> ListCheckpoints(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (absl::StartsWith(name, kPrefix) && absl::EndsWith(name, kSuffix) &&
        name.size() == FileName(0).size()) {
      names.push_back(name);
    }
  }
  closedir(d);
  std::sort(names.rbegin(), names.rend());
  return names;
}

}  // namespace

std::string SerializeShardState(const ShardState& s) {
  Writer w;
  w.Bytes(kMagic, sizeof(kMagic));
  w.Num<uint32_t>(kVersion);
  w.Num<uint32_t>(s.shard_index);
  w.Num<uint32_t>(s.num_shards);
  w.Num<uint32_t>(s.num_workers);
  w.Num<uint32_t>(s.optimizer_kind);
  w.Num<uint8_t>(s.frozen ? 1 : 0);
  w.Num<uint8_t>(s.preconditioned ? 1 : 0);
  w.Num<uint8_t>(s.delta.has_value() ? 1 : 0);
  w.Num<uint8_t>(0);
  w.Num<uint64_t>(s.step);
  w.Num<uint64_t>(s.freeze_step);
  w.Num<uint64_t>(s.prev_replica_checksum);
  w.Num<uint64_t>(s.replica_checksum);
  w.Blob(s.layout.SerializeAsString());
  w.Blob(s.delta.has_value() ? s.delta->SerializeAsString() : std::string());
  w.Array(s.x);
  w.Array(s.m);
  w.Array(s.v);
  w.Array(s.x_hat);
  w.Array(s.last_pushed);
  return w.Finish();
}

absl::StatusOr<ShardState> ParseShardState(absl::string_view bytes) {
  if (bytes.size() < sizeof(kMagic) + 4 + 8 ||
      std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError(
        "not a pserver checkpoint (magic \"PSCKPT\\0\\1\" missing)");
  }
  uint64_t stored;
  std::memcpy(&stored, bytes.data() + bytes.size() - 8, 8);
  Checksum64 h;
  h.Update(bytes.data(), bytes.size() - 8);
  if (h.Finish() != stored) {
    return absl::DataLossError(
        "checksum mismatch: the checkpoint is truncated or corrupt");
  }
  Reader r(bytes.substr(0, bytes.size() - 8));
  char magic[8];
  r.Bytes(magic, 8);
  uint32_t version = 0;
  ShardState s;
  uint8_t frozen = 0, preconditioned = 0, has_delta = 0, pad = 0;
  std::string layout, delta;
  if (!r.Num(&version)) return absl::DataLossError("truncated header");
  if (version != kVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint format version is ", version, "; expected ", kVersion));
  }
  bool ok = r.Num(&s.shard_index) && r.Num(&s.num_shards) &&
            r.Num(&s.num_workers) && r.Num(&s.optimizer_kind) &&
            r.Num(&frozen) && r.Num(&preconditioned) && r.Num(&has_delta) &&
            r.Num(&pad) && r.Num(&s.step) && r.Num(&s.freeze_step) &&
            r.Num(&s.prev_replica_checksum) && r.Num(&s.replica_checksum) &&
            r.Blob(&layout) && r.Blob(&delta) && r.Array(&s.x) &&
            r.Array(&s.m) && r.Array(&s.v) && r.Array(&s.x_hat) &&
            r.Array(&s.last_pushed);
  if (!ok) return absl::DataLossError("checkpoint is truncated");
  if (r.remaining() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint has ", r.remaining(), " trailing bytes"));
  }
  s.frozen = frozen != 0;
  s.preconditioned = preconditioned != 0;
  if (!s.layout.ParseFromString(layout)) {
    return absl::InvalidArgumentError("checkpoint layout does not parse");
  }
  if (absl::Status st = ValidateLayout(s.layout).status(); !st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint layout: ", st.message()));
  }
  if (has_delta) {
    v1::EncodedTensor t;
    if (!t.ParseFromString(delta)) {
      return absl::InvalidArgumentError("checkpoint delta does not parse");
    }
    s.delta = std::move(t);
  }
  if (s.num_shards == 0 || s.shard_index >= s.num_shards ||
      s.num_workers == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint shard ", s.shard_index, "/", s.num_shards, " with ",
        s.num_workers, " workers is not a valid configuration"));
  }
  uint64_t n = ShardRangeFor(TotalElements(s.layout), s.num_shards,
                             s.shard_index)
                   .size();
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
  if (wants_v != !s.v.empty()) {
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
                             int keep) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::UnavailableError(
        absl::StrCat("mkdir ", dir, ": ", std::strerror(errno)));
  }
  if (absl::Status st =
          WriteFileAtomically(dir + "/" + FileName(s.step), SerializeShardState(s));
      !st.ok()) {
    return st;
  }
  // Retention: the newest `keep` complete files; stray temporaries go too.
  std::vector<std::string> names = ListCheckpoints(dir);
  for (size_t i = static_cast<size_t>(std::max(keep, 1)); i < names.size();
       ++i) {
    ::unlink((dir + "/" + names[i]).c_str());
  }
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string name = e->d_name;
      if (absl::StartsWith(name, kPrefix) && absl::EndsWith(name, ".tmp")) {
        ::unlink((dir + "/" + name).c_str());
      }
    }
    closedir(d);
  }
  return absl::OkStatus();
}

absl::StatusOr<ShardState> LoadNewestCheckpoint(
    const std::string& dir, const CheckpointExpectation& expect,
    std::vector<std::string>* refused) {
  for (const std::string& name : ListCheckpoints(dir)) {
    const std::string path = dir + "/" + name;
    absl::StatusOr<std::string> bytes = ReadFileToString(path);
    absl::StatusOr<ShardState> s =
        bytes.ok() ? ParseShardState(*bytes) : bytes.status();
    std::string why;
    if (!s.ok()) {
      why = std::string(s.status().message());
    } else if (s->shard_index != expect.shard_index ||
               s->num_shards != expect.num_shards) {
      why = absl::StrCat("it is shard ", s->shard_index, "/", s->num_shards,
                         "; this shard is ", expect.shard_index, "/",
                         expect.num_shards);
    } else if (s->num_workers != expect.num_workers) {
      why = absl::StrCat("it has ", s->num_workers, " workers; expected ",
                         expect.num_workers);
    } else if (s->optimizer_kind != expect.optimizer_kind) {
      why = "it was written by another optimizer";
    }
    if (why.empty()) return s;
    if (refused) refused->push_back(absl::StrCat(path, ": ", why));
  }
  return absl::NotFoundError(absl::StrCat("no usable checkpoint in ", dir));
}

}  // namespace pserver
