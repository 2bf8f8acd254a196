#!/usr/bin/env python3
"""report.py OUT_DIR TEMPLATE BENCHMARKS_MD IMG_DIR README: bench/compare's write-up.

Reads the outputs that bench/compare left in OUT_DIR (mlp.txt, data.txt, launch.txt,
allreduce.txt, tails.jsonl, ddp.txt, gpt.txt, zero.txt, machine.txt), fills the @NAME@ placeholders of TEMPLATE with tables and
writes BENCHMARKS_MD, draws the plots as SVG into IMG_DIR, and replaces the block between
<!-- bench:headline:begin --> and <!-- bench:headline:end --> in README. Only the standard
library: the plots are written as SVG by hand. Fails (exit 1, naming the file) when an output is
missing or does not parse, so a broken run never produces a half-filled page.
"""
import json
import math
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tails  # noqa: E402  (bench/tails.py: the allreduce's tails and swings)


class ReportError(Exception):
    pass


def read(out, name):
    path = os.path.join(out, name)
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        raise ReportError(f"{path}: {e.strerror}") from None


def json_lines(text, prefix=""):
    rows = []
    for line in text.splitlines():
        if line.startswith(prefix + "{"):
            rows.append(json.loads(line[len(prefix):]))
    return rows


def fmt(v, digits=0):
    return f"{v:.{digits}f}" if v is not None else "-"


def ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "-"


# ---- the outputs ---------------------------------------------------------------------------

def parse_mlp(text):
    runs = json_lines(text)
    cddp = [r["samples_per_s"] for r in runs if r["impl"] == "cddp"]
    torch = [r["samples_per_s"] for r in runs if r["impl"] == "pytorch"]
    if not cddp or not torch:
        raise ReportError("mlp.txt: no cddp or PyTorch run")
    version = next(r["version"] for r in runs if r["impl"] == "pytorch")
    return {"cddp": cddp, "torch": torch, "version": version}


def parse_data(text):
    rows = json_lines(text)
    if len(rows) < 2:
        raise ReportError("data.txt: want the runs with and without prefetching")
    return rows


def parse_launch(text):
    rows = []
    for line in text.splitlines():
        m = re.match(r"(.*?):\s+median ([\d.]+) ms \(min ([\d.]+), max ([\d.]+), (\d+) runs\)", line)
        if m:
            rows.append((m.group(1).strip(), float(m.group(2)), float(m.group(3)),
                         float(m.group(4)), int(m.group(5))))
    if len(rows) < 2:
        raise ReportError("launch.txt: no timings")
    return rows


ALLREDUCE_COLS = ["cddp", "cddp_bw", "reg", "reg_bw", "mpi", "mpi_bw", "gloo", "gloo_bw"]


def parse_allreduce(text):
    rows = []
    for line in text.splitlines():
        cells = [c.split() for c in line.split("|")]
        if len(cells) < 5 or not cells[0] or not cells[0][0].isdigit():
            continue
        vals = [float(x) if x != "-" else None for c in cells[1:5] for x in c]
        if len(vals) != 8:
            raise ReportError(f"allreduce.txt: cannot read the row '{line}'")
        rows.append(dict(bytes=int(cells[0][0]), **dict(zip(ALLREDUCE_COLS, vals))))
    if not rows:
        raise ReportError("allreduce.txt: no table")
    if "WRONG RESULTS" in text:
        raise ReportError("allreduce.txt: an allreduce returned wrong results")
    return rows


def parse_allreduce_tcp(text):
    """The TCP table's rows ('tcp BYTES | cddp busbw | ompi busbw | ratio'); [] if absent."""
    rows = []
    for line in text.splitlines():
        if not line.startswith("tcp "):
            continue
        cells = [c.split() for c in line.split("|")]
        vals = [float(x) if x != "-" else None for c in cells[1:3] for x in c]
        if len(vals) != 4:
            raise ReportError(f"allreduce.txt: cannot read the TCP row '{line}'")
        rows.append(dict(bytes=int(cells[0][1]), **dict(zip(["cddp", "cddp_bw", "mpi", "mpi_bw"],
                                                               vals))))
    return rows


