// PyClient: the state a Python optimizer's state_dict() carries: this
// worker's record (error-feedback residuals) and the shards' whole state.
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "python/native/float_buffer.h"
#include "python/native/py_client.h"
#include "python/native/status_error.h"

namespace py = pybind11;

namespace pserver::python {

py::bytes PyClient::SerializeState() const {
  Registered();
  NotInCall();
  absl::StatusOr<std::string> record = client_->SerializeState();
  ThrowIfError(record.status());
  return py::bytes(*record);
}

void PyClient::RestoreState(const py::bytes& record,
                            const std::string& source) {
  Registered();
  std::string bytes = record;
  Call([&] { return client_->RestoreState(bytes, source); });
}

std::string PyClient::push_codec() const {
  Registered();
  NotInCall();
  return CodecName(client_->push_codec());
}

uint64_t PyClient::Leave() {
  Registered();
  NotInCall();
  absl::StatusOr<uint64_t> step;
  try {
    Call([&] {
      step = client_->Leave();
      return step.status();
    });
  } catch (...) {
    registered_ = false;  // out of the rounds, even if a shard did not answer
    throw;
  }
  registered_ = false;  // Call marks a successful call as registered
  return *step;
}

py::list PyClient::FetchShardStates() {
  Registered();
  absl::StatusOr<std::vector<ShardStateCopy>> states;
  Call([&] {
    states = client_->FetchShardStates();
    return states.status();
  });
  py::list out;
  for (ShardStateCopy& s : *states) {
    out.append(py::make_tuple(s.step, s.replica_checksum, py::bytes(s.bytes)));
    std::string().swap(s.bytes);  // one copy of each at a time
  }
  return out;
}

py::dict PyClient::InstallShardStates(const py::list& states,
                                      const py::handle& out) {
  Registered();
  std::vector<ShardStateCopy> copies;
  for (size_t i = 0; i < states.size(); ++i) {
    py::tuple t;
    try {
      t = states[i].cast<py::tuple>();
    } catch (const py::cast_error&) {
      throw py::value_error(absl::StrCat(
          "states[", i, "] is not a tuple; expected (step, "
          "replica_checksum, bytes)"));
    }
    if (t.size() != 3 || !py::isinstance<py::buffer>(t[2])) {
      throw py::value_error(absl::StrCat(
          "states[", i, "] is not (step, replica_checksum, bytes); expected "
          "what fetch_shard_states() returns"));
    }
    ShardStateCopy c;
    c.step = t[0].cast<uint64_t>();
    c.replica_checksum = t[1].cast<uint64_t>();
    py::buffer_info b = t[2].cast<py::buffer>().request();
    if (b.ndim > 1 || b.itemsize != 1 ||
        (b.ndim == 1 && b.strides[0] != 1)) {
      throw py::value_error(absl::StrCat(
          "states[", i, "]'s bytes are not contiguous uint8; expected bytes "
          "or a 1-d uint8 array"));
    }
    c.bytes.assign(static_cast<const char*>(b.ptr),
                   static_cast<size_t>(b.size));
    copies.push_back(std::move(c));
  }
  std::optional<FloatBuffer> dst;
  if (!out.is_none()) {
    dst.emplace(out, "out", true,
                static_cast<long long>(client_->num_params()));
  }
  absl::StatusOr<Client::InstallOutcome> outcome;
  Call([&] {
    outcome = client_->InstallShardStates(copies);
    return outcome.status();
  });
  if (dst.has_value()) CopyWeights(dst->mutable_span());
  py::dict result;
  result["installed"] = outcome->installed;
  result["shards_ahead"] = outcome->shards_ahead;
  return result;
}

void PyClient::SetClipNorm(float max_norm) {
  NotInCall();
  absl::Status s = client_->SetClipNorm(max_norm);
  if (s.code() == absl::StatusCode::kInvalidArgument) {
    throw py::value_error(std::string(s.message()));
  }
  ThrowIfError(s);
}

}  // namespace pserver::python
