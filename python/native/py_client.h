// pserver._native.Client: one pserver::Client (worker/client.h) for Python,
// with the worker's Prometheus metrics (worker/client_metrics.h and
// worker/metrics.h on one registry, served on /metrics when asked, as the
// pserver_worker daemon does).
#ifndef PSERVER_PYTHON_NATIVE_PY_CLIENT_H_
#define PSERVER_PYTHON_NATIVE_PY_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "prometheus/exposer.h"
#include "python/native/float_buffer.h"
#include "prometheus/registry.h"
#include "worker/client.h"
#include "worker/metrics.h"

namespace pserver::python {

// The constructor's arguments, as Python passes them (checked there).
struct PyClientArgs {
  std::vector<std::string> servers;
  uint32_t worker_id = 0;
  uint32_t num_workers = 1;
  // Empty: the job's, as the shards announce it at register().
  std::string push_codec;
  std::string warmup_codec = "fp32";
  uint32_t block_size = 256;
  double k_fraction = 0.01;
  uint32_t bits = 8;
  float ef_decay = 1.0f;
  // Deep Gradient Compression's momentum-factor masking
  // (ClientOptions::momentum_masking): needs a sparse push codec and the
  // shards' --onebit_momentum=worker, else register() is refused.
  bool momentum_masking = false;
  // A compression schedule file (JSON or text proto; docs/schedules.md),
  // the one the shards run with (pserver_worker --schedule); empty: none.
  std::string schedule;
  // The run's length in rounds (pushes), sent at register
  // (Client::SetRunLength): a schedule with fractional bounds needs the
  // job's; 0: unknown.
  uint64_t run_length = 0;
  uint64_t seed = 1;
  // The script's Adam betas and eps (ClientOptions::beta1, ...); none: not
  // given.
  std::optional<float> beta1, beta2, eps;
  // Local steps between pushes (ClientOptions::local_steps), 1..100000.
  uint32_t local_steps = 1;
  double rpc_timeout = 30;
  double pull_timeout = 120;
  double retry_budget = 300;
  // host:port for http://host:port/metrics (port 0: any); empty: off.
  std::string metrics_listen;
  // Transport security, as pserver_worker's --tls_ca, --tls_cert,
  // --tls_key, --auth_token_file (paths; common/tls.h). tls_ca turns TLS
  // on; the token file, or else PSERVER_AUTH_TOKEN, needs TLS.
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string auth_token_file;
};

// Thread-compatible like the client it wraps; a second thread calling in
// while an RPC is in flight (GIL released) gets a RuntimeError instead of a
// data race, also from the reads of the client's mutable state (weights,
// residuals, stats, step, stage, schedule phase). Prometheus scrapes read
// the counters from the exposer's threads at any time.
class PyClient {
 public:
  // ValueError for a bad codec or timeout or a TLS combination that does
  // not go together (naming the argument); pserver.Error for a TLS file that
  // cannot be read (NOT_FOUND, PERMISSION_DENIED) and when metrics_listen
  // does not bind (UNAVAILABLE). Contacts no shard.
  explicit PyClient(const PyClientArgs& args);
  ~PyClient();

  // Registers the layout (names and shapes, in order) with every shard.
  // Ranks other than 0 first wait (up to retry_budget) until rank 0 has
  // installed its weights, so rank 0's initial weights are everyone's.
  // `out` (optional) receives the shards' weights.
  // `groups` (one per tensor: its hyper-parameter group, default 0),
  // `kinds` ("parameter", "buffer" or "broadcast" per tensor) and `group_specs` (one
  // dict per group: "lr_scale", "weight_decay", each float or None) shape
  // the layout's groups and tensor kinds (parameter_server.proto
  // ModelLayout); ValueError naming the entry for anything else.
  void Register(const std::vector<std::string>& names,
                const std::vector<std::vector<uint64_t>>& shapes,
                const pybind11::handle& initial_weights,
                const pybind11::handle& out,
                const std::optional<std::vector<uint32_t>>& groups,
                const std::optional<std::vector<std::string>>& kinds,
                const pybind11::handle& group_specs);

  // The hyper-parameters every push carries from now on (Client::SetHyper):
  // None, or one (lr, weight_decay) pair per group. ValueError naming the
  // entry for another count or a value that is not finite and >= 0.
  void SetHyper(const pybind11::handle& values);
  // Client::SetClipNorm: the shards clip each round's mean gradient to this
  // norm (0: none); ValueError for a value it refuses.
  void SetClipNorm(float max_norm);
  // Shard 0's optimizer flags (RegisterResponse.optimizer_settings) as a
  // dict; ValueError before register().
  pybind11::dict ShardConfig() const;

