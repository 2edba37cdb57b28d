// Writes the seed corpora of the fuzz targets: a few small, valid inputs per
// target in the formats of fuzz_inputs.h. Run once after changing a format:
//   build/tests/fuzz/fuzz_make_corpus tests/fuzz/corpus
// The output is deterministic, so the committed files only change when the
// formats or the encoders do.
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "common/checksum.h"
#include "common/codec.h"
#include "tune/gradient_file.h"
#include "pserver/v1/parameter_server.pb.h"
#include "server/checkpoint.h"
#include "tests/fuzz/fuzz_inputs.h"

namespace pserver {
namespace fuzz {
namespace {

int failures = 0;

void Write(const std::string& dir, const std::string& name,
           const std::string& bytes) {
  ::mkdir(dir.c_str(), 0755);
  const std::string path = dir + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), f) !=
                          bytes.size()) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    ++failures;
  }
  if (f) std::fclose(f);
}

std::vector<float> Values(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t z = 0x9E3779B9u * (seed + 1);
  for (size_t i = 0; i < n; ++i) {
    z ^= z << 13;
    z ^= z >> 17;
    z ^= z << 5;
    v[i] = static_cast<float>(z >> 8) / (1 << 24) - 0.5f;
  }
  return v;
}

v1::EncodedTensor Encode(v1::Codec codec, const v1::CodecParams& p,
                         absl::Span<const float> v) {
  v1::EncodedTensor t;
  auto c = MakeCodec(codec, p);
  if (!c.ok() || !(*c)->Encode(v, 7, &t).ok()) {
    std::fprintf(stderr, "cannot encode with %s\n", CodecName(codec).c_str());
    ++failures;
  }
  return t;
}