def parse_ddp(text):
    cddp = json_lines(text)
    torch = json_lines(text, "torch ")

    def best(runs, world):
        v = [r["samples_per_s"] for r in runs if r["world"] == world]
        return max(v) if v else None

    res = {w: (best(cddp, w), best(torch, w)) for w in (1, 2)}
    if None in res[1] + res[2]:
        raise ReportError("ddp.txt: want cddp and PyTorch runs on 1 and 2 ranks")
    last = [r for r in cddp if r["world"] == 2][-1]
    version = torch[0]["version"]
    return {"best": res, "split": last, "version": version,
            "rounds": len([r for r in cddp if r["world"] == 1])}


GPT_SETTINGS = [("cddp1", "cddp, 1 rank"), ("torch1", "PyTorch, 1 thread"),
                ("cddp2", "cddp DDP, 2 ranks"), ("torchddp2", "PyTorch DDP (gloo), 2 ranks"),
                ("cddp_all", "cddp, 1 process x all cores"),
                ("torch_all", "PyTorch, 1 process x all cores")]
# nanoGPT's CPU recipe, as bench/gpt_vs_torch.py runs it
GPT_L, GPT_C, GPT_T, GPT_V = 4, 128, 64, 256


def parse_runs(text, name, settings):
    """The "run SETTING {json}" lines of name, by setting; every one of settings must be there."""
    runs = {}
    for line in text.splitlines():
        if line.startswith("run "):
            _, key, js = line.split(" ", 2)
            runs.setdefault(key, []).append(json.loads(js))
    missing = [k for k, _ in settings if k not in runs]
    if missing:
        raise ReportError(f"{name}: no runs of {', '.join(missing)}")
    return runs


ZERO_SETTINGS = [("cddp_ddp", "cddp DDP"), ("cddp_zero", "cddp ZeRO-1 (`--zero`)"),
                 ("torch_ddp", "PyTorch DDP (gloo)"),
                 ("torch_zero", "PyTorch DDP + ZeroRedundancyOptimizer")]


def zero_table(z):
    rows = ["| GPT 6 x 256, 2 ranks | tokens/s, median | spread (min-max) | ms per iteration | "
            "optimizer state, rank 0 | peak RSS, rank 0 (median) |", "|---|---|---|---|---|---|"]
    for key, label in ZERO_SETTINGS:
        tps = [r["tokens_per_s"] for r in z[key]]
        med = statistics.median(tps)
        iter_tokens = 2 * 8 * 64
        rss = statistics.median(r["peak_rss_bytes"] for r in z[key])
        rows.append(f"| {label} | {med:.0f} | {min(tps):.0f}-{max(tps):.0f} | "
                    f"{1e3 * iter_tokens / med:.1f} | "
                    f"{z[key][0]['optim_state_bytes'] / 2**20:.1f} MiB | {rss / 2**20:.0f} MiB |")
    return "\n".join(rows)


def zero_targets(z):
    m = {k: median_tps(v) for k, v in z.items()}
    state = {k: z[k][0]["optim_state_bytes"] for k in m}
    slow = m["cddp_ddp"] / m["cddp_zero"]
    share = state["cddp_zero"] / state["cddp_ddp"]
    return "\n".join([
        f"- cddp's step with ZeRO-1 <= 1.1x its DDP step: {slow:.3f}x — "
        f"**{'met' if slow <= 1.1 else 'not met'}** (PyTorch's: "
        f"{m['torch_ddp'] / m['torch_zero']:.3f}x)",
        f"- optimizer state per rank about 1/2 of DDP's on 2 ranks: {share:.3f} — "
        f"**{'met' if abs(share - 0.5) <= 0.01 else 'not met'}** (PyTorch's: "
        f"{state['torch_zero'] / state['torch_ddp']:.3f})",
        f"- cddp ZeRO-1 against PyTorch ZeRO: {m['cddp_zero'] / m['torch_zero']:.2f}x the tokens/s",
    ])


