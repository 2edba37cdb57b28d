"""Turns codec_profile's JSON (tests/bench/codec_profile.cc) into
codec_profile.md (a whole-model table per window of captured steps, then each
tensor's errors) and codec_profile.svg (error against bits per element, one
panel per window, log axes). Standard library only.

  /usr/bin/python3 codec_profile_report.py --json codec_profile.json \
      --out DIR [--note TEXT ...]

Figures (per window of W consecutive steps, tune/codec_profile.h):
  ratio        fp32 bytes / encoded payload bytes per step (no framing)
  err          mean over steps of ||g_t - D(E(g_t))|| / ||g_t|| (no error
               feedback: what one round trip loses)
  win err      ||sum g - sum D(E(g))|| / ||sum g|| over the window, no EF
  EF win err   the same with error feedback: the error that reaches the
               model after W steps (= residual / ||sum g||)
  EF step err  mean over steps of ||g_t - D(E(g_t + e_t))|| / ||g_t||
  rates        elements per second, one thread: Encode, the error-feedback
               encode the worker runs (fused kernel if the codec has one),
               and Decode
"""

import argparse
import json
import math
import os

FAMILY_COLORS = {
    "float": "#7f7f7f",
    "onebit": "#1f77b4",
    "quantize": "#2ca02c",
    "topk": "#d62728",
    "topk_quantize": "#ff7f0e",
    "randomk": "#9467bd",
}
OTHER_COLORS = ["#8c564b", "#e377c2", "#17becf", "#bcbd22"]


def color(family, families):
    if family in FAMILY_COLORS:
        return FAMILY_COLORS[family]
    extra = [f for f in families if f not in FAMILY_COLORS]
    return OTHER_COLORS[extra.index(family) % len(OTHER_COLORS)]


def fmt_err(v):
    if v is None:
        return "inf"
    if v == 0:
        return "0"
    return f"{v:.3g}"


def fmt_rate(v):
    return "-" if not v else f"{v / 1e6:.0f}"


def bits(r):
    return 32.0 / r["ratio"] if r["ratio"] else float("nan")


def model_table(rows):
    out = ["| codec | bits/elem | ratio | err | win err | EF win err | EF step err "
           "| encode Melem/s | EF encode Melem/s | decode Melem/s |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['label']} | {bits(r):.3g} | {r['ratio']:.3g} | "
                   f"{fmt_err(r['rel_error'])} | {fmt_err(r['window_error'])} | "
                   f"{fmt_err(r['ef_window_error'])} | {fmt_err(r['ef_step_error'])} | "
                   f"{fmt_rate(r['encode_elements_per_second'])} | "
                   f"{fmt_rate(r['ef_encode_elements_per_second'])} | "
                   f"{fmt_rate(r['decode_elements_per_second'])} |")
    return out


def tensor_table(rows_by_tensor, tensors, labels):
    head = "| codec | " + " | ".join(f"{t['name']} ({t['elements']})" for t in tensors) + " |"
    out = [head, "|---|" + "---:|" * len(tensors)]
    for label in labels:
        cells = []
        for t in tensors:
            r = rows_by_tensor.get((t["name"], label))
            cells.append("-" if r is None else
                         f"{fmt_err(r['rel_error'])} / {fmt_err(r['ef_window_error'])}")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return out


