#include "server/checkpoint.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/checksum.h"
#include "common/chunking.h"
#include "common/file_io.h"
#include "common/rejection.h"
#include "gtest/gtest.h"
#include "server/shard.h"
#include "tests/server/server_test_util.h"
#include "tests/test_util/temp_dir.h"

namespace pserver {
namespace {

using testing_util::Fp32Tensor;
using testing_util::Gradient;
using testing_util::InitialWeights;
using testing_util::kSmallElements;
using testing_util::PullRequestFor;
using testing_util::PushRequestFor;
using testing_util::RegisterRequestFor;

struct ShardStateCopyForTest {
  uint64_t step = 0;
  uint64_t checksum = 0;
  uint32_t chunks = 0;
  std::string bytes;
};

std::string NewDir(const std::string& name) {
  return testing_util::MakeTempDir(name);
}

ShardConfig Config(const std::string& dir, uint64_t freeze_step = 5) {
  ShardConfig c;
  c.num_workers = 2;
  c.optimizer.freeze_step = freeze_step;
  c.pull_codec = v1::CODEC_ONEBIT;
  c.checkpoint_dir = dir;
  return c;
}

// Runs rounds [from, to) with deterministic pushes from both workers, in the
// space the shard expects (precondition with the frozen variance if any).
void RunRounds(Shard& shard, uint64_t from, uint64_t to) {
  for (uint64_t t = from; t < to; ++t) {
    v1::GetStatusResponse st = shard.Status();
    ASSERT_EQ(st.current_step(), t);
    bool pre = st.stage() == v1::OPTIMIZER_STAGE_COMPRESSION;
    std::vector<float> d;
    if (pre) {
      auto v = shard.GetFrozenVariance(v1::GetFrozenVarianceRequest());
      ASSERT_TRUE(v.ok()) << v.status();
      d = testing_util::DecodeAll(v->variance());
      for (float& x : d) x = 1.0f / (std::sqrt(x) + 1e-8f);
    }
    for (uint32_t w = 0; w < 2; ++w) {
      std::vector<float> g = Gradient(kSmallElements, w, t, 0.1f);
      if (pre) {
        for (size_t i = 0; i < g.size(); ++i) g[i] *= d[i];
      }
      auto r = shard.Push(PushRequestFor(
          w, t, Fp32Tensor(g),
          pre ? v1::GRADIENT_SPACE_PRECONDITIONED : v1::GRADIENT_SPACE_RAW));
      ASSERT_TRUE(r.ok()) << r.status();
    }
  }
}

std::unique_ptr<Shard> NewRegisteredShard(const ShardConfig& c) {
  auto shard = Shard::Create(c, nullptr);
  EXPECT_TRUE(shard.ok()) << shard.status();
  std::vector<float> x0 = InitialWeights(kSmallElements);
  for (uint32_t w = 0; w < 2; ++w) {
    auto r = (*shard)->Register(RegisterRequestFor(w, 2, x0));
    EXPECT_TRUE(r.ok()) << r.status();
  }
  return std::move(shard).value();
}

TEST(Checkpoint, SaveRestoreGivesBitIdenticalStateAndContinuation) {
  std::string dir = NewDir("ckpt_identical");
  ShardConfig c = Config(dir, /*freeze_step=*/100);
  auto a = NewRegisteredShard(c);
  RunRounds(*a, 0, 7);
  ASSERT_TRUE(a->SaveCheckpoint().ok());
  auto b = Shard::Create(c, nullptr);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->Status().state_checksum(), a->Status().state_checksum());
  EXPECT_EQ((*b)->Status().replica_checksum(), a->Status().replica_checksum());
  // The restored shard serves the same delta to a worker that holds the
  // replica of the previous step (compression state survived).
  RunRounds(*a, 7, 12);
  RunRounds(**b, 7, 12);
  EXPECT_EQ((*b)->Status().state_checksum(), a->Status().state_checksum());
}

TEST(Checkpoint, CrossingTheFreezeInEitherDirectionAcrossARestore) {
  // Reference: 12 rounds straight through a freeze at 5.
  std::string ref_dir = NewDir("ckpt_ref");
  auto ref = NewRegisteredShard(Config(ref_dir));
  RunRounds(*ref, 0, 12);
  // Saved before the freeze, restored, then crossing it.
  std::string dir1 = NewDir("ckpt_before");
  auto a = NewRegisteredShard(Config(dir1));
  RunRounds(*a, 0, 3);
  ASSERT_TRUE(a->SaveCheckpoint().ok());
  a.reset();
  auto a2 = Shard::Create(Config(dir1), nullptr);
  ASSERT_TRUE(a2.ok());
  EXPECT_EQ((*a2)->Status().stage(), v1::OPTIMIZER_STAGE_WARMUP);
  RunRounds(**a2, 3, 12);
  EXPECT_EQ((*a2)->Status().state_checksum(), ref->Status().state_checksum());
  // Saved after the freeze (frozen v and preconditioned momentum kept).
  std::string dir2 = NewDir("ckpt_after");
  auto b = NewRegisteredShard(Config(dir2));
  RunRounds(*b, 0, 8);
  ASSERT_TRUE(b->SaveCheckpoint().ok());
  b.reset();
  auto b2 = Shard::Create(Config(dir2), nullptr);
  ASSERT_TRUE(b2.ok());
  EXPECT_EQ((*b2)->Status().stage(), v1::OPTIMIZER_STAGE_COMPRESSION);
  RunRounds(**b2, 8, 12);
  EXPECT_EQ((*b2)->Status().state_checksum(), ref->Status().state_checksum());
}

TEST(Checkpoint, CorruptNewestFallsBackAndMismatchedIsRefused) {
  std::string dir = NewDir("ckpt_fallback");
  ShardConfig c = Config(dir, 100);
  c.checkpoint_every = 0;
  auto a = NewRegisteredShard(c);
  RunRounds(*a, 0, 2);
  ASSERT_TRUE(a->SaveCheckpoint().ok());
  uint64_t at2 = a->Status().state_checksum();
  RunRounds(*a, 2, 4);
  ASSERT_TRUE(a->SaveCheckpoint().ok());
  // Truncate the newest (step 4).
  std::string newest = absl::StrCat(dir, "/ckpt-00000000000000000004.pserver");
  ASSERT_EQ(truncate(newest.c_str(), 100), 0);
  auto b = Shard::Create(c, nullptr);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)->Status().current_step(), 2u);
  EXPECT_EQ((*b)->Status().state_checksum(), at2);
  bool mentioned = false;
  for (const std::string& line : (*b)->startup_log()) {
    if (line.find("refused checkpoint") != std::string::npos &&
        line.find("00004") != std::string::npos) {
      mentioned = true;
    }
  }
  EXPECT_TRUE(mentioned);
}