def gpt_flops_per_token():
    """3 x (2 x the forward's multiply-adds) per token, the attention counted whole."""
    C = GPT_C
    per_layer = 2 * 12 * C * C + 2 * 2 * GPT_T * C
    return 3 * (GPT_L * per_layer + 2 * C * GPT_V)


def median_tps(runs):
    return statistics.median(r["tokens_per_s"] for r in runs)


def parse_machine(text):
    return dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)


# ---- tables --------------------------------------------------------------------------------

def mlp_table(m):
    c, t = max(m["cddp"]), max(m["torch"])
    return "\n".join([
        f"| implementation | samples/s (best of {len(m['cddp'])}) | runs |",
        "|---|---|---|",
        f"| cddp | {c:.0f} | {', '.join(f'{v:.0f}' for v in m['cddp'])} |",
        f"| PyTorch {m['version']} | {t:.0f} | {', '.join(f'{v:.0f}' for v in m['torch'])} |",
        f"| **cddp / PyTorch** | **{ratio(c, t)}** | |",
    ])


def data_table(rows):
    out = ["| prefetch | loading + collation, samples/s | MLP training, samples/s | "
           "share of step time waiting for data |", "|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['prefetch']} | {r['load_samples_per_s']:.0f} | "
                   f"{r['train_samples_per_s']:.0f} | {100 * r['wait_share']:.2f}% |")
    return "\n".join(out)


def launch_table(rows):
    out = ["| what | median | min | max | runs |", "|---|---|---|---|---|"]
    for name, med, lo, hi, n in rows:
        out.append(f"| `{name}` | {med:.1f} ms | {lo:.1f} | {hi:.1f} | {n} |")
    return "\n".join(out)


def human(b):
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= size:
            return f"{b // size} {unit}"
    return f"{b} B"


def allreduce_table(rows):
    out = ["| size | cddp µs | busbw | cddp registered µs | busbw | Open MPI µs | busbw | "
           "gloo µs | busbw | Open MPI / cddp | Open MPI / cddp registered | gloo / cddp |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append("| " + " | ".join([
            human(r["bytes"]), fmt(r["cddp"], 2), fmt(r["cddp_bw"], 2), fmt(r["reg"], 2),
            fmt(r["reg_bw"], 2), fmt(r["mpi"], 2), fmt(r["mpi_bw"], 2), fmt(r["gloo"], 1),
            fmt(r["gloo_bw"], 3), ratio(r["mpi"], r["cddp"]), ratio(r["mpi"], r["reg"]),
            ratio(r["gloo"], r["cddp"])]) + " |")
    return "\n".join(out)


def verdict(ok):
    return "**met**" if ok else "**not met**"


def allreduce_targets(rows):
    by = {r["bytes"]: r for r in rows}
    lines = []

    def check(size, what, want, bw):
        r = by.get(size)
        if not r or not r["mpi"]:
            lines.append(f"- {what}: not measured (no Open MPI numbers at {human(size)})")
            return
        for key, label in (("cddp", "plain buffers"), ("reg", "registered buffers")):
            if r[key] is None:
                continue
            x = r["mpi"] / r[key]
            ok = x >= want
            detail = (f"{r[key + '_bw']:.2f} vs {r['mpi_bw']:.2f} GB/s" if bw else
                      f"{r[key]:.2f} vs {r['mpi']:.2f} µs")
            lines.append(f"- {what}, {label}: {x:.2f}x Open MPI ({detail}) — {verdict(ok)}")

    check(4096, "4 KiB latency at most 2x Open MPI's (ratio >= 0.5x)", 0.5, False)
    check(1 << 20, "busbw >= 1x Open MPI at 1 MiB", 1.0, True)
    check(16 << 20, "busbw >= 2x Open MPI at 16 MiB", 2.0, True)
    check(64 << 20, "busbw >= 2x Open MPI at 64 MiB", 2.0, True)
    return "\n".join(lines)


