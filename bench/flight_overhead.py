"""flight_overhead.py BUILD_DIR [ROUNDS]: what the flight recorder and straggler attribution cost
(issue: <= 1 % of a step). The MLP on Fashion-MNIST (fashion_mnist, one epoch, batch 32 per rank)
and the GPT (gpt_train, 60 iterations) on 2 ranks under cddprun, each with the recorder and the
comparisons on (the defaults) and off (CDDP_FLIGHT_EVENTS=0 CDDP_STRAGGLER_EVERY=0), the four runs
of a round interleaved. Prints every run, and per model the median throughput on and off, their
spread (min-max), and the median of the rounds' on/off ratios."""
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from interleaved import run_json  # noqa: E402


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: flight_overhead.py BUILD_DIR [ROUNDS]")
    build = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    bin_ = os.path.join(build, "bin")
    launch = [os.path.join(bin_, "cddprun"), "--standalone", "--nproc_per_node", "2"]
    mlp = launch + [os.path.join(bin_, "fashion_mnist"), "--model", "mlp", "--epochs", "1",
                    "--batch", "32", "--out", "none", "--json"]
    gpt = launch + [os.path.join(bin_, "gpt_train"), "--max_iters", "60", "--batch_size", "12",
                    "--eval_interval", "100000", "--eval_iters", "1", "--final_eval", "1",
                    "--sample", "0", "--out", "none", "--log_interval", "0", "--json"]
    base = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", CDDP_LOG_LEVEL="error")
    off = dict(base, CDDP_FLIGHT_EVENTS="0", CDDP_STRAGGLER_EVERY="0")
    models = [("mlp", mlp, "samples_per_s"), ("gpt", gpt, "tokens_per_s")]
    seen = {(m, s): [] for m, _, _ in models for s in ("on", "off")}
    for r in range(n):
        for name, cmd, key in models:
            order = [("on", base), ("off", off)] if r % 2 == 0 else [("off", off), ("on", base)]
            for setting, env in order:
                v = run_json(name, cmd, env)[key]
                seen[(name, setting)].append(v)
                print(f"round {r + 1} {name} {setting}: {v:.0f} {key}", flush=True)
    for name, _, key in models:
        on, off_ = seen[(name, "on")], seen[(name, "off")]
        ratios = [a / b for a, b in zip(on, off_)]
        print(f"{name}: on {statistics.median(on):.0f} ({min(on):.0f}-{max(on):.0f}), off "
              f"{statistics.median(off_):.0f} ({min(off_):.0f}-{max(off_):.0f}) {key}; on/off "
              f"median {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
