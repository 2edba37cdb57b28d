// Reader for the IDX files of MNIST and Fashion-MNIST
// (http://yann.lecun.com/exdb/mnist/, "FILE FORMATS"): a big-endian header
// (magic 0x00000803 for 3-d unsigned-byte images, 0x00000801 for 1-d
// unsigned-byte labels, then one uint32 per dimension) followed by the bytes.
// Files may be gzip-compressed (decoded with zlib) or plain.
//
// Every function here treats the file as untrusted: a missing file is
// NOT_FOUND, a corrupt or truncated compressed stream or data shorter than the
// header announces is DATA_LOSS, a wrong magic, implausible dimensions, extra
// trailing bytes or an out-of-range label is INVALID_ARGUMENT. Messages name
// the file and the expected value. Memory grows only with the bytes actually
// decoded, never from header counts alone. All functions are thread-safe.
//
//   absl::StatusOr<Dataset> train =
//       LoadFashionMnist(kFashionMnistDir, DataSplit::kTrain);
//   if (!train.ok()) return train.status();
#ifndef PSERVER_WORKER_IDX_READER_H_
#define PSERVER_WORKER_IDX_READER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/dataset.h"

namespace pserver {

// Where Debian's dataset-fashion-mnist package installs the files.
inline constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

// Largest decoded IDX file accepted (the Fashion-MNIST training images are
// 47 MB); bounds the memory a gzip bomb can claim.
inline constexpr uint64_t kMaxIdxBytes = uint64_t{1} << 30;

struct IdxImages {
  int64_t count = 0;
  int rows = 0;
  int cols = 0;
  std::vector<float> pixels;  // count x rows x cols, byte / 255
};

// Reads a 3-d unsigned-byte IDX file (magic 0x00000803).
absl::StatusOr<IdxImages> ReadIdxImages(const std::string& path);

// Reads a 1-d unsigned-byte IDX file (magic 0x00000801) whose values must all
// be below num_classes. REQUIRES: 0 < num_classes <= 256.
absl::StatusOr<std::vector<uint8_t>> ReadIdxLabels(const std::string& path,
                                                   int num_classes = 10);

enum class DataSplit { kTrain, kTest };

// Loads "<dir>/{train,t10k}-images-idx3-ubyte[.gz]" and the matching labels
// (the .gz name is tried first). Requires 28 x 28 images, labels in [0, 10)
// and as many labels as images.
absl::StatusOr<Dataset> LoadFashionMnist(absl::string_view dir,
                                         DataSplit split);

}  // namespace pserver

#endif  // PSERVER_WORKER_IDX_READER_H_
