// The shard's optimizer step on a large slice (not a unit test): Adam before
// the freeze, 1-bit Adam's compression stage (worker momentum, the
// preconditioned default) and SGD with Nesterov momentum, over n elements
// with the thread pool the shard uses. A 100M-parameter 1-bit step spends
// about half its shard time here (tests/bench/results/step_profile.txt).
//
//   build/tests/bench/optimizer_bench --benchmark_min_time=1
//       --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//
// Figures: time per step and elements per second; bytes per second counts
// the arrays each element reads and writes (g, x, m and v as the kind needs),
// to compare with the copy bandwidth of codec_bench.
#include <cstdint>
#include <memory>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/thread_pool.h"
#include "server/moment_optimizer.h"

namespace pserver {
namespace {

enum Kind { kAdam = 0, kOneBitFrozen = 1, kNesterov = 2 };

std::vector<float> Filled(uint64_t n, float scale, uint64_t seed) {
  std::vector<float> v(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (float& f : v) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    f = scale * (static_cast<float>(s >> 40) / 16777216.0f - 0.5f);
  }
  return v;
}

void BM_OptimizerStep(benchmark::State& state) {
  const uint64_t n = static_cast<uint64_t>(state.range(0));
  const Kind kind = static_cast<Kind>(state.range(1));
  OptimizerConfig c;
  c.lr = 1e-3f;
  c.weight_decay = 0.01f;
  int bytes_per_element = 0;
  switch (kind) {
    case kAdam:
      c.kind = OptimizerKind::kAdam;
      bytes_per_element = 4 * (1 + 2 + 2 + 2);  // g; x, m, v read + written
      break;
    case kOneBitFrozen:
      c.kind = OptimizerKind::kOneBitAdam;
      c.freeze_step = 1;
      c.worker_momentum = true;
      bytes_per_element = 4 * (1 + 2 + 2);  // g; x, m (v not read)
      break;
    case kNesterov:
      c.kind = OptimizerKind::kSgd;
      c.momentum = 0.9f;
      c.nesterov = true;
      bytes_per_element = 4 * (1 + 2 + 2);
      break;
  }
  MomentOptimizer opt(c, n, {});
  const std::vector<float> g = Filled(n, 0.02f, 1);
  std::vector<float> x = Filled(n, 0.1f, 2);
  opt.Step(g, absl::MakeSpan(x));  // the freeze, and first touch of m and v
  double norm = 0;
  for (auto _ : state) {
    norm += opt.Step(g, absl::MakeSpan(x));
  }
  benchmark::DoNotOptimize(norm);
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(n));
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(n) *
                          bytes_per_element);
  state.counters["threads"] = ThreadPool::Default()->helpers() + 1;
}

BENCHMARK(BM_OptimizerStep)
    ->ArgNames({"n", "kind"})
    ->ArgsProduct({{1 << 20, 1 << 26}, {kAdam, kOneBitFrozen, kNesterov}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace pserver

BENCHMARK_MAIN();
