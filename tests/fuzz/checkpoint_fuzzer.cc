// libFuzzer target: the checkpoint loader, ParseShardState, and (optionally)
// a shard restored from what it accepted.
//
// Input format: tests/fuzz/fuzz_inputs.h. Checked beyond "no crash, no UB":
// whatever ParseShardState accepts serializes and parses again. With
// kCkptLoad an accepted state is written into a private folder and loaded by
// Shard::Create, which then answers a pull and runs one round: a checkpoint
// that passes the loader's checks must be safe to run on.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "common/checksum.h"
#include "common/codec.h"
#include "server/checkpoint.h"
#include "server/shard.h"
#include "tests/fuzz/fuzz_inputs.h"

namespace pserver {
namespace fuzz {
namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

// One folder per process, removed at exit.
const std::string& Folder() {
  static const std::string* dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string t = std::string(tmp && *tmp ? tmp : "/tmp") +
                    "/pserver-ckpt-fuzz-XXXXXX";
    std::vector<char> buf(t.begin(), t.end());
    buf.push_back('\0');
    Check(mkdtemp(buf.data()) != nullptr);
    auto* d = new std::string(buf.data());
    std::atexit([] {
      std::string f = Folder() + "/" + absl::StrFormat("ckpt-%020d.pserver", 0);
      std::remove(f.c_str());
      std::remove(Folder().c_str());
    });
    return d;
  }();
  return *dir;
}

void LoadAndRun(const std::string& bytes, const ShardState& s, bool onebit) {
  if (s.num_workers > kMaxLoadWorkers || s.optimizer_kind > 2) return;
  const std::string path =
      Folder() + "/" + absl::StrFormat("ckpt-%020d.pserver", 0);
  FILE* f = std::fopen(path.c_str(), "wb");
  Check(f != nullptr);
  Check(std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size());
  Check(std::fclose(f) == 0);

  ShardConfig c;
  c.shard_index = s.shard_index;
  c.num_shards = s.num_shards;
  c.num_workers = s.num_workers;
  c.optimizer.kind = static_cast<OptimizerKind>(s.optimizer_kind);
  c.optimizer.preconditioned = s.preconditioned;
  // The loader refuses a warmup checkpoint whose freeze step differs from
  // the shard's; match it so the restore path is what gets fuzzed.
  if (s.freeze_step >= 1) c.optimizer.freeze_step = s.freeze_step;
  c.pull_codec = onebit ? v1::CODEC_ONEBIT : v1::CODEC_FP32;
  c.checkpoint_dir = Folder();
  absl::StatusOr<std::unique_ptr<Shard>> shard = Shard::Create(c, nullptr);
  if (!shard.ok()) return;
  v1::GetStatusResponse st = (*shard)->Status();

  // The pull a worker tracking the replica would send: takes the delta path.
  v1::PullRequest pull;
  pull.set_step(st.current_step());
  pull.set_replica_step(static_cast<int64_t>(st.current_step()) - 1);
  pull.set_replica_checksum(s.prev_replica_checksum);
  bool answered = false;
  uint64_t id = (*shard)->Pull(pull, [&answered](absl::Status,
                                                 PullAnswer answer) {
    answered = true;
    // What a worker does with it.
    if (answer != nullptr) {
      const v1::PullResponse r = answer->Parse();
      auto dec = MakeDecoderFor(r.weights());
      if (dec.ok() && r.weights().num_elements() <= kMaxDecodeElements) {
        std::vector<float> x(r.weights().num_elements());
        (void)(*dec)->DecodeAccumulate(r.weights(), 1.0f, absl::MakeSpan(x));
      }
    }
  });
  if (id != 0) (*shard)->CancelPull(id, absl::CancelledError("fuzz"));
  Check(answered);

  // One round: every worker pushes zeros for the current step.
  const uint64_t n = st.shard_end() - st.shard_begin();
  for (uint32_t w = 0; w < s.num_workers; ++w) {
    v1::PushRequest p;
    p.set_worker_id(w);
    p.set_step(st.current_step());
    p.set_space(st.stage() == v1::OPTIMIZER_STAGE_COMPRESSION &&
                        s.preconditioned
                    ? v1::GRADIENT_SPACE_PRECONDITIONED
                    : v1::GRADIENT_SPACE_RAW);
    v1::EncodedTensor* g = p.mutable_gradient();
    g->set_codec(v1::CODEC_FP32);
    g->set_num_elements(n);
    g->mutable_payload()->assign(n * 4, '\0');
    (void)(*shard)->Push(p);
  }
  v1::GetFrozenVarianceRequest fv;
  (void)(*shard)->GetFrozenVariance(fv);
  (void)(*shard)->Status();
}

}  // namespace
}  // namespace fuzz
}  // namespace pserver

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pserver;
  using namespace pserver::fuzz;
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  if (flags & kCkptSeal) {
    Checksum64 h;
    h.Update(bytes.data(), bytes.size());
    uint64_t sum = h.Finish();
    bytes.append(reinterpret_cast<const char*>(&sum), 8);
  }
  absl::StatusOr<ShardState> s = ParseShardState(bytes);
  if (!s.ok()) return 0;
  Check(ParseShardState(SerializeShardState(*s)).ok());
  if (flags & kCkptLoad) LoadAndRun(bytes, *s, flags & kCkptOneBitPull);
  return 0;
}
