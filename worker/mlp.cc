#include "worker/mlp.h"

#include <cblas.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/rng.h"

namespace pserver {

void SetBlasThreads(int threads) { openblas_set_num_threads(threads); }
int BlasThreads() { return openblas_get_num_threads(); }

absl::StatusOr<Mlp> Mlp::Create(std::vector<int> layer_sizes) {
  if (layer_sizes.size() < 2) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "MLP needs at least an input and an output size, got %d sizes",
        layer_sizes.size()));
  }
  uint64_t total = 0;
  for (size_t i = 0; i < layer_sizes.size(); ++i) {
    if (layer_sizes[i] <= 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "MLP layer_sizes[%d] is %d, expected a positive size", i,
          layer_sizes[i]));
    }
    if (i > 0) {
      total += (static_cast<uint64_t>(layer_sizes[i - 1]) + 1) *
               static_cast<uint64_t>(layer_sizes[i]);
      if (total > kMaxParams) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "MLP has more than %d parameters (the limit)", kMaxParams));
      }
    }
  }
  if (layer_sizes.back() > 256) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "MLP has %d classes, expected at most 256 (labels are bytes)",
        layer_sizes.back()));
  }
  return Mlp(std::move(layer_sizes));
}

absl::StatusOr<Mlp> Mlp::Create(int inputs,
                                const std::vector<int>& hidden_sizes,
                                int classes) {
  std::vector<int> sizes;
  sizes.push_back(inputs);
  sizes.insert(sizes.end(), hidden_sizes.begin(), hidden_sizes.end());
  sizes.push_back(classes);
  return Create(std::move(sizes));
}

Mlp::Mlp(std::vector<int> sizes) : sizes_(std::move(sizes)) {
  uint64_t offset = 0;
  for (int l = 0; l < num_layers(); ++l) {
    const uint64_t in = sizes_[l];
    const uint64_t out = sizes_[l + 1];
    const std::string prefix = absl::StrCat("fc", l + 1);
    layout_.push_back({prefix + ".weight", {out, in}, offset, out * in});
    offset += out * in;
    layout_.push_back({prefix + ".bias", {out}, offset, out});
    offset += out;
  }
  num_params_ = offset;
  acts_.resize(num_layers());
}

void Mlp::InitParams(uint64_t seed, absl::Span<float> params,
                     InitScheme scheme) const {
  assert(params.size() == num_params_);
  for (size_t t = 0; t < layout_.size(); ++t) {
    const ParamTensor& tensor = layout_[t];
    float* p = params.data() + tensor.offset;
    const bool bias = tensor.shape.size() == 1;
    // A bias [out] follows its weight [out, in]: fan_in is that weight's in.
    const double fan_in = static_cast<double>(
        bias ? layout_[t - 1].shape[1] : tensor.shape[1]);
    SplitMix64 rng(DeriveSeed(seed, t));
    if (scheme == InitScheme::kPyTorch) {
      const double bound = 1.0 / std::sqrt(fan_in);
      for (uint64_t i = 0; i < tensor.size; ++i) {
        p[i] = static_cast<float>(bound * (2.0 * rng.NextDouble() - 1.0));
      }
    } else if (bias) {
      std::fill(p, p + tensor.size, 0.0f);
    } else {
      const double stddev = std::sqrt(2.0 / fan_in);
      for (uint64_t i = 0; i < tensor.size; ++i) {
        p[i] = static_cast<float>(stddev * rng.Normal());
      }
    }
  }
}

std::vector<float> Mlp::InitParams(uint64_t seed, InitScheme scheme) const {
  std::vector<float> params(num_params_);
  InitParams(seed, absl::MakeSpan(params), scheme);
  return params;
}

void Mlp::EnsureCapacity(int batch) {
  if (batch <= capacity_) return;
  int widest = 0;
  for (int l = 0; l < num_layers(); ++l) {
    acts_[l].resize(static_cast<size_t>(batch) * sizes_[l + 1]);
    widest = std::max(widest, sizes_[l + 1]);
  }
  delta_.resize(static_cast<size_t>(batch) * widest);
  delta_next_.resize(static_cast<size_t>(batch) * widest);
  capacity_ = batch;
}

void Mlp::Forward(absl::Span<const float> params, const float* x, int batch) {
  EnsureCapacity(batch);
  const float* in_act = x;
  for (int l = 0; l < num_layers(); ++l) {
    const int in = sizes_[l];
    const int out = sizes_[l + 1];
    float* z = acts_[l].data();
    // z = in_act [batch, in] * W^T, W is [out, in].
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, out, in, 1.0f,
                in_act, in, Weight(params, l), in, 0.0f, z, out);
    const float* b = Bias(params, l);
    const bool relu = l + 1 < num_layers();
    for (int r = 0; r < batch; ++r) {
      float* row = z + static_cast<size_t>(r) * out;
      if (relu) {
        for (int j = 0; j < out; ++j) row[j] = std::max(row[j] + b[j], 0.0f);
      } else {
        for (int j = 0; j < out; ++j) row[j] += b[j];
      }
    }
    in_act = z;
  }
}

