#!/usr/bin/env python3
"""The PyTorch baseline of bench/gpu_ctr.sh: configs/wide_deep_ctr.pbtxt's model on one GPU.

Trains on the arrays bench/ctr_export writes from the same Criteo-layout files our workers read
(the same dense features and the same sparse ids: the export runs our reader), so the two sides
see identical inputs. The model, as ours builds it (model/model_plan.cc, ps_server/optimizer.cc):

  deep:  nn.EmbeddingBag(ids, 16, mode="mean"), initialised U(-0.05, 0.05), concatenated with
         the 13 dense features -> Linear 64 ReLU -> Linear 32 ReLU -> Linear 1 (Glorot uniform
         weights, zero biases)
  wide:  nn.EmbeddingBag(ids, 1, mode="sum"), zeros, added to the logit
  loss:  sigmoid cross-entropy, mean over the batch
  optimizers: Adam (lr 1e-3, fused) on the dense layers; Adagrad (lr 0.05, initial accumulator
         0.1, eps 1e-7) on the deep table; FTRL-proximal (lr --ftrl_lr, the config's 0.5;
         power -0.5, initial accumulator 0.1, l1 0.001, l2 0) on the wide table, as
         TensorFlow's and ours.

Tables live on the GPU with one row per distinct id of the data (train and test together: an
exact vocabulary, no hash collisions, like our tables without eviction) and one padding row;
each example's ids are a row of a [examples, 26] index tensor, padded with that row, which
EmbeddingBag leaves out of its sums and means. The whole data set is on the GPU before timing
starts; batches are taken in a fresh random order every epoch.

Two ways to train the tables (--tables), for the strongest baseline at each table size:
  sparse       sparse gradients (EmbeddingBag(sparse=True)): a step updates only its batch's
               rows; eager (its coalesce and torch's sparse Adagrad synchronise every step);
               --dense_compile 1 compiles the tower.
  dense_graph  dense gradients: a step sweeps every row (a zero gradient changes neither
               Adagrad's nor FTRL's row), with no synchronisation, so the whole step (forward,
               backward, capturable fused Adam, the tables' optimizers) is captured in one CUDA
               graph and replayed (PyTorch's documented whole-network capture). Fast while the
               tables are small; the sweep grows with them.
TF32 stays off, as on our side.

Prints one line per epoch and
  TORCH_CTR examples_per_second=X seconds=T epochs=E test_auc=A batch=B rows=U compile=0|1
"""
import argparse
import sys
import time

import numpy as np
import torch


def load(prefix, dense_dim):
    dense = np.fromfile(prefix + ".dense", dtype=np.float32)
    labels = np.fromfile(prefix + ".labels", dtype=np.float32)
    offsets = np.fromfile(prefix + ".offsets", dtype=np.int64)
    ids = np.fromfile(prefix + ".ids", dtype=np.int64)
    n = labels.shape[0]
    if dense.shape[0] != n * dense_dim or offsets.shape[0] != n + 1 or offsets[-1] != ids.shape[0]:
        sys.exit("torch_ctr.py: %s.* do not agree (examples %d, dense %d, offsets %d, ids %d)"
                 % (prefix, n, dense.shape[0], offsets.shape[0], ids.shape[0]))
    return dense.reshape(n, dense_dim), labels, offsets, ids


def auc(scores, labels):
    """Area under the ROC curve (Mann-Whitney, ties counted half)."""
    order = torch.argsort(scores)
    s = scores[order]
    y = labels[order]
    # Ranks 1..n, tied scores given their mean rank.
    _, inverse, counts = torch.unique_consecutive(s, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).to(torch.float64)
    mean_rank = ends - (counts.to(torch.float64) - 1) / 2
    ranks = mean_rank[inverse]
    pos = y.sum().item()
    neg = y.numel() - pos
    if pos == 0 or neg == 0:
        return float("nan")
    return ((ranks * y).sum().item() - pos * (pos + 1) / 2) / (pos * neg)


