// A multilayer perceptron for classification: dense layers with ReLU between
// them and softmax cross-entropy on the logits, forward and backward through
// OpenBLAS sgemm. The parameters live outside the object in one flat fp32
// vector, laid out as named tensors end to end (PyTorch's nn.Linear
// convention, weight [out, in] row-major then bias [out]):
//   fc1.weight [h1, in], fc1.bias [h1], fc2.weight [h2, h1], fc2.bias [h2],
//   ..., fcL.weight [classes, h_{L-1}], fcL.bias [classes].
//
//   absl::StatusOr<Mlp> mlp = Mlp::Create({784, 256, 128, 10});
//   std::vector<float> params = mlp->InitParams(/*seed=*/1);
//   std::vector<float> grad(mlp->num_params());
//   float loss = mlp->LossAndGradient(params, x, y, batch, absl::MakeSpan(grad));
#ifndef PSERVER_WORKER_MLP_H_
#define PSERVER_WORKER_MLP_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/dataset.h"

namespace pserver {

// Sets how many threads OpenBLAS uses for every sgemm in the process (its
// default is one per core). Several workers sharing a machine do better with
// 1. The thread count changes how sgemm splits its work and so the rounding:
// gradients are bit-identical only between runs with the same count (on this
// machine most elements differ between 1 and 2 threads), so a reproducible
// run fixes it. Call before training starts; not synchronised with running
// sgemm calls.
void SetBlasThreads(int threads);
int BlasThreads();

// How InitParams draws the initial weights.
enum class InitScheme {
  // PyTorch's nn.Linear default (kaiming_uniform_ with a = sqrt(5), and its
  // bias rule): weights and biases uniform in [-1/sqrt(fan_in),
  // 1/sqrt(fan_in)), standard deviation 1/sqrt(3 fan_in).
  kPyTorch,
  // He (Kaiming) normal (He et al., ICCV 2015): weights ~ N(0, 2 / fan_in),
  // biases 0.
  kHeNormal,
};

// One named tensor of the flat parameter vector.
struct ParamTensor {
  std::string name;             // "fc1.weight", "fc1.bias", ...
  std::vector<uint64_t> shape;  // {out, in} for a weight, {out} for a bias
  uint64_t offset = 0;          // first element in the flat vector
  uint64_t size = 0;            // product of shape
};

struct EvalResult {
  int64_t count = 0;
  int64_t correct = 0;
  double accuracy = 0.0;   // correct / count
  double mean_loss = 0.0;  // mean cross-entropy, nats
};

// Thread-compatible, not thread-safe: forward/backward use scratch buffers
// held in the object (grown on demand, reused across calls), so each thread
// needs its own Mlp. Copies are independent.
class Mlp {
 public:
  // Largest model accepted, in parameters.
  static constexpr uint64_t kMaxParams = uint64_t{1} << 29;

  // `layer_sizes` = {inputs, hidden..., classes}, e.g. {784, 256, 128, 10}.
  // INVALID_ARGUMENT unless there are at least two sizes, all positive, at
  // most 256 classes (labels are bytes) and at most kMaxParams parameters.
  static absl::StatusOr<Mlp> Create(std::vector<int> layer_sizes);

  // Convenience for the flags: {inputs, hidden_sizes..., classes}.
  static absl::StatusOr<Mlp> Create(int inputs,
                                    const std::vector<int>& hidden_sizes,
                                    int classes);

  const std::vector<int>& layer_sizes() const { return sizes_; }
  const std::vector<ParamTensor>& layout() const { return layout_; }
  uint64_t num_params() const { return num_params_; }
  int num_inputs() const { return sizes_.front(); }
  int num_classes() const { return sizes_.back(); }

  // Initial weights by `scheme` (see InitScheme; fan_in is a layer's input
  // count, for its bias too). Deterministic given the seed and scheme: tensor
  // i draws from its own stream DeriveSeed(seed, i). REQUIRES: params.size()
  // == num_params().
  void InitParams(uint64_t seed, absl::Span<float> params,
                  InitScheme scheme = InitScheme::kPyTorch) const;
  std::vector<float> InitParams(uint64_t seed,
                                InitScheme scheme = InitScheme::kPyTorch) const;

  // Mean softmax cross-entropy over the batch, and its gradient with respect
  // to the parameters written (not added) into `grad`.
  // REQUIRES: params.size() == grad.size() == num_params(); batch > 0;
  // x holds batch x num_inputs() floats row-major; y holds batch labels, each
  // below num_classes(); grad does not overlap params or x.
  // `layer_done(begin, end)`, when set, is called as each layer's weights
  // and bias gradients grad[begin, end) are final (last layer first).
  float LossAndGradient(
      absl::Span<const float> params, const float* x, const uint8_t* y,
      int batch, absl::Span<float> grad,
      const std::function<void(uint64_t, uint64_t)>& layer_done = nullptr);

  // OK when `data` can feed this model: data.features() == num_inputs() and
  // data.num_classes <= num_classes(); INVALID_ARGUMENT naming the mismatch
  // otherwise.
  absl::Status CheckData(const Dataset& data) const;

  // Accuracy and mean loss over n examples, forward passes of at most `chunk`
  // examples at a time. Same REQUIRES on params, x and y as above; chunk > 0.
  EvalResult Evaluate(absl::Span<const float> params, const float* x,
                      const uint8_t* y, int64_t n, int chunk = 1000);
  // The whole data set. REQUIRES: data.features() == num_inputs() and
  // data.num_classes <= num_classes().
  EvalResult Evaluate(absl::Span<const float> params, const Dataset& data,
                      int chunk = 1000);

 private:
  explicit Mlp(std::vector<int> sizes);

  int num_layers() const { return static_cast<int>(sizes_.size()) - 1; }
  const float* Weight(absl::Span<const float> p, int layer) const {
    return p.data() + layout_[2 * layer].offset;
  }
  const float* Bias(absl::Span<const float> p, int layer) const {
    return p.data() + layout_[2 * layer + 1].offset;
  }
  // Runs the layers on `batch` rows of x, leaving post-ReLU activations of
  // each hidden layer in acts_[l] and logits in acts_.back().
  void Forward(absl::Span<const float> params, const float* x, int batch);
  // Turns acts_.back() into d loss / d logits for the mean loss (in place)
  // and returns the summed loss; counts correct predictions if asked.
  double SoftmaxCrossEntropy(const uint8_t* y, int batch, bool want_grad,
                             int64_t* correct);
  void EnsureCapacity(int batch);

  std::vector<int> sizes_;
  std::vector<ParamTensor> layout_;
  uint64_t num_params_ = 0;
  int capacity_ = 0;  // rows the scratch buffers hold
  // acts_[l]: output of layer l (batch x sizes_[l + 1]); ReLU applied for
  // hidden layers; the last is the logits, then d loss / d logits.
  std::vector<std::vector<float>> acts_;
  // delta_: d loss / d (pre-activation) of the layer being back-propagated,
  // ping-ponged with delta_next_.
  std::vector<float> delta_;
  std::vector<float> delta_next_;
};

}  // namespace pserver

#endif  // PSERVER_WORKER_MLP_H_