// Issue 47: a folder holding another shard's or another job's checkpoints
// (two shards given one --checkpoint_dir) was refused file by file and the
// shard came up empty, its workers then waiting for minutes; now the start
// fails at once, naming the folder, the file and why.
TEST(Checkpoint, Issue47AnotherShardsFolderIsRefusedAtStart) {
  std::string dir = NewDir("ckpt_other_shard");
  ShardConfig c = Config(dir, 100);
  c.checkpoint_every = 0;
  auto a = NewRegisteredShard(c);
  RunRounds(*a, 0, 2);
  ASSERT_TRUE(a->SaveCheckpoint().ok());
  ShardConfig second = c;
  second.num_shards = 2;
  second.shard_index = 1;
  auto d = Shard::Create(second, nullptr);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(d.status().message().find(dir), std::string::npos);
  EXPECT_NE(d.status().message().find("it is shard 0/1; this shard is 1/2"),
            std::string::npos)
      << d.status();
  ShardConfig workers = c;
  workers.num_workers = 3;
  auto e = Shard::Create(workers, nullptr);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("it has 2 workers; expected 3"),
            std::string::npos)
      << e.status();
  // The shard's own folder still loads.
  auto own = Shard::Create(c, nullptr);
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ((*own)->Status().current_step(), 2u);
}

