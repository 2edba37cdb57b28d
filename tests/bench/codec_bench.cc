// Codec throughput, single thread, as elements per second, against a plain
// copy of the same fp32 array (`copy`) and a read-only `sum`. After the run
// a table prints each benchmark's elements/s divided by copy's at the same
// size. Run: codec_bench [--benchmark_filter=...]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/codec.h"
#include "common/error_feedback.h"
#include "common/validated_tensor.h"

namespace pserver {
namespace {

constexpr int64_t kSizes[] = {int64_t{1} << 20, int64_t{1} << 26};

// Gaussian-like data from a fixed LCG (Box-Muller), shared by all benchmarks
// of a size so their figures are comparable.
const std::vector<float>& Data(size_t n, int which = 0) {
  static std::map<std::pair<size_t, int>, std::vector<float>> cache;
  auto& v = cache[{n, which}];
  if (v.empty()) {
    v.resize(n);
    uint64_t s = 0x9e3779b97f4a7c15ull * (which + 1);
    auto next = [&s] {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      return ((s >> 40) + 0.5) / 16777216.0;
    };
    for (size_t i = 0; i < n; i += 2) {
      double r = std::sqrt(-2 * std::log(next())), a = 6.283185307179586 * next();
      v[i] = static_cast<float>(r * std::cos(a));
      if (i + 1 < n) v[i + 1] = static_cast<float>(r * std::sin(a)) * (which ? 0.1f : 1.0f);
    }
  }
  return v;
}

std::unique_ptr<Codec> Make(v1::Codec c, v1::CodecParams p = {}) {
  auto codec = MakeCodec(c, p);
  if (!codec.ok()) std::abort();
  return std::move(*codec);
}

void BM_copy(benchmark::State& state) {
  const size_t n = state.range(0);
  const std::vector<float>& src = Data(n);
  std::vector<float> dst(n);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), n * 4);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
}

void BM_sum(benchmark::State& state) {
  const size_t n = state.range(0);
  const std::vector<float>& src = Data(n);
  for (auto _ : state) {
    // Eight independent partial sums so the adds are not latency bound.
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (size_t i = 0; i + 8 <= n; i += 8) {
      for (int j = 0; j < 8; ++j) s[j] += src[i + j];
    }
    float total = 0;
    for (float x : s) total += x;
    benchmark::DoNotOptimize(total);
  }
  state.SetItemsProcessed(state.iterations() * n);
}

