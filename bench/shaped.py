#!/usr/bin/env python3
"""shaped.py RATE RESULTS.jsonl: the summary of bench/shaped_links.sh.

RESULTS holds one JSON line per (implementation, host count, size, round), in-place allreduce
times and bus bandwidths. Prints Markdown: per host count and size, each implementation's median
bus bandwidth with its spread across rounds, the link rate and cddp's share of it; then the α-β
model of cddp's ring allreduce, t(n, S) = 2(n-1)·α + 2(n-1)/n·S·β, fitted by least squares to
cddp's median times at the ring's sizes (above CDDP_TCP_SMALL_KB, 64 KiB; relative errors
weighed alike), its predictions next
to the measurements, and what it predicts for 8 to 64 hosts at 10 and 100 Gbit/s.
"""
import json
import re
import statistics
import sys
from collections import defaultdict

SMALL = 64 << 10  # CDDP_TCP_SMALL_KB: up to this size, the one-hop path, not the ring


def rate_bytes(rate):
    m = re.fullmatch(r"([0-9.]+)([kmg]?)(bit|bps)", rate.lower())
    if not m:
        sys.exit(f"shaped.py: cannot read the rate {rate!r} (tc's units: 1gbit, 500mbit)")
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
    return float(m.group(1)) * scale / (8 if m.group(3) == "bit" else 1)


def size_text(b):
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div:
            return f"{b // div} {unit}"
    return f"{b} B"


