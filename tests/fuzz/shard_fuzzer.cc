// libFuzzer target: the request validator, Shard::Register/Push/Pull (and
// GetFrozenVariance), on sequences of untrusted requests.
//
// Each input drives a fresh in-process shard (2 workers, 1-bit Adam freezing
// at step 2, fp32 pull codec, no checkpoints, no leases), so every finding
// replays from its input file alone. Input format: tests/fuzz/fuzz_inputs.h.
// Beyond "no crash, no UB": a rejected request must leave
// Status().state_checksum unchanged (server/shard.h), and a pull never
// changes it; a violation traps.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/codec.h"
#include "common/layout.h"
#include "pserver/v1/parameter_server.pb.h"
#include "server/shard.h"
#include "tests/fuzz/fuzz_inputs.h"

namespace pserver {
namespace fuzz {
namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

v1::ModelLayout Layout() {
  v1::ModelLayout l;
  v1::TensorSpec* w = l.add_tensors();
  w->set_name("w");
  w->add_shape(4);
  w->add_shape(64);
  v1::TensorSpec* b = l.add_tensors();
  b->set_name("b");
  b->add_shape(64);
  return l;
}

std::vector<float> Values(uint64_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t z = 0x9E3779B9u * (seed + 1);
  for (uint64_t i = 0; i < n; ++i) {
    z ^= z << 13;
    z ^= z >> 17;
    z ^= z << 5;
    v[i] = static_cast<float>(z >> 8) / (1 << 24) - 0.5f;
  }
  return v;
}

v1::EncodedTensor Encoded(v1::Codec codec, absl::Span<const float> v,
                          uint64_t seed) {
  v1::EncodedTensor t;
  v1::CodecParams p;
  p.set_block_size(64);
  p.set_k(32);
  absl::StatusOr<std::unique_ptr<Codec>> c = MakeCodec(codec, p);
  if (!c.ok() || !(*c)->Encode(v, seed, &t).ok()) Check(false);
  return t;
}

// The consistency mode of a Reset's first byte: bsp, ssp with s = 0, or
// async (ssp with s > 0 starts a timer thread that could change the state
// between an operation and the fuzzer's check; tests/server covers it).
ConsistencyConfig ModeFrom(uint8_t b) {
  ConsistencyConfig c;
  switch (b % 3) {
    case 1:
      c.mode = Consistency::kSsp;
      break;
    case 2:
      c.mode = Consistency::kAsync;
      break;
    default:
      break;
  }
  return c;
}

std::unique_ptr<Shard> NewShard(uint8_t mode = 0) {
  ShardConfig c;
  c.consistency = ModeFrom(mode);
  c.num_workers = kShardWorkers;
  c.optimizer.kind = OptimizerKind::kOneBitAdam;
  c.optimizer.lr = 1e-2f;
  c.optimizer.freeze_step = kShardFreezeStep;
  c.pull_codec = v1::CODEC_FP32;
  absl::StatusOr<std::unique_ptr<Shard>> s = Shard::Create(c, nullptr);
  Check(s.ok());
  return *std::move(s);
}

v1::RegisterRequest RegisterFor(uint32_t worker) {
  v1::RegisterRequest r;
  r.set_worker_id(worker);
  r.set_num_workers(kShardWorkers);
  r.set_shard_index(0);
  r.set_num_shards(1);
  *r.mutable_layout() = Layout();
  *r.mutable_initial_weights() =
      Encoded(v1::CODEC_FP32, Values(kShardElements, 99), 0);
  return r;
}

v1::Codec CodecFrom(uint8_t b) { return static_cast<v1::Codec>(1 + b % 9); }

uint64_t StepFrom(uint64_t current, uint8_t delta) {
  return current + static_cast<uint64_t>(static_cast<int64_t>(
                       static_cast<int8_t>(delta)));
}

struct Body {
  const uint8_t* p;
  size_t n;
  uint8_t at(size_t i) const { return i < n ? p[i] : 0; }
};

class Harness {
 public:
  Harness() : shard_(NewShard()) {
    Check(shard_->Register(RegisterFor(0)).ok());
    Check(shard_->Register(RegisterFor(1)).ok());
  }

