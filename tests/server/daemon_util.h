// The pserver_server daemon in a child process for tests that look at it
// from the outside: its memory (/proc/<pid>/status), its stderr, and raw
// calls through the generic stub (bytes that need not be a valid message).
#ifndef PSERVER_TESTS_SERVER_DAEMON_UTIL_H_
#define PSERVER_TESTS_SERVER_DAEMON_UTIL_H_

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "pserver/v1/parameter_server.grpc.pb.h"
#include "tests/test_util/proc_status.h"
#include "tests/worker/process_util.h"

#ifndef PSERVER_SERVER_BIN
#error "PSERVER_SERVER_BIN must name the pserver_server binary"
#endif

namespace pserver {
namespace testing_util {

inline constexpr long kMiB = 1 << 20;

// Sets VmHWM back to the current VmRSS (Linux >= 4.0).
inline bool ResetPeak(pid_t pid) {
  std::ofstream out(absl::StrCat("/proc/", pid, "/clear_refs"));
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

// One pserver_server daemon on a free loopback port, killed at the end.
class Daemon {
 public:
  explicit Daemon(const std::vector<std::string>& flags)
      : dir_(pserver::testing::TempDir("pserver_daemon")) {
    std::vector<std::string> argv = {
        PSERVER_SERVER_BIN, "--listen=127.0.0.1:0", "--metrics_listen=",
        absl::StrCat("--port_file=", dir_, "/port"), "--drain_seconds=0"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    process_ = std::make_unique<pserver::testing::Process>(argv, log_path());
    port_ = pserver::testing::ReadPortFile(dir_ + "/port",
                                           std::chrono::seconds(30));
  }
  ~Daemon() {
    process_->Kill();
    std::remove((dir_ + "/port").c_str());
    std::remove(log_path().c_str());
    rmdir(dir_.c_str());
  }

  int port() const { return port_; }
  pid_t pid() const { return process_->pid(); }
  // The daemon's stdout and stderr.
  std::string log_path() const { return dir_ + "/server.log"; }

  // A channel of its own (its own TCP connection): `id` makes the channel
  // arguments differ, so gRPC does not share the subchannel.
  std::shared_ptr<grpc::Channel> Channel(int id) const {
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(-1);
    args.SetMaxReceiveMessageSize(-1);
    args.SetInt("pserver.test.connection", id);
    return grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port_),
                                     grpc::InsecureChannelCredentials(), args);
  }

 private:
  std::string dir_;
  std::unique_ptr<pserver::testing::Process> process_;
  int port_ = 0;
};

// `bytes` of zeros as one request, made of slices over one static buffer
// (the client holds 1 MiB however large the message).
inline grpc::ByteBuffer ZerosMessage(size_t bytes) {
  static const std::string* chunk = new std::string(kMiB, '\0');
  std::vector<grpc::Slice> slices;
  for (size_t left = bytes; left > 0;) {
    size_t n = std::min<size_t>(left, chunk->size());
    slices.emplace_back(chunk->data(), n, grpc::Slice::STATIC_SLICE);
    left -= n;
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// A unary call of `method` ("/pserver.v1.ParameterServer/Push") with raw
// request bytes; blocks until it finishes.
inline grpc::Status GenericCall(const std::shared_ptr<grpc::Channel>& channel,
                                const std::string& method,
                                const grpc::ByteBuffer& request,
                                grpc::ByteBuffer* response,
                                absl::Duration timeout) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  absl::Mutex mu;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, response,
                 [&](grpc::Status s) {
                   absl::MutexLock lock(&mu);
                   status = std::move(s);
                   done = true;
                 });
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(&done));
  return status;
}

inline bool Healthy(const Daemon& d) {
  auto stub = v1::ParameterServer::NewStub(d.Channel(1000));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::GetStatusResponse resp;
  return stub->GetStatus(&ctx, v1::GetStatusRequest(), &resp).ok();
}

}  // namespace testing_util
}  // namespace pserver

#endif  // PSERVER_TESTS_SERVER_DAEMON_UTIL_H_
