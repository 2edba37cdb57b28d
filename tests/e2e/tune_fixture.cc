// Writes a small gradient capture file for pserver_tune's command-line test
// (tune_cli_test.sh): a model of three tensors (two weight matrices whose
// gradients differ in scale and shape of distribution, and a bias) at steps
// 0-5 and 10-13, from a fixed seed.
//
//   tune_fixture OUT            # the model above
//   tune_fixture OUT other      # the same but fc2.weight is 32x64 (another
//                               # layout, for the --deltas mismatch)
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tune/gradient_file.h"

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3 || (argc == 3 && std::strcmp(argv[2], "other"))) {
    std::fprintf(stderr, "usage: tune_fixture OUT [other]\n");
    return 2;
  }
  const bool other = argc == 3;
  pserver::v1::ModelLayout layout;
  auto add = [&](const char* name, std::vector<uint64_t> shape) {
    pserver::v1::TensorSpec* t = layout.add_tensors();
    t->set_name(name);
    for (uint64_t d : shape) t->add_shape(d);
  };
  add("fc1.weight", {128, 64});
  add("fc1.bias", {64});
  add("fc2.weight",
      other ? std::vector<uint64_t>{32, 64} : std::vector<uint64_t>{64, 32});
  auto w = pserver::GradientFileWriter::Create(argv[1], layout, 0);
  if (!w.ok()) {
    std::fprintf(stderr, "tune_fixture: %s\n", w.status().ToString().c_str());
    return 1;
  }
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::student_t_distribution<float> heavy(2.0f);
  const size_t fc1 = 128 * 64, bias = 64, fc2 = 64 * 32;
  std::vector<float> g(fc1 + bias + fc2);
  for (uint64_t step : {0, 1, 2, 3, 4, 5, 10, 11, 12, 13}) {
    size_t i = 0;
    // fc1: loud, heavy-tailed; bias: loud; fc2: quiet, Gaussian.
    for (size_t k = 0; k < fc1; ++k) g[i++] = 0.1f * heavy(rng);
    for (size_t k = 0; k < bias; ++k) g[i++] = 0.1f * normal(rng);
    for (size_t k = 0; k < fc2; ++k) g[i++] = 0.001f * normal(rng);
    if (absl::Status s = (*w)->Append(step, g); !s.ok()) {
      std::fprintf(stderr, "tune_fixture: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  if (absl::Status s = (*w)->Close(); !s.ok()) {
    std::fprintf(stderr, "tune_fixture: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
