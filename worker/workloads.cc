#include "worker/workloads.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/batcher.h"
#include "worker/idx_reader.h"
#include "worker/rng.h"

namespace pserver {
namespace {

v1::ModelLayout ToLayout(const std::vector<ParamTensor>& tensors) {
  v1::ModelLayout l;
  for (const ParamTensor& t : tensors) {
    v1::TensorSpec* spec = l.add_tensors();
    spec->set_name(t.name);
    for (uint64_t d : t.shape) spec->add_shape(d);
  }
  return l;
}

Dataset Prefix(Dataset d, int64_t n) {
  if (n <= 0 || n >= d.size) return d;
  d.size = n;
  d.images.resize(static_cast<size_t>(n) * d.features());
  d.labels.resize(static_cast<size_t>(n));
  return d;
}

class MlpWorkload : public Workload {
 public:
  MlpWorkload(const TrainerOptions& o, Dataset train, Dataset test, Mlp mlp,
              Batcher batcher)
      : seed_(o.seed),
        init_(o.init),
        batch_size_(o.batch_size),
        train_(std::move(train)),
        test_(std::move(test)),
        mlp_(std::move(mlp)),
        batcher_(std::move(batcher)),
        layout_(ToLayout(mlp_.layout())),
        total_(o.steps > 0 ? o.steps : o.epochs * batcher_.steps_per_epoch()),
        x_(static_cast<size_t>(o.batch_size) * train_.features()),
        y_(static_cast<size_t>(o.batch_size)) {}

  const v1::ModelLayout& layout() const override { return layout_; }
  std::vector<float> InitialWeights() const override {
    return mlp_.InitParams(seed_, init_);
  }
  int64_t total_steps() const override { return total_; }
  int64_t steps_per_epoch() const override {
    return batcher_.steps_per_epoch();
  }
  absl::StatusOr<double> Gradient(int64_t step, absl::Span<const float> weights,
                                  absl::Span<float> grad,
                                  const GradientReadyFn& ready) override {
    GatherBatch(train_, batcher_.WorkerBatch(step), x_.data(), y_.data());
    const float loss = mlp_.LossAndGradient(weights, x_.data(), y_.data(),
                                            batch_size_, grad, ready);
    if (!std::isfinite(loss)) {
      return absl::InternalError(absl::StrCat(
          "training diverged: loss is ", loss, " at step ", step));
    }
    return loss;
  }
  std::optional<EvalResult> Evaluate(absl::Span<const float> weights) override {
    return mlp_.Evaluate(weights, test_);
  }

 private:
  const uint64_t seed_;
  const InitScheme init_;
  const int batch_size_;
  Dataset train_, test_;
  Mlp mlp_;
  Batcher batcher_;
  const v1::ModelLayout layout_;
  const int64_t total_;
  std::vector<float> x_;
  std::vector<uint8_t> y_;
};

class SyntheticWorkload : public Workload {
 public:
  SyntheticWorkload(const TrainerOptions& o, uint32_t worker_id)
      : seed_(o.seed),
        n_(o.synthetic_params),
        worker_id_(worker_id),
        total_(o.steps > 0 ? o.steps : 100) {
    uint64_t left = n_;
    for (int t = 0; t < o.synthetic_tensors; ++t) {
      const uint64_t size = left / (o.synthetic_tensors - t);
      left -= size;
      v1::TensorSpec* spec = layout_.add_tensors();
      spec->set_name(absl::StrCat("synthetic.", t));
      spec->add_shape(size);
    }
  }