// GetShardState's chunks of `shard`, joined (worker 0).
ShardStateCopyForTest FetchState(Shard& shard) {
  ShardStateCopyForTest out;
  v1::GetShardStateRequest req;
  for (uint32_t c = 0; c == 0 || c < out.chunks; ++c) {
    req.set_chunk(c);
    req.set_step(out.step);
    auto r = shard.GetShardState(req);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return out;
    out.step = r->step();
    out.checksum = r->replica_checksum();
    out.chunks = r->num_chunks();
    out.bytes += r->data();
  }
  return out;
}

// InstallShardState of `state` into `shard` in chunks; the last answer.
absl::StatusOr<v1::InstallShardStateResponse> Install(
    Shard& shard, const ShardStateCopyForTest& state) {
  absl::StatusOr<v1::InstallShardStateResponse> r;
  const uint64_t k = kShardStateChunkBytes;
  for (uint64_t c = 0; c * k < state.bytes.size(); ++c) {
    v1::InstallShardStateRequest req;
    req.set_chunk(static_cast<uint32_t>(c));
    req.set_total_bytes(state.bytes.size());
    req.set_step(state.step);
    req.set_replica_checksum(state.checksum);
    req.set_data(state.bytes.substr(c * k, k));
    r = shard.InstallShardState(req);
    if (!r.ok() || r->installed() || r->already_current()) return r;
  }
  return r;
}

// Issue 47: a fresh job resuming from a worker's state_dict() gets the
// shards' whole state (moments, stage, replica, the workers' last pushes;
// the state checksum covers them all), not just the weights. The model is
// large enough for the state to take several chunks.
TEST(ShardTransfer, Issue47InstalledStateIsTheWholeStateOfItsSource) {
  ShardConfig c = Config("", /*freeze_step=*/3);
  auto a = Shard::Create(c, nullptr);
  ASSERT_TRUE(a.ok());
  const uint64_t n = 400000;  // 4 arrays of 1.6 MB: 2 chunks
  auto large = [&](uint32_t w) {
    v1::RegisterRequest r = RegisterRequestFor(w, 2, InitialWeights(n));
    r.mutable_layout()->Clear();
    v1::TensorSpec* t = r.mutable_layout()->add_tensors();
    t->set_name("w");
    t->add_shape(n);
    return r;
  };
  for (uint32_t w = 0; w < 2; ++w) {
    auto r = (*a)->Register(large(w));
    ASSERT_TRUE(r.ok()) << r.status();
  }
  for (uint64_t t = 0; t < 5; ++t) {
    for (uint32_t w = 0; w < 2; ++w) {
      v1::GetStatusResponse st = (*a)->Status();
      ASSERT_EQ(st.current_step(), t);
      ASSERT_EQ(st.stage(), t < 3 ? v1::OPTIMIZER_STAGE_WARMUP
                                  : v1::OPTIMIZER_STAGE_COMPRESSION);
      auto r = (*a)->Push(PushRequestFor(
          w, t, Fp32Tensor(Gradient(n, w, t, 0.1f)),
          t < 3 ? v1::GRADIENT_SPACE_RAW : v1::GRADIENT_SPACE_PRECONDITIONED));
      ASSERT_TRUE(r.ok()) << r.status();
    }
  }
  ShardStateCopyForTest state = FetchState(**a);
  ASSERT_EQ(state.step, 5u);
  ASSERT_EQ(state.chunks, 2u);
  // A shard that registered the model (the job's construction) but ran no
  // round takes it.
  auto b = Shard::Create(c, nullptr);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE((*b)->Register(large(0)).ok());
  auto r = Install(**b, state);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->installed());
  EXPECT_EQ(r->current_step(), 5u);
  EXPECT_EQ((*b)->Status().state_checksum(), (*a)->Status().state_checksum());
  EXPECT_EQ((*b)->Status().stage(), v1::OPTIMIZER_STAGE_COMPRESSION);
  // Installing it again is a no-op.
  r = Install(**b, state);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->already_current());
  EXPECT_FALSE(r->installed());
  // A shard with no model at all takes it too.
  auto f = Shard::Create(c, nullptr);
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE(Install(**f, state).ok());
  EXPECT_EQ((*f)->Status().state_checksum(), (*a)->Status().state_checksum());
}

