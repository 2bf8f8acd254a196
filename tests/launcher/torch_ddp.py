"""torch_ddp.py: a torchrun-style script (env:// rendezvous, gloo): each rank contributes
rank + 1 to an allreduce and a DDP-wrapped Linear runs one step."""
import os

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
model = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))
model(torch.ones(2, 4)).sum().backward()
dist.barrier()
print(f"rank {rank} of {world}: allreduce sum {t.item()}", flush=True)
dist.destroy_process_group()