  void Run(uint8_t op, Body body) {
    const v1::GetStatusResponse before = shard_->Status();
    bool rejected = false;
    bool may_change = true;
    switch (op % kShardOpCount) {
      case kOpRegister: {
        v1::RegisterRequest r;
        if (!r.ParseFromArray(body.p, static_cast<int>(body.n))) return;
        // A first registration allocates the whole claimed model (up to
        // kMaxModelElements, gigabytes): a limit, not a bug; keep it small.
        if (!before.model_registered() &&
            TotalElements(r.layout()) > (uint64_t{1} << 16)) {
          return;
        }
        rejected = !shard_->Register(r).ok();
        break;
      }
      case kOpPush: {
        v1::PushRequest r;
        if (!r.ParseFromArray(body.p, static_cast<int>(body.n))) return;
        rejected = !shard_->Push(r).ok();
        break;
      }
      case kOpPull: {
        v1::PullRequest r;
        if (!r.ParseFromArray(body.p, static_cast<int>(body.n))) return;
        // Under ssp and async an answered pull records the version the
        // worker now computes on; a refused one changes nothing.
        rejected = !Pull(r).ok();
        may_change = relaxed_;
        break;
      }
      case kOpPushRaw: {
        v1::PushRequest r;
        r.set_worker_id(body.at(0));
        r.set_step(StepFrom(before.current_step(), body.at(1)));
        r.set_space(static_cast<v1::GradientSpace>(body.at(3) % 3));
        v1::EncodedTensor* t = r.mutable_gradient();
        t->set_codec(CodecFrom(body.at(2)));
        t->set_num_elements(kShardElements);
        t->mutable_params()->set_bits(body.at(4));
        t->mutable_params()->set_block_size(body.at(5));
        if (body.n > 6) t->set_payload(body.p + 6, body.n - 6);
        t->mutable_params()->set_k(t->payload().size() / 4);
        rejected = !shard_->Push(r).ok();
        break;
      }
      case kOpPushValid: {
        v1::PushRequest r;
        r.set_worker_id(body.at(0));
        r.set_step(StepFrom(before.current_step(), body.at(1)));
        r.set_space(static_cast<v1::GradientSpace>(body.at(3) % 3));
        *r.mutable_gradient() =
            Encoded(CodecFrom(body.at(2)),
                    Values(kShardElements, body.at(4)), body.at(4));
        rejected = !shard_->Push(r).ok();
        break;
      }
      case kOpReset:
        shard_ = NewShard(body.at(0));
        relaxed_ = ModeFrom(body.at(0)).mode != Consistency::kBsp;
        return;
      case kOpFrozenVariance: {
        v1::GetFrozenVarianceRequest r;
        r.set_worker_id(body.at(0));
        (void)shard_->GetFrozenVariance(r);
        may_change = false;
        break;
      }
      case kOpPullRaw: {
        v1::PullRequest r;
        r.set_worker_id(body.at(0));
        r.set_step(StepFrom(before.current_step(), body.at(1)));
        r.set_replica_step(static_cast<int64_t>(
            StepFrom(before.current_step(), body.at(2))));
        r.set_replica_checksum(before.replica_checksum());
        r.set_want_snapshot(body.at(3) & 1);
        rejected = !Pull(r).ok();
        may_change = relaxed_;
        break;
      }
    }
    if (rejected || !may_change) {
      Check(shard_->Status().state_checksum() == before.state_checksum());
    }
  }

 private:
  // A pull with a no-op callback; one left waiting is cancelled at once so
  // waiters do not pile up.
  absl::Status Pull(const v1::PullRequest& r) {
    bool answered = false;
    absl::Status status;
    uint64_t id =
        shard_->Pull(r, [&answered, &status](absl::Status s, PullAnswer) {
          answered = true;
          status = std::move(s);
        });
    if (id != 0) {
      Check(!answered);
      shard_->CancelPull(id, absl::CancelledError("fuzz"));
    }
    Check(answered);
    return status;
  }

  std::unique_ptr<Shard> shard_;
  bool relaxed_ = false;
};

}  // namespace
}  // namespace fuzz
}  // namespace pserver

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pserver::fuzz;
  Harness h;
  size_t pos = 0;
  for (int ops = 0; ops < kMaxShardOps && pos + 3 <= size; ++ops) {
    const uint8_t op = data[pos];
    size_t len = data[pos + 1] | (data[pos + 2] << 8);
    pos += 3;
    if (len > size - pos) len = size - pos;
    h.Run(op, Body{data + pos, len});
    pos += len;
  }
  return 0;
}
