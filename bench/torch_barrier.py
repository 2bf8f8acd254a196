"""torch_barrier.py: PyTorch's side of bench/launch_bench.sh: env:// rendezvous (rank 0's
TCPStore at MASTER_ADDR:MASTER_PORT), a gloo process group and one barrier."""
import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
