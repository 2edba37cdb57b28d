#include "python/native/py_client.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/codec.h"
#include "common/daemon/daemon_flags.h"
#include "common/layout.h"
#include "python/native/float_buffer.h"
#include "python/native/model_wait.h"
#include "python/native/status_error.h"

namespace py = pybind11;

namespace pserver::python {
namespace {

v1::Codec CodecArg(const std::string& name, const char* arg) {
  if (name.empty()) return v1::CODEC_UNSPECIFIED;  // the job's (at register)
  absl::StatusOr<v1::Codec> c = ParseCodecName(name);
  if (!c.ok()) {
    throw py::value_error(absl::StrCat(arg, ": ", c.status().message()));
  }
  return *c;
}

absl::Duration SecondsArg(double s, const char* arg) {
  if (!(s > 0) || s > 86400 * 7) {
    throw py::value_error(
        absl::StrCat(arg, " is ", s, "; expected 0 < seconds <= 604800"));
  }
  return absl::Seconds(s);
}

// Raises a daemon flag's error (common/daemon/daemon_flags.h) as the error
// of the argument of the same name: "--tls_key: ..." becomes "tls_key: ...",
// a ValueError for INVALID_ARGUMENT and pserver.Error (same code) otherwise.
void ThrowAsArgumentError(const absl::Status& s) {
  absl::string_view m = s.message();
  absl::ConsumePrefix(&m, "--");
  if (s.code() == absl::StatusCode::kInvalidArgument) {
    throw py::value_error(std::string(m));
  }
  ThrowIfError(absl::Status(s.code(), m));
}

}  // namespace

PyClient::PyClient(const PyClientArgs& a)
    : registry_(std::make_shared<prometheus::Registry>()) {
  options_.server_addresses = a.servers;
  options_.worker_id = a.worker_id;
  options_.num_workers = a.num_workers;
  options_.push_codec = CodecArg(a.push_codec, "push_codec");
  options_.beta1 = a.beta1;
  options_.beta2 = a.beta2;
  options_.eps = a.eps;
  options_.warmup_codec = CodecArg(a.warmup_codec, "warmup_codec");
  options_.push_params.set_block_size(a.block_size);
  options_.push_params.set_k_fraction(a.k_fraction);
  options_.push_params.set_bits(a.bits);
  options_.warmup_params = options_.push_params;
  options_.ef_decay = a.ef_decay;
  options_.momentum_masking = a.momentum_masking;
  absl::StatusOr<std::shared_ptr<const CompressionSchedule>> schedule =
      LoadScheduleFlag(a.schedule);  // empty: none
  if (!schedule.ok()) ThrowAsArgumentError(schedule.status());
  options_.schedule = *std::move(schedule);
  if (a.local_steps < 1 || a.local_steps > 100000) {
    throw py::value_error(absl::StrCat("local_steps is ", a.local_steps,
                                       "; expected 1..100000"));
  }
  options_.local_steps = a.local_steps;
  options_.seed = a.seed;
  options_.rpc_timeout = SecondsArg(a.rpc_timeout, "rpc_timeout");
  options_.pull_timeout = SecondsArg(a.pull_timeout, "pull_timeout");
  options_.retry_budget = SecondsArg(a.retry_budget, "retry_budget");
  absl::StatusOr<TransportSecurity> security = LoadSecurityFromFlags(
      {a.tls_cert, a.tls_key, a.tls_ca, a.auth_token_file},
      TransportSecurity::kClient);
  // The message names the file or argument, never a secret.
  if (!security.ok()) ThrowAsArgumentError(security.status());
  options_.security = *std::move(security);
  // Shards failing and answering again, rejoins: one line each on stderr,
  // as pserver_worker prints them (written without the GIL).
  options_.log = [id = options_.worker_id](absl::string_view line) {
    std::fprintf(stderr, "pserver worker %u: %s\n", id,
                 std::string(line).c_str());
  };
  // Every argument is checked before the port is taken, as pserver_worker
  // checks every flag before it serves.
  absl::StatusOr<std::unique_ptr<Client>> c =
      Client::Connect(options_, registry_.get());
  ThrowIfError(c.status());
  client_ = *std::move(c);
  client_->SetRunLength(a.run_length);
  worker_metrics_ = std::make_unique<WorkerMetrics>(*registry_);
  absl::StatusOr<std::unique_ptr<prometheus::Exposer>> exposer =
      ServeMetrics(a.metrics_listen, registry_);
  if (!exposer.ok()) {
    // "--metrics_listen X: cannot listen: ...": here an argument, not a flag.
    absl::string_view m = exposer.status().message();
    absl::ConsumePrefix(&m, "--");
    ThrowIfError(absl::Status(exposer.status().code(), m));
  }
  exposer_ = *std::move(exposer);
}

PyClient::~PyClient() {
  // Without the GIL (often this runs in the garbage collector, on whatever
  // thread allocated): ending an overlapped step left open joins the
  // client's push thread, which reads the gradient buffer until it ends,
  // so it must end before the buffer is released; the exposer's threads
  // stop too. Python's other threads go on meanwhile.
  py::gil_scoped_release release;
  exposer_.reset();  // no scrape of the client's counters from here on
  client_.reset();
}

void PyClient::Register(const std::vector<std::string>& names,
                        const std::vector<std::vector<uint64_t>>& shapes,
                        const py::handle& initial_weights,
                        const py::handle& out,
                        const std::optional<std::vector<uint32_t>>& groups,
                        const std::optional<std::vector<std::string>>& kinds,
                        const py::handle& group_specs) {
  if (names.size() != shapes.size()) {
    throw py::value_error(absl::StrCat("names has ", names.size(),
                                       " entries and shapes ", shapes.size(),
                                       "; expected one shape per name"));
  }
  for (const auto& [arg, size] :
       {std::pair<const char*, size_t>{"groups", groups ? groups->size() : 0},
        {"kinds", kinds ? kinds->size() : 0}}) {
    if (size != 0 && size != names.size()) {
      throw py::value_error(absl::StrCat(arg, " has ", size,
                                         " entries; expected one per name (",
                                         names.size(), ")"));
    }
  }
  v1::ModelLayout layout;
  for (size_t i = 0; i < names.size(); ++i) {
    v1::TensorSpec* t = layout.add_tensors();
    t->set_name(names[i]);
    for (uint64_t d : shapes[i]) t->add_shape(d);
    if (groups && !groups->empty()) t->set_group((*groups)[i]);
    if (kinds && !kinds->empty()) {
      const std::string& k = (*kinds)[i];
      if (k == "buffer") {
        t->set_kind(v1::TENSOR_KIND_BUFFER);
      } else if (k == "broadcast") {
        t->set_kind(v1::TENSOR_KIND_BROADCAST_BUFFER);
      } else if (k != "parameter") {
        throw py::value_error(absl::StrCat("kinds[", i, "] is '", k,
                                           "'; expected 'parameter', "
                                           "'buffer' or 'broadcast'"));
      }
    }
  }
  if (!group_specs.is_none()) {
    py::list specs = py::cast<py::list>(group_specs);
    for (size_t g = 0; g < specs.size(); ++g) {
      py::dict spec = py::cast<py::dict>(specs[g]);
      v1::ParamGroup* group = layout.add_groups();
      for (auto item : spec) {
        const std::string key = py::cast<std::string>(item.first);
        if (key != "lr_scale" && key != "weight_decay") {
          throw py::value_error(absl::StrCat(
              "group_specs[", g, "] has key '", key,
              "'; expected 'lr_scale' and 'weight_decay'"));
        }
        if (item.second.is_none()) continue;
        const float v = py::cast<float>(item.second);
        if (key == "lr_scale") {
          group->set_lr_scale(v);
        } else {
          group->set_weight_decay(v);
        }
      }
    }
  }
  // Layout errors (empty, repeated name, zero dimension) before anything
  // is sent, with the layout's own message.
  absl::StatusOr<std::vector<TensorSlot>> slots = ValidateLayout(layout);
  if (!slots.ok()) throw py::value_error(std::string(slots.status().message()));
  const long long total = static_cast<long long>(TotalElements(layout));
  FloatBuffer init(initial_weights, "initial_weights", false, total);
  std::unique_ptr<FloatBuffer> dst;
  if (!out.is_none()) {
    dst = std::make_unique<FloatBuffer>(out, "out", true, total);
  }
  Call([&] {
    if (options_.worker_id != 0) {
      if (absl::Status s =
              WaitForModel(options_.server_addresses, options_.security,
                           options_.retry_budget);
          !s.ok()) {
        return s;
      }
    }
    absl::Status s = client_->Register(layout, init.span());
    if (s.ok() && dst) CopyWeights(dst->mutable_span());
    return s;
  });
  last_step_end_ = absl::Now();
}

void PyClient::SetHyper(const py::handle& values) {
  Registered();
  NotInCall();
  std::vector<v1::HyperParams> hyper;
  if (!values.is_none()) {
    py::sequence seq = py::cast<py::sequence>(values);
    for (size_t g = 0; g < seq.size(); ++g) {
      py::sequence pair = py::cast<py::sequence>(seq[g]);
      if (pair.size() != 2) {
        throw py::value_error(absl::StrCat(
            "hyper[", g, "] has ", pair.size(),
            " entries; expected (lr, weight_decay)"));
      }
      v1::HyperParams h;
      h.set_lr(py::cast<float>(pair[0]));
      h.set_weight_decay(py::cast<float>(pair[1]));
      hyper.push_back(h);
    }
  }
  absl::Status s = client_->SetHyper(std::move(hyper));
  if (s.code() == absl::StatusCode::kInvalidArgument) {
    throw py::value_error(std::string(s.message()));
  }
  ThrowIfError(s);
}

py::dict PyClient::ShardConfig() const {
  Registered();
  NotInCall();
  const v1::OptimizerSettings& o = client_->shard_settings();
  py::dict d;
  d["optimizer"] = o.optimizer();
  d["lr"] = o.lr();
  d["beta1"] = o.beta1();
  d["beta2"] = o.beta2();
  d["eps"] = o.eps();
  d["weight_decay"] = o.weight_decay();
  d["momentum"] = o.momentum();
  d["nesterov"] = o.nesterov();
  d["bias_correction"] = o.bias_correction();
  return d;
}

uint64_t PyClient::Step(const py::handle& gradient, const py::handle& out,
                        std::optional<double> loss,
                        const std::vector<uint32_t>& no_gradient,
                        bool overflow) {
  Registered();
  const long long n = static_cast<long long>(client_->num_params());
  FloatBuffer g(gradient, "gradient", false, n);
  FloatBuffer dst(out, "out", true, n);
  if (in_step()) {
    throw std::runtime_error(
        "step() while an overlapped step is in progress; call finish_step()");
  }
  Call([&] {
    absl::Status s = client_->Step(g.span(), no_gradient, overflow);
    if (s.ok()) CopyWeights(dst.mutable_span());
    return s;
  });
  ObserveStep(loss);
  return client_->step();
}

void PyClient::StartStep(const py::handle& gradient) {
  Registered();
  NotInCall();
  if (in_step()) {
    throw std::runtime_error(
        "start_step() while a step is in progress; call finish_step() first");
  }
  auto g = std::make_unique<FloatBuffer>(
      gradient, "gradient", false,
      static_cast<long long>(client_->num_params()));
  ThrowIfError(client_->StartStep(g->span()));
  step_gradient_ = std::move(g);
}

void PyClient::GradientReady(uint64_t begin, uint64_t end) {
  NotInCall();
  if (!in_step()) {
    throw std::runtime_error("gradient_ready() outside a step; call "
                             "start_step() first");
  }
  ThrowIfError(client_->GradientReady(begin, end));
}

uint64_t PyClient::FinishStep(const py::handle& out,
                              std::optional<double> loss,
                              const std::vector<uint32_t>& no_gradient) {
  if (!in_step()) {
    throw std::runtime_error("finish_step() outside a step; call "
                             "start_step() first");
  }
  FloatBuffer dst(out, "out", true,
                  static_cast<long long>(client_->num_params()));
  try {
    Call([&] {
      absl::Status s = client_->FinishStep(no_gradient);
      if (s.ok()) CopyWeights(dst.mutable_span());
      return s;
    });
  } catch (...) {
    // Refused before the pushes ended (a non-finite range): still in the
    // step, so the buffer stays held; otherwise the step is over.
    if (!client_->in_step()) step_gradient_.reset();
    throw;
  }
  step_gradient_.reset();
  ObserveStep(loss);
  return client_->step();
}

void PyClient::ObserveStep(std::optional<double> loss) {
  // As pserver_worker's loop: the step's time (here since the previous
  // step returned: the caller's forward and backward, then push and pull),
  // the step, the loss when known, the residual norm.
  const absl::Time now = absl::Now();
  worker_metrics_->ObserveStep(
      absl::ToDoubleSeconds(now - last_step_end_.value_or(now)),
      client_->step(), loss.value_or(last_loss_));
  if (loss) last_loss_ = *loss;
  if (exposer_ != nullptr) {
    worker_metrics_->SetResidualNorm(client_->ResidualNorm());
  }
  last_step_end_ = now;
}

void PyClient::CopyWeightsInto(const py::handle& out) {
  Registered();
  NotInCall();
  FloatBuffer dst(out, "out", true,
                  static_cast<long long>(client_->num_params()));
  CopyWeights(dst.mutable_span());
}

uint32_t PyClient::schedule_phase() const {
  NotInCall();
  return client_->schedule_phase();
}

std::string PyClient::consistency() const {
  NotInCall();
  if (!registered_) return "";
  switch (client_->consistency()) {
    case v1::CONSISTENCY_SSP:
      return "ssp";
    case v1::CONSISTENCY_ASYNC:
      return "async";
    default:
      return "bsp";
  }
}

std::string PyClient::stage() const {
  NotInCall();
  return registered_ ? v1::OptimizerStage_Name(client_->stage()) : "";
}

double PyClient::residual_norm() const {
  NotInCall();
  return client_->ResidualNorm();
}

py::dict PyClient::Stats() const {
  NotInCall();
  const ClientStats& s = client_->stats();
  py::dict d;
  d["steps"] = s.steps;
  d["push_payload_bytes"] = s.push_payload_bytes;
  d["pull_payload_bytes"] = s.pull_payload_bytes;
  d["push_fp32_bytes"] = s.push_fp32_bytes;
  d["pull_fp32_bytes"] = s.pull_fp32_bytes;
  uint64_t sent = s.push_payload_bytes + s.pull_payload_bytes;
  d["compression_ratio"] =
      sent == 0 ? 0.0
                : static_cast<double>(s.push_fp32_bytes + s.pull_fp32_bytes) /
                      static_cast<double>(sent);
  d["snapshots"] = s.snapshots;
  d["variance_payload_bytes"] = s.variance_payload_bytes;
  d["checksum_mismatches"] = s.checksum_mismatches;
  d["retries"] = s.retries;
  d["rejoins"] = s.rejoins;
  d["encode_seconds"] = s.encode_seconds;
  d["push_seconds"] = s.push_seconds;
  d["pull_seconds"] = s.pull_seconds;
  return d;
}

std::string PyClient::security() const {
  return SecuritySummary(options_.security, TransportSecurity::kClient);
}

py::object PyClient::metrics_port() const {
  if (exposer_ == nullptr) return py::none();
  std::vector<int> ports = exposer_->GetListeningPorts();
  if (ports.empty()) return py::none();
  return py::int_(ports.front());
}

void PyClient::Registered() const {
  if (!registered_) {
    throw py::value_error("the client is not registered; call register() "
                          "first");
  }
}

void PyClient::CopyWeights(absl::Span<float> dst) const {
  absl::Span<const float> w = client_->weights();
  std::copy(w.begin(), w.end(), dst.begin());
}

constexpr char kBusy[] =
    "pserver Client is already in a call from another thread; a Client "
    "serves one training loop";

void PyClient::NotInCall() const {
  if (busy_.load()) throw std::runtime_error(kBusy);
}

void PyClient::Call(absl::FunctionRef<absl::Status()> rpc) {
  if (busy_.exchange(true)) throw std::runtime_error(kBusy);
  absl::Status s;
  {
    py::gil_scoped_release release;
    s = rpc();
  }
  busy_.store(false);
  if (s.ok()) registered_ = true;
  ThrowIfError(s);
}

}  // namespace pserver::python
