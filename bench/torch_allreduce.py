"""torch_allreduce.py: torch.distributed (gloo) allreduce measured like cddp-bench-allreduce
(float32 sum, in place, each call timed after a refill), for bench/compare_allreduce.sh."""
import json
import sys
import time

import torch
import torch.distributed as dist

min_b, max_b, iters, warmup = int(sys.argv[1]), int(sys.argv[2]), 20, 5
dist.init_process_group("gloo")
rank, n = dist.get_rank(), dist.get_world_size()
b = min_b
while b <= max_b:
    t = torch.empty(b // 4)
    total = 0.0
    for k in range(warmup + iters):
        t.fill_(rank + 1)
        t0 = time.perf_counter()
        dist.all_reduce(t)
        if k >= warmup:
            total += time.perf_counter() - t0
    wrong = int((t != n * (n + 1) / 2).sum())
    if rank == 0:
        s = total / iters
        print(json.dumps({"impl": "gloo", "ranks": n, "bytes": b,
                          "time_us_inplace": round(s * 1e6, 2),
                          "busbw_inplace": round(b / s / 1e9 * 2 * (n - 1) / n, 3),
                          "wrong_inplace": wrong}), flush=True)
    b *= 2
dist.destroy_process_group()
