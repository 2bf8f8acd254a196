#!/usr/bin/python3
"""bf16_vs_torch.py BUILD_DIR [ROUNDS] [MODELS]: mixed precision on the CPU, cddp against itself in
float32 and against PyTorch's CPU autocast to bfloat16 (and float32), rounds interleaved.

MODELS, comma-separated (default gpt4,gpt6,mlp,cnn,resnet,resnet16):
  gpt4    nanoGPT's CPU recipe (4 layers, 4 heads, width 128, context 64, batch 12), 30 iterations
  gpt6    a larger GPT: 6 layers, 6 heads, width 384, context 256, batch 12, 10 iterations
  mlp     the seed's MLP (784-512-512-10) on Fashion-MNIST, one epoch at batch 64 (fashion_mnist
          against bench/mlp_torch.py's model; PyTorch's epoch does not hold the evaluation cddp's
          does not count either)
  cnn     fashion_mnist's CNN (2 convolutions with ReLU and pooling, 2 linear layers), the same
  resnet  fashion_mnist's ResNet (16, 32, 64 channels, BatchNorm), the first 12800 samples
  resnet16  the same, cddp's activations in bf16 between the layers (CDDP_BF16_ACTIVATIONS=1)
Each model runs on one rank with one math thread, and on 2 ranks under cddprun (one thread each;
PyTorch's DDP over gloo), in cddp fp32, cddp bf16 (--dtype bf16), PyTorch fp32 and PyTorch
autocast bf16. Prints every run, then per model and ranks the median (lowest..highest) of each
and the ratios cddp bf16 / cddp fp32 and cddp bf16 / PyTorch bf16; for the GPTs also once warm, at
each run's median iteration (gpt_train's and gpt_torch.py's median_iter_ms), since a 10-iteration
run also measures its first one. The processor and which bf16 path cddp took are printed first: speed-ups need AVX512-BF16 or AMX (elsewhere cddp refuses bf16).
"""
import os
import statistics
import subprocess
import sys

from interleaved import PY, run_json

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: bf16_vs_torch.py BUILD_DIR [ROUNDS] [gpt4,gpt6,mlp,cnn,resnet,resnet16]")
    build = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    models = (sys.argv[3] if len(sys.argv) > 3 else "gpt4,gpt6,mlp,cnn,resnet,resnet16").split(",")
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", CDDP_LOG_LEVEL="error")
    launch = [os.path.join(build, "bin", "cddprun"), "--standalone", "--nproc_per_node", "2"]
    gpt = os.path.join(build, "bin", "gpt_train")
    fm = os.path.join(build, "bin", "fashion_mnist")
    shapes = {"gpt4": ["--n_layer", "4", "--n_head", "4", "--n_embd", "128", "--block_size", "64"],
              "gpt6": ["--n_layer", "6", "--n_head", "6", "--n_embd", "384", "--block_size", "256"]}
    iters = {"gpt4": "30", "gpt6": "10"}

    def cmds(model, impl, dtype):
        if model.startswith("gpt"):
            common = shapes[model] + ["--batch_size", "12", "--max_iters", iters[model]]
            if impl == "cddp":
                return [gpt] + common + ["--dtype", dtype, "--eval_interval", "100000",
                                         "--eval_iters", "1", "--final_eval", "1", "--sample", "0",
                                         "--out", "none", "--log_interval", "0", "--json"], \
                    "tokens_per_s"
            return [PY, os.path.join(HERE, "gpt_torch.py")] + common + \
                ["--dtype", dtype, "--eval_batches", "1"], "tokens_per_s"
        resnet = model.startswith("resnet")
        common = ["--model", "resnet" if resnet else model, "--batch-size", "64", "--dtype",
                  dtype] + (["--limit", "12800"] if resnet else [])
        if impl == "cddp":
            return [fm, "--epochs", "1", "--log-every", "0", "--out", "none", "--json"] + common, \
                "samples_per_s"
        return [PY, os.path.join(HERE, "mlp_torch.py")] + common, "samples_per_s"

    how = subprocess.run([fm, "--dtype", "bf16", "--epochs", "1", "--limit", "64", "--log-every",
                          "0", "--out", "none"],
                         env=dict(env, CDDP_LOG_LEVEL="info"), capture_output=True, text=True)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), "?")
    print(f"processor: {cpu}")
    print("cddp: " + " ".join(line.strip() for line in (how.stdout + how.stderr).splitlines()
                              if "products" in line or "bf16" in line))
    seen = {}
    for r in range(n):
        for model in models:
            for world in (1, 2):
                for impl in ("cddp", "torch"):
                    for dtype in ("fp32", "bf16"):
                        cmd, unit = cmds(model, impl, dtype)
                        if world == 2:
                            cmd = launch + cmd
                        j = run_json("bf16_vs_torch", cmd,
                                     dict(env, CDDP_BF16_ACTIVATIONS="1") if model == "resnet16"
                                     else env)
                        key = (model, world, impl, dtype)
                        seen.setdefault(key, []).append(j[unit])
                        extra = ""
                        if model.startswith("gpt"):  # once warm: the median iteration's speed
                            warm = j[unit] * j["train_s"] / j["iters"] / (
                                j["median_iter_ms"] / 1e3)
                            seen.setdefault(("warm",) + key, []).append(warm)
                            extra = f" warm={warm:.1f} (median iteration {j['median_iter_ms']} ms)"
                        print(f"run {model} world={world} {impl} {dtype} {unit}={j[unit]:.1f}"
                              + extra, flush=True)
    def table(title, rows, prefix=()):
        print(f"\n{title}\n")
        print("| model | ranks | cddp fp32 | cddp bf16 | PyTorch fp32 | PyTorch autocast bf16 | "
              "cddp bf16 / cddp fp32 | cddp bf16 / PyTorch bf16 |")
        print("|---|---|---|---|---|---|---|---|")
        for model in rows:
            for world in (1, 2):
                med = {}
                cells = []
                for impl, dtype in (("cddp", "fp32"), ("cddp", "bf16"), ("torch", "fp32"),
                                    ("torch", "bf16")):
                    v = seen[prefix + (model, world, impl, dtype)]
                    med[(impl, dtype)] = statistics.median(v)
                    cells.append(f"{statistics.median(v):.0f} ({min(v):.0f}..{max(v):.0f})")
                print(f"| {model} | {world} | " + " | ".join(cells) +
                      f" | {med[('cddp', 'bf16')] / med[('cddp', 'fp32')]:.2f} | "
                      f"{med[('cddp', 'bf16')] / med[('torch', 'bf16')]:.2f} |")

    table("Whole runs (tokens/s for the GPTs, samples/s for the others):", models)
    gpts = [m for m in models if m.startswith("gpt")]
    if gpts:
        table("The GPTs once warm (tokens/s at each run's median iteration; the whole runs above "
              "also pay the first iteration's page faults and oneDNN's kernel generation):", gpts,
              ("warm",))
    print(f"\n(median of {n} interleaved rounds, lowest..highest)")


if __name__ == "__main__":
    main()
