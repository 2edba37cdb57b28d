#include "worker/mlp.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/test_data.h"
#include "worker/batcher.h"
#include "worker/rng.h"

namespace pserver {
namespace {

// Slow, obviously-correct double-precision forward pass: the reference the
// analytic gradient is checked against by central differences.
double ReferenceLoss(const std::vector<int>& sizes,
                     const std::vector<double>& p, const float* x,
                     const uint8_t* y, int batch) {
  double total = 0;
  for (int r = 0; r < batch; ++r) {
    std::vector<double> a(x + static_cast<size_t>(r) * sizes[0],
                          x + static_cast<size_t>(r + 1) * sizes[0]);
    size_t offset = 0;
    for (size_t l = 0; l + 1 < sizes.size(); ++l) {
      const int in = sizes[l], out = sizes[l + 1];
      const double* w = p.data() + offset;
      const double* b = w + static_cast<size_t>(in) * out;
      offset += static_cast<size_t>(in + 1) * out;
      std::vector<double> z(out);
      for (int j = 0; j < out; ++j) {
        double s = b[j];
        for (int i = 0; i < in; ++i) s += w[static_cast<size_t>(j) * in + i] * a[i];
        z[j] = (l + 2 < sizes.size()) ? std::max(s, 0.0) : s;
      }
      a = std::move(z);
    }
    double m = *std::max_element(a.begin(), a.end());
    double sum = 0;
    for (double v : a) sum += std::exp(v - m);
    total += std::log(sum) + m - a[y[r]];
  }
  return total / batch;
}

struct Batch {
  std::vector<float> x;
  std::vector<uint8_t> y;
};

Batch RandomBatch(int batch, int inputs, int classes, uint64_t seed) {
  SplitMix64 rng(seed);
  Batch b;
  for (int i = 0; i < batch * inputs; ++i) b.x.push_back(rng.NextDouble());
  for (int i = 0; i < batch; ++i) b.y.push_back(rng.Uniform(classes));
  return b;
}

// Checks the analytic gradient at `coords` against central differences of
// the double reference; also checks the loss itself.
void ExpectGradientMatches(Mlp& mlp, const std::vector<float>& params,
                           const Batch& b, int batch,
                           const std::vector<uint64_t>& coords) {
  std::vector<float> grad(mlp.num_params(),
                          std::numeric_limits<float>::quiet_NaN());
  const float loss = mlp.LossAndGradient(params, b.x.data(), b.y.data(),
                                         batch, absl::MakeSpan(grad));
  std::vector<double> p(params.begin(), params.end());
  const double ref = ReferenceLoss(mlp.layer_sizes(), p, b.x.data(),
                                   b.y.data(), batch);
  EXPECT_NEAR(loss, ref, 1e-5 * std::max(1.0, ref));
  const double h = 1e-5;
  for (uint64_t i : coords) {
    const double saved = p[i];
    p[i] = saved + h;
    const double up = ReferenceLoss(mlp.layer_sizes(), p, b.x.data(),
                                    b.y.data(), batch);
    p[i] = saved - h;
    const double down = ReferenceLoss(mlp.layer_sizes(), p, b.x.data(),
                                      b.y.data(), batch);
    p[i] = saved;
    const double fd = (up - down) / (2 * h);
    EXPECT_NEAR(grad[i], fd, 2e-5 + 1e-3 * std::abs(fd)) << "coordinate " << i;
  }
}

TEST(Mlp, LayoutIsNamedTensorsEndToEnd) {
  absl::StatusOr<Mlp> mlp = Mlp::Create(784, {256, 128}, 10);
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  const std::vector<ParamTensor>& layout = mlp->layout();
  ASSERT_EQ(layout.size(), 6u);
  const std::vector<std::pair<std::string, std::vector<uint64_t>>> expected = {
      {"fc1.weight", {256, 784}}, {"fc1.bias", {256}},
      {"fc2.weight", {128, 256}}, {"fc2.bias", {128}},
      {"fc3.weight", {10, 128}},  {"fc3.bias", {10}}};
  uint64_t offset = 0;
  for (size_t i = 0; i < layout.size(); ++i) {
    EXPECT_EQ(layout[i].name, expected[i].first);
    EXPECT_EQ(layout[i].shape, expected[i].second);
    EXPECT_EQ(layout[i].offset, offset);
    uint64_t size = 1;
    for (uint64_t d : expected[i].second) size *= d;
    EXPECT_EQ(layout[i].size, size);
    offset += size;
  }
  EXPECT_EQ(mlp->num_params(), 235146u);
  EXPECT_EQ(offset, 235146u);
}

TEST(Mlp, CreateRejectsBadSizes) {
  EXPECT_EQ(Mlp::Create({784}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Mlp::Create({784, 0, 10}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Mlp::Create({784, -3, 10}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Mlp::Create({784, 300}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Mlp::Create({1 << 20, 1 << 10, 10}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mlp::Create({784, 10}).ok());
}

TEST(Mlp, CheckDataComparesShapes) {
  absl::StatusOr<Mlp> mlp = Mlp::Create({784, 32, 10});
  ASSERT_TRUE(mlp.ok());
  Dataset d;
  d.rows = 28;
  d.cols = 28;
  d.num_classes = 10;
  EXPECT_TRUE(mlp->CheckData(d).ok());
  d.cols = 27;
  EXPECT_EQ(mlp->CheckData(d).code(), absl::StatusCode::kInvalidArgument);
  d.cols = 28;
  d.num_classes = 11;
  EXPECT_EQ(mlp->CheckData(d).code(), absl::StatusCode::kInvalidArgument);
}

TEST(Mlp, HeInitStatistics) {
  absl::StatusOr<Mlp> mlp = Mlp::Create({784, 256, 128, 10});
  ASSERT_TRUE(mlp.ok());
  const std::vector<float> params = mlp->InitParams(42, InitScheme::kHeNormal);
  for (const ParamTensor& t : mlp->layout()) {
    const float* p = params.data() + t.offset;
    if (t.shape.size() == 1) {
      EXPECT_TRUE(std::all_of(p, p + t.size, [](float v) { return v == 0; }))
          << t.name;
      continue;
    }
    const double var = 2.0 / t.shape[1];
    double sum = 0, sq = 0;
    int64_t within = 0;
    for (uint64_t i = 0; i < t.size; ++i) {
      sum += p[i];
      sq += double{p[i]} * p[i];
      within += std::abs(p[i]) < std::sqrt(var);
    }
    const double n = static_cast<double>(t.size);
    // Mean within 4 standard errors, variance within 4 relative standard
    // errors (sqrt(2/n)), about 68.3% within one standard deviation.
    EXPECT_NEAR(sum / n, 0.0, 4 * std::sqrt(var / n)) << t.name;
    EXPECT_NEAR(sq / n / var, 1.0, 4 * std::sqrt(2 / n)) << t.name;
    EXPECT_NEAR(within / n, 0.6827, 4 * std::sqrt(0.6827 * 0.3173 / n))
        << t.name;
  }
}

// PyTorch's nn.Linear default: weights and biases uniform in
// [-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in the layer's inputs, so
// variance bound^2 / 3 and about half the values inside bound / 2.
TEST(Mlp, PyTorchInitStatistics) {
  absl::StatusOr<Mlp> mlp = Mlp::Create({784, 256, 128, 10});
  ASSERT_TRUE(mlp.ok());
  const std::vector<float> params = mlp->InitParams(42, InitScheme::kPyTorch);
  EXPECT_EQ(params, mlp->InitParams(42));  // the default scheme
  for (size_t k = 0; k < mlp->layout().size(); ++k) {
    const ParamTensor& t = mlp->layout()[k];
    const uint64_t fan_in = mlp->layout()[k & ~size_t{1}].shape[1];
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    const float* p = params.data() + t.offset;
    double sum = 0, sq = 0, top = 0;
    int64_t half = 0;
    for (uint64_t i = 0; i < t.size; ++i) {
      ASSERT_LE(std::abs(p[i]), static_cast<float>(bound))
          << t.name << "[" << i << "]";
      sum += p[i];
      sq += double{p[i]} * p[i];
      top = std::max(top, std::abs(double{p[i]}));
      half += std::abs(p[i]) < bound / 2;
    }
    const double n = static_cast<double>(t.size);
    const double var = bound * bound / 3;
    // Mean within 4 standard errors; variance within 4 of its relative
    // standard errors (sqrt(0.8 / n) for a uniform); half the values inside
    // bound / 2; the largest |value| above c * bound, where c^n = 1e-6 is
    // the chance that all n fall inside c * bound.
    EXPECT_NEAR(sum / n, 0.0, 4 * std::sqrt(var / n)) << t.name;
    EXPECT_NEAR(sq / n / var, 1.0, 4 * std::sqrt(0.8 / n)) << t.name;
    EXPECT_NEAR(half / n, 0.5, 4 * std::sqrt(0.25 / n)) << t.name;
    EXPECT_GT(top, std::pow(1e-6, 1.0 / n) * bound) << t.name;
    // Biases are drawn too (He-normal sets them to 0).
    EXPECT_TRUE(std::all_of(p, p + t.size, [](float v) { return v != 0; }))
        << t.name;
  }
}

// The two schemes give different weights for the same seed, and He-normal's
// spread (sqrt(2 / fan_in)) is sqrt(6) times PyTorch's (1 / sqrt(3 fan_in)).
TEST(Mlp, InitSchemesDiffer) {
  absl::StatusOr<Mlp> mlp = Mlp::Create({784, 256, 128, 10});
  ASSERT_TRUE(mlp.ok());
  const std::vector<float> he = mlp->InitParams(5, InitScheme::kHeNormal);
  const std::vector<float> pt = mlp->InitParams(5, InitScheme::kPyTorch);
  const ParamTensor& w = mlp->layout()[0];  // fc1.weight, 200704 values
  double he_sq = 0, pt_sq = 0;
  for (uint64_t i = w.offset; i < w.offset + w.size; ++i) {
    he_sq += double{he[i]} * he[i];
    pt_sq += double{pt[i]} * pt[i];
  }
  EXPECT_NEAR(std::sqrt(he_sq / pt_sq), std::sqrt(6.0), 0.02);
  EXPECT_NE(he, pt);
}

TEST(Mlp, InitIsDeterministicGivenSeed) {
  absl::StatusOr<Mlp> mlp = Mlp::Create({784, 256, 128, 10});
  ASSERT_TRUE(mlp.ok());
  const std::vector<float> a = mlp->InitParams(7);
  EXPECT_EQ(a, mlp->InitParams(7));
  EXPECT_NE(a, mlp->InitParams(8));
  const std::vector<float> he = mlp->InitParams(7, InitScheme::kHeNormal);
  EXPECT_EQ(he, mlp->InitParams(7, InitScheme::kHeNormal));
  EXPECT_NE(he, mlp->InitParams(8, InitScheme::kHeNormal));
  // Pinned values: a change here changes every seeded run.
  SplitMix64 rng(0);
  EXPECT_EQ(rng.Next(), 0xE220A8397B1DCDAFULL);
}

TEST(Mlp, GradientMatchesFiniteDifferencesSmall) {
  absl::StatusOr<Mlp> mlp = Mlp::Create({20, 16, 8, 10});
  ASSERT_TRUE(mlp.ok());
  std::vector<float> params = mlp->InitParams(3);
  // Non-zero biases so that their gradients are exercised off the origin.
  SplitMix64 rng(99);
  for (const ParamTensor& t : mlp->layout()) {
    if (t.shape.size() != 1) continue;
    for (uint64_t i = 0; i < t.size; ++i) {
      params[t.offset + i] = static_cast<float>(0.1 * rng.Normal());
    }
  }
  const Batch b = RandomBatch(5, 20, 10, 5);
  std::vector<uint64_t> all(mlp->num_params());
  for (uint64_t i = 0; i < all.size(); ++i) all[i] = i;
  ExpectGradientMatches(*mlp, params, b, 5, all);
}

TEST(Mlp, GradientMatchesFiniteDifferencesFullSize) {
  absl::StatusOr<Mlp> mlp = Mlp::Create({784, 256, 128, 10});
  ASSERT_TRUE(mlp.ok());
  const std::vector<float> params = mlp->InitParams(11);
  Batch b = RandomBatch(8, 784, 10, 6);
  if (const Dataset* train = testing_data::FashionMnist(DataSplit::kTrain)) {
    std::copy(train->images.begin(), train->images.begin() + 8 * 784,
              b.x.begin());
    std::copy(train->labels.begin(), train->labels.begin() + 8, b.y.begin());
  }
  std::vector<uint64_t> coords;
  SplitMix64 rng(12);
  for (const ParamTensor& t : mlp->layout()) {
    for (int k = 0; k < 8; ++k) coords.push_back(t.offset + rng.Uniform(t.size));
  }
  ExpectGradientMatches(*mlp, params, b, 8, coords);
}

TEST(Mlp, GradientIsOverwrittenAndRepeatable) {
  absl::StatusOr<Mlp> mlp = Mlp::Create({30, 12, 10});
  ASSERT_TRUE(mlp.ok());
  const std::vector<float> params = mlp->InitParams(1);
  const Batch small = RandomBatch(3, 30, 10, 1);
  const Batch large = RandomBatch(64, 30, 10, 2);
  std::vector<float> g1(mlp->num_params(), 123.0f), g2(mlp->num_params());
  const float l1 = mlp->LossAndGradient(params, small.x.data(), small.y.data(),
                                        3, absl::MakeSpan(g1));
  // A larger batch in between grows the scratch buffers.
  mlp->LossAndGradient(params, large.x.data(), large.y.data(), 64,
                       absl::MakeSpan(g2));
  const float l2 = mlp->LossAndGradient(params, small.x.data(), small.y.data(),
                                        3, absl::MakeSpan(g2));
  EXPECT_EQ(l1, l2);
  EXPECT_EQ(g1, g2);
}

TEST(Mlp, LossIsStableForHugeLogits) {
  absl::StatusOr<Mlp> mlp = Mlp::Create({2, 3});
  ASSERT_TRUE(mlp.ok());
  // Logits = 1000 * x: exp would overflow without the max subtracted.
  std::vector<float> params = {1000, 0, 0, 1000, 0, 0, 0, 0, 0};
  const std::vector<float> x = {1, 0};
  const uint8_t y_right = 0, y_wrong = 1;
  std::vector<float> grad(mlp->num_params());
  EXPECT_NEAR(mlp->LossAndGradient(params, x.data(), &y_right, 1,
                                   absl::MakeSpan(grad)),
              0.0f, 1e-6);
  EXPECT_NEAR(mlp->LossAndGradient(params, x.data(), &y_wrong, 1,
                                   absl::MakeSpan(grad)),
              1000.0f, 1e-3);
  for (float g : grad) EXPECT_TRUE(std::isfinite(g));
}

TEST(Mlp, EvaluateInChunksMatchesOnePass) {
  absl::StatusOr<Mlp> mlp = Mlp::Create({50, 20, 10});
  ASSERT_TRUE(mlp.ok());
  const std::vector<float> params = mlp->InitParams(5);
  const Batch b = RandomBatch(103, 50, 10, 8);
  const EvalResult one = mlp->Evaluate(params, b.x.data(), b.y.data(), 103,
                                       /*chunk=*/1000);
  const EvalResult chunked = mlp->Evaluate(params, b.x.data(), b.y.data(),
                                           103, /*chunk=*/10);
  EXPECT_EQ(one.count, 103);
  EXPECT_EQ(one.correct, chunked.correct);
  EXPECT_DOUBLE_EQ(one.accuracy, static_cast<double>(one.correct) / 103);
  EXPECT_NEAR(one.mean_loss, chunked.mean_loss, 1e-6);
  std::vector<float> grad(mlp->num_params());
  EXPECT_NEAR(one.mean_loss,
              mlp->LossAndGradient(params, b.x.data(), b.y.data(), 103,
                                   absl::MakeSpan(grad)),
              1e-5);
}

// Plain Adam (Kingma & Ba 2015) with bias correction, for the training tests.
class Adam {
 public:
  Adam(size_t n, float lr) : lr_(lr), m_(n), v_(n) {}
  void Step(std::vector<float>& p, const std::vector<float>& g) {
    ++t_;
    const double c1 = 1 - std::pow(0.9, t_), c2 = 1 - std::pow(0.999, t_);
    for (size_t i = 0; i < p.size(); ++i) {
      m_[i] = 0.9f * m_[i] + 0.1f * g[i];
      v_[i] = 0.999f * v_[i] + 0.001f * g[i] * g[i];
      p[i] -= static_cast<float>(lr_ * (m_[i] / c1) /
                                 (std::sqrt(v_[i] / c2) + 1e-8));
    }
  }

 private:
  float lr_;
  int t_ = 0;
  std::vector<float> m_, v_;
};

// Trains `steps` Adam steps of batch 32 on the first `n` examples.
std::vector<float> Train(Mlp& mlp, const Dataset& data, int64_t n, int steps,
                         uint64_t seed, std::vector<float>* losses) {
  std::vector<float> params = mlp.InitParams(seed);
  std::vector<float> grad(mlp.num_params());
  Adam adam(params.size(), 1e-3f);
  absl::StatusOr<Batcher> batcher = Batcher::Create(n, 1, 0, 32, seed);
  EXPECT_TRUE(batcher.ok());
  std::vector<float> x(32 * 784);
  std::vector<uint8_t> y(32);
  for (int step = 0; step < steps; ++step) {
    GatherBatch(data, batcher->WorkerBatch(step), x.data(), y.data());
    const float loss = mlp.LossAndGradient(params, x.data(), y.data(), 32,
                                           absl::MakeSpan(grad));
    if (losses != nullptr) losses->push_back(loss);
    adam.Step(params, grad);
  }
  return params;
}

TEST(Mlp, TrainsOnFashionMnistSubset) {
  const Dataset* train = testing_data::FashionMnist(DataSplit::kTrain);
  if (train == nullptr) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  absl::StatusOr<Mlp> mlp = Mlp::Create({784, 256, 128, 10});
  ASSERT_TRUE(mlp.ok());
  const int64_t n = 2000;
  const EvalResult before = mlp->Evaluate(mlp->InitParams(1), train->images.data(),
                                          train->labels.data(), n);
  std::vector<float> losses;
  const std::vector<float> params = Train(*mlp, *train, n, 300, 1, &losses);
  const EvalResult after =
      mlp->Evaluate(params, train->images.data(), train->labels.data(), n);
  double first = 0, last = 0;
  for (int i = 0; i < 20; ++i) {
    first += losses[i];
    last += losses[losses.size() - 1 - i];
  }
  EXPECT_LT(last, 0.5 * first);
  EXPECT_LT(after.mean_loss, 0.5 * before.mean_loss);
  EXPECT_GT(after.accuracy, 0.70);
  std::printf("subset of %lld: train accuracy %.3f -> %.3f, loss %.3f -> %.3f\n",
              static_cast<long long>(n), before.accuracy, after.accuracy,
              before.mean_loss, after.mean_loss);
}

TEST(Mlp, TrainingIsDeterministicGivenSeed) {
  const Dataset* train = testing_data::FashionMnist(DataSplit::kTrain);
  if (train == nullptr) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  absl::StatusOr<Mlp> mlp = Mlp::Create({784, 64, 10});
  ASSERT_TRUE(mlp.ok());
  const std::vector<float> a = Train(*mlp, *train, 1000, 40, 3, nullptr);
  const std::vector<float> b = Train(*mlp, *train, 1000, 40, 3, nullptr);
  const std::vector<float> c = Train(*mlp, *train, 1000, 40, 4, nullptr);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(Mlp, ForwardBackwardTiming) {
  absl::StatusOr<Mlp> mlp = Mlp::Create({784, 256, 128, 10});
  ASSERT_TRUE(mlp.ok());
  const std::vector<float> params = mlp->InitParams(1);
  std::vector<float> grad(mlp->num_params());
  const int default_threads = BlasThreads();
  for (int threads : {1, default_threads}) {
  SetBlasThreads(threads);
  for (int batch : {32, 128}) {
    const Batch b = RandomBatch(batch, 784, 10, batch);
    mlp->LossAndGradient(params, b.x.data(), b.y.data(), batch,
                         absl::MakeSpan(grad));
    std::vector<double> times;
    for (int rep = 0; rep < 50; ++rep) {
      const auto start = std::chrono::steady_clock::now();
      mlp->LossAndGradient(params, b.x.data(), b.y.data(), batch,
                           absl::MakeSpan(grad));
      times.push_back(std::chrono::duration<double, std::micro>(
                          std::chrono::steady_clock::now() - start)
                          .count());
    }
    std::sort(times.begin(), times.end());
    std::printf(
        "784-256-128-10 forward+backward, batch %d, %d BLAS threads: "
        "median %.0f us\n",
        batch, threads, times[times.size() / 2]);
  }
  }
  SetBlasThreads(default_threads);
}

}  // namespace
}  // namespace pserver