void CodecCorpus(const std::string& dir) {
  struct Case {
    v1::Codec codec;
    const char* tag;
    v1::CodecParams params;
  };
  std::vector<Case> cases;
  for (v1::Codec c : {v1::CODEC_FP32, v1::CODEC_FP16, v1::CODEC_BF16,
                      v1::CODEC_ONEBIT, v1::CODEC_TOPK, v1::CODEC_RANDOMK,
                      v1::CODEC_QUANTIZE, v1::CODEC_TOPK_QUANTIZE,
                      v1::CODEC_BLOCK_TOPK}) {
    v1::CodecParams p;
    p.set_block_size(32);
    p.set_k(10);
    cases.push_back({c, "", p});
  }
  v1::CodecParams p;
  p.set_k(12);
  p.set_value_format(v1::VALUE_FORMAT_FP16);
  cases.push_back({v1::CODEC_TOPK, "-fp16", p});
  p.set_unbiased(true);
  cases.push_back({v1::CODEC_RANDOMK, "-fp16-unbiased", p});
  p = {};
  p.set_bits(3);
  p.set_block_size(40);
  p.set_range(v1::QUANTIZE_RANGE_ADAPTIVE);
  p.set_rounding(v1::ROUNDING_STOCHASTIC);
  cases.push_back({v1::CODEC_QUANTIZE, "-3bit-adaptive", p});
  p = {};
  p.set_block_size(0);
  p.set_scale_mode(v1::SCALE_MODE_L2);
  cases.push_back({v1::CODEC_ONEBIT, "-oneblock-l2", p});
  // block_topk: rows of 10 cut 4 + 4 + 2 (short blocks); flat fp16 blocks
  // of 5; rows of 25 cut 16 + 9 with fp16 values.
  p = {};
  p.set_block_size(4);
  p.set_row_length(10);
  p.set_k(5);
  cases.push_back({v1::CODEC_BLOCK_TOPK, "-b4-rows10", p});
  p = {};
  p.set_block_size(5);
  p.set_k_fraction(0.3);
  p.set_value_format(v1::VALUE_FORMAT_FP16);
  cases.push_back({v1::CODEC_BLOCK_TOPK, "-b5-fp16", p});
  p.set_block_size(16);
  p.set_row_length(25);
  cases.push_back({v1::CODEC_BLOCK_TOPK, "-b16-rows25-fp16", p});

  const std::vector<float> v = Values(100, 1);
  for (const Case& c : cases) {
    v1::EncodedTensor t = Encode(c.codec, c.params, v);
    const std::string name = CodecName(c.codec) + c.tag;
    Write(dir, name + ".proto",
          std::string(1, static_cast<char>(kCodecProto)) +
              t.SerializeAsString());
    // The same tensor in the raw form (its header fields fit one byte each
    // here, except n and block, which take two).
    const v1::CodecParams& q = t.params();
    std::string raw(1, static_cast<char>(kCodecRaw));
    raw.push_back(static_cast<char>(t.codec()));
    raw.push_back(static_cast<char>((q.value_format() & 3) |
                                    ((q.range() & 3) << 2) |
                                    ((q.unbiased() ? 1 : 0) << 4) |
                                    ((q.scale_mode() & 3) << 5)));
    raw.push_back(static_cast<char>(t.num_elements() & 0xFF));
    raw.push_back(static_cast<char>(t.num_elements() >> 8));
    raw.push_back(static_cast<char>(q.block_size() & 0xFF));
    raw.push_back(static_cast<char>(q.block_size() >> 8));
    raw.push_back(static_cast<char>(
        c.codec == v1::CODEC_BLOCK_TOPK ? q.row_length() : q.bits()));
    raw.push_back(static_cast<char>(c.codec == v1::CODEC_RANDOMK ? 0xFF
                                                                 : q.k()));
    raw += t.payload();
    Write(dir, name + ".raw", raw);
  }
  // A segmented tensor (per-tensor codecs): fp32, onebit and topk pieces.
  v1::EncodedTensor seg;
  seg.set_codec(v1::CODEC_SEGMENTS);
  seg.set_num_elements(100);
  v1::CodecParams k5;
  k5.set_k(5);
  const std::vector<float> a(v.begin(), v.begin() + 30);
  const std::vector<float> b(v.begin() + 30, v.begin() + 70);
  const std::vector<float> c(v.begin() + 70, v.end());
  *seg.add_segments() = Encode(v1::CODEC_FP32, k5, a);
  *seg.add_segments() = Encode(v1::CODEC_ONEBIT, k5, b);
  *seg.add_segments() = Encode(v1::CODEC_TOPK, k5, c);
  Write(dir, "segments.proto",
        std::string(1, static_cast<char>(kCodecProto)) +
            seg.SerializeAsString());
}

std::string PushValid(uint8_t worker, int8_t step_delta, v1::Codec codec,
                      v1::GradientSpace space, uint8_t seed) {
  std::string b;
  b.push_back(static_cast<char>(worker));
  b.push_back(static_cast<char>(step_delta));
  b.push_back(static_cast<char>(codec - 1));
  b.push_back(static_cast<char>(space));
  b.push_back(static_cast<char>(seed));
  return b;
}

