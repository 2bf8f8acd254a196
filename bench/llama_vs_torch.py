"""llama_vs_torch.py BUILD_DIR [ROUNDS] [ITERS]: Llama training speed, cddp against transformers.

A Llama of 4 layers, width 256, 8 heads sharing 4 key/value heads, an MLP of 704, context 128,
batch 8, vocabulary 256 (the fortunes as bytes), AdamW, gradients clipped at 1.0: gpt_train
--arch llama --bench ITERS (default 20) against transformers' LlamaForCausalLM in PyTorch
(bench/llama_torch.py, run with .pyenv's python), each with one thread and with every core, one
run of each setting per round, the rounds interleaved (ROUNDS, default 5). Prints each run's
tokens/s, then the medians, the spread (min-max) and cddp / transformers. Target: 1.5x.
"""
import os
import statistics
import sys

from interleaved import rounds

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPE = {"n_layer": 4, "n_embd": 256, "n_head": 8, "n_kv_head": 4}


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: llama_vs_torch.py BUILD_DIR [ROUNDS] [ITERS]")
    build, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5
    iters = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    cores = os.cpu_count() or 1
    py = os.path.join(HERE, "..", ".pyenv", "bin", "python")
    shape = [f for k, v in SHAPE.items() for f in ("--" + k, str(v))]
    cddp = [os.path.join(build, "bin", "gpt_train"), "--arch", "llama", "--intermediate_size",
            "704", "--block_size", "128", "--batch_size", "8", "--bench", str(iters), "--json"]
    cddp += shape
    torch = [py, os.path.join(HERE, "llama_torch.py"), "--iters", str(iters)] + shape
    env = {t: dict(os.environ, OMP_NUM_THREADS=str(t), OPENBLAS_NUM_THREADS=str(t),
                   CDDP_LOG_LEVEL="error") for t in (1, cores)}
    seen = rounds("llama_vs_torch", [
        ("cddp1", cddp, env[1], {}), ("torch1", torch + ["--threads", "1"], env[1], {}),
        ("cddp_all", cddp, env[cores], {}),
        ("torch_all", torch + ["--threads", str(cores)], env[cores], {})], n)
    for what in ("1", "_all"):
        c = [j["tokens_per_s"] for j in seen["cddp" + what]]
        t = [j["tokens_per_s"] for j in seen["torch" + what]]
        print(f"{'one thread' if what == '1' else f'{cores} threads'}: cddp "
              f"{statistics.median(c):.0f} ({min(c):.0f}-{max(c):.0f}), transformers "
              f"{statistics.median(t):.0f} ({min(t):.0f}-{max(t):.0f}) tokens/s: "
              f"{statistics.median(c) / statistics.median(t):.2f}x")


main()
