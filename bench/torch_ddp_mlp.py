#!/usr/bin/env python3
"""PyTorch DistributedDataParallel baseline of bench/gpu_train.sh: the MLP of configs/mlp.pbtxt
on several GPUs of one host, one process per GPU, NCCL.

Start with torchrun (python3 -m torch.distributed.run --standalone --nproc_per_node=G
bench/torch_ddp_mlp.py --data=DIR --batch_size=B). Each process trains the same network as
bench/torch_mlp.py (784 -> 256 -> 256 -> 10, ReLU, softmax cross-entropy, Adam 1e-3, FP32 with
TF32 off) on its own shard of Fashion-MNIST's training images (rank r takes every G-th image),
held on its GPU, with --batch_size examples per GPU per step; DDP averages the gradients over
the GPUs with NCCL all-reduce, overlapped with backward (its default bucketing). After
--warmup_seconds it times --seconds (a barrier and torch.cuda.synchronize() at both ends) and
rank 0 prints
  TORCH_DDP gpus=G batch_per_gpu=B steps=N seconds=S examples_per_second=X step_ms=X
where examples_per_second counts every GPU's examples. NVLink multicast stays off
(NCCL_NVLS_ENABLE=0, set here unless the environment sets it).
"""
import argparse
import gzip
import os
import sys
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def read_idx(path, offset):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="folder with the Fashion-MNIST .gz files")
    p.add_argument("--batch_size", type=int, default=128, help="examples per GPU per step")
    p.add_argument("--warmup_seconds", type=float, default=3)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(a.seed)

    images = read_idx(os.path.join(a.data, "train-images-idx3-ubyte.gz"), 16)
    labels = read_idx(os.path.join(a.data, "train-labels-idx1-ubyte.gz"), 8)
    n_all = labels.shape[0]
    x_all = images.reshape(n_all, 784).astype(np.float32)[rank::world] / 255.0
    y_all = labels.astype(np.int64)[rank::world]
    n = y_all.shape[0]
    x_all = torch.from_numpy(x_all).to(dev)
    y_all = torch.from_numpy(y_all).to(dev)

    model = torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10)).to(dev)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()

    def batches():
        while True:
            perm = torch.randperm(n, device=dev)
            # Whole batches only: every rank takes the same number of steps.
            for i in range(0, n - a.batch_size + 1, a.batch_size):
                idx = perm[i:i + a.batch_size]
                yield x_all[idx], y_all[idx]

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    it = batches()
    chunk = 20  # steps between clock reads
    start = time.perf_counter()
    while time.perf_counter() - start < a.warmup_seconds:
        for _ in range(chunk):
            loss = step(*next(it))
        torch.cuda.synchronize(dev)
    # Every rank runs the same number of steps: rank 0 decides when to stop.
    dist.barrier()
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    steps = 0
    stop = torch.zeros(1, device=dev)
    while True:
        for _ in range(chunk):
            loss = step(*next(it))
            steps += 1
        if rank == 0 and time.perf_counter() - t0 >= a.seconds:
            stop.fill_(1)
        dist.broadcast(stop, 0)
        if stop.item() > 0:
            break
    torch.cuda.synchronize(dev)
    dist.barrier()
    seconds = time.perf_counter() - t0
    if rank == 0:
        examples = steps * a.batch_size * world
        print(f"TORCH_DDP gpus={world} batch_per_gpu={a.batch_size} steps={steps} "
              f"seconds={seconds:.3f} examples_per_second={examples / seconds:.1f} "
              f"step_ms={1e3 * seconds / steps:.4f} loss={loss.item():.4f} "
              f"torch={torch.__version__}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