def allreduce_tcp_table(rows):
    if not rows:
        return "(not measured in this run)"
    out = ["| size | cddp TCP µs | busbw | Open MPI TCP µs | busbw | Open MPI / cddp |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        out.append("| " + " | ".join([
            human(r["bytes"]), fmt(r["cddp"], 1), fmt(r["cddp_bw"], 2), fmt(r["mpi"], 1),
            fmt(r["mpi_bw"], 2), ratio(r["mpi"], r["cddp"])]) + " |")
    timed = [r for r in rows if r["cddp"] and r["mpi"]]
    if timed:
        at_least = sum(1 for r in timed if r["mpi"] >= r["cddp"])
        big = [r for r in timed if r["bytes"] >= 1 << 20]
        x = (math.prod(r["mpi"] / r["cddp"] for r in big) ** (1 / len(big))) if big else None
        out += ["", f"cddp is at least as fast at {at_least} of {len(timed)} sizes"
                + (f"; from 1 MiB up, geometric mean {x:.2f}x Open MPI's speed — "
                   f"{verdict(x >= 1.0)} (target: >= 1x)" if x else "") + "."]
    return "\n".join(out)


def ddp_table(d):
    (c1, t1), (c2, t2) = d["best"][1], d["best"][2]
    return "\n".join([
        "| MLP, batch 32 per rank, 1 thread per rank | 1 rank | 2 ranks | 2 ranks / 1 rank |",
        "|---|---|---|---|",
        f"| cddp DDP (samples/s, best of {d['rounds']}) | {c1:.0f} | {c2:.0f} | {ratio(c2, c1)} |",
        f"| PyTorch {d['version']} DDP, gloo | {t1:.0f} | {t2:.0f} | {ratio(t2, t1)} |",
        f"| cddp / PyTorch | {ratio(c1, t1)} | **{ratio(c2, t2)}** | |",
    ])


def ddp_split(d):
    s = d["split"]
    where = " inline in backward" if s.get("comm_inline") else ""
    return (f"forward {s['forward_ms']:.2f} ms, backward {s['backward_ms']:.2f} ms, allreduce "
            f"{s['allreduce_ms']:.2f} ms in {s['buckets']} buckets{where}, waited "
            f"{s['wait_ms']:.2f} ms after backward, overlap {100 * s['overlap']:.0f}%")


def ddp_targets(d):
    (c1, _), (c2, t2) = d["best"][1], d["best"][2]
    return "\n".join([
        f"- cddp on 2 ranks >= 3.5x PyTorch DDP on 2 ranks: {c2 / t2:.2f}x — {verdict(c2 / t2 >= 3.5)}",
        f"- cddp on 2 ranks >= 1.7x cddp on 1 rank: {c2 / c1:.2f}x — {verdict(c2 / c1 >= 1.7)}",
    ])


def gpt_table(g):
    rows = ["| GPT, nanoGPT's CPU recipe | tokens/s, median | spread (min-max) | runs |",
            "|---|---|---|---|"]
    for key, label in GPT_SETTINGS:
        v = [r["tokens_per_s"] for r in g[key]]
        rows.append(f"| {label} | {statistics.median(v):.0f} | {min(v):.0f}-{max(v):.0f} | "
                    f"{' '.join(f'{x:.0f}' for x in v)} |")
    return "\n".join(rows)


def gpt_split(g):
    rows = ["| cddp (medians, ms per iteration) | forward | backward | allreduce | optimizer | "
            "model GFLOP/s per rank |", "|---|---|---|---|---|---|"]
    for key, label, world in (("cddp1", "1 rank", 1), ("cddp2", "2 ranks", 2)):
        part = {k: statistics.median(r["iter_ms"][k] for r in g[key])
                for k in ("forward", "backward", "allreduce", "optimizer")}
        rate = median_tps(g[key]) / world * gpt_flops_per_token() / 1e9
        rows.append(f"| {label} | {part['forward']:.1f} | {part['backward']:.1f} | "
                    f"{part['allreduce']:.1f} | {part['optimizer']:.1f} | {rate:.1f} |")
    return "\n".join(rows)