def fit(points):
    """Least squares of the relative error of t = a*x1 + b*x2 (each equation divided by its t,
    so that small sizes count as much as large ones): (a, b)."""
    points = [(x1 / t, x2 / t, 1.0) for x1, x2, t in points]
    s11 = sum(x1 * x1 for x1, _, _ in points)
    s12 = sum(x1 * x2 for x1, x2, _ in points)
    s22 = sum(x2 * x2 for _, x2, _ in points)
    s1t = sum(x1 * t for x1, _, t in points)
    s2t = sum(x2 * t for _, x2, t in points)
    det = s11 * s22 - s12 * s12
    if det == 0:
        return None
    return (s1t * s22 - s2t * s12) / det, (s11 * s2t - s12 * s1t) / det


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    link = rate_bytes(sys.argv[1])
    runs = defaultdict(list)  # (impl, hosts, bytes) -> [(time_us, busbw)]
    ddp = defaultdict(list)  # (hosts, batch) -> [samples/s]
    with open(sys.argv[2]) as f:
        for line in f:
            r = json.loads(line)
            if "samples_per_s" in r:
                ddp[(r["hosts"], r["batch"])].append(r["samples_per_s"])
                continue
            runs[(r["impl"], r["hosts"], r["bytes"])].append(
                (r["time_us_inplace"], r["busbw_inplace"]))
    hosts = sorted({h for _, h, _ in runs})
    sizes = sorted({b for _, _, b in runs})
    print(f"Links shaped to {sys.argv[1]} ({link / 1e9:.3f} GB/s each way), one rank per host, "
          f"in-place float32 sum; bus bandwidth in GB/s, median (min-max) of "
          f"{max(len(v) for v in runs.values())} rounds.\n")
    for n in hosts:
        print(f"**{n} hosts**\n")
        print("| size | cddp | Open MPI | cddp / link | cddp / Open MPI |")
        print("|---|---|---|---|---|")
        for b in sizes:
            cells, med = [], {}
            for impl in ("cddp", "openmpi"):
                v = [bw for _, bw in runs.get((impl, n, b), [])]
                if not v:
                    cells.append("-")
                    continue
                med[impl] = statistics.median(v)
                cells.append(f"{med[impl]:.3f} ({min(v):.3f}-{max(v):.3f})")
            share = f"{100 * med['cddp'] * 1e9 / link:.0f} %" if "cddp" in med else "-"
            ratio = (f"{med['cddp'] / med['openmpi']:.1f}x"
                     if "cddp" in med and med.get("openmpi") else "-")
            print(f"| {size_text(b)} | {cells[0]} | {cells[1]} | {share} | {ratio} |")
        print()

    # The α-β model on cddp's ring sizes.
    pts, meas = [], {}
    for (impl, n, b), v in runs.items():
        if impl != "cddp" or b <= SMALL or n < 2:
            continue
        t = statistics.median(tt for tt, _ in v) * 1e-6
        meas[(n, b)] = t
        pts.append((2 * (n - 1), 2 * (n - 1) / n * b, t))
    ab = fit(pts)
    if not ab:
        return
    alpha, beta = ab
    if alpha < 0:  # a latency below zero fits noise: the bandwidth term alone, then
        alpha = 0.0
        beta = sum(x2 / t for _, x2, t in pts) / sum((x2 / t) ** 2 for _, x2, t in pts)
    # One hop's latency: cddp's smallest allreduce on the fewest hosts (one hop, inside the
    # links' burst), for the predictions when the ring's fit cannot tell α from noise.
    n0, b0 = min(hosts), min(sizes)
    hop = statistics.median(t for t, _ in runs[("cddp", n0, b0)]) * 1e-6
    print(f"α-β model of cddp's ring allreduce, fitted to {len(pts)} medians: "
          f"α = {alpha * 1e6:.1f} µs per step, β = {beta * 1e9:.2f} ns/B "
          f"({1 / beta / 1e9:.3f} GB/s; the link: {link / 1e9:.3f} GB/s). One hop "
          f"({size_text(b0)} on {n0} hosts): {hop * 1e6:.1f} µs.\n")
    print("| hosts | size | measured (ms) | model (ms) | error |")
    print("|---|---|---|---|---|")
    worst = 0.0
    for (n, b) in sorted(meas):
        model = 2 * (n - 1) * alpha + 2 * (n - 1) / n * b * beta
        err = (model - meas[(n, b)]) / meas[(n, b)]
        worst = max(worst, abs(err))
        print(f"| {n} | {size_text(b)} | {meas[(n, b)] * 1e3:.2f} | {model * 1e3:.2f} | "
              f"{100 * err:+.0f} % |")
    print(f"\nLargest error: {100 * worst:.0f} %.\n")
    a = max(alpha, hop)
    print(f"Predicted for a 100 MiB gradient (25 M float32 parameters), one rank per host, "
          f"with α = {a * 1e6:.1f} µs (the larger of the fit and one hop) and the link's own "
          f"β:\n")
    print("| hosts | 10 Gbit/s: ms | bus GB/s | 100 Gbit/s: ms | bus GB/s |")
    print("|---|---|---|---|---|")
    s = 100 << 20
    for n in (8, 16, 32, 64):
        cells = []
        for gbit in (10, 100):
            b_link = 8 / (gbit * 1e9)
            t = 2 * (n - 1) * a + 2 * (n - 1) / n * s * b_link
            cells += [f"{t * 1e3:.1f}", f"{2 * (n - 1) / n * s / t / 1e9:.2f}"]
        print(f"| {n} | " + " | ".join(cells) + " |")

    if ddp:
        ddp_table(ddp, beta)


GRAD_BYTES = 4 * (784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10)  # bench_mlp's MLP


def ddp_table(ddp, beta):
    """bench_mlp on one host and on 2: samples/s, the scaling, and the model's prediction: a
    step of 2 hosts takes one host's step plus the gradients' allreduce, GRAD_BYTES·β (the ring
    of 2 moves the whole message each way; bench_mlp's backward is too short to hide it)."""
    print(f"\nData-parallel training, bench_mlp ({GRAD_BYTES / 1e6:.2f} MB of gradients a "
          f"step), one rank per host; samples/s of all ranks, median (min-max):\n")
    print("| batch per rank | 1 host | 2 hosts | scaling | model: 2 hosts | error |")
    print("|---|---|---|---|---|---|")
    for batch in sorted({b for _, b in ddp}):
        one, two = ddp.get((1, batch)), ddp.get((2, batch))
        if not one or not two:
            continue
        m1, m2 = statistics.median(one), statistics.median(two)
        step = batch / m1 + GRAD_BYTES * beta
        model = 2 * batch / step
        print(f"| {batch} | {m1:.0f} ({min(one):.0f}-{max(one):.0f}) | {m2:.0f} "
              f"({min(two):.0f}-{max(two):.0f}) | {m2 / m1:.2f}x | {model:.0f} | "
              f"{100 * (model - m2) / m2:+.0f} % |")


if __name__ == "__main__":
    main()