TEST(ShardTransfer, Issue47AShardWithRoundsOfItsOwnRefusesAndKeepsItsState) {
  ShardConfig c = Config("", 100);
  auto a = NewRegisteredShard(c);
  RunRounds(*a, 0, 4);
  ShardStateCopyForTest state = FetchState(*a);
  auto b = NewRegisteredShard(c);
  RunRounds(*b, 0, 2);
  const uint64_t before = b->Status().state_checksum();
  auto r = Install(*b, state);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(r.status()), v1::REJECT_REASON_STATE_MISMATCH);
  EXPECT_NE(r.status().message().find("holds step 2"), std::string::npos)
      << r.status();
  EXPECT_NE(r.status().message().find("of step 4"), std::string::npos);
  EXPECT_EQ(b->Status().state_checksum(), before);
  // Another job's state (worker count) is refused after its last chunk,
  // the shard unchanged.
  ShardConfig three = c;
  three.num_workers = 3;
  auto d = Shard::Create(three, nullptr);
  ASSERT_TRUE(d.ok());
  r = Install(**d, state);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("it has 2 workers; expected 3"),
            std::string::npos)
      << r.status();
  EXPECT_FALSE((*d)->registered());
  // Chunks out of order are refused naming the expected one.
  v1::InstallShardStateRequest req;
  req.set_chunk(1);
  req.set_total_bytes(10u << 20);
  req.set_data("x");
  auto o = b->InstallShardState(req);
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), absl::StatusCode::kFailedPrecondition)
      << o.status();  // b has rounds: refused before the chunk is looked at
  auto e = Shard::Create(c, nullptr);
  ASSERT_TRUE(e.ok());
  o = (*e)->InstallShardState(req);
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(o.status().message().find("expected chunk 0 of 3"),
            std::string::npos)
      << o.status();
  // A later export chunk without chunk 0 first.
  v1::GetShardStateRequest g;
  g.set_chunk(1);
  auto x = b->GetShardState(g);
  ASSERT_FALSE(x.ok());
  EXPECT_NE(x.status().message().find("expected chunk 0 first"),
            std::string::npos);
}

// Hole 6: a checkpoint whose x_hat does not match its recorded replica
// checksum (a valid file written from a damaged replica) made Shard::Create
// fail with DATA_LOSS; it is refused like any unusable file and the shard
// starts from the previous checkpoint.
TEST(CheckpointRestore, Hole6ReplicaMismatchFallsBack) {
  std::string dir = NewDir("ckpt_hole6_replica");
  ShardConfig c = Config(dir, 100);
  auto a = NewRegisteredShard(c);
  RunRounds(*a, 0, 2);
  ASSERT_TRUE(a->SaveCheckpoint().ok());
  uint64_t at2 = a->Status().state_checksum();
  RunRounds(*a, 2, 4);
  ASSERT_TRUE(a->SaveCheckpoint().ok());
  const std::string newest = dir + "/ckpt-00000000000000000004.pserver";
  auto bytes = ReadFileToString(newest);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto damaged = ParseShardState(*bytes);
  ASSERT_TRUE(damaged.ok()) << damaged.status();
  damaged->x_hat[3] += 1.0f;  // the file stays well-formed and sealed
  ASSERT_TRUE(WriteFileAtomically(newest, SerializeShardState(*damaged)).ok());

  auto b = Shard::Create(c, nullptr);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->Status().current_step(), 2u);
  EXPECT_EQ((*b)->Status().state_checksum(), at2);
  bool mentioned = false;
  for (const std::string& line : (*b)->startup_log()) {
    mentioned |= line.find(newest) != std::string::npos &&
                 line.find("replica") != std::string::npos;
  }
  EXPECT_TRUE(mentioned);
}

