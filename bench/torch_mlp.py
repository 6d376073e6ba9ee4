#!/usr/bin/env python3
"""PyTorch baseline of bench/gpu_train.sh: the MLP of configs/mlp.pbtxt trained on one GPU.

The same network (784 -> 256 -> 256 -> 10, ReLU, softmax cross-entropy), optimizer (Adam,
learning rate 1e-3) and data (Fashion-MNIST's 60,000 training images from the same idx .gz
files, read with gzip + numpy, pixels / 255) as the cluster's worker, in plain eager PyTorch:
the whole training set lives on the GPU, each epoch is a fresh permutation on the GPU, and a
step is index -> forward -> loss -> backward -> Adam, with no host synchronization inside
the loop (the idiomatic fast path). Matrix products are full FP32 (TF32 off), as the
cluster's cuBLAS kernels are. Not modelled: configs/mlp.pbtxt's learning-rate decay (a
per-update scalar on the ps; no effect on speed worth a scheduler call here).

After --warmup_seconds of training it times --seconds more (torch.cuda.synchronize() before
starting and after the last step, so queued GPU work is counted) and prints
  TORCH_MLP device=<name> batch=B steps=N examples=N seconds=S examples_per_second=X step_ms=X
"""
import argparse
import gzip
import os
import sys
import time

import numpy as np
import torch


def read_idx(path, offset):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="folder with the Fashion-MNIST .gz files")
    p.add_argument("--batch_size", type=int, default=128)
    p.add_argument("--warmup_seconds", type=float, default=3)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--device", default="cuda:0", help="cuda:N, or cpu to try the script")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()

    if not torch.cuda.is_available() and a.device.startswith("cuda"):
        print("torch_mlp.py: CUDA is not available to PyTorch", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(a.seed)
    dev = torch.device(a.device)

    images = read_idx(os.path.join(a.data, "train-images-idx3-ubyte.gz"), 16)
    labels = read_idx(os.path.join(a.data, "train-labels-idx1-ubyte.gz"), 8)
    n = labels.shape[0]
    x_all = torch.from_numpy(images.reshape(n, 784).astype(np.float32) / 255.0).to(dev)
    y_all = torch.from_numpy(labels.astype(np.int64)).to(dev)

    model = torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()

    def batches():
        while True:
            perm = torch.randperm(n, device=dev)
            for i in range(0, n, a.batch_size):
                idx = perm[i:i + a.batch_size]
                yield x_all[idx], y_all[idx], min(a.batch_size, n - i)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    it = batches()
    # Warm-up: allocator, cuBLAS handles and heuristics, Adam's state.
    start = time.perf_counter()
    # Steps between clock reads: enough to keep the GPU's queue full, one on the CPU.
    chunk = 20 if dev.type == "cuda" else 1
    while time.perf_counter() - start < a.warmup_seconds:
        for _ in range(chunk):
            x, y, _ = next(it)
            loss = step(x, y)
        sync()
    steps = examples = 0
    sync()
    t0 = time.perf_counter()
    while True:
        for _ in range(chunk):
            x, y, b = next(it)
            loss = step(x, y)
            steps += 1
            examples += b
        if time.perf_counter() - t0 >= a.seconds:
            break
    sync()
    seconds = time.perf_counter() - t0
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else str(dev)
    print(f"TORCH_MLP device={name.replace(' ', '_')} batch={a.batch_size} steps={steps} "
          f"examples={examples} seconds={seconds:.3f} "
          f"examples_per_second={examples / seconds:.1f} step_ms={1e3 * seconds / steps:.4f} "
          f"loss={loss.item():.4f} torch={torch.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