  // Pushes `gradient` for the current step and writes the next weights into
  // `out`. Both are checked (size num_params) before anything is sent; on
  // any error `out` and the client's step are unchanged. `loss` (optional)
  // sets pserver_worker_train_loss. Returns the new step. `no_gradient`:
  // the layout's parameter tensors (indices, increasing) without a gradient
  // this step (worker/client.h Step). `overflow`: a loss scaler found
  // inf/NaN in it; the round updates nothing (round_skipped, on every
  // worker).
  uint64_t Step(const pybind11::handle& gradient, const pybind11::handle& out,
                std::optional<double> loss,
                const std::vector<uint32_t>& no_gradient, bool overflow);
  bool round_skipped() const { return client_->round_skipped(); }

  // The overlapped step (worker/client.h, StartStep): `gradient` (held
  // until FinishStep) is filled by backward; GradientReady(begin, end) hands
  // a range over as it is final, and its chunks are pushed at once on a
  // background thread; FinishStep hands the rest over, waits for the pushes
  // and pulls, and writes the next weights into `out` (as Step). Errors as
  // Step's, pserver.Error for a range refused (overlapping, outside,
  // non-finite) and RuntimeError for a call out of order.
  void StartStep(const pybind11::handle& gradient);
  void GradientReady(uint64_t begin, uint64_t end);
  uint64_t FinishStep(const pybind11::handle& out, std::optional<double> loss,
                      const std::vector<uint32_t>& no_gradient);
  bool in_step() const { return client_->in_step(); }

  void CopyWeightsInto(const pybind11::handle& out);

  // The client's state (error-feedback residuals of every shard and stage,
  // worker id, worker count, shard ranges, step) as the record
  // worker/client_state.cc writes for --state_file.
  pybind11::bytes SerializeState() const;
  // Restores a record from SerializeState() (or a --state_file), refused
  // with pserver.Error (state unchanged) when it is corrupt or for another
  // worker id, worker count, shard layout or model size.
  void RestoreState(const pybind11::bytes& record, const std::string& source);
  // Every shard's whole state (Client::FetchShardStates): a list of
  // (step, replica_checksum, bytes), one per shard.
  pybind11::list FetchShardStates();
  // Client::InstallShardStates of such a list (each bytes entry any
  // buffer of uint8), then writes the shards' weights into `out` (optional).
  // Returns {"installed": shards this call installed, "shards_ahead":
  // whether the running job was past it and kept its own}. pserver.Error
  // for a refusal, the state unchanged; ValueError for a malformed list.
  pybind11::dict InstallShardStates(const pybind11::list& states,
                                    const pybind11::handle& out);
  // Client::Leave: out of the rounds on every shard; returns the shards'
  // step. register() brings the worker back.
  uint64_t Leave();

  uint64_t step() const {
    NotInCall();
    return client_->step();
  }
  uint64_t num_params() const {
    NotInCall();
    return client_->num_params();
  }
  bool registered() const { return registered_; }
  double residual_norm() const;
  std::string stage() const;
  // The codec pushes use (its name): the one given, else the job's.
  std::string push_codec() const;
  // The compression schedule's phase of the next push (0 without one).
  uint32_t schedule_phase() const;
  // What the shards' rounds wait for: "bsp", "ssp" or "async" ("" before
  // register).
  std::string consistency() const;
  pybind11::dict Stats() const;
  // "plaintext", "TLS", "mutual TLS", "TLS+token" or "mutual TLS+token".
  std::string security() const;
  // The port /metrics is served on, or None when metrics_listen was empty.
  pybind11::object metrics_port() const;

 private:
  void Registered() const;
  // RuntimeError when another thread is in Call().
  void NotInCall() const;
  void CopyWeights(absl::Span<float> dst) const;
  // The step's metrics, after Step or FinishStep.
  void ObserveStep(std::optional<double> loss);
  // Runs `rpc` without the GIL, one at a time; raises its error.
  void Call(absl::FunctionRef<absl::Status()> rpc);

  ClientOptions options_;
  // Declared before the client and the metrics that count into it, and the
  // exposer last: destroyed first, so no scrape sees a dead counter.
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<WorkerMetrics> worker_metrics_;
  bool registered_ = false;
  std::atomic<bool> busy_{false};
  std::optional<absl::Time> last_step_end_;  // for the step duration
  double last_loss_ = 0;  // the last loss given to Step()
  // The overlapped step's gradient buffer (StartStep .. FinishStep).
  std::unique_ptr<FloatBuffer> step_gradient_;
  std::unique_ptr<prometheus::Exposer> exposer_;
};

}  // namespace pserver::python

#endif  // PSERVER_PYTHON_NATIVE_PY_CLIENT_H_