class Tower(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.l1 = torch.nn.Linear(width, 64)
        self.l2 = torch.nn.Linear(64, 32)
        self.l3 = torch.nn.Linear(32, 1)
        for l in (self.l1, self.l2, self.l3):
            torch.nn.init.xavier_uniform_(l.weight)
            torch.nn.init.zeros_(l.bias)

    def forward(self, x):
        x = torch.relu(self.l1(x))
        x = torch.relu(self.l2(x))
        return self.l3(x).squeeze(1)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train", required=True, help="ctr_export's prefix of the training set")
    p.add_argument("--test", required=True, help="ctr_export's prefix of the test set")
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--dense_dim", type=int, default=13)
    p.add_argument("--dense_compile", type=int, default=0, help="1: torch.compile the tower")
    p.add_argument("--tables", choices=["sparse", "dense_graph"], default="sparse",
                   help="sparse: sparse gradients, the rows of the batch updated; dense_graph: "
                   "dense gradients, every row updated (a zero gradient changes nothing), the "
                   "whole step captured in one CUDA graph")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--ftrl_lr", type=float, default=0.5,
                   help="the wide table's FTRL learning rate (gpu_ctr.sh passes the config's)")
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(args.seed)
    dev = torch.device("cuda")

    t_load = time.time()
    tr = load(args.train, args.dense_dim)
    te = load(args.test, args.dense_dim)
    ids_all = torch.from_numpy(np.concatenate([tr[3], te[3]])).to(dev)
    vocab, index = torch.unique(ids_all, return_inverse=True)
    rows = vocab.numel()
    n_train_ids = tr[3].shape[0]

    def to_dev(d, index_part):
        """Dense features, labels and the ids as [examples, 26]: each example's ids, then
        `rows` (the padding row, which EmbeddingBag leaves out of sums and means)."""
        dense, labels, offsets, _ = d
        offsets = torch.from_numpy(offsets).to(dev)
        lengths = offsets[1:] - offsets[:-1]
        width = max(1, int(lengths.max().item()) if lengths.numel() else 1)
        padded = torch.full((lengths.numel(), width), rows, dtype=torch.int64, device=dev)
        example = torch.repeat_interleave(torch.arange(lengths.numel(), device=dev), lengths)
        column = torch.arange(index_part.numel(), device=dev) - offsets[:-1][example]
        padded[example, column] = index_part
        return (torch.from_numpy(dense).to(dev), torch.from_numpy(labels).to(dev), padded)

    train = to_dev(tr, index[:n_train_ids])
    test = to_dev(te, index[n_train_ids:])
    del ids_all, vocab, index
    n = train[1].numel()
    print("torch_ctr: %d training and %d test examples, %d rows per table, loaded in %.1f s"
          % (n, test[1].numel(), rows, time.time() - t_load), flush=True)

    # One row more than the ids: the padding row (index `rows`), never trained.
    sparse = args.tables == "sparse"
    graph = not sparse
    deep = torch.nn.EmbeddingBag(rows + 1, 16, mode="mean", sparse=sparse,
                                 padding_idx=rows).to(dev)
    with torch.no_grad():
        torch.nn.init.uniform_(deep.weight, -0.05, 0.05)
        deep.weight[rows].zero_()
    wide = torch.nn.EmbeddingBag(rows + 1, 1, mode="sum", sparse=sparse,
                                 padding_idx=rows).to(dev)
    torch.nn.init.zeros_(wide.weight)
    tower = Tower(args.dense_dim + 16).to(dev)
    tower_fn = torch.compile(tower) if args.dense_compile and not graph else tower
    adam = torch.optim.Adam(tower.parameters(), lr=1e-3, eps=1e-7, fused=True, capturable=graph)
    adagrad = torch.optim.Adagrad([deep.weight], lr=0.05, initial_accumulator_value=0.1, eps=1e-7)
    deep_accum = torch.full_like(deep.weight, 0.1) if graph else None
    # FTRL-proximal state of the wide table (TensorFlow's formulation, as ps_server's).
    ftrl_lr, ftrl_l1 = args.ftrl_lr, 0.001
    ftrl_accum = torch.full((rows + 1,), 0.1, device=dev)
    ftrl_linear = torch.zeros(rows + 1, device=dev)
    loss_fn = torch.nn.BCEWithLogitsLoss()

    def logits(d, sel):
        ids = d[2][sel]
        x = torch.cat([d[0][sel], deep(ids)], dim=1)
        return tower_fn(x) + wide(ids).squeeze(1)

    def ftrl(idx, grad):
        """FTRL-proximal on rows idx of the wide table (all rows when idx is None)."""
        sel = slice(None) if idx is None else idx
        w = wide.weight.data[sel, 0]
        acc = ftrl_accum[sel]
        acc_new = acc + grad * grad
        lin = ftrl_linear[sel] + grad - (acc_new.sqrt() - acc.sqrt()) / ftrl_lr * w
        quad = acc_new.sqrt() / ftrl_lr
        w_new = torch.where(lin.abs() > ftrl_l1, (torch.sign(lin) * ftrl_l1 - lin) / quad,
                            torch.zeros_like(lin))
        ftrl_linear[sel] = lin
        ftrl_accum[sel] = acc_new
        wide.weight.data[sel, 0] = w_new

    def tables_step():
        """The tables' optimizers, after backward."""
        if sparse:
            adagrad.step()
            g = wide.weight.grad.coalesce()
            ftrl(g.indices()[0], g.values().squeeze(1))
            return
        # Every row: a row the batch did not touch has a zero gradient, which Adagrad and FTRL
        # leave unchanged.
        g = deep.weight.grad
        deep_accum.addcmul_(g, g)
        deep.weight.data.addcdiv_(g, deep_accum.sqrt().add_(1e-7), value=-0.05)
        ftrl(None, wide.weight.grad[:, 0])

    def train_step(sel):
        loss = loss_fn(logits(train, sel), train[1][sel])
        loss.backward()
        adam.step()
        tables_step()
        return loss

    def clear_grads():
        for t in (deep.weight, wide.weight, *tower.parameters()):
            t.grad = None

    def evaluate():
        scores = []
        with torch.no_grad():
            m = test[1].numel()
            for b in range(0, m, 65536):
                sel = torch.arange(b, min(m, b + 65536), device=dev)
                scores.append(logits(test, sel))
        return auc(torch.cat(scores).double(), test[1].double())

    # Untimed passes of a full and of the epoch's last, shorter batch (allocations, cuBLAS
    # handles, compilation for both shapes), with no update.
    for size in sorted({min(n, args.batch), n % args.batch} - {0}):
        warm = torch.arange(size, device=dev)
        loss_fn(logits(train, warm), train[1][warm]).backward()
        clear_grads()
    torch.cuda.synchronize()

    full = torch.arange(min(n, args.batch), device=dev)  # the batch the graph reads
    if graph:
        # The whole step (forward, backward, Adam, the tables' optimizers) captured in one CUDA
        # graph, replayed once per full batch (PyTorch's documented whole-network capture).
        # The warm-up steps it needs update the model: every parameter and optimizer state is
        # put back afterwards, so training starts from the same state as the sparse variant.
        state = [deep.weight, wide.weight, *tower.parameters(), deep_accum, ftrl_accum,
                 ftrl_linear]
        saved = [t.detach().clone() for t in state]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                clear_grads()
                train_step(full)
        torch.cuda.current_stream().wait_stream(side)
        clear_grads()
        step_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(step_graph):
            graph_loss = train_step(full)
        with torch.no_grad():
            for t, v in zip(state, saved):
                t.copy_(v)
            for st in adam.state.values():
                for v in st.values():
                    v.zero_()
        del saved
        torch.cuda.synchronize()

    steps = 0
    timed = 0.0
    for epoch in range(args.epochs):
        perm = torch.randperm(n, device=dev)
        torch.cuda.synchronize()
        t0 = time.time()
        for b in range(0, n, args.batch):
            sel = perm[b:b + args.batch]
            if graph and sel.numel() == full.numel():
                full.copy_(sel)
                step_graph.replay()
                loss = graph_loss
            else:
                clear_grads()
                loss = train_step(sel)
                clear_grads()
            steps += 1
        torch.cuda.synchronize()
        timed += time.time() - t0
        print("torch_ctr: epoch %d: %.0f examples/s, loss %.4f" % (epoch + 1, n / (time.time() - t0),
                                                                 loss.item()), flush=True)
    test_auc = evaluate()
    print("TORCH_CTR examples_per_second=%.0f seconds=%.2f epochs=%d test_auc=%.4f batch=%d "
          "rows=%d tables=%s compile=%d steps=%d"
          % (n * args.epochs / timed, timed, args.epochs, test_auc, args.batch, rows, args.tables,
             args.dense_compile and not graph, steps))


if __name__ == "__main__":
    main()