// Hole 6: a checkpoint written in another --onebit_mode (momentum space) or,
// still in warmup, with another freeze step is refused, naming both values,
// and an older one that matches is loaded instead.
TEST(CheckpointRestore, Hole6OnebitModeMismatchRefused) {
  std::string dir = NewDir("ckpt_hole6_mode");
  ShardState s;
  *s.layout.add_tensors() = testing_util::SmallLayout().tensors(1);
  s.x.assign(256, 1.0f);
  s.m.assign(256, 0.5f);
  s.v.assign(256, 2.0f);
  s.x_hat.assign(256, 1.0f);
  s.replica_checksum = ChecksumOf(s.x_hat);
  s.last_pushed = {0};
  s.frozen = true;
  s.freeze_step = 5;
  s.step = 7;
  s.preconditioned = false;  // DeepSpeed-exact: m is raw
  ASSERT_TRUE(WriteCheckpoint(dir, s).ok());
  s.step = 8;
  s.preconditioned = true;  // robust: m is D m
  ASSERT_TRUE(WriteCheckpoint(dir, s).ok());

  CheckpointExpectation deepspeed;
  deepspeed.preconditioned = false;
  deepspeed.freeze_step = 100;  // history for a frozen checkpoint
  std::vector<std::string> refused;
  auto got = LoadNewestCheckpoint(dir, deepspeed, &refused);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->step, 7u);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].find("00008.pserver: it was written with "
                            "preconditioned=1; this shard has 0 (--onebit_mode)"),
            std::string::npos)
      << refused[0];

  // In warmup the freeze step still decides when v freezes.
  std::string warm = NewDir("ckpt_hole6_freeze");
  s.frozen = false;
  s.step = 3;
  s.freeze_step = 50;
  ASSERT_TRUE(WriteCheckpoint(warm, s).ok());
  CheckpointExpectation later;
  later.preconditioned = true;
  later.freeze_step = 100;
  refused.clear();
  EXPECT_TRUE(absl::IsNotFound(LoadNewestCheckpoint(warm, later, &refused).status()));
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].find("freeze_step=50; this shard has 100 (--freeze_step)"),
            std::string::npos)
      << refused[0];
  later.freeze_step = 50;
  EXPECT_TRUE(LoadNewestCheckpoint(warm, later, nullptr).ok());

  // --onebit_momentum: after the freeze m is the whole momentum (server) or
  // its freeze-time part (worker); a checkpoint of the other kind is refused.
  std::string mom = NewDir("ckpt_hole6_momentum");
  s.frozen = true;
  s.step = 9;
  s.worker_momentum = true;
  ASSERT_TRUE(WriteCheckpoint(mom, s).ok());
  CheckpointExpectation server_side;
  server_side.worker_momentum = false;
  refused.clear();
  EXPECT_TRUE(absl::IsNotFound(
      LoadNewestCheckpoint(mom, server_side, &refused).status()));
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].find("written with --onebit_momentum=worker; this shard "
                            "has --onebit_momentum=server"),
            std::string::npos)
      << refused[0];
  server_side.worker_momentum = true;
  auto loaded = LoadNewestCheckpoint(mom, server_side, nullptr);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->worker_momentum);
}

TEST(Checkpoint, PeriodicWriterAndCloseWriteTheNewestState) {
  std::string dir = NewDir("ckpt_periodic");
  ShardConfig c = Config(dir, 100);
  c.checkpoint_every = 2;
  auto a = NewRegisteredShard(c);
  RunRounds(*a, 0, 5);
  ASSERT_TRUE(a->Close().ok());
  uint64_t want = a->Status().state_checksum();
  a.reset();
  auto b = Shard::Create(c, nullptr);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)->Status().current_step(), 5u);
  EXPECT_EQ((*b)->Status().state_checksum(), want);
}

