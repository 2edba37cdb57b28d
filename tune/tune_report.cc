#include "tune/tune_report.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/json_text.h"

namespace pserver {
namespace {

std::string Xml(absl::string_view s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += ch;
    }
  }
  return out;
}

std::string Err(double v) {
  if (!std::isfinite(v)) return "inf";
  return v == 0 ? "0" : absl::StrFormat("%.3g", v);
}

std::string DirectionJson(absl::Span<const CodecCandidate> candidates,
                          const TunedDirection& d) {
  const TuneResult& r = d.result;
  std::string out = absl::StrCat(
      "{\"source\": ", JsonString(d.source), ", \"mode\": ", JsonString(d.mode),
      ", \"windows\": ", d.windows, ", \"steps\": ", d.steps,
      ", \"budget_bytes\": ", JsonNumber(r.budget_bytes),
      ", \"model\": {\"bytes_per_step\": ", JsonNumber(r.bytes),
      ", \"fp32_bytes_per_step\": ", JsonNumber(r.fp32_bytes),
      ", \"ratio\": ", JsonNumber(r.bytes > 0 ? r.fp32_bytes / r.bytes : 0),
      ", \"ef_window_error\": ", JsonNumber(r.ef_window_error),
      ", \"error\": ", JsonNumber(r.error), "}, \"tensors\": [");
  for (size_t t = 0; t < r.tensors.size(); ++t) {
    const TensorChoice& tc = r.tensors[t];
    absl::StrAppend(&out, t == 0 ? "" : ", ", "{\"name\": ", JsonString(tc.name),
                    ", \"elements\": ", tc.elements,
                    ", \"chosen\": ", JsonString(candidates[tc.chosen].label),
                    ", \"reason\": ", JsonString(tc.reason), ", \"candidates\": [");
    for (size_t c = 0; c < tc.candidates.size(); ++c) {
      const CandidateSummary& s = tc.candidates[c];
      const CodecCandidate& cand = candidates[c];
      absl::StrAppend(
          &out, c == 0 ? "" : ", ", "{\"label\": ", JsonString(cand.label),
          ", \"family\": ", JsonString(cand.family),
          ", \"codec\": ", JsonString(CodecName(cand.codec)),
          ", \"params\": ", CodecParamsJson(cand.params),
          ", \"bytes_per_step\": ", JsonNumber(s.bytes), ", \"ratio\": ", JsonNumber(s.ratio),
          ", \"ef_window_error\": ", JsonNumber(s.ef_window_error),
          ", \"error\": ", JsonNumber(s.error), ", \"ef_err_sq\": ", JsonNumber(s.ef_err_sq),
          ", \"eligible\": ", s.eligible ? "true" : "false",
          ", \"ef_encode_elements_per_second\": ",
          JsonNumber(s.encode_elements_per_second),
          ", \"decode_elements_per_second\": ",
          JsonNumber(s.decode_elements_per_second), "}");
    }
    out += "]}";
  }
  return out + "]}";
}

// Colours of the codec families (as codec_profile_report.py's).
std::string FamilyColor(const std::string& family) {
  static const std::map<std::string, std::string> kColors = {
      {"float", "#7f7f7f"},         {"onebit", "#1f77b4"},
      {"quantize", "#2ca02c"},      {"topk", "#d62728"},
      {"topk_quantize", "#ff7f0e"}, {"randomk", "#9467bd"},
      {"block_topk", "#8c564b"}};
  auto it = kColors.find(family);
  return it == kColors.end() ? "#17becf" : it->second;
}

// A log axis over [lo, hi] (powers of ten) onto [a, b] pixels.
struct LogAxis {
  double lo = 1, hi = 10;
  double a = 0, b = 1;
  static LogAxis Over(double min, double max, double a, double b) {
    LogAxis x;
    x.lo = std::floor(std::log10(min));
    x.hi = std::ceil(std::log10(max));
    if (x.hi <= x.lo) x.hi = x.lo + 1;
    x.a = a;
    x.b = b;
    return x;
  }
  double operator()(double v) const {
    const double e = std::clamp(std::log10(v), lo, hi);
    return a + (e - lo) / (hi - lo) * (b - a);
  }
};

