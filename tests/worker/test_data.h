// The real Fashion-MNIST sets, loaded once per test binary.
#ifndef PSERVER_TESTS_WORKER_TEST_DATA_H_
#define PSERVER_TESTS_WORKER_TEST_DATA_H_

#include "absl/status/statusor.h"
#include "worker/dataset.h"
#include "worker/idx_reader.h"

namespace pserver {
namespace testing_data {

// Null when the Debian package dataset-fashion-mnist is not installed.
inline const Dataset* FashionMnist(DataSplit split) {
  static const auto* train = new absl::StatusOr<Dataset>(
      LoadFashionMnist(kFashionMnistDir, DataSplit::kTrain));
  static const auto* test = new absl::StatusOr<Dataset>(
      LoadFashionMnist(kFashionMnistDir, DataSplit::kTest));
  const absl::StatusOr<Dataset>* d = split == DataSplit::kTrain ? train : test;
  return d->ok() ? &**d : nullptr;
}

}  // namespace testing_data
}  // namespace pserver

#endif  // PSERVER_TESTS_WORKER_TEST_DATA_H_