double Mlp::SoftmaxCrossEntropy(const uint8_t* y, int batch, bool want_grad,
                                int64_t* correct) {
  const int classes = num_classes();
  const float scale = 1.0f / static_cast<float>(batch);
  double loss = 0.0;
  for (int r = 0; r < batch; ++r) {
    float* z = acts_.back().data() + static_cast<size_t>(r) * classes;
    const int label = y[r];
    assert(label < classes);
    int argmax = 0;
    for (int j = 1; j < classes; ++j) {
      if (z[j] > z[argmax]) argmax = j;
    }
    if (correct != nullptr && argmax == label) ++*correct;
    // log softmax with the maximum subtracted, so exp never overflows.
    const float zmax = z[argmax];
    double sum = 0.0;
    for (int j = 0; j < classes; ++j) sum += std::exp(double{z[j]} - zmax);
    loss += std::log(sum) - (double{z[label]} - zmax);
    if (want_grad) {
      const double inv = 1.0 / sum;
      for (int j = 0; j < classes; ++j) {
        const double p = std::exp(double{z[j]} - zmax) * inv;
        z[j] = static_cast<float>(p - (j == label ? 1.0 : 0.0)) * scale;
      }
    }
  }
  return loss;
}

float Mlp::LossAndGradient(
    absl::Span<const float> params, const float* x, const uint8_t* y,
    int batch, absl::Span<float> grad,
    const std::function<void(uint64_t, uint64_t)>& layer_done) {
  assert(params.size() == num_params_ && grad.size() == num_params_);
  assert(batch > 0);
  Forward(params, x, batch);
  const double loss = SoftmaxCrossEntropy(y, batch, /*want_grad=*/true,
                                          /*correct=*/nullptr);

  // delta: d loss / d z_l for the layer being processed, [batch, out].
  float* delta = acts_.back().data();
  for (int l = num_layers() - 1; l >= 0; --l) {
    const int in = sizes_[l];
    const int out = sizes_[l + 1];
    const float* in_act = l == 0 ? x : acts_[l - 1].data();
    float* grad_w = grad.data() + layout_[2 * l].offset;
    float* grad_b = grad.data() + layout_[2 * l + 1].offset;
    // dW = delta^T [out, batch] * in_act [batch, in].
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, batch, 1.0f,
                delta, out, in_act, in, 0.0f, grad_w, in);
    std::fill(grad_b, grad_b + out, 0.0f);
    for (int r = 0; r < batch; ++r) {
      const float* row = delta + static_cast<size_t>(r) * out;
      for (int j = 0; j < out; ++j) grad_b[j] += row[j];
    }
    if (layer_done) {
      const uint64_t w_at = layout_[2 * l].offset, b_at = layout_[2 * l + 1].offset;
      layer_done(std::min(w_at, b_at),
                 std::max(w_at + static_cast<uint64_t>(out) * in,
                          b_at + static_cast<uint64_t>(out)));
    }
    if (l == 0) break;
    // d loss / d a_{l-1} = delta [batch, out] * W [out, in], then through
    // the ReLU: zero where the activation was clamped.
    float* next = delta == delta_.data() ? delta_next_.data() : delta_.data();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, in, out,
                1.0f, delta, out, Weight(params, l), in, 0.0f, next, in);
    const float* act = acts_[l - 1].data();
    const size_t n = static_cast<size_t>(batch) * in;
    for (size_t i = 0; i < n; ++i) {
      if (act[i] <= 0.0f) next[i] = 0.0f;
    }
    delta = next;
  }
  return static_cast<float>(loss / batch);
}

absl::Status Mlp::CheckData(const Dataset& data) const {
  if (data.features() != num_inputs()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "data has %d features per example (%d x %d), the model expects %d "
        "inputs",
        data.features(), data.rows, data.cols, num_inputs()));
  }
  if (data.num_classes > num_classes()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "data has %d classes, the model has %d outputs", data.num_classes,
        num_classes()));
  }
  return absl::OkStatus();
}

EvalResult Mlp::Evaluate(absl::Span<const float> params, const float* x,
                         const uint8_t* y, int64_t n, int chunk) {
  assert(params.size() == num_params_ && chunk > 0);
  EvalResult result;
  double loss = 0.0;
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int rows = static_cast<int>(std::min<int64_t>(chunk, n - begin));
    Forward(params, x + begin * num_inputs(), rows);
    loss += SoftmaxCrossEntropy(y + begin, rows, /*want_grad=*/false,
                                &result.correct);
  }
  result.count = n;
  if (n > 0) {
    result.accuracy = static_cast<double>(result.correct) / n;
    result.mean_loss = loss / n;
  }
  return result;
}

EvalResult Mlp::Evaluate(absl::Span<const float> params, const Dataset& data,
                         int chunk) {
  assert(data.features() == num_inputs());
  return Evaluate(params, data.images.data(), data.labels.data(), data.size,
                  chunk);
}

}  // namespace pserver