struct Panel {
  const TunedDirection* d;
  size_t tensor;
};

}  // namespace

std::string TuneTable(absl::Span<const CodecCandidate> candidates,
                      const TunedDirection& d) {
  const TuneResult& r = d.result;
  size_t name_w = 6;
  for (const TensorChoice& t : r.tensors) {
    name_w = std::max(name_w, t.name.size());
  }
  std::string out = absl::StrFormat(
      "%s codecs, %s; measured on %s (%zu windows, %zu steps)\n", d.name,
      d.mode, d.source, d.windows, d.steps);
  absl::StrAppendFormat(&out, "%-*s %10s  %-30s %12s %8s %11s %11s  %s\n",
                        static_cast<int>(name_w), "tensor", "elements", "codec",
                        "bytes/step", "ratio", "EF win err", "err no EF",
                        "why");
  for (const TensorChoice& t : r.tensors) {
    const CandidateSummary& s = t.choice();
    absl::StrAppendFormat(&out, "%-*s %10d  %-30s %12.0f %8.2f %11s %11s  %s\n",
                          static_cast<int>(name_w), t.name, t.elements,
                          candidates[t.chosen].label, s.bytes, s.ratio,
                          Err(s.ef_window_error), Err(s.error), t.reason);
  }
  uint64_t elements = 0;
  for (const TensorChoice& t : r.tensors) elements += t.elements;
  absl::StrAppendFormat(&out, "%-*s %10d  %-30s %12.0f %8.2f %11s %11s\n",
                        static_cast<int>(name_w), "(model)", elements, "",
                        r.bytes, r.bytes > 0 ? r.fp32_bytes / r.bytes : 0.0,
                        Err(r.ef_window_error), Err(r.error));
  return out;
}

std::string TuneJson(absl::Span<const CodecCandidate> candidates,
                     const TunedDirection& push, const TunedDirection* pull) {
  return absl::StrCat(
      "{\"push\": ", DirectionJson(candidates, push), ",\n \"pull\": ",
      pull == nullptr ? "null" : DirectionJson(candidates, *pull), "}\n");
}

