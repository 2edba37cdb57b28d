#include "tune/codec_profile.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/error_feedback.h"
#include "common/mix.h"

namespace pserver {
namespace {

double Mean(absl::Span<const double> v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

double MeanBytes(const std::vector<uint64_t>& b) {
  double s = 0;
  for (uint64_t x : b) s += static_cast<double>(x);
  return b.empty() ? 0.0 : s / static_cast<double>(b.size());
}

double MeanRelative(const std::vector<double>& num,
                    const std::vector<double>& den) {
  std::vector<double> r(num.size());
  for (size_t t = 0; t < num.size(); ++t) r[t] = RelativeNorm(num[t], den[t]);
  return Mean(r);
}

double SquaredDistance(absl::Span<const float> a, absl::Span<const float> b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    s += d * d;
  }
  return s;
}

double SquaredNorm(absl::Span<const double> a) {
  double s = 0;
  for (double x : a) s += x * x;
  return s;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : (v[m - 1] + v[m]) / 2;
}

// Median seconds of one call of `pass`: one untimed call (warm-up and
// calibration), then o.repetitions timed runs of enough calls to last
// o.min_timed_seconds.
template <typename Pass>
absl::StatusOr<double> TimePasses(Pass& pass, const ProfileOptions& o) {
  absl::Time t0 = absl::Now();
  if (absl::Status s = pass(); !s.ok()) return s;
  const double once = absl::ToDoubleSeconds(absl::Now() - t0);
  const double want = o.min_timed_seconds / std::max(once, 1e-9);
  const int64_t calls = static_cast<int64_t>(
      std::min(1e6, std::max(1.0, std::ceil(want))));
  std::vector<double> per_call(o.repetitions);
  for (int r = 0; r < o.repetitions; ++r) {
    t0 = absl::Now();
    for (int64_t k = 0; k < calls; ++k) {
      if (absl::Status s = pass(); !s.ok()) return s;
    }
    per_call[r] = absl::ToDoubleSeconds(absl::Now() - t0) / calls;
  }
  return Median(per_call);
}

}  // namespace

double RelativeNorm(double a_sq, double b_sq) {
  if (b_sq > 0) return std::sqrt(a_sq / b_sq);
  return a_sq == 0 ? 0.0 : std::numeric_limits<double>::infinity();
}

double CodecProfile::mean_bytes() const { return MeanBytes(bytes); }
double CodecProfile::mean_ef_bytes() const { return MeanBytes(ef_bytes); }
double CodecProfile::ratio() const {
  const double b = mean_bytes();
  return b > 0 ? static_cast<double>(Fp32Bytes(elements)) / b : 0.0;
}
double CodecProfile::rel_error() const { return MeanRelative(err_sq, g_sq); }
double CodecProfile::window_error() const {
  return RelativeNorm(window_err_sq, window_g_sq);
}
double CodecProfile::ef_step_error() const {
  return MeanRelative(ef_err_sq, g_sq);
}
double CodecProfile::ef_window_error() const {
  return RelativeNorm(ef_window_err_sq, window_g_sq);
}
double CodecProfile::encode_elements_per_second() const {
  return encode_seconds > 0
             ? static_cast<double>(elements) * steps() / encode_seconds
             : 0.0;
}
double CodecProfile::ef_encode_elements_per_second() const {
  return ef_encode_seconds > 0
             ? static_cast<double>(elements) * steps() / ef_encode_seconds
             : 0.0;
}
double CodecProfile::decode_elements_per_second() const {
  return decode_seconds > 0
             ? static_cast<double>(elements) * steps() / decode_seconds
             : 0.0;
}

absl::StatusOr<CodecProfile> ProfileCodec(
    const Codec& codec, absl::Span<const absl::Span<const float>> steps,
    const ProfileOptions& o) {
  if (steps.empty()) {
    return absl::InvalidArgumentError("steps is empty; expected >= 1 step");
  }
  const size_t n = steps[0].size();
  if (n == 0) {
    return absl::InvalidArgumentError("steps[0] is empty; expected >= 1 element");
  }
  for (size_t t = 1; t < steps.size(); ++t) {
    if (steps[t].size() != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("steps[", t, "] has ", steps[t].size(),
                       " elements; expected ", n, " (as steps[0])"));
    }
  }
  if (o.repetitions < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "repetitions is ", o.repetitions, "; expected >= 1"));
  }
  if (!(o.min_timed_seconds >= 0 && o.min_timed_seconds <= 60)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "min_timed_seconds is ", o.min_timed_seconds, "; expected 0..60"));
  }
  if (!std::isfinite(o.ef_decay)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ef_decay is ", o.ef_decay, "; expected a finite value"));
  }
  const size_t w = steps.size();
  CodecProfile p;
  p.elements = n;
  std::vector<float> decoded(n);
  std::vector<double> sum_g(n, 0.0), sum_d(n, 0.0), sum_ef(n, 0.0);
  std::vector<v1::EncodedTensor> encoded(w);

  // Without error feedback: each step on its own.
  for (size_t t = 0; t < w; ++t) {
    if (absl::Status s = codec.Encode(steps[t], MixPair(o.seed, t), &encoded[t]);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = codec.Decode(encoded[t], absl::MakeSpan(decoded));
        !s.ok()) {
      return s;
    }
    p.bytes.push_back(PayloadBytes(encoded[t]));
    double g_sq = 0;
    for (size_t i = 0; i < n; ++i) {
      const double g = steps[t][i];
      g_sq += g * g;
      sum_g[i] += g;
      sum_d[i] += decoded[i];
    }
    p.g_sq.push_back(g_sq);
    p.err_sq.push_back(SquaredDistance(steps[t], decoded));
  }

  // With error feedback, as the worker runs it (the fused kernel if any).
  ErrorFeedback ef(&codec, n, o.ef_decay);
  v1::EncodedTensor out;
  for (size_t t = 0; t < w; ++t) {
    if (absl::Status s = ef.Encode(steps[t], MixPair(o.seed, t), &out);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = codec.Decode(out, absl::MakeSpan(decoded)); !s.ok()) {
      return s;
    }
    p.ef_bytes.push_back(PayloadBytes(out));
    p.ef_err_sq.push_back(SquaredDistance(steps[t], decoded));
    for (size_t i = 0; i < n; ++i) sum_ef[i] += decoded[i];
  }
  p.window_g_sq = SquaredNorm(sum_g);
  for (size_t i = 0; i < n; ++i) {
    sum_d[i] = sum_g[i] - sum_d[i];
    sum_ef[i] = sum_g[i] - sum_ef[i];
  }
  p.window_err_sq = SquaredNorm(sum_d);
  p.ef_window_err_sq = SquaredNorm(sum_ef);

  // Throughput: plain Encode and Decode of the window's steps, repeated.
  auto encode_pass = [&]() -> absl::Status {
    for (size_t t = 0; t < w; ++t) {
      if (absl::Status s = codec.Encode(steps[t], MixPair(o.seed, t), &out);
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  };
  auto decode_pass = [&]() -> absl::Status {
    for (size_t t = 0; t < w; ++t) {
      if (absl::Status s = codec.Decode(encoded[t], absl::MakeSpan(decoded));
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  };
  absl::StatusOr<double> enc = TimePasses(encode_pass, o);
  if (!enc.ok()) return enc.status();
  // The residual goes on from where the measured window left it.
  auto ef_encode_pass = [&]() -> absl::Status {
    for (size_t t = 0; t < w; ++t) {
      if (absl::Status s = ef.Encode(steps[t], MixPair(o.seed, t), &out);
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  };
  absl::StatusOr<double> ef_enc = TimePasses(ef_encode_pass, o);
  if (!ef_enc.ok()) return ef_enc.status();
  absl::StatusOr<double> dec = TimePasses(decode_pass, o);
  if (!dec.ok()) return dec.status();
  p.encode_seconds = *enc;
  p.ef_encode_seconds = *ef_enc;
  p.decode_seconds = *dec;
  return p;
}
absl::StatusOr<CodecProfile> CombineProfiles(
    absl::Span<const CodecProfile> parts) {
  if (parts.empty()) {
    return absl::InvalidArgumentError("parts is empty; expected >= 1 profile");
  }
  CodecProfile c;
  const size_t w = parts[0].steps();
  c.bytes.assign(w, 0);
  c.ef_bytes.assign(w, 0);
  c.g_sq.assign(w, 0);
  c.err_sq.assign(w, 0);
  c.ef_err_sq.assign(w, 0);
  for (size_t i = 0; i < parts.size(); ++i) {
    const CodecProfile& p = parts[i];
    if (p.steps() != w || p.bytes.size() != w || p.ef_bytes.size() != w ||
        p.err_sq.size() != w || p.ef_err_sq.size() != w) {
      return absl::InvalidArgumentError(
          absl::StrCat("parts[", i, "] covers ", p.steps(),
                       " steps; expected ", w, " (as parts[0])"));
    }
    c.elements += p.elements;
    for (size_t t = 0; t < w; ++t) {
      c.bytes[t] += p.bytes[t];
      c.ef_bytes[t] += p.ef_bytes[t];
      c.g_sq[t] += p.g_sq[t];
      c.err_sq[t] += p.err_sq[t];
      c.ef_err_sq[t] += p.ef_err_sq[t];
    }
    c.window_g_sq += p.window_g_sq;
    c.window_err_sq += p.window_err_sq;
    c.ef_window_err_sq += p.ef_window_err_sq;
    // A pass over the model is a pass over each of its tensors.
    c.encode_seconds += p.encode_seconds;
    c.ef_encode_seconds += p.ef_encode_seconds;
    c.decode_seconds += p.decode_seconds;
  }
  return c;
}

std::vector<CodecCandidate> CodecSweep() {
  std::vector<CodecCandidate> out;
  auto add = [&](std::string label, std::string family, v1::Codec codec,
                 v1::CodecParams params) {
    out.push_back({std::move(label), std::move(family), codec,
                   std::move(params)});
  };
  add("fp32", "float", v1::CODEC_FP32, {});
  add("fp16", "float", v1::CODEC_FP16, {});
  add("bf16", "float", v1::CODEC_BF16, {});
  // MakeCodec reads block_size 0 as unset (256): a block of 2^20 is the
  // whole tensor for any tensor up to that size.
  for (uint32_t block : {32u, 256u, 2048u, 1u << 20}) {
    for (v1::ScaleMode scale : {v1::SCALE_MODE_MEAN_ABS, v1::SCALE_MODE_L2}) {
      v1::CodecParams p;
      p.set_block_size(block);
      p.set_scale_mode(scale);
      add(absl::StrCat("onebit b",
                       block == (1u << 20) ? "1M" : absl::StrCat(block),
                       scale == v1::SCALE_MODE_L2 ? " l2" : " mean_abs"),
          "onebit", v1::CODEC_ONEBIT, p);
    }
  }
  for (uint32_t bits : {2u, 4u, 6u, 8u}) {
    for (v1::QuantizeRange range :
         {v1::QUANTIZE_RANGE_LINEAR, v1::QUANTIZE_RANGE_ADAPTIVE}) {
      for (v1::Rounding rounding :
           {v1::ROUNDING_NEAREST, v1::ROUNDING_STOCHASTIC}) {
        v1::CodecParams p;
        p.set_block_size(256);
        p.set_bits(bits);
        p.set_range(range);
        p.set_rounding(rounding);
        add(absl::StrCat("quantize ", bits, "b ",
                         range == v1::QUANTIZE_RANGE_LINEAR ? "linear"
                                                            : "adaptive",
                         rounding == v1::ROUNDING_NEAREST ? " nearest"
                                                          : " stochastic"),
            "quantize", v1::CODEC_QUANTIZE, p);
      }
    }
  }
  for (double k : {0.001, 0.01, 0.05, 0.1}) {
    const std::string pct = absl::StrFormat("%g%%", k * 100);
    v1::CodecParams p;
    p.set_k_fraction(k);
    add("topk " + pct, "topk", v1::CODEC_TOPK, p);
    for (uint32_t bits : {4u, 8u}) {
      v1::CodecParams q = p;
      q.set_bits(bits);
      q.set_block_size(256);
      add(absl::StrCat("topk_quantize ", pct, " ", bits, "b"), "topk_quantize",
          v1::CODEC_TOPK_QUANTIZE, q);
    }
    add("randomk " + pct, "randomk", v1::CODEC_RANDOMK, p);
    for (uint32_t block : {4u, 16u, 64u}) {
      v1::CodecParams b = p;
      b.set_block_size(block);
      add(absl::StrCat("block_topk ", pct, " b", block), "block_topk",
          v1::CODEC_BLOCK_TOPK, b);
    }
  }
  return out;
}

}  // namespace pserver