TEST(Checkpoint, ResumeStepFastForwardsAShardThatLostRounds) {
  std::string dir = NewDir("ckpt_resume");
  {
    auto before = NewRegisteredShard(Config(dir, 100));
    RunRounds(*before, 0, 3);
    ASSERT_TRUE(before->Close().ok());  // the last checkpoint: step 3
  }
  // The restarted shard is at step 3; its workers went on to step 6.
  auto restarted = Shard::Create(Config(dir, 100), nullptr);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  Shard* a = restarted->get();
  ASSERT_EQ(a->Status().current_step(), 3u);
  v1::RegisterRequest r = RegisterRequestFor(0, 2, InitialWeights(kSmallElements));
  r.set_resume_step(6);
  auto resp = a->Register(r);
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->current_step(), 6u);
  // Pulls are snapshots now; pushes for step 6 are accepted.
  auto pull = a->PullBlocking(PullRequestFor(0, 6, 5, 0), absl::Seconds(1));
  ASSERT_TRUE(pull.ok()) << pull.status();
  EXPECT_EQ(pull->kind(), v1::PULL_KIND_SNAPSHOT);
  RunRounds(*a, 6, 8);
  // A fresh shard (no checkpoint) takes the worker's weights at resume_step
  // and restarts 1-bit Adam's warmup there.
  std::string empty = NewDir("ckpt_none");
  auto f = Shard::Create(Config(empty, 5), nullptr);
  ASSERT_TRUE(f.ok());
  std::vector<float> replica(kSmallElements, 0.5f);
  v1::RegisterRequest rr = RegisterRequestFor(0, 2, replica);
  rr.set_resume_step(50);
  auto fr = (*f)->Register(rr);
  ASSERT_TRUE(fr.ok()) << fr.status();
  EXPECT_EQ(fr->current_step(), 50u);
  EXPECT_EQ(fr->stage(), v1::OPTIMIZER_STAGE_WARMUP);
  EXPECT_EQ(fr->freeze_step(), 55u);
}

// CI found it (e2e.shard_failure): after a restart one worker resumed at
// step t (the shard fast-forwarded to t), another at t + 1 before the first
// had resent its push for t. That push was refused as "never pushed" and the
// worker died; it is a push for a lost round and is acknowledged instead.
TEST(Checkpoint, LostRoundPushAfterASecondFastForwardIsAcknowledged) {
  std::string dir = NewDir("ckpt_lost_round");
  {
    auto before = NewRegisteredShard(Config(dir, 100));
    RunRounds(*before, 0, 3);
    ASSERT_TRUE(before->Close().ok());  // the last checkpoint: step 3
  }
  auto restarted = Shard::Create(Config(dir, 100), nullptr);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  Shard* a = restarted->get();
  const std::vector<float> x0 = InitialWeights(kSmallElements);
  v1::RegisterRequest r0 = RegisterRequestFor(0, 2, x0);
  r0.set_resume_step(4);  // worker 0 still has to finish step 4
  ASSERT_TRUE(a->Register(r0).ok());
  v1::RegisterRequest r1 = RegisterRequestFor(1, 2, x0);
  r1.set_resume_step(5);  // worker 1 already finished it
  auto resp1 = a->Register(r1);
  ASSERT_TRUE(resp1.ok()) << resp1.status();
  ASSERT_EQ(resp1->current_step(), 5u);
  const uint64_t before = a->Status().state_checksum();

  auto late = a->Push(PushRequestFor(
      0, 4, Fp32Tensor(Gradient(kSmallElements, 0, 4, 0.1f))));
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_TRUE(late->round_lost());
  EXPECT_FALSE(late->duplicate());
  EXPECT_EQ(late->current_step(), 5u);
  EXPECT_EQ(a->Status().state_checksum(), before);  // nothing applied
  // A step before the lost rounds that the checkpoint says was pushed is
  // still a duplicate, and a step the shard has not reached is refused.
  auto old = a->Push(PushRequestFor(
      0, 2, Fp32Tensor(Gradient(kSmallElements, 0, 2, 0.1f))));
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_TRUE(old->duplicate());
  EXPECT_FALSE(old->round_lost());
  EXPECT_FALSE(a->Push(PushRequestFor(
                   0, 6, Fp32Tensor(Gradient(kSmallElements, 0, 6, 0.1f))))
                   .ok());
  // Worker 0 pulls the current weights and both go on.
  auto pull = a->PullBlocking(PullRequestFor(0, 5, 3, 0), absl::Seconds(1));
  ASSERT_TRUE(pull.ok()) << pull.status();
  EXPECT_EQ(pull->kind(), v1::PULL_KIND_SNAPSHOT);
  RunRounds(*a, 5, 7);
}