def gpt_targets(g):
    m = {k: median_tps(v) for k, v in g.items()}
    checks = [("cddp on 1 rank >= 1.4x PyTorch on 1 thread", m["cddp1"] / m["torch1"], 1.4),
              ("cddp on 2 ranks >= 1.4x PyTorch DDP on 2 ranks", m["cddp2"] / m["torchddp2"], 1.4),
              ("cddp on 2 ranks >= 1.85x cddp on 1 rank", m["cddp2"] / m["cddp1"], 1.85)]
    rows = [f"- {text}: {v:.2f}x — {verdict(v >= want)}" for text, v, want in checks]
    rows.append(f"- cddp on 2 ranks against one process on every core: cddp "
                f"{m['cddp2'] / m['cddp_all']:.2f}x, PyTorch {m['cddp2'] / m['torch_all']:.2f}x")
    return "\n".join(rows)


def headline(mlp, ar, ddp, machine, gpt):
    by = {r["bytes"]: r for r in ar}
    (c1, t1), (c2, t2) = ddp["best"][1], ddp["best"][2]
    rows = [f"Latest `bench/compare` run ({machine.get('date', '?')}, "
            f"{machine.get('cpu', '?')}); ratios > 1: cddp is faster.", "",
            "| comparison | cddp | peer | cddp / peer |", "|---|---|---|---|",
            f"| MLP training, 1 process (samples/s) | {max(mlp['cddp']):.0f} | PyTorch "
            f"{max(mlp['torch']):.0f} | {ratio(max(mlp['cddp']), max(mlp['torch']))} |",
            f"| DDP training, 2 ranks (samples/s) | {c2:.0f} | PyTorch DDP gloo {t2:.0f} | "
            f"{ratio(c2, t2)} |",
            f"| DDP scaling, 1 → 2 ranks | {ratio(c2, c1)} | PyTorch {ratio(t2, t1)} | |"]
    g = {k: median_tps(v) for k, v in gpt.items()}
    rows += [f"| GPT training, 1 process (tokens/s, median) | {g['cddp1']:.0f} | PyTorch "
             f"{g['torch1']:.0f} | {ratio(g['cddp1'], g['torch1'])} |",
             f"| GPT DDP training, 2 ranks (tokens/s, median) | {g['cddp2']:.0f} | PyTorch DDP "
             f"gloo {g['torchddp2']:.0f} | {ratio(g['cddp2'], g['torchddp2'])} |"]
    for size in (4096, 1 << 20, 64 << 20):
        r = by.get(size)
        if r and r["mpi"]:
            rows.append(f"| allreduce {human(size)}, 2 ranks (µs) | {r['cddp']:.2f} | "
                        f"Open MPI {r['mpi']:.2f} | {ratio(r['mpi'], r['cddp'])} |")
    return "\n".join(rows)


# ---- plots ---------------------------------------------------------------------------------

COLORS = ["#1f77b4", "#2ca02c", "#d62728", "#9467bd"]
W, H, L, R, T, B = 680, 380, 64, 170, 36, 48


def svg(body, title):
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
            f'font-family="sans-serif" font-size="12">\n'
            f'<rect width="{W}" height="{H}" fill="white"/>\n'
            f'<text x="{L}" y="22" font-size="14" font-weight="bold">{title}</text>\n'
            + body + "</svg>\n")


def nice_top(v):
    if v <= 0:
        return 1.0
    e = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if m * e >= v:
            return m * e
    return 10 * e