  const v1::ModelLayout& layout() const override { return layout_; }
  std::vector<float> InitialWeights() const override {
    std::vector<float> init(n_);
    SplitMix64 rng(DeriveSeed(seed_, 1));
    for (float& v : init) v = static_cast<float>(rng.NextDouble() - 0.5) * 0.1f;
    return init;
  }
  int64_t total_steps() const override { return total_; }
  int64_t steps_per_epoch() const override { return 0; }
  absl::StatusOr<double> Gradient(int64_t step, absl::Span<const float>,
                                  absl::Span<float> grad,
                                  const GradientReadyFn& ready) override {
    if (noise_.empty()) {
      // A table of at most kNoiseElements, tiled over the gradient from a
      // step-dependent shift: the gradient is what the benchmark needs, a
      // second model-sized buffer is not (the worker's memory is measured).
      noise_.resize(std::min<uint64_t>(n_, kNoiseElements));
      SplitMix64 g(DeriveSeed(seed_, 1000 + worker_id_));
      for (float& v : noise_) {
        v = static_cast<float>(g.NextDouble() - 0.5) * 0.01f;
      }
    }
    // Tensor by tensor from the last, as a backward pass produces them:
    // element i is noise[(shift + i) % m].
    const uint64_t m = noise_.size();
    const uint64_t shift = Mix64(static_cast<uint64_t>(step)) % m;
    uint64_t end = n_;
    for (int t = layout_.tensors_size() - 1; t >= 0; --t) {
      const uint64_t begin = end - layout_.tensors(t).shape(0);
      for (uint64_t i = begin; i < end;) {
        const uint64_t from = (shift + i) % m;
        const uint64_t len = std::min(end - i, m - from);
        std::memcpy(grad.data() + i, noise_.data() + from, len * sizeof(float));
        i += len;
      }
      if (ready && begin < end) ready(begin, end);
      end = begin;
    }
    return 0.0;
  }
  std::optional<EvalResult> Evaluate(absl::Span<const float>) override {
    return std::nullopt;
  }

 private:
  static constexpr uint64_t kNoiseElements = uint64_t{1} << 22;
  const uint64_t seed_;
  const uint64_t n_;
  const uint32_t worker_id_;
  const int64_t total_;
  v1::ModelLayout layout_;
  std::vector<float> noise_;  // seeded noise, built at the first step
};

}  // namespace

absl::StatusOr<std::unique_ptr<Workload>> MakeMlpWorkload(
    const TrainerOptions& o, uint32_t worker_id, uint32_t num_workers) {
  absl::StatusOr<Dataset> train = LoadFashionMnist(o.data_dir, DataSplit::kTrain);
  if (!train.ok()) return train.status();
  absl::StatusOr<Dataset> test = LoadFashionMnist(o.data_dir, DataSplit::kTest);
  if (!test.ok()) return test.status();
  *train = Prefix(*std::move(train), o.train_subset);
  *test = Prefix(*std::move(test), o.test_subset);
  absl::StatusOr<Mlp> mlp =
      Mlp::Create(train->features(), o.hidden, std::max(10, train->num_classes));
  if (!mlp.ok()) return mlp.status();
  if (absl::Status s = mlp->CheckData(*train); !s.ok()) return s;
  absl::StatusOr<Batcher> batcher =
      Batcher::Create(train->size, static_cast<int>(num_workers),
                      static_cast<int>(worker_id), o.batch_size, o.seed);
  if (!batcher.ok()) return batcher.status();
  return std::unique_ptr<Workload>(
      new MlpWorkload(o, *std::move(train), *std::move(test),
                      *std::move(mlp), *std::move(batcher)));
}

absl::StatusOr<std::unique_ptr<Workload>> MakeSyntheticWorkload(
    const TrainerOptions& o, uint32_t worker_id) {
  if (o.synthetic_params == 0 || o.synthetic_tensors <= 0 ||
      static_cast<uint64_t>(o.synthetic_tensors) > o.synthetic_params) {
    return absl::InvalidArgumentError(absl::StrCat(
        "synthetic_params is ", o.synthetic_params, " in ",
        o.synthetic_tensors, " tensors; expected 1 <= tensors <= params"));
  }
  return std::unique_ptr<Workload>(new SyntheticWorkload(o, worker_id));
}

}  // namespace pserver