// `r` is refused FAILED_PRECONDITION, CONFIG_MISMATCH, with `message`,
// and the shard's state is as it was.
void ExpectLocalStepsRefused(Shard& shard, const v1::RegisterRequest& r,
                             const std::string& message) {
  const uint64_t before = shard.Status().state_checksum();
  auto refused = shard.Register(r);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find(message), std::string::npos)
      << refused.status();
  EXPECT_EQ(ReasonOf(refused.status()), v1::REJECT_REASON_CONFIG_MISMATCH);
  EXPECT_EQ(shard.Status().state_checksum(), before);
}

// A shard started with --local_steps refuses a worker with another value,
// the installer included, before anything is installed, and takes one with
// it; the value is bounded like a Register's.
TEST(Checkpoint, AShardsLocalStepsFlagRefusesOtherValues) {
  ShardConfig c = Config("", 100);
  c.local_steps = 16;
  const std::vector<float> x0 = InitialWeights(kSmallElements);
  auto shard = Shard::Create(c, nullptr);
  ASSERT_TRUE(shard.ok()) << shard.status();
  v1::RegisterRequest r0 = RegisterRequestFor(0, 2, x0);  // local_steps 0: 1
  ExpectLocalStepsRefused(
      **shard, r0, "local_steps is 1; expected 16 (this shard's --local_steps)");
  EXPECT_FALSE((*shard)->Status().model_registered());
  r0.set_local_steps(16);
  ASSERT_TRUE((*shard)->Register(r0).ok());
  c.local_steps = kMaxJobLocalSteps + 1;
  auto bad = Shard::Create(c, nullptr);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("local_steps is 1048577; expected "
                                        "0..1048576 (0: any)"),
            std::string::npos) << bad.status();
}

// Local steps are part of the job's schedule (issue 12): the installer's
// value holds for every worker, survives a restart, and a worker with
// another value is refused without changing anything.
TEST(Checkpoint, LocalStepsAreTheJobsAndSurviveARestart) {
  std::string dir = NewDir("ckpt_local_steps");
  ShardConfig c = Config(dir, 100);
  const std::vector<float> x0 = InitialWeights(kSmallElements);
  {
    auto shard = Shard::Create(c, nullptr);
    ASSERT_TRUE(shard.ok()) << shard.status();
    v1::RegisterRequest r0 = RegisterRequestFor(0, 2, x0);
    r0.set_local_steps(16);
    ASSERT_TRUE((*shard)->Register(r0).ok());
    v1::RegisterRequest r1 = RegisterRequestFor(1, 2, x0);  // local_steps 0: 1
    ExpectLocalStepsRefused(
        **shard, r1, "local_steps is 1; the job pushes every 16 local steps");
    v1::RegisterRequest huge = RegisterRequestFor(1, 2, x0);
    huge.set_local_steps(kMaxJobLocalSteps + 1);
    EXPECT_EQ((*shard)->Register(huge).status().code(),
              absl::StatusCode::kInvalidArgument);
    r1.set_local_steps(16);
    ASSERT_TRUE((*shard)->Register(r1).ok());
    ASSERT_TRUE((*shard)->SaveCheckpoint().ok());
  }
  auto restarted = Shard::Create(c, nullptr);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  v1::RegisterRequest r = RegisterRequestFor(1, 2, x0);
  r.set_local_steps(4);
  EXPECT_EQ((*restarted)->Register(r).status().code(),
            absl::StatusCode::kFailedPrecondition);
  r.set_local_steps(16);
  EXPECT_TRUE((*restarted)->Register(r).ok());
  // A restart with --local_steps other than the checkpoint's would refuse
  // every worker one way or the other: it does not start.
  c.local_steps = 8;
  auto other = Shard::Create(c, nullptr);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(other.status().message().find(
                "checkpoint local_steps is 16; expected 8 (this shard's "
                "--local_steps)"),
            std::string::npos) << other.status();
  c.local_steps = 16;
  EXPECT_TRUE(Shard::Create(c, nullptr).ok());
}

// kill -9 while checkpoints are being written, at many points: whatever is
// on disk afterwards loads completely (the newest complete one) or not at
// all, never partly.
bool HasCheckpointFile(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("ckpt-", 0) == 0 &&
        name.size() > 8 && name.substr(name.size() - 8) == ".pserver") {
      return true;
    }
  }
  return false;
}