v1::ModelLayout ShardLayout() {
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

void ShardCorpus(const std::string& dir) {
  // Rounds with every codec through the freeze (step 2), then pulls.
  std::string s;
  const v1::Codec codecs[] = {v1::CODEC_FP32, v1::CODEC_ONEBIT,
                              v1::CODEC_TOPK, v1::CODEC_QUANTIZE};
  for (int step = 0; step < 4; ++step) {
    v1::GradientSpace space = step >= static_cast<int>(kShardFreezeStep)
                                  ? v1::GRADIENT_SPACE_PRECONDITIONED
                                  : v1::GRADIENT_SPACE_RAW;
    for (uint8_t w = 0; w < kShardWorkers; ++w) {
      AppendRecord(&s, kOpPushValid,
                   PushValid(w, 0, codecs[(step + w) % 4], space, step * 2 + w));
    }
    AppendRecord(&s, kOpPullRaw, std::string("\0\0\xff\0", 4));
  }
  AppendRecord(&s, kOpFrozenVariance, std::string(1, '\1'));
  AppendRecord(&s, kOpPushValid,
               PushValid(0, -1, v1::CODEC_FP32, v1::GRADIENT_SPACE_RAW, 1));
  AppendRecord(&s, kOpPullRaw, std::string("\1\1\0\0", 4));
  Write(dir, "rounds-through-freeze", s);

  // Requests as protos: a re-registration, an fp32 push, a pull.
  s.clear();
  v1::RegisterRequest reg;
  reg.set_worker_id(1);
  reg.set_num_workers(kShardWorkers);
  reg.set_num_shards(1);
  *reg.mutable_layout() = ShardLayout();
  AppendRecord(&s, kOpRegister, reg.SerializeAsString());
  v1::PushRequest push;
  push.set_worker_id(0);
  push.set_step(0);
  v1::CodecParams fp16;
  fp16.set_value_format(v1::VALUE_FORMAT_FP16);
  fp16.set_k(20);
  *push.mutable_gradient() =
      Encode(v1::CODEC_TOPK, fp16, Values(kShardElements, 3));
  AppendRecord(&s, kOpPush, push.SerializeAsString());
  push.set_worker_id(1);
  *push.mutable_gradient() =
      Encode(v1::CODEC_RANDOMK, fp16, Values(kShardElements, 4));
  AppendRecord(&s, kOpPush, push.SerializeAsString());
  v1::PullRequest pull;
  pull.set_worker_id(1);
  pull.set_step(1);
  pull.set_replica_step(0);
  AppendRecord(&s, kOpPull, pull.SerializeAsString());
  pull.set_step(2);
  AppendRecord(&s, kOpPull, pull.SerializeAsString());
  Write(dir, "protos", s);

  // A fresh shard registered through the fuzzed path, then raw pushes.
  s.clear();
  AppendRecord(&s, kOpReset, "");
  reg.set_worker_id(0);
  v1::CodecParams none;
  *reg.mutable_initial_weights() =
      Encode(v1::CODEC_FP32, none, Values(kShardElements, 5));
  AppendRecord(&s, kOpRegister, reg.SerializeAsString());
  reg.set_worker_id(1);
  reg.clear_initial_weights();
  reg.set_resume_step(3);
  AppendRecord(&s, kOpRegister, reg.SerializeAsString());
  v1::CodecParams ob;
  ob.set_block_size(0);
  v1::EncodedTensor g = Encode(v1::CODEC_ONEBIT, ob, Values(kShardElements, 6));
  std::string raw("\0\0\3\1\0\0", 6);
  raw += g.payload();
  AppendRecord(&s, kOpPushRaw, raw);
  raw = std::string("\1\0\0\1\0\0", 6);
  raw += Encode(v1::CODEC_FP32, none, Values(kShardElements, 7)).payload();
  AppendRecord(&s, kOpPushRaw, raw);
  Write(dir, "fresh-register-raw-push", s);
  // The same on shards under ssp with s = 0 and async (the Reset's byte).
  for (const auto& [mode, name] :
       {std::pair<char, const char*>{1, "ssp0-register-raw-push"},
        std::pair<char, const char*>{2, "async-register-raw-push"}}) {
    std::string m;
    AppendRecord(&m, kOpReset, std::string(1, mode));
    m += s.substr(3);  // after the empty Reset record
    Write(dir, name, m);
  }
}

ShardState SmallState(uint32_t kind, bool with_delta) {
  ShardState st;
  st.num_workers = 2;
  st.optimizer_kind = kind;
  st.step = 5;
  st.freeze_step = 100;
  v1::TensorSpec* t = st.layout.add_tensors();
  t->set_name("w");
  t->add_shape(2);
  t->add_shape(16);
  st.x = Values(32, 11);
  st.m = Values(32, 12);
  if (kind != 2) {  // sgd keeps no v
    st.v = Values(32, 13);
    for (float& f : st.v) f = f * f;
  }
  st.x_hat = Values(32, 14);
  st.last_pushed = {4, 4};
  st.replica_checksum = ChecksumOf(st.x_hat);
  st.prev_replica_checksum = 12345;
  if (with_delta) {
    v1::CodecParams p;
    p.set_block_size(16);
    st.delta = {Encode(v1::CODEC_ONEBIT, p, Values(32, 15))};
  }
  return st;
}

void CheckpointCorpus(const std::string& dir) {
  struct Case {
    const char* name;
    uint8_t flags;
    ShardState state;
  };
  Case cases[] = {
      // Sealed (checksum left to the target), so single mutations of a
      // field still reach the loader.
      {"onebit-adam-delta-load", kCkptSeal | kCkptLoad | kCkptOneBitPull,
       SmallState(0, true)},
      {"adam-load", kCkptSeal | kCkptLoad, SmallState(1, false)},
      {"sgd-load", kCkptSeal | kCkptLoad, SmallState(2, false)},
      {"onebit-adam-parse-only", 0, SmallState(0, true)},
  };
  for (Case& c : cases) {
    std::string bytes = SerializeShardState(c.state);
    if (c.flags & kCkptSeal) bytes.resize(bytes.size() - 8);
    Write(dir, c.name, std::string(1, static_cast<char>(c.flags)) + bytes);
  }
  // Sealed by the target: the same body without its checksum.
  ShardState frozen = SmallState(0, true);
  frozen.frozen = true;
  frozen.step = 120;
  std::string bytes = SerializeShardState(frozen);
  bytes.resize(bytes.size() - 8);
  Write(dir, "frozen-sealed-load",
        std::string(1, static_cast<char>(kCkptSeal | kCkptLoad)) + bytes);
}

// Gradient files (tune/gradient_file.h) as GradientFileWriter writes
// them: the MLP's tensor shapes shrunk, a scalar, a header alone.
void GradientFileCorpus(const std::string& dir) {
  ::mkdir(dir.c_str(), 0755);
  v1::ModelLayout layout;
  auto add = [&](const char* name, std::vector<uint64_t> shape) {
    v1::TensorSpec* t = layout.add_tensors();
    t->set_name(name);
    for (uint64_t d : shape) t->add_shape(d);
  };
  add("fc1.weight", {4, 3});
  add("fc1.bias", {4});
  add("scale", {});
  auto write = [&](const std::string& name, std::vector<uint64_t> steps) {
    auto w = GradientFileWriter::Create(dir + "/" + name, layout, 2);
    if (!w.ok()) {
      std::fprintf(stderr, "%s\n", w.status().ToString().c_str());
      ++failures;
      return;
    }
    std::vector<float> g(17);
    for (uint64_t s : steps) {
      for (size_t i = 0; i < g.size(); ++i) g[i] = 0.125f * (i + s) - 1.0f;
      if (!(*w)->Append(s, g).ok()) ++failures;
    }
    if (!(*w)->Close().ok()) ++failures;
  };
  write("header-only", {});
  write("two-windows", {0, 1, 2, 10, 11});
}

}  // namespace
}  // namespace fuzz
}  // namespace pserver

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT_FOLDER (e.g. tests/fuzz/corpus)\n",
                 argv[0]);
    return 2;
  }
  const std::string out = argv[1];
  ::mkdir(out.c_str(), 0755);
  pserver::fuzz::CodecCorpus(out + "/codec");
  pserver::fuzz::ShardCorpus(out + "/shard");
  pserver::fuzz::CheckpointCorpus(out + "/checkpoint");
  pserver::fuzz::GradientFileCorpus(out + "/gradient_file");
  return pserver::fuzz::failures == 0 ? 0 : 1;
}