// encode with error feedback: g, e_in -> payload, e_out.
void EncodeEf(benchmark::State& state, v1::Codec c, v1::CodecParams p) {
  const size_t n = state.range(0);
  auto codec = Make(c, p);
  const std::vector<float>& g = Data(n);
  std::vector<float> e_in(Data(n, 1)), e_out(n);
  v1::EncodedTensor t;
  uint64_t seed = 0;
  for (auto _ : state) {
    if (!EncodeWithFeedback(*codec, g, e_in, 1.0f, seed++, &t, absl::MakeSpan(e_out)).ok()) {
      state.SkipWithError("encode failed");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.counters["bytes_per_elem"] = static_cast<double>(t.payload().size()) / n;
}

void DecodeAcc(benchmark::State& state, v1::Codec c, v1::CodecParams p) {
  const size_t n = state.range(0);
  auto codec = Make(c, p);
  v1::EncodedTensor t;
  if (!codec->Encode(Data(n), 1, &t).ok()) std::abort();
  std::vector<float> acc(n, 0.0f);
  for (auto _ : state) {
    if (!codec->DecodeAccumulate(t, 0.25f, absl::MakeSpan(acc)).ok()) {
      state.SkipWithError("decode failed");
      break;
    }
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
}

// A pulled delta applied to the replica: out = base + decode(t) in the
// codec's one pass (AddInto), or as a copy and then an accumulate (what a
// codec without one does; the baseline, same run).
void DecodeAdd(benchmark::State& state, v1::Codec c, v1::CodecParams p,
               bool one_pass) {
  const size_t n = state.range(0);
  auto codec = Make(c, p);
  v1::EncodedTensor t;
  if (!codec->Encode(Data(n), 1, &t).ok()) std::abort();
  absl::StatusOr<ValidatedTensor> v = ValidateTensor(t, n);
  if (!v.ok()) std::abort();
  const std::vector<float> base = Data(n);
  std::vector<float> out(n, 0.0f);
  for (auto _ : state) {
    if (one_pass) {
      v->AddInto(base, absl::MakeSpan(out));
    } else {
      std::copy(base.begin(), base.end(), out.begin());
      v->AccumulateInto(1.0f, absl::MakeSpan(out));
    }
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
}

// TopK 1% selection only (no error feedback), and the std::nth_element
// baseline on the same data (copy included: selection must not reorder u).
void TopKEncode(benchmark::State& state, v1::TopKSelection sel) {
  const size_t n = state.range(0);
  v1::CodecParams p;
  p.set_k_fraction(0.01);
  p.set_selection(sel);
  auto codec = Make(v1::CODEC_TOPK, p);
  v1::EncodedTensor t;
  for (auto _ : state) {
    if (!codec->Encode(Data(n), 0, &t).ok()) std::abort();
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.counters["bytes_per_elem"] = static_cast<double>(t.payload().size()) / n;
}

// Encode alone (no error feedback) with any codec.
void EncodeOnly(benchmark::State& state, v1::Codec c, v1::CodecParams p) {
  const size_t n = state.range(0);
  auto codec = Make(c, p);
  v1::EncodedTensor t;
  for (auto _ : state) {
    if (!codec->Encode(Data(n), 0, &t).ok()) std::abort();
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.counters["bytes_per_elem"] = static_cast<double>(t.payload().size()) / n;
}

void BM_topk_nth_element(benchmark::State& state) {
  const size_t n = state.range(0);
  const std::vector<float>& u = Data(n);
  std::vector<float> work(n);
  const size_t k = n / 100;
  for (auto _ : state) {
    std::memcpy(work.data(), u.data(), n * 4);
    std::nth_element(work.begin(), work.begin() + (k - 1), work.end(),
                     [](float a, float b) { return std::fabs(a) > std::fabs(b); });
    benchmark::DoNotOptimize(work[k - 1]);
  }
  state.SetItemsProcessed(state.iterations() * n);
}

v1::CodecParams With(void (*f)(v1::CodecParams*)) {
  v1::CodecParams p;
  f(&p);
  return p;
}

void Register() {
  auto sizes = [](benchmark::internal::Benchmark* b) {
    for (int64_t n : kSizes) b->Arg(n);
    b->Unit(benchmark::kMillisecond)->UseRealTime();
  };
  sizes(benchmark::RegisterBenchmark("copy", BM_copy));
  sizes(benchmark::RegisterBenchmark("sum", BM_sum));
  struct Entry {
    const char* name;
    v1::Codec codec;
    v1::CodecParams params;
  };
  std::vector<Entry> entries = {
      {"fp32", v1::CODEC_FP32, {}},
      {"fp16", v1::CODEC_FP16, {}},
      {"bf16", v1::CODEC_BF16, {}},
      {"onebit", v1::CODEC_ONEBIT, {}},
      {"onebit_l2", v1::CODEC_ONEBIT, With([](v1::CodecParams* p) { p->set_scale_mode(v1::SCALE_MODE_L2); })},
      {"topk1pct", v1::CODEC_TOPK, {}},
      {"randomk1pct", v1::CODEC_RANDOMK, {}},
      {"quantize8", v1::CODEC_QUANTIZE, {}},
      {"quantize4_stochastic", v1::CODEC_QUANTIZE, With([](v1::CodecParams* p) {
         p->set_bits(4);
         p->set_rounding(v1::ROUNDING_STOCHASTIC);
       })},
      {"topk_quantize1pct", v1::CODEC_TOPK_QUANTIZE, {}},
      // 1% of the blocks of 16 (the default), so 1% of the elements as topk1pct.
      {"block_topk1pct", v1::CODEC_BLOCK_TOPK, {}},
  };
  for (const Entry& e : entries) {
    sizes(benchmark::RegisterBenchmark((std::string(e.name) + "/encode_ef").c_str(),
                                       EncodeEf, e.codec, e.params));
    sizes(benchmark::RegisterBenchmark((std::string(e.name) + "/decode_acc").c_str(),
                                       DecodeAcc, e.codec, e.params));
  }
  for (const Entry& e : entries) {
    if (e.codec != v1::CODEC_ONEBIT && e.codec != v1::CODEC_QUANTIZE) continue;
    sizes(benchmark::RegisterBenchmark((std::string(e.name) + "/add").c_str(),
                                       DecodeAdd, e.codec, e.params, true));
    sizes(benchmark::RegisterBenchmark(
        (std::string(e.name) + "/copy_then_acc").c_str(), DecodeAdd, e.codec,
        e.params, false));
  }
  sizes(benchmark::RegisterBenchmark("topk1pct_sampled/encode", TopKEncode,
                                     v1::TOPK_SELECTION_SAMPLED));
  sizes(benchmark::RegisterBenchmark("topk1pct_exact/encode", TopKEncode,
                                     v1::TOPK_SELECTION_EXACT));
  sizes(benchmark::RegisterBenchmark("topk1pct_nth_element/encode", BM_topk_nth_element));
  sizes(benchmark::RegisterBenchmark("block_topk1pct/encode", EncodeOnly,
                                     v1::CODEC_BLOCK_TOPK, v1::CodecParams()));
}

// Keeps every run's items/s to print ratios at the end.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      if (r.error_occurred || r.run_type != Run::RT_Iteration) continue;
      auto it = r.counters.find("items_per_second");
      if (it != r.counters.end()) rates_.push_back({r.benchmark_name(), it->second});
    }
    ConsoleReporter::ReportRuns(runs);
  }

  void PrintRatios() const {
    // Names look like "<what>/<size>/real_time"; the size is the key.
    auto size_of = [](const std::string& name) {
      std::string rest = name.substr(0, name.rfind("/real_time"));
      return rest.substr(rest.rfind('/') + 1);
    };
    auto base_of = [](const std::string& name) {
      std::string rest = name.substr(0, name.rfind("/real_time"));
      return rest.substr(0, rest.rfind('/'));
    };
    std::map<std::string, double> copy, nth, sampled, by_name;
    for (const auto& [name, rate] : rates_) {
      by_name[name] = rate;
      if (base_of(name) == "copy") copy[size_of(name)] = rate;
      if (base_of(name) == "topk1pct_nth_element/encode") nth[size_of(name)] = rate;
      if (base_of(name) == "topk1pct_sampled/encode") sampled[size_of(name)] = rate;
    }
    std::printf("\n%-40s %10s %12s %10s %10s\n", "benchmark", "elements", "Gelem/s",
                "x copy", "x nth_el");
    for (const auto& [name, rate] : rates_) {
      std::string size = size_of(name);
      double c = copy.count(size) ? copy.at(size) : 0;
      double t = nth.count(size) ? nth.at(size) : 0;
      bool topk = base_of(name).rfind("topk1pct_", 0) == 0;
      std::printf("%-40s %10s %12.3f %10.2f", base_of(name).c_str(), size.c_str(), rate / 1e9,
                  c > 0 ? rate / c : 0.0);
      if (topk && t > 0) {
        std::printf(" %10.1f", rate / t);
      } else {
        std::printf(" %10s", "");
      }
      // The targets, judged on this run's figures.
      const std::string base = base_of(name);
      const double to_copy = c > 0 ? rate / c : 0, to_nth = t > 0 ? rate / t : 0;
      const double sel = sampled.count(size) ? sampled.at(size) : 0;
      double ratio = 0, target = 0;
      if (base == "topk1pct/encode_ef" && sel > 0) {
        // Time relative to the sampled selection alone: at most 2x.
        std::printf("  %.2fx sampled's time, target 2x: %s", sel / rate,
                    sel / rate <= 2.0 ? "met" : "MISSED");
      }
      if (base == "onebit/encode_ef") { ratio = to_copy; target = 0.7; }
      if (base == "onebit/decode_acc") { ratio = to_copy; target = 1.0; }
      if (base == "topk1pct_sampled/encode") { ratio = to_nth; target = 20; }
      if (base == "topk1pct_exact/encode") { ratio = to_nth; target = 4; }
      // ratio 0: its baseline (copy or nth_element) was filtered out.
      if (target > 0 && ratio > 0) {
        std::printf("  target %gx: %s", target, ratio >= target ? "met" : "MISSED");
      }
      // block_topk against topk at the same size and fraction, this run.
      if (base.rfind("block_topk1pct/", 0) == 0) {
        std::string peer = name.substr(std::string("block_").size());
        if (base == "block_topk1pct/encode") {
          peer = "topk1pct_sampled/encode" + name.substr(base.size());
        }
        if (by_name.count(peer) && by_name.at(peer) > 0) {
          std::printf("  %.2fx topk's rate", rate / by_name.at(peer));
        }
      }
      std::printf("\n");
    }
    std::printf("\nTargets: onebit/encode_ef >= 0.7x copy, onebit/decode_acc >= 1.0x copy,\n"
                "topk1pct_sampled >= 20x nth_element, topk1pct_exact >= 4x nth_element,\n"
                "topk1pct/encode_ef (error feedback, as pushes run it) within 2x of\n"
                "topk1pct_sampled's time.\n");
  }

 private:
  std::vector<std::pair<std::string, double>> rates_;
};

}  // namespace
}  // namespace pserver

int main(int argc, char** argv) {
  pserver::Register();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  pserver::RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.PrintRatios();
  benchmark::Shutdown();
  return 0;
}