TEST(Checkpoint, KillDuringWritesNeverLeavesAHalfLoadableCheckpoint) {
  std::string dir = NewDir("ckpt_kill");
  // A big enough state that each write takes a while.
  ShardState s;
  v1::TensorSpec* t = s.layout.add_tensors();
  t->set_name("big");
  t->add_shape(1 << 18);
  s.x.assign(1 << 18, 1.0f);
  s.m.assign(1 << 18, 2.0f);
  s.v.assign(1 << 18, 3.0f);
  s.x_hat.assign(1 << 18, 1.0f);
  s.replica_checksum = ChecksumOf(s.x_hat);
  s.last_pushed = {0};
  CheckpointExpectation expect;
  int loaded = 0;
  for (int round = 0; round < 25; ++round) {
    pid_t pid = fork();
    if (pid == 0) {
      ShardState c = s;
      for (uint64_t step = 1000 * round + 1;; ++step) {
        c.step = step;
        c.x[step % c.x.size()] = static_cast<float>(step);
        if (!WriteCheckpoint(dir, c).ok()) _exit(1);
      }
    }
    // Kill points spread over 1..~120 ms: before the first write, inside
    // writes, between rename and the folder fsync, during retention.
    usleep(1000 + 4900 * round);
    if (round == 24) {
      // On a loaded machine no write may have finished within ~120 ms: the
      // last kill waits (up to 30 s) for a complete file, so that the
      // loaded > 0 check below does not depend on the machine's speed.
      for (int i = 0; i < 3000 && !HasCheckpointFile(dir); ++i) usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    std::vector<std::string> refused;
    auto got = LoadNewestCheckpoint(dir, expect, &refused);
    if (got.ok()) {
      ++loaded;
      EXPECT_EQ(got->x.size(), s.x.size());
      EXPECT_EQ(got->x[got->step % got->x.size()], static_cast<float>(got->step))
          << "half-written state at step " << got->step;
    } else {
      EXPECT_TRUE(absl::IsNotFound(got.status())) << got.status();
    }
    EXPECT_TRUE(refused.empty()) << refused[0];
  }
  EXPECT_GT(loaded, 0);
}

}  // namespace
}  // namespace pserver

namespace pserver {
namespace {

// A shard that fast-forwarded from fresh weights restarts 1-bit Adam's
// warmup (freeze at resume + freeze_step) and saves that step; a restart from
// its checkpoint must freeze at the same step, not at --freeze_step again
// (found while writing the component tests of issue 9: RestoreState ignored
// the checkpoint's freeze_step, so the restarted shard froze v at once).
TEST(Checkpoint, Issue9RestartKeepsAShiftedFreezeStep) {
  std::string dir = NewDir("ckpt_shifted_freeze");
  ShardConfig c = Config(dir, 5);
  {
    auto f = Shard::Create(c, nullptr);
    ASSERT_TRUE(f.ok());
    for (uint32_t w = 0; w < 2; ++w) {
      v1::RegisterRequest r = RegisterRequestFor(w, 2, InitialWeights(kSmallElements));
      r.set_resume_step(50);
      auto resp = (*f)->Register(r);
      ASSERT_TRUE(resp.ok()) << resp.status();
      EXPECT_EQ(resp->freeze_step(), 55u);
    }
    RunRounds(**f, 50, 52);
    ASSERT_TRUE((*f)->Close().ok());  // checkpoint at step 52, in warmup
  }
  auto b = Shard::Create(c, nullptr);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ((*b)->Status().current_step(), 52u);
  auto resp = (*b)->Register(RegisterRequestFor(0, 2, InitialWeights(kSmallElements)));
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->freeze_step(), 55u);
  RunRounds(**b, 52, 54);
  EXPECT_EQ((*b)->Status().stage(), v1::OPTIMIZER_STAGE_WARMUP);  // step 54
  RunRounds(**b, 54, 55);
  EXPECT_EQ((*b)->Status().stage(), v1::OPTIMIZER_STAGE_COMPRESSION);
}

}  // namespace
}  // namespace pserver