def busbw_plot(rows):
    series = [("cddp", "cddp_bw"), ("cddp, registered", "reg_bw"), ("Open MPI", "mpi_bw"),
              ("gloo", "gloo_bw")]
    xs = [math.log2(r["bytes"]) for r in rows]
    x0, x1 = min(xs), max(xs)
    top = nice_top(max(r[k] or 0 for r in rows for _, k in series))
    pw, ph = W - L - R, H - T - B

    def px(x):
        return L + (x - x0) / (x1 - x0 or 1) * pw

    def py(y):
        return T + ph - y / top * ph

    body = [f'<rect x="{L}" y="{T}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>']
    for i in range(6):
        y = top * i / 5
        body.append(f'<line x1="{L}" y1="{py(y):.1f}" x2="{L + pw}" y2="{py(y):.1f}" '
                    f'stroke="#ddd"/><text x="{L - 6}" y="{py(y) + 4:.1f}" '
                    f'text-anchor="end">{y:g}</text>')
    for r in rows:
        if r["bytes"] in (4096, 65536, 1 << 20, 16 << 20, 64 << 20) or r is rows[-1]:
            x = px(math.log2(r["bytes"]))
            body.append(f'<text x="{x:.1f}" y="{T + ph + 16}" text-anchor="middle">'
                        f'{human(r["bytes"]).replace(" ", "")}</text>')
    body.append(f'<text x="{L + pw / 2}" y="{H - 8}" text-anchor="middle">message size '
                f'(float32 sum, in place, 2 ranks)</text>')
    body.append(f'<text x="16" y="{T + ph / 2}" text-anchor="middle" '
                f'transform="rotate(-90 16 {T + ph / 2})">busbw (GB/s)</text>')
    for i, (name, key) in enumerate(series):
        pts = [(px(math.log2(r["bytes"])), py(r[key])) for r in rows if r[key] is not None]
        if not pts:
            continue
        c = COLORS[i]
        body.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="'
                    + " ".join(f"{x:.1f},{y:.1f}" for x, y in pts) + '"/>')
        body += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{c}"/>' for x, y in pts]
        ly = T + 12 + 20 * i
        body.append(f'<line x1="{L + pw + 12}" y1="{ly}" x2="{L + pw + 32}" y2="{ly}" '
                    f'stroke="{c}" stroke-width="2"/><text x="{L + pw + 38}" y="{ly + 4}">'
                    f'{name}</text>')
    return svg("\n".join(body) + "\n", "Allreduce bus bandwidth")


def ddp_plot(d):
    (c1, t1), (c2, t2) = d["best"][1], d["best"][2]
    groups = [("1 rank", c1, t1), ("2 ranks", c2, t2)]
    top = nice_top(max(c1, c2, t1, t2))
    pw, ph = W - L - R, H - T - B
    body = [f'<rect x="{L}" y="{T}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>']
    for i in range(6):
        y = top * i / 5
        yy = T + ph - y / top * ph
        body.append(f'<line x1="{L}" y1="{yy:.1f}" x2="{L + pw}" y2="{yy:.1f}" stroke="#ddd"/>'
                    f'<text x="{L - 6}" y="{yy + 4:.1f}" text-anchor="end">{y:g}</text>')
    bw = pw / 6
    for g, (label, *vals) in enumerate(groups):
        gx = L + pw * (0.25 + 0.5 * g) - bw
        for k, v in enumerate(vals):
            h = v / top * ph
            x = gx + k * bw
            body.append(f'<rect x="{x:.1f}" y="{T + ph - h:.1f}" width="{bw * 0.9:.1f}" '
                        f'height="{h:.1f}" fill="{COLORS[2 * k]}"/><text x="{x + bw * 0.45:.1f}" '
                        f'y="{T + ph - h - 4:.1f}" text-anchor="middle">{v:.0f}</text>')
        body.append(f'<text x="{gx + bw:.1f}" y="{T + ph + 16}" text-anchor="middle">{label}'
                    f'</text>')
    for k, name in enumerate(("cddp DDP", "PyTorch DDP (gloo)")):
        ly = T + 12 + 20 * k
        body.append(f'<rect x="{L + pw + 12}" y="{ly - 6}" width="20" height="10" '
                    f'fill="{COLORS[2 * k]}"/><text x="{L + pw + 38}" y="{ly + 4}">{name}</text>')
    body.append(f'<text x="16" y="{T + ph / 2}" text-anchor="middle" '
                f'transform="rotate(-90 16 {T + ph / 2})">samples/s</text>')
    body.append(f'<text x="{L + pw / 2}" y="{H - 8}" text-anchor="middle">MLP 784-512-512-10, '
                f'batch 32 per rank, one thread per rank</text>')
    return svg("\n".join(body) + "\n", "Data-parallel training throughput")