std::string TuneSvg(absl::Span<const CodecCandidate> candidates,
                    const TunedDirection& push, const TunedDirection* pull) {
  // The panels: each direction's tensors, the largest first when they do not
  // all fit, shown in layout order.
  std::vector<Panel> panels;
  size_t omitted = 0;
  for (const TunedDirection* d : {&push, pull}) {
    if (d == nullptr) continue;
    // Tensors kept dense had no choice to show.
    std::vector<size_t> order;
    for (size_t t = 0; t < d->result.tensors.size(); ++t) {
      if (d->result.tensors[t].reason != "dense") order.push_back(t);
    }
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return d->result.tensors[a].elements > d->result.tensors[b].elements;
    });
    const size_t room = kMaxPlotPanels / (pull == nullptr ? 1 : 2);
    if (order.size() > room) {
      omitted += order.size() - room;
      order.resize(room);
    }
    std::sort(order.begin(), order.end());
    for (size_t t : order) panels.push_back({d, t});
  }
  const int cols = 3, pw = 260, ph = 190, left = 70, top = 50, gx = 80, gy = 70;
  const int rows = static_cast<int>((panels.size() + cols - 1) / cols);
  const int width = left + cols * (pw + gx);
  const int height = top + rows * (ph + gy) + 70;
  std::string s = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<text x=\"%d\" y=\"20\" font-size=\"13\">pserver_tune: EF window "
      "error against bytes per step, per tensor (log axes); ringed: the "
      "chosen codec. push: %s</text>\n",
      width, height, left, Xml(push.mode));
  std::vector<std::string> families;
  for (size_t i = 0; i < panels.size(); ++i) {
    const Panel& p = panels[i];
    const TensorChoice& t = p.d->result.tensors[p.tensor];
    const int x0 = left + static_cast<int>(i % cols) * (pw + gx);
    const int y0 = top + static_cast<int>(i / cols) * (ph + gy);
    double bmin = INFINITY, bmax = 0, emin = INFINITY, emax = 0;
    for (const CandidateSummary& c : t.candidates) {
      if (c.bytes > 0) {
        bmin = std::min(bmin, c.bytes);
        bmax = std::max(bmax, c.bytes);
      }
      if (c.ef_window_error > 0 && std::isfinite(c.ef_window_error)) {
        emin = std::min(emin, c.ef_window_error);
        emax = std::max(emax, c.ef_window_error);
      }
    }
    if (!(bmax > 0)) bmin = 1, bmax = 10;
    if (!(emax > 0)) emin = 1e-3, emax = 1;
    const LogAxis x = LogAxis::Over(bmin, bmax, x0, x0 + pw);
    const LogAxis y = LogAxis::Over(emin, emax, y0 + ph, y0);
    absl::StrAppendFormat(
        &s,
        "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"12\">%s "
        "%s (%d)</text>\n<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" "
        "fill=\"none\" stroke=\"#999\"/>\n",
        x0 + pw / 2, y0 - 8, Xml(p.d->name), Xml(t.name), t.elements, x0, y0,
        pw, ph);
    for (double e = x.lo; e <= x.hi + 1e-9; e += 1) {
      const double xv = x(std::pow(10.0, e));
      absl::StrAppendFormat(
          &s,
          "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#ddd\"/>"
          "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%g</text>\n",
          xv, y0, xv, y0 + ph, xv, y0 + ph + 14, std::pow(10.0, e));
    }
    for (double e = y.lo; e <= y.hi + 1e-9; e += 1) {
      const double yv = y(std::pow(10.0, e));
      absl::StrAppendFormat(
          &s,
          "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>"
          "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n",
          x0, yv, x0 + pw, yv, x0 - 4, yv + 4, std::pow(10.0, e));
    }
    absl::StrAppendFormat(&s,
                          "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">"
                          "bytes per step</text>\n",
                          x0 + pw / 2, y0 + ph + 28);
    for (size_t c = 0; c < t.candidates.size(); ++c) {
      const CandidateSummary& cs = t.candidates[c];
      if (!(cs.bytes > 0)) continue;
      const std::string& fam = candidates[c].family;
      if (std::find(families.begin(), families.end(), fam) == families.end()) {
        families.push_back(fam);
      }
      // Zero error (lossless) sits on the bottom edge.
      const double yv =
          cs.ef_window_error > 0 ? y(cs.ef_window_error) : y0 + ph;
      const std::string title = absl::StrFormat(
          "%s: %.0f bytes/step, %.3gx, EF window error %s%s",
          candidates[c].label, cs.bytes, cs.ratio, Err(cs.ef_window_error),
          cs.eligible ? "" : " (saves too little)");
      absl::StrAppendFormat(
          &s,
          "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\" "
          "fill-opacity=\"%s\"><title>%s</title></circle>\n",
          x(cs.bytes), yv, FamilyColor(fam), cs.eligible ? "0.9" : "0.3",
          Xml(title));
      if (c == t.chosen) {
        absl::StrAppendFormat(
            &s,
            "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"7\" fill=\"none\" "
            "stroke=\"black\" stroke-width=\"1.5\"><title>chosen: %s (%s)"
            "</title></circle>\n",
            x(cs.bytes), yv, Xml(candidates[c].label), Xml(t.reason));
      }
    }
  }
  int ly = top + rows * (ph + gy) + 10;
  int lx = left;
  for (const std::string& f : families) {
    absl::StrAppendFormat(&s,
                          "<circle cx=\"%d\" cy=\"%d\" r=\"4\" fill=\"%s\"/>"
                          "<text x=\"%d\" y=\"%d\">%s</text>\n",
                          lx + 4, ly - 4, FamilyColor(f), lx + 12, ly, Xml(f));
    lx += 30 + 7 * static_cast<int>(f.size());
  }
  ly += 20;
  absl::StrAppendFormat(
      &s,
      "<text x=\"%d\" y=\"%d\" fill=\"#555\">Error 0 (fp32) is drawn on the "
      "bottom edge; faded points save less than the tuner's minimum; tensors "
      "kept dense are not drawn; hover a point for its codec.%s</text>\n",
      left, ly,
      omitted == 0
          ? ""
          : absl::StrCat(" ", omitted, " smaller tensors are not drawn."));
  s += "</svg>\n";
  return s;
}

}  // namespace pserver
