#!/usr/bin/env python3
"""tails.py FILE: sums up bench/allreduce_tails.sh's JSON lines as Markdown tables.

Latency (4-64 KiB): per load, size and implementation, the median over the rounds of each
round's p50 and p99 (with the smallest and largest), and p99/p50. Bandwidth (1-64 MiB): per load
and size, cddp's and Open MPI's bus bandwidth in every round, and the rounds where cddp's was
below Open MPI's. bench/report.py uses summary() for docs/BENCHMARKS.md.
"""
import json
import statistics
import sys

NAMES = {"shm": "cddp (shm)", "vader": "Open MPI (vader)", "tcp": "cddp (tcp)"}


def human(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


def spread(values, digits=1):
    med = statistics.median(values)
    return f"{med:.{digits}f} [{min(values):.{digits}f}-{max(values):.{digits}f}]"


def summary(rows):
    """Markdown for the rows (dicts); raises ValueError when there is nothing to sum up."""
    if not rows:
        raise ValueError("no measurements")
    if any(r.get("wrong_inplace", 0) for r in rows):
        raise ValueError("an allreduce returned wrong results")
    by = {}
    for r in rows:
        by.setdefault((r["load"], r["transport"], r["bytes"]), []).append(r)
    loads = [l for l in ("idle", "loaded") if any(k[0] == l for k in by)]
    rounds = max(r["round"] for r in rows)
    out = [f"Latency, 2 ranks, float32 sum in place, {rounds} rounds: the median "
           "over the rounds of each round's p50 and p99 in µs [smallest-largest round], and "
           "p99/p50 of those medians.", "",
           "| load | size | implementation | p50 (µs) | p99 (µs) | p99/p50 |",
           "|---|---|---|---|---|---|"]
    for load in loads:
        for size in (4096, 8192, 16384, 32768, 65536):
            for impl in ("shm", "vader", "tcp"):
                rs = by.get((load, impl, size))
                if not rs:
                    continue
                p50 = [r["p50_us_inplace"] for r in rs]
                p99 = [r["p99_us_inplace"] for r in rs]
                out.append(f"| {load} | {human(size)} | {NAMES[impl]} | {spread(p50)} | "
                           f"{spread(p99)} | {statistics.median(p99) / statistics.median(p50):.1f} |")
    out += ["", "Bandwidth, 2 ranks: bus bandwidth in GB/s in each round (cddp over shared memory, "
            "Open MPI's vader), and the rounds where cddp's was below Open MPI's.", "",
            "| load | size | cddp, each round | Open MPI, each round | cddp below Open MPI |",
            "|---|---|---|---|---|"]
    for load in loads:
        for size in (1 << 20, 4 << 20, 16 << 20, 64 << 20):
            c = sorted(by.get((load, "shm", size), []), key=lambda r: r["round"])
            m = {r["round"]: r["busbw_inplace"] for r in by.get((load, "vader", size), [])}
            if not c:
                continue
            below = sum(1 for r in c if r["round"] in m and r["busbw_inplace"] < m[r["round"]])
            out.append(f"| {load} | {human(size)} | "
                       f"{' '.join('%.1f' % r['busbw_inplace'] for r in c)} | "
                       f"{' '.join('%.1f' % m[k] for k in sorted(m)) or '-'} | "
                       f"{below} of {len(c)} |")
    return "\n".join(out) + "\n"


def read(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.startswith("{")]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tails.py FILE (the output of bench/allreduce_tails.sh)")
    try:
        print(summary(read(sys.argv[1])), end="")
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"tails.py: {e}")