# ---- putting it together -------------------------------------------------------------------

def fill(template, values):
    def sub(m):
        if m.group(1) not in values:
            raise ReportError(f"the template names @{m.group(1)}@, which the report lacks")
        return values[m.group(1)]
    return re.sub(r"@([A-Z_]+)@", sub, template)


def replace_block(text, block, path):
    begin, end = "<!-- bench:headline:begin -->", "<!-- bench:headline:end -->"
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < i:
        raise ReportError(f"{path}: no {begin} ... {end} block")
    return text[:i + len(begin)] + "\n" + block + "\n" + text[j:]


def write(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv):
    if len(argv) != 6:
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    out, template, md, img, readme = argv[1:]
    try:
        mlp = parse_mlp(read(out, "mlp.txt"))
        data = parse_data(read(out, "data.txt"))
        launch = parse_launch(read(out, "launch.txt"))
        ar_text = read(out, "allreduce.txt")
        ar = parse_allreduce(ar_text)
        ar_tcp = parse_allreduce_tcp(ar_text)
        try:
            ar_tails = tails.summary(json_lines(read(out, "tails.jsonl")))
        except (ValueError, KeyError) as e:
            raise ReportError(f"tails.jsonl: {e}") from None
        ddp = parse_ddp(read(out, "ddp.txt"))
        gpt = parse_runs(read(out, "gpt.txt"), "gpt.txt", GPT_SETTINGS)
        zero = parse_runs(read(out, "zero.txt"), "zero.txt", ZERO_SETTINGS)
        machine = parse_machine(read(out, "machine.txt"))
        with open(template) as f:
            tpl = f.read()
        with open(readme) as f:
            readme_text = f.read()
        head = headline(mlp, ar, ddp, machine, gpt)
        page = fill(tpl, {
            "DATE": machine.get("date", "?"),
            "MACHINE": ", ".join(f"{k} {v}" for k, v in machine.items() if k != "date"),
            "HEADLINE": head,
            "MLP_TABLE": mlp_table(mlp),
            "DATA_TABLE": data_table(data),
            "LAUNCH_TABLE": launch_table(launch),
            "ALLREDUCE_TABLE": allreduce_table(ar),
            "ALLREDUCE_TARGETS": allreduce_targets(ar),
            "ALLREDUCE_TCP_TABLE": allreduce_tcp_table(ar_tcp),
            "ALLREDUCE_TAILS": ar_tails,
            "DDP_TABLE": ddp_table(ddp),
            "DDP_SPLIT": ddp_split(ddp),
            "DDP_TARGETS": ddp_targets(ddp),
            "GPT_TABLE": gpt_table(gpt),
            "GPT_SPLIT": gpt_split(gpt),
            "GPT_TARGETS": gpt_targets(gpt),
            "ZERO_TABLE": zero_table(zero),
            "ZERO_TARGETS": zero_targets(zero),
        })
        readme_text = replace_block(readme_text, head, readme)
    except (ReportError, ValueError, KeyError, json.JSONDecodeError) as e:
        print(f"report.py: {e}", file=sys.stderr)
        return 1
    os.makedirs(img, exist_ok=True)
    write(os.path.join(img, "allreduce_busbw.svg"), busbw_plot(ar))
    write(os.path.join(img, "ddp_throughput.svg"), ddp_plot(ddp))
    write(md, page)
    write(readme, readme_text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
