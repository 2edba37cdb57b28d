// An in-memory labelled image data set (Fashion-MNIST for the reference
// workload).
#ifndef PSERVER_WORKER_DATASET_H_
#define PSERVER_WORKER_DATASET_H_

#include <cstdint>
#include <vector>

namespace pserver {

// Images are row-major, `size` x features(), pixel values in [0, 1]; labels
// are in [0, num_classes). Plain value type.
struct Dataset {
  int64_t size = 0;
  int rows = 0;
  int cols = 0;
  int num_classes = 0;
  std::vector<float> images;
  std::vector<uint8_t> labels;

  int features() const { return rows * cols; }
  const float* image(int64_t i) const {
    return images.data() + i * static_cast<int64_t>(features());
  }
};

}  // namespace pserver

#endif  // PSERVER_WORKER_DATASET_H_