def svg(data):
    windows = [w["name"] for w in data["windows"]]
    rows = [r for r in data["results"] if r["tensor"] == "(model)"]
    families = []
    for r in rows:
        if r["family"] not in families:
            families.append(r["family"])
    pw, ph, left, top, gap = 330, 300, 60, 50, 20
    W = left + len(windows) * (pw + gap) + 10
    H = top + ph + 110
    xs = [bits(r) for r in rows if r["ratio"]]
    ys = [v for r in rows for v in (r["rel_error"], r["ef_window_error"]) if v]
    xlo = 10 ** math.floor(math.log10(min(xs)))
    xhi = 10 ** math.ceil(math.log10(max(xs)))
    ylo = 10 ** math.floor(math.log10(min(ys)))
    yhi = 10 ** math.ceil(math.log10(max(ys)))

    def x(v, i):
        v = min(max(v, xlo), xhi)
        return left + i * (pw + gap) + (math.log10(v) - math.log10(xlo)) / \
            (math.log10(xhi) - math.log10(xlo)) * pw

    def y(v):
        v = min(max(v, ylo), yhi)
        return top + ph - (math.log10(v) - math.log10(ylo)) / \
            (math.log10(yhi) - math.log10(ylo)) * ph

    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
         'font-family="sans-serif" font-size="11">',
         '<rect width="100%" height="100%" fill="white"/>',
         f'<text x="{left}" y="18" font-size="13">Codecs on captured gradients '
         f'({sum(t["elements"] for t in data["tensors"])} parameters, '
         f'{len(data["tensors"])} tensors): relative error against bits per element</text>']
    for i, name in enumerate(windows):
        x0 = left + i * (pw + gap)
        wdef = data["windows"][i]
        s.append(f'<text x="{x0 + pw / 2:.0f}" y="{top - 10}" text-anchor="middle" '
                 f'font-size="12">{name} (steps {wdef["first_step"]}-{wdef["last_step"]})</text>')
        s.append(f'<rect x="{x0}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
        e = math.log10(xlo)
        while e <= math.log10(xhi) + 1e-9:
            v = 10 ** e
            xv = x(v, i)
            s.append(f'<line x1="{xv:.1f}" y1="{top}" x2="{xv:.1f}" y2="{top + ph}" stroke="#ddd"/>')
            s.append(f'<text x="{xv:.1f}" y="{top + ph + 14}" text-anchor="middle">{v:g}</text>')
            e += 1
        e = math.log10(ylo)
        while e <= math.log10(yhi) + 1e-9:
            v = 10 ** e
            yv = y(v)
            s.append(f'<line x1="{x0}" y1="{yv:.1f}" x2="{x0 + pw}" y2="{yv:.1f}" stroke="#ddd"/>')
            if i == 0:
                s.append(f'<text x="{x0 - 4}" y="{yv + 4:.1f}" text-anchor="end">{v:g}</text>')
            e += 1
        s.append(f'<text x="{x0 + pw / 2:.0f}" y="{top + ph + 30}" text-anchor="middle">'
                 'bits per element (log)</text>')
        for r in rows:
            if r["window"] != name or not r["ratio"]:
                continue
            c = color(r["family"], families)
            xv = x(bits(r), i)
            title = (f'{r["label"]}: {r["ratio"]:.3g}x, err {fmt_err(r["rel_error"])}, '
                     f'EF window err {fmt_err(r["ef_window_error"])}')
            if r["rel_error"]:
                s.append(f'<circle cx="{xv:.1f}" cy="{y(r["rel_error"]):.1f}" r="3.5" fill="none" '
                         f'stroke="{c}" stroke-width="1.3"><title>{title}</title></circle>')
            if r["ef_window_error"]:
                s.append(f'<circle cx="{xv:.1f}" cy="{y(r["ef_window_error"]):.1f}" r="3.5" '
                         f'fill="{c}"><title>{title}</title></circle>')
    s.append(f'<text x="14" y="{top + ph / 2:.0f}" transform="rotate(-90 14 {top + ph / 2:.0f})" '
             'text-anchor="middle">relative error (log)</text>')
    ly = top + ph + 52
    lx = left
    for f in families:
        s.append(f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="{color(f, families)}"/>'
                 f'<text x="{lx + 14}" y="{ly}">{f}</text>')
        lx += 30 + 7 * len(f)
    ly += 20
    s.append(f'<circle cx="{left + 5}" cy="{ly - 4}" r="3.5" fill="none" stroke="black"/>'
             f'<text x="{left + 14}" y="{ly}">one round trip, no error feedback (mean over steps)</text>')
    s.append(f'<circle cx="{left + 345}" cy="{ly - 4}" r="3.5" fill="black"/>'
             f'<text x="{left + 354}" y="{ly}">with error feedback, over the window (what reaches the model)</text>')
    ly += 18
    s.append(f'<text x="{left}" y="{ly}" fill="#555">Lossless and zero-error points '
             '(fp32) are not drawn on the log axis; hover a point for its codec.</text>')
    s.append("</svg>")
    return "\n".join(s) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--note", action="append", default=[])
    a = ap.parse_args()
    with open(a.json) as f:
        data = json.load(f)
    if not data["results"]:
        raise SystemExit(f"{a.json}: results is empty; expected the profiler's rows")
    tensors = data["tensors"]
    total = sum(t["elements"] for t in tensors)
    md = ["# Codecs on captured gradients", ""]
    md += [f"Gradients: worker {data['worker_id']} of the run, {total} parameters in "
           f"{len(tensors)} tensors (" +
           ", ".join(f"{t['name']} {'x'.join(map(str, t['shape']))}" for t in tensors) + ")."]
    md += [f"Windows: " + "; ".join(f"{w['name']} = steps {w['first_step']}-{w['last_step']} "
                                    f"({w['steps']} steps)" for w in data["windows"]) + "."]
    o = data["options"]
    md += [f"Error feedback decay {o['ef_decay']}; throughput single-threaded, median of "
           f"{o['repetitions']} repetitions of at least {o['min_timed_seconds']} s."]
    md += [""] + [n for n in a.note] + ([""] if a.note else [])
    md += ["```", "Figures" + __doc__.split("Figures", 1)[1].rstrip(), "```", ""]
    labels = []
    for r in data["results"]:
        if r["label"] not in labels:
            labels.append(r["label"])
    for w in data["windows"]:
        rows = [r for r in data["results"] if r["window"] == w["name"] and r["tensor"] == "(model)"]
        md += [f"## {w['name']}: steps {w['first_step']}-{w['last_step']}, whole model", ""]
        md += model_table(rows) + [""]
    for w in data["windows"]:
        by = {(r["tensor"], r["label"]): r for r in data["results"]
              if r["window"] == w["name"] and r["tensor"] != "(model)"}
        md += [f"## {w['name']}: per tensor, err / EF win err", ""]
        md += tensor_table(by, tensors, labels) + [""]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "codec_profile.md"), "w") as f:
        f.write("\n".join(md))
    with open(os.path.join(a.out, "codec_profile.svg"), "w") as f:
        f.write(svg(data))


if __name__ == "__main__":
    main()
