#!/usr/bin/python3
"""ab_builds.py OLD_BUILD NEW_BUILD [ROUNDS] [MODELS] [THREADS]: two builds of cddp side by side, one
process, THREADS math threads (default 1; with more, the GPT's batch is 12 per thread, what a user
runs instead of as many ranks): the training speed of the MLP, the CNN and the ResNet (bench_mlp, one epoch of
Fashion-MNIST, batch 64) and of the GPT (gpt_train, nanoGPT's CPU recipe, 60 iterations), each
model run by the old build and then the new one in every round (ROUNDS, default 3), the rounds
interleaved so that both see the same machine. MODELS: a comma-separated subset of
mlp,cnn,resnet,gpt (default all).

For a change that must not cost speed (a refactoring) or claims some: prints every run, then per
model the median of each build with its spread (lowest..highest) and new / old.
"""
import os
import statistics
import sys

from interleaved import run_json


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: ab_builds.py OLD_BUILD NEW_BUILD [ROUNDS] [mlp,cnn,resnet,gpt] [THREADS]")
    builds = {"old": sys.argv[1], "new": sys.argv[2]}
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    models = (sys.argv[4] if len(sys.argv) > 4 else "mlp,cnn,resnet,gpt").split(",")
    threads = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               CDDP_LOG_LEVEL="error")

    def cmd(build, model):
        if model == "gpt":
            return [os.path.join(build, "bin", "gpt_train"), "--max_iters", "60", "--batch_size",
                    str(12 * threads), "--eval_interval", "100000", "--eval_iters", "1", "--final_eval", "1",
                    "--sample", "0", "--out", "none", "--log_interval", "0", "--json"]
        return [os.path.join(build, "bin", "bench_mlp"), "--model", model, "--batch-size", "64",
                "--lr", "0.01", "--threads", str(threads)]

    seen = {(m, b): [] for m in models for b in builds}
    for r in range(n):
        for m in models:
            for b, build in builds.items():
                j = run_json("ab_builds", cmd(build, m), env)
                v = j["tokens_per_s"] if m == "gpt" else j["samples_per_s"]
                seen[(m, b)].append(v)
                print(f"round {r + 1} {m} {b}: {v:.0f}", flush=True)
    print()
    print(f"| model ({n} rounds, {threads} threads, median (lowest..highest)) | old | new | new / old |")
    print("|---|---|---|---|")
    for m in models:
        unit = "tokens/s" if m == "gpt" else "samples/s"
        o, w = seen[(m, "old")], seen[(m, "new")]
        f = lambda v: f"{statistics.median(v):.0f} ({min(v):.0f}..{max(v):.0f})"
        print(f"| {m}, {unit} | {f(o)} | {f(w)} | "
              f"{statistics.median(w) / statistics.median(o):.3f} |")


if __name__ == "__main__":
    main()
