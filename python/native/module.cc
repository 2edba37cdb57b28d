// pserver._native: the C++ client library (worker/client.h) for Python.
// Tensors cross as float32 buffers without copies (python/native/
// float_buffer.h); every RPC runs with the GIL released; an absl::Status
// error becomes pserver.Error (python/native/status_error.h).
#include <optional>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "python/native/py_client.h"
#include "python/native/status_error.h"

namespace py = pybind11;

PYBIND11_MODULE(_native, m) {
  using pserver::python::PyClient;
  using pserver::python::PyClientArgs;
  m.doc() = "pserver's C++ client library (worker/client.h)";
  pserver::python::RegisterStatusError(m);

  const PyClientArgs d;  // the defaults, in one place
  py::class_<PyClient>(m, "Client")
      .def(py::init([](std::vector<std::string> servers, uint32_t worker_id,
                       uint32_t num_workers, std::string push_codec,
                       std::string warmup_codec, uint32_t block_size,
                       double k_fraction, uint32_t bits, float ef_decay,
                       uint64_t seed, uint32_t local_steps,
                       double rpc_timeout, double pull_timeout,
                       double retry_budget, std::string metrics_listen,
                       std::string tls_ca, std::string tls_cert,
                       std::string tls_key, std::string auth_token_file,
                       bool momentum_masking, std::string schedule,
                       uint64_t run_length, std::optional<float> beta1,
                       std::optional<float> beta2, std::optional<float> eps) {
             PyClientArgs a;
             a.servers = std::move(servers);
             a.worker_id = worker_id;
             a.num_workers = num_workers;
             a.push_codec = std::move(push_codec);
             a.warmup_codec = std::move(warmup_codec);
             a.block_size = block_size;
             a.k_fraction = k_fraction;
             a.bits = bits;
             a.ef_decay = ef_decay;
             a.seed = seed;
             a.local_steps = local_steps;
             a.rpc_timeout = rpc_timeout;
             a.pull_timeout = pull_timeout;
             a.retry_budget = retry_budget;
             a.metrics_listen = std::move(metrics_listen);
             a.tls_ca = std::move(tls_ca);
             a.tls_cert = std::move(tls_cert);
             a.tls_key = std::move(tls_key);
             a.auth_token_file = std::move(auth_token_file);
             a.momentum_masking = momentum_masking;
             a.schedule = std::move(schedule);
             a.run_length = run_length;
             a.beta1 = beta1;
             a.beta2 = beta2;
             a.eps = eps;
             return std::make_unique<PyClient>(a);
           }),
           py::arg("servers"), py::arg("worker_id"), py::arg("num_workers"),
           py::arg("push_codec") = d.push_codec,
           py::arg("warmup_codec") = d.warmup_codec,
           py::arg("block_size") = d.block_size,
           py::arg("k_fraction") = d.k_fraction, py::arg("bits") = d.bits,
           py::arg("ef_decay") = d.ef_decay, py::arg("seed") = d.seed,
           py::arg("local_steps") = d.local_steps,
           py::arg("rpc_timeout") = d.rpc_timeout,
           py::arg("pull_timeout") = d.pull_timeout,
           py::arg("retry_budget") = d.retry_budget,
           py::arg("metrics_listen") = d.metrics_listen,
           py::arg("tls_ca") = d.tls_ca, py::arg("tls_cert") = d.tls_cert,
           py::arg("tls_key") = d.tls_key,
           py::arg("auth_token_file") = d.auth_token_file,
           py::arg("momentum_masking") = d.momentum_masking,
           py::arg("schedule") = d.schedule,
           py::arg("run_length") = d.run_length,
           py::arg("beta1") = std::optional<float>(),
           py::arg("beta2") = std::optional<float>(),
           py::arg("eps") = std::optional<float>())
      .def("register", &PyClient::Register, py::arg("names"),
           py::arg("shapes"), py::arg("initial_weights"),
           py::arg("out") = py::none(), py::kw_only(),
           py::arg("groups") = std::optional<std::vector<uint32_t>>(),
           py::arg("kinds") = std::optional<std::vector<std::string>>(),
           py::arg("group_specs") = py::none())
      .def("set_hyper", &PyClient::SetHyper, py::arg("values"))
      .def("set_clip_norm", &PyClient::SetClipNorm, py::arg("max_norm"))
      .def_property_readonly("shard_config", &PyClient::ShardConfig)
      .def("step", &PyClient::Step, py::arg("gradient"), py::arg("out"),
           py::arg("loss") = std::optional<double>(),
           py::arg("no_gradient") = std::vector<uint32_t>(),
           py::arg("overflow") = false)
      .def_property_readonly("round_skipped", &PyClient::round_skipped)
      .def("start_step", &PyClient::StartStep, py::arg("gradient"))
      .def("gradient_ready", &PyClient::GradientReady, py::arg("begin"),
           py::arg("end"))
      .def("finish_step", &PyClient::FinishStep, py::arg("out"),
           py::arg("loss") = std::optional<double>(),
           py::arg("no_gradient") = std::vector<uint32_t>())
      .def_property_readonly("in_step", &PyClient::in_step)
      .def("copy_weights_into", &PyClient::CopyWeightsInto, py::arg("out"))
      .def("serialize_state", &PyClient::SerializeState)
      .def("restore_state", &PyClient::RestoreState, py::arg("record"),
           py::arg("source") = "state record")
      .def("fetch_shard_states", &PyClient::FetchShardStates)
      .def("leave", &PyClient::Leave)
      .def("install_shard_states", &PyClient::InstallShardStates,
           py::arg("states"), py::arg("out") = py::none())
      .def_property_readonly("residual_norm", &PyClient::residual_norm)
      .def_property_readonly("global_step", &PyClient::step)
      .def_property_readonly("num_params", &PyClient::num_params)
      .def_property_readonly("registered", &PyClient::registered)
      .def_property_readonly("stage", &PyClient::stage)
      .def_property_readonly("push_codec", &PyClient::push_codec)
      .def_property_readonly("schedule_phase", &PyClient::schedule_phase)
      .def_property_readonly("consistency", &PyClient::consistency)
      .def_property_readonly("metrics_port", &PyClient::metrics_port)
      .def_property_readonly("security", &PyClient::security)
      .def("stats", &PyClient::Stats);
}
