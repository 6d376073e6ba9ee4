#!/usr/bin/env python3
"""PyTorch baseline of bench/gpu_train.sh for any model config: the network of --model built
from the config file itself (ModelConfig.network, or the dense `layers` of an MLP config).

The config is read by a small parser of the protocol-buffer text format subset our configs use
(nested messages in {} or <>, scalar fields with numbers, enums, true/false and quoted strings,
repeated fields, [a, b] lists, # comments); no protobuf library is needed. Each layer of
proto/model_config.proto becomes the PyTorch equivalent with the cluster's NHWC semantics:
  input        [N, H*W*C] -> [N, C, H, W] in torch.channels_last memory (NHWC in memory, as
               ours), from input_shape; a flat [N, input_dim] without it
  conv2d       torch.nn.Conv2d, padding exactly as TensorFlow: VALID none, SAME
               total = max((ceil(in / s) - 1) * s + k - in, 0), the extra row/column at the
               bottom/right (F.pad before the convolution when it is not symmetric, e.g. 3x3 at
               stride 2 on an even size); no bias unless use_bias; then the activation.
               Kernels He normal (truncated normal, stddev sqrt(2 / fan_in) / .87962566, Keras's)
               unless kernel_initializer says otherwise
  batch_norm   BatchNorm2d (BatchNorm1d on a flat input), PyTorch momentum = 1 - Keras momentum
               (default 0.99), eps = epsilon (default 0.001); PyTorch's running variance uses
               Bessel's correction, as TensorFlow's fused kernel
  max_pool     F.max_pool2d (SAME padding with -inf, as TensorFlow), default 2x2 stride 2
  average_pool F.avg_pool2d; with SAME padding divided by the positions inside the input (the
               zero-padded sum over the zero-padded count of ones), as TensorFlow
  global_average_pool  the mean over H and W
  flatten      NHWC order (permute to NHWC, then flatten), so the next dense kernel's rows are
               in our order
  activation   relu, sigmoid, tanh or linear
  add          the sum of its inputs, then its activation
  dense        torch.nn.Linear (Glorot uniform kernel, zero bias unless set), then activation
The loss is softmax cross-entropy; the optimizer Adam with the config's learning rate, betas
and epsilon (default 1e-3, 0.9, 0.999, 1e-7 as our ps), and its learning-rate decay
(TensorFlow's exponential_decay, not staircase, per update) unless --no_decay.

Data, as bench/torch_mlp.py: Fashion-MNIST's training images from the idx .gz files in --data
(gzip + numpy, pixels / 255), all on the device, a fresh random permutation each epoch, the
epoch's last (short) batch included (not under --capture or --ddp: whole batches only); the
config's augmentation (ResNet-20's random shift and mirror) on the device in every mode;
FP32 with TF32 off for matmul and cuDNN; torch.backends.cudnn.benchmark on.

--capture, on one GPU (not with --ddp; --device=cpu exits 2: CUDA graphs need CUDA):
  none       (default) eager PyTorch: per step the gather, augmentation, forward, backward and
             torch.optim.Adam's default implementation, launched op by op from Python.
  graph      the whole training step in ONE CUDA graph, replayed per step (PyTorch's "whole
             network capture", torch.cuda.graph): in the graph, the batch's indices are read
             from a static permutation tensor at a position held on the device (which the graph
             advances), the batch gathered from the device-resident data, augmented (the CUDA
             RNG draws new numbers on every replay), the learning rate tensor set to
             lr * rate ^ (updates / steps) from an update count on the device (the decay works
             as in eager), forward in training mode (batch norm's batch statistics and moving
             averages updated in the graph), loss, backward, and Adam with capturable=True and
             the learning rate as a tensor: fused=True where this PyTorch captures it, else
             foreach=True (--adam_impl; the output says which). Between epochs, outside the
             graph: a fresh permutation copied into the static one. Whole batches only: the
             epoch's last n mod B examples (a different set each epoch) are dropped, which the
             output's last_batch=dropped says. Needs PyTorch 2.1+.
  compile_graph  the model torch.compile'd (--compile_mode: default, or
             max-autotune-no-cudagraphs; none that makes CUDA graphs of its own), then the
             whole step captured as in graph. Without torch.compile or Triton it exits 1 with a
             message on stderr; a compile or capture error likewise.
  Before a capture: one forward and backward, then --warmup_steps (default 3) eager steps on a
  side stream (lazy Adam state, cuDNN autotuning and torch.compile happen there), the capture
  on the same stream with the gradients None (backward allocates them in the graph's pool), and
  one replay whose loss must be finite (else the next Adam implementation, else exit 1). Then
  the weights and batch-norm statistics are copied back (copy_) from a state_dict snapshot taken
  before any of it, Adam's state (step counts, moments) zeroed, and the learning rate, update
  count and position reset, all in place: training starts from the initial weights with a fresh
  optimizer while the graph keeps pointing at the same tensors. stderr gets the capture's time;
  the output lines setup_seconds (warm-up, compile and capture) and capture_seconds.
  Evaluation runs the eager (uncompiled) model in eval mode between replays.

Modes:
  (default)  speed: after --warmup_seconds of training, times --seconds more
             (torch.cuda.synchronize() at both ends) and prints
    TORCH_CNN device=<name> model=<name> batch=B steps=N examples=N seconds=S
              examples_per_second=X step_ms=X params=P loss=L torch=<version> capture=<mode>
              decay=<lr decay> adam=default|fused|foreach augment=on|off
              last_batch=kept|dropped [setup_seconds=S capture_seconds=S [compile_mode=M]]
             (under --capture, exit 1 if the final loss is not finite)
  --epochs N --eval: trains N full epochs and after each evaluates the test set (t10k files,
             moving batch-norm statistics) and prints
    TORCH_CNN_EPOCH model=<name> epoch=E steps=N train_loss=L test_loss=L test_accuracy=A
              seconds=S
             then TORCH_CNN_ACCURACY model=<name> epochs=N batch=B test_accuracy=A ...
             (--epochs without --eval: only the final evaluation; seconds include the
             evaluations; under --capture the line ends with the capture's fields)
  --target_accuracy A: time to accuracy, in any --capture mode. After the warm-up (eager too:
             --warmup_steps steps, and one of the short last batch's size, then the same
             in-place reset to the initial weights and a fresh Adam), trains with the clock
             running and, after every --eval_every_examples (default 30000, half an epoch)
             training examples (at the first step boundary past it), stops the clock
             (torch.cuda.synchronize() first), evaluates the whole test set and prints
    TORCH_CNN_EVAL model=<name> capture=<mode> examples=N train_seconds=S test_accuracy=A
              epochs=E steps=N train_loss=L test_loss=L
             then synchronizes and starts the clock again: evaluation time is excluded. When
             the test accuracy first reaches A, it prints and stops:
    TORCH_CNN_TTA model=<name> capture=<mode> batch=B target=A seconds=<training seconds>
              examples=N epochs=<fraction> test_accuracy=A reached=true ...
             or, after --max_epochs (default 30) epochs (evaluated at the end), the same line
             with seconds=inf reached=false. epochs counts passes over the data (steps / steps
             per epoch); warm-up, compile and capture happen before the clock starts.
  --ddp      under torchrun (python3 -m torch.distributed.run --standalone --nproc_per_node=G
             bench/torch_cnn.py --ddp --model=F --data=DIR --batch_size=B): one process per GPU,
             NCCL, DistributedDataParallel (static_graph on unless --ddp_static_graph=0,
             --bucket_cap_mb, default 25; buffers broadcast from rank 0 each step; plain per-GPU
             batch norm, as our workers), rank r training on every G-th image, --batch_size per
             GPU, whole batches only. With --capture: DDP is built on the capture's side stream,
             NCCL's asynchronous error handling is off (TORCH_NCCL_ASYNC_ERROR_HANDLING=0 unless
             set) and at least 11 eager DDP steps run before the capture, as PyTorch documents
             for capturing DDP's all-reduce in the graph; compile_graph compiles DDP around the
             model (--ddp_compile=outer: the compiled graph split at the buckets) or the model
             inside DDP (inner); only the first Adam implementation is tried. Speed: the
             protocol of bench/torch_ddp_mlp.py, and rank 0 prints
    TORCH_DDP_CNN model=<name> gpus=G batch_per_gpu=B steps=N seconds=S examples_per_second=X
              step_ms=X params=P loss=L torch=<version> capture=<mode> static_graph=0|1 ...
             where examples_per_second counts every GPU's examples. --target_accuracy: as on one
             GPU, examples counting every GPU's, each rank evaluating its copy and rank 0's
             accuracy deciding for all; rank 0 prints the lines (with gpus=G). NVLink multicast
             stays off (NCCL_NVLS_ENABLE=0 unless set). With --device=cpu: gloo on the CPU, to
             try it.
  --describe prints the layer list with shapes and the parameter count computed from the
             shapes (no PyTorch needed) and exits.
params counts trainable parameters (kernels, biases, batch norm's gamma and beta); bn_stats the
moving means and variances, which our ps also stores as variables.
"""
import argparse
import gzip
import importlib
import math
import os
import re
import sys
import time
import warnings

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except (ImportError, OSError):  # --describe works without them
    np = torch = F = None


# ---------------------------------------------------------------------------------------------
# Protocol-buffer text format (the subset our configs use).

_TOKEN = re.compile(r"""
    (?P<space>\s+|\#[^\n]*)
  | (?P<str>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<num>[-+]?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)[fF]?(?![A-Za-z_]))
  | (?P<id>-?[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<punct>[{}\[\]<>:,;])
""", re.VERBOSE)


class TextFormatError(ValueError):
    pass


def _tokens(text):
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            line = text.count("\n", 0, pos) + 1
            raise TextFormatError(f"line {line}: cannot read {text[pos:pos + 20]!r}")
        if m.lastgroup != "space":
            out.append((m.lastgroup, m.group(), text.count("\n", 0, pos) + 1))
        pos = m.end()
    return out


def _scalar(tok):
    kind, s, line = tok
    if kind == "str":
        return bytes(s[1:-1], "utf-8").decode("unicode_escape")
    if kind == "num":
        if re.fullmatch(r"[-+]?0[xX][0-9a-fA-F]+", s):
            return int(s, 16)
        t = s.rstrip("fF")
        if re.fullmatch(r"[-+]?\d+", t):
            return int(t)
        return float(t)
    if kind == "id":
        low = s.lower()
        if s in ("true", "True", "t"):
            return True
        if s in ("false", "False", "f"):
            return False
        if low in ("inf", "infinity", "-inf", "-infinity", "nan"):
            return float(low)
        return s  # an enum value's name
    raise TextFormatError(f"line {line}: expected a value, not {s!r}")


def parse_text_format(text):
    """The message in `text` as a dict: field name -> list of values (every field as if
    repeated, in order); a message value is such a dict, a scalar an int, float, bool or str."""
    toks = _tokens(text)
    pos = 0

    def peek():
        return toks[pos][1] if pos < len(toks) else None

    def take(expected=None):
        nonlocal pos
        if pos >= len(toks):
            raise TextFormatError(f"unexpected end of input (expected {expected or 'more'})")
        tok = toks[pos]
        if expected is not None and tok[1] != expected:
            raise TextFormatError(f"line {tok[2]}: expected {expected!r}, not {tok[1]!r}")
        pos += 1
        return tok

    def message(end):
        msg = {}
        while peek() != end:
            if end is None and pos >= len(toks):
                break
            kind, name, line = take()
            if kind != "id":
                raise TextFormatError(f"line {line}: expected a field name, not {name!r}")
            if name.startswith("-"):
                raise TextFormatError(f"line {line}: bad field name {name!r}")
            colon = peek() == ":"
            if colon:
                take(":")
            values = []
            nxt = peek()
            if nxt in ("{", "<"):
                take()
                values.append(message("}" if nxt == "{" else ">"))
                take("}" if nxt == "{" else ">")
            elif nxt == "[":
                take("[")
                while peek() != "]":
                    if peek() in ("{", "<"):
                        open_ = take()[1]
                        values.append(message("}" if open_ == "{" else ">"))
                        take("}" if open_ == "{" else ">")
                    else:
                        values.append(_scalar(take()))
                    if peek() == ",":
                        take(",")
                    elif peek() != "]":
                        raise TextFormatError(f"line {line}: expected ',' or ']' in {name}")
                take("]")
            else:
                if not colon:
                    raise TextFormatError(f"line {line}: expected ':' after {name}")
                values.append(_scalar(take()))
            msg.setdefault(name, []).extend(values)
            if peek() in (",", ";"):
                take()
        return msg

    msg = message(None)
    if pos != len(toks):
        raise TextFormatError(f"line {toks[pos][2]}: unexpected {toks[pos][1]!r}")
    return msg


def get(msg, name, default=None):
    """The last value of field `name` (proto3: the one that counts), or default."""
    v = (msg or {}).get(name)
    return v[-1] if v else default


def get_all(msg, name):
    return list((msg or {}).get(name, []))


# ---------------------------------------------------------------------------------------------
# The network as a plan: layers with their inputs and shapes (no PyTorch).

KINDS = ("dense", "conv2d", "batch_norm", "max_pool", "average_pool", "global_average_pool",
         "flatten", "activation", "add")


class Node:
    def __init__(self, name, kind, spec, inputs):
        self.name, self.kind, self.spec, self.inputs = name, kind, spec, inputs
        self.in_shape = None   # the (first) input's shape: (H, W, C) or (D,)
        self.out_shape = None
        self.params = {}       # trainable variable -> shape (our names, HWIO / [in, out])
        self.stats = {}        # batch norm's moving statistics -> shape
        self.pad = None        # conv2d and pools: (top, bottom, left, right)
        self.kernel = self.stride = None
        self.activation = "LINEAR"

    def describe(self):
        ins = ",".join(self.inputs)
        shape = "x".join(str(d) for d in self.out_shape)
        extra = ""
        if self.kind in ("conv2d", "max_pool", "average_pool"):
            extra = f" k={self.kernel} s={self.stride} pad(t,b,l,r)={self.pad}"
        if self.activation != "LINEAR":
            extra += f" {self.activation.lower()}"
        n = sum(math.prod(s) for s in self.params.values())
        return (f"{self.name:<14} {self.kind:<19} <- {ins:<22} -> {shape:<10} "
                f"params={n}{extra}")


def _same(size, k, s):
    out = -(-size // s)
    total = max((out - 1) * s + k - size, 0)
    return out, total // 2, total - total // 2


def _valid(size, k, s):
    return (size - k) // s + 1, 0, 0


class Plan:
    def __init__(self, config):
        self.config = config
        self.name = get(config, "name", "model")
        self.input_dim = int(get(config, "input_dim", 0))
        shape = get(config, "input_shape")
        if get_all(config, "embeddings"):
            raise ValueError("embedding layers are not supported by torch_cnn.py")
        loss = get(config, "loss", "SOFTMAX_CROSS_ENTROPY")
        if loss not in ("SOFTMAX_CROSS_ENTROPY", 0):
            raise ValueError(f"loss {loss} is not supported (softmax cross-entropy only)")
        if shape:
            h, w, c = (int(get(shape, k, 0)) for k in ("height", "width", "channels"))
            if h * w * c != self.input_dim:
                raise ValueError(f"input_shape {h}x{w}x{c} != input_dim {self.input_dim}")
            self.input_shape = (h, w, c)
        else:
            self.input_shape = (self.input_dim,)
        network = get_all(config, "network")
        layers = get_all(config, "layers")
        if network and layers:
            raise ValueError("set either `layers` or `network`, not both")
        if layers:  # an MLP config: each DenseLayer is a dense layer of the network
            network = [{"name": [get(d, "name", f"dense_{i}")], "dense": [d]}
                       for i, d in enumerate(layers)]
        if not network:
            raise ValueError("the config has no layers")
        self.nodes = []
        shapes = {"input": self.input_shape}
        for i, layer in enumerate(network):
            kinds = [k for k in KINDS if k in layer]
            if len(kinds) != 1:
                raise ValueError(f"network[{i}]: exactly one kind of {KINDS}, not {kinds}")
            kind = kinds[0]
            name = get(layer, "name", "") or f"{kind}_{i}"
            if name in shapes:
                raise ValueError(f"network[{i}]: the name {name!r} is taken")
            inputs = get_all(layer, "inputs") or [self.nodes[-1].name if self.nodes else "input"]
            for n in inputs:
                if n not in shapes:
                    raise ValueError(f"layer {name}: input {n!r} is not an earlier layer")
            node = Node(name, kind, get(layer, kind) or {}, inputs)
            node.in_shape = shapes[inputs[0]]
            if len(inputs) > 1 and kind != "add":
                raise ValueError(f"layer {name}: only add reads more than one input")
            self._infer(node, [shapes[n] for n in inputs])
            shapes[name] = node.out_shape
            self.nodes.append(node)
        self.output = self.nodes[-1].name
        read = {n for node in self.nodes for n in node.inputs}
        unread = [n.name for n in self.nodes[:-1] if n.name not in read]
        if unread:
            raise ValueError(f"layers whose output nothing reads: {unread}")
        self.params = sum(math.prod(s) for n in self.nodes for s in n.params.values())
        self.bn_stats = sum(math.prod(s) for n in self.nodes for s in n.stats.values())

    def _infer(self, node, in_shapes):
        s, x = node.spec, in_shapes[0]
        k = node.kind
        if k == "dense":
            if len(x) != 1:
                raise ValueError(f"layer {node.name}: dense needs a flat input (add a flatten)")
            units = int(get(s, "units", 0))
            node.params = {"kernel": (x[0], units), "bias": (units,)}
            node.activation = get(s, "activation", "LINEAR")
            node.out_shape = (units,)
        elif k in ("conv2d", "max_pool", "average_pool"):
            if len(x) != 3:
                raise ValueError(f"layer {node.name}: {k} needs an image input")
            if k == "conv2d":
                kernel = int(get(s, "kernel_size", 0))
                stride = int(get(s, "stride", 0)) or 1
                if kernel < 1:
                    raise ValueError(f"layer {node.name}: kernel_size must be >= 1")
            else:
                kernel = int(get(s, "pool_size", 0)) or 2
                stride = int(get(s, "stride", 0)) or kernel
            fn = _valid if get(s, "padding", "SAME") in ("VALID", 1) else _same
            oh, pt, pb = fn(x[0], kernel, stride)
            ow, pl, pr = fn(x[1], kernel, stride)
            if oh < 1 or ow < 1:
                raise ValueError(f"layer {node.name}: a {kernel}x{kernel} window does not fit "
                                 f"{x[0]}x{x[1]}")
            node.kernel, node.stride, node.pad = kernel, stride, (pt, pb, pl, pr)
            if k == "conv2d":
                filters = int(get(s, "filters", 0))
                node.params = {"kernel": (kernel, kernel, x[2], filters)}
                if get(s, "use_bias", False):
                    node.params["bias"] = (filters,)
                node.activation = get(s, "activation", "LINEAR")
                node.out_shape = (oh, ow, filters)
            else:
                node.out_shape = (oh, ow, x[2])
        elif k == "batch_norm":
            c = x[-1]
            node.params = {"gamma": (c,), "beta": (c,)}
            node.stats = {"moving_mean": (c,), "moving_variance": (c,)}
            node.momentum = float(get(s, "momentum", 0.99))
            node.epsilon = float(get(s, "epsilon", 0.001))
            node.out_shape = x
        elif k == "global_average_pool":
            if len(x) != 3:
                raise ValueError(f"layer {node.name}: global_average_pool needs an image input")
            node.out_shape = (x[2],)
        elif k == "flatten":
            node.out_shape = (math.prod(x),)
        elif k == "activation":
            node.activation = get(s, "activation", "LINEAR")
            node.out_shape = x
        elif k == "add":
            if len(in_shapes) < 2 or any(t != x for t in in_shapes):
                raise ValueError(f"layer {node.name}: add needs 2+ inputs of one shape, not "
                                 f"{in_shapes}")
            node.activation = get(s, "activation", "LINEAR")
            node.out_shape = x

    def describe(self):
        lines = [f"model {self.name}: input {'x'.join(map(str, self.input_shape))}, "
                 f"{len(self.nodes)} layers"]
        lines += ["  " + n.describe() for n in self.nodes]
        lines.append(f"params={self.params} bn_stats={self.bn_stats} "
                     f"({self.params / 1e6:.3f} M trainable)")
        return "\n".join(lines)

    def optimizer(self):
        """(learning_rate, beta1, beta2, epsilon, decay_rate, decay_steps) of the config's
        Adam (the only optimizer supported here)."""
        opt = get(self.config, "optimizer", {})
        adam = get(opt, "adam")
        if adam is None:
            raise ValueError("torch_cnn.py supports the Adam optimizer only")
        decay = get(opt, "decay", {})
        return (float(get(adam, "learning_rate", 0.001) or 0.001),
                float(get(adam, "beta1", 0.9) or 0.9), float(get(adam, "beta2", 0.999) or 0.999),
                float(get(adam, "epsilon", 1e-7) or 1e-7),
                float(get(decay, "decay_rate", 0) or 0), int(get(decay, "decay_steps", 0) or 0))


# ---------------------------------------------------------------------------------------------
# The network in PyTorch.

_ACT = {"LINEAR": None, 0: None, "RELU": "relu", 1: "relu", "SIGMOID": "sigmoid", 2: "sigmoid",
        "TANH": "tanh", 3: "tanh"}


def _activate(x, act):
    a = _ACT[act]
    if a == "relu":
        return F.relu(x)
    if a == "sigmoid":
        return torch.sigmoid(x)
    if a == "tanh":
        return torch.tanh(x)
    return x


def _init(t, spec, fan_in, fan_out, default):
    """Fills t as an InitializerSpec (model.proto) would; default: the kind when spec is unset."""
    kind = get(spec, "kind", default) if spec else default
    with torch.no_grad():
        if kind in ("ZEROS", 0):
            t.zero_()
        elif kind in ("CONSTANT", 1):
            t.fill_(float(get(spec, "value", 0)))
        elif kind in ("UNIFORM", 2):
            t.uniform_(float(get(spec, "min", 0)), float(get(spec, "max", 0)))
        elif kind in ("NORMAL", 3):
            t.normal_(float(get(spec, "mean", 0)), float(get(spec, "stddev", 0)))
        elif kind in ("TRUNCATED_NORMAL", 4):
            m, sd = float(get(spec, "mean", 0)), float(get(spec, "stddev", 0))
            torch.nn.init.trunc_normal_(t, m, sd, m - 2 * sd, m + 2 * sd)
        elif kind in ("GLOROT_UNIFORM", 5):
            lim = math.sqrt(6.0 / (fan_in + fan_out))
            t.uniform_(-lim, lim)
        elif kind in ("HE_NORMAL", 6):
            sd = math.sqrt(2.0 / fan_in) / 0.87962566103423978
            torch.nn.init.trunc_normal_(t, 0.0, sd, -2 * sd, 2 * sd)
        else:
            raise ValueError(f"initializer {kind} is not supported")


def build_model(plan):
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleDict()
            self.steps = []  # (name, kind, module or None, input names, node)
            for n in plan.nodes:
                mod = None
                if n.kind == "conv2d":
                    kh, kw, cin, cout = n.params["kernel"]
                    pt, pb, pl, pr = n.pad
                    sym = pt == pb and pl == pr
                    mod = torch.nn.Conv2d(cin, cout, n.kernel, n.stride,
                                          padding=(pt, pl) if sym else 0,
                                          bias="bias" in n.params)
                    n.sym = sym
                    _init(mod.weight, get(n.spec, "kernel_initializer"), cin * kh * kw,
                          cout * kh * kw, "HE_NORMAL")
                    if mod.bias is not None:
                        with torch.no_grad():
                            mod.bias.zero_()
                elif n.kind == "dense":
                    fin, fout = n.params["kernel"]
                    mod = torch.nn.Linear(fin, fout)
                    _init(mod.weight, get(n.spec, "kernel_initializer"), fin, fout,
                          "GLOROT_UNIFORM")
                    _init(mod.bias, get(n.spec, "bias_initializer"), fin, fout, "ZEROS")
                elif n.kind == "batch_norm":
                    bn = torch.nn.BatchNorm2d if len(n.in_shape) == 3 else torch.nn.BatchNorm1d
                    mod = bn(n.in_shape[-1], eps=n.epsilon, momentum=1.0 - n.momentum)
                if mod is not None:
                    # ModuleDict keys may not contain "."
                    self.layers[n.name.replace(".", "_")] = mod
                self.steps.append((n.name, n.kind, mod, n.inputs, n))
            self.image = len(plan.input_shape) == 3

        def forward(self, x):
            if self.image:
                h, w, c = plan.input_shape
                # [N, H*W*C] row-major NHWC -> logical NCHW whose memory is NHWC (channels_last)
                x = x.view(-1, h, w, c).permute(0, 3, 1, 2)
            outs = {"input": x}
            for name, kind, mod, inputs, n in self.steps:
                x = outs[inputs[0]]
                if kind == "conv2d":
                    if not n.sym:
                        pt, pb, pl, pr = n.pad
                        x = F.pad(x, (pl, pr, pt, pb))
                    x = _activate(mod(x), n.activation)
                elif kind == "dense":
                    x = _activate(mod(x), n.activation)
                elif kind == "batch_norm":
                    x = mod(x)
                elif kind == "max_pool":
                    pt, pb, pl, pr = n.pad
                    if pt or pb or pl or pr:
                        x = F.pad(x, (pl, pr, pt, pb), value=float("-inf"))
                    x = F.max_pool2d(x, n.kernel, n.stride)
                elif kind == "average_pool":
                    pad = (n.pad[2], n.pad[3], n.pad[0], n.pad[1])
                    if any(pad):
                        ones = torch.ones_like(x[:1, :1])
                        x = (F.avg_pool2d(F.pad(x, pad), n.kernel, n.stride) /
                             F.avg_pool2d(F.pad(ones, pad), n.kernel, n.stride))
                    else:
                        x = F.avg_pool2d(x, n.kernel, n.stride)
                elif kind == "global_average_pool":
                    x = x.mean(dim=(2, 3))
                elif kind == "flatten":
                    x = x.permute(0, 2, 3, 1).reshape(x.shape[0], -1) if x.dim() == 4 else x
                elif kind == "activation":
                    x = _activate(x, n.activation)
                elif kind == "add":
                    for other in inputs[1:]:
                        x = x + outs[other]
                    x = _activate(x, n.activation)
                outs[name] = x
            return outs[plan.output]

    return Net()


# ---------------------------------------------------------------------------------------------
# Training.

def read_idx(path, offset):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def load(data, prefix, input_dim):
    images = read_idx(os.path.join(data, f"{prefix}-images-idx3-ubyte.gz"), 16)
    labels = read_idx(os.path.join(data, f"{prefix}-labels-idx1-ubyte.gz"), 8)
    n = labels.shape[0]
    if images.size != n * input_dim:
        raise ValueError(f"{prefix} images have {images.size // n} pixels, the model "
                         f"input_dim {input_dim}")
    return images.reshape(n, input_dim).astype(np.float32) / 255.0, labels.astype(np.int64)


def snapshot(model):
    """A copy of the model's parameters and buffers (batch norm's statistics too): what
    restore() puts back."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def restore(model, saved, opt):
    """Puts the weights and buffers of `saved` back into the model's own tensors (copy_) and
    zeroes Adam's state (step counts, moments) in place, so that training starts again from the
    initial weights while a captured CUDA graph keeps pointing at the same memory. Adam's state
    starts as zeros, so zeroing it is the same as a new optimizer."""
    with torch.no_grad():
        for k, v in model.state_dict().items():
            v.copy_(saved[k])
        for state in opt.state.values():
            for k, v in state.items():
                if torch.is_tensor(v):
                    v.zero_()
                else:
                    state[k] = 0


class CapturedStep:
    """The whole training step in one CUDA graph (--capture graph and compile_graph): the
    batch's indices taken from a static permutation at a position held on the device, the
    gather from the device-resident data, the augmentation, forward (in training mode), loss,
    backward, the learning-rate decay and a capturable Adam (the learning rate a tensor), all
    replayed by one graph.replay() per step. Only whole batches: an epoch is n // batch replays.

    Not thread-safe. Lifecycle: CapturedStep(...) -> capture() once -> epoch_steps() any number
    of times, each one epoch. capture() leaves the weights, batch-norm statistics and Adam's
    state as they were at construction (restore()); so does reset()."""

    def __init__(self, model, fwd, augment, x_all, y_all, batch, lr, betas, eps, decay_rate,
                 decay_steps, side=None):
        self.model, self.fwd, self.augment = model, fwd, augment  # fwd: model or its compiled form
        self.x_all, self.y_all, self.batch = x_all, y_all, batch
        self.dev = x_all.device
        self.n = y_all.shape[0]
        self.steps_per_epoch = self.n // batch
        self.lr, self.betas, self.eps = lr, betas, eps
        self.decay_rate, self.decay_steps = decay_rate, decay_steps
        self.decaying = decay_rate > 0 and decay_steps > 0
        self.loss_fn = torch.nn.CrossEntropyLoss()
        # Static inputs of the graph: the epoch's permutation, the position in it, the number of
        # updates so far (for the decay) and the learning rate Adam reads.
        self.perm = torch.randperm(self.n, device=self.dev)
        self.pos = torch.zeros((), dtype=torch.int64, device=self.dev)
        self.offsets = torch.arange(batch, dtype=torch.int64, device=self.dev)
        self.updates = torch.zeros((), dtype=torch.float64, device=self.dev)
        self.lr_t = torch.full((), lr, dtype=torch.float32, device=self.dev)
        # The stream of the warm-up and the capture (DDP's: it must be built on it).
        self.side = side if side is not None else torch.cuda.Stream(self.dev)
        self.saved = snapshot(model)  # before any warm-up step
        self.opt = self.graph = self.loss = None
        self.adam = None              # the Adam implementation captured: fused or foreach
        self.capture_seconds = None

    def _loss(self):
        idx = torch.index_select(self.perm, 0, self.pos + self.offsets)
        self.pos.add_(self.batch)
        x = self.augment(torch.index_select(self.x_all, 0, idx))
        y = torch.index_select(self.y_all, 0, idx)
        return self.loss_fn(self.fwd(x), y)

    def _step(self):
        """One training step, as device work only: no host synchronization, fixed shapes."""
        loss = self._loss()
        if self.decaying:
            # As step() in main: the t-th update uses lr * rate ^ ((t - 1) / steps).
            self.lr_t.copy_(torch.pow(self.decay_rate, self.updates / self.decay_steps) * self.lr)
            self.updates.add_(1)
        loss.backward()
        self.opt.step()
        return loss

    def _on_side_stream(self, fn, times):
        """Runs fn `times` times eagerly on the side stream that the capture uses too (as
        PyTorch's documentation warms up before a capture: lazy initialization, cuDNN's
        autotuning and torch.compile's compilation happen here, not in the graph)."""
        self.side.wait_stream(torch.cuda.current_stream(self.dev))
        with torch.cuda.stream(self.side), warnings.catch_warnings():
            # Adam's note that a capturable instance runs uncaptured: here it is meant to.
            warnings.filterwarnings("ignore", message=".*capturable=True.*")
            for _ in range(times):
                fn()
        torch.cuda.current_stream(self.dev).wait_stream(self.side)

    def _forward_backward(self):
        self._loss().backward()

    def capture(self, impls, warmup_steps):
        """Warms up and captures the step with the first Adam implementation of `impls`
        ("fused", "foreach") that captures and replays to a finite loss; raises RuntimeError
        when none does, or the error of the plain forward and backward (e.g. torch.compile's)."""
        if self.steps_per_epoch < 1:
            raise RuntimeError(f"{self.n} training examples make no whole batch of {self.batch}")
        # Forward and backward alone first: a failing torch.compile shows here, not retried.
        self.pos.zero_()
        self._on_side_stream(self._forward_backward, 1)
        for p in self.model.parameters():
            p.grad = None
        errors = []
        for impl in impls:
            try:
                self._capture(impl, warmup_steps)
                self.adam = impl
                self.reset()
                return
            except Exception as e:  # noqa: BLE001 -- reported, then the next implementation
                errors.append(f"Adam {impl}: {type(e).__name__}: {e}")
                print(f"torch_cnn.py: capturing the step with Adam {impl} failed: "
                      f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
                self.opt = self.graph = self.loss = None
                for p in self.model.parameters():
                    p.grad = None
                torch.cuda.synchronize(self.dev)
        raise RuntimeError("; ".join(errors))

    def _capture(self, impl, warmup_steps):
        kind = {"fused": True} if impl == "fused" else {"foreach": True}
        self.opt = torch.optim.Adam(self.model.parameters(), lr=self.lr_t, betas=self.betas,
                                    eps=self.eps, capturable=True, **kind)
        # The tensor that Adam reads (should a version copy the one given).
        self.lr_t = self.opt.param_groups[0]["lr"]
        if not torch.is_tensor(self.lr_t) or self.lr_t.device != self.dev:
            raise RuntimeError(f"Adam keeps the learning rate as {self.lr_t!r}, not as a tensor "
                               f"on {self.dev}")
        self.reset()

        def warm():
            self.opt.zero_grad(set_to_none=True)
            self._step()

        self._on_side_stream(warm, max(1, min(warmup_steps, self.steps_per_epoch)))
        self.pos.zero_()
        # The gradients are None at capture: backward then allocates them from the graph's
        # private memory pool, where every replay writes them.
        self.opt.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize(self.dev)
        t0 = time.perf_counter()
        with torch.cuda.graph(graph, stream=self.side):
            loss = self._step()
        torch.cuda.synchronize(self.dev)
        self.capture_seconds = time.perf_counter() - t0
        graph.replay()
        value = loss.item()
        if not math.isfinite(value):
            raise RuntimeError(f"the loss after a replay is {value}")
        self.graph, self.loss = graph, loss

    def reset(self):
        """The initial weights, statistics and Adam state again, the learning rate and update
        count at their start; all in place."""
        restore(self.model, self.saved, self.opt)
        self.lr_t.fill_(self.lr)
        self.updates.zero_()
        self.pos.zero_()

    def epoch_steps(self):
        """One epoch: a fresh permutation, then n // batch replays; yields (the loss tensor,
        which each replay overwrites, and the batch's examples) after each."""
        self.perm.copy_(torch.randperm(self.n, device=self.dev))
        self.pos.zero_()
        for _ in range(self.steps_per_epoch):
            self.graph.replay()
            yield self.loss, self.batch


def torch_version():
    m = re.match(r"(\d+)\.(\d+)", torch.__version__)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="configs/resnet20.pbtxt", help="model config (text format)")
    p.add_argument("--data", help="folder with the Fashion-MNIST .gz files")
    p.add_argument("--batch_size", type=int, default=128, help="per GPU with --ddp")
    p.add_argument("--warmup_seconds", type=float, default=3)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--device", default="cuda:0", help="cuda:N, or cpu to try the script")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--epochs", type=int, default=0, help="train this many epochs (accuracy mode)")
    p.add_argument("--eval", action="store_true", help="with --epochs: evaluate after each epoch")
    p.add_argument("--max_train_examples", type=int, default=0, help="0: all (for trying)")
    p.add_argument("--max_test_examples", type=int, default=0, help="0: all (for trying)")
    p.add_argument("--no_decay", action="store_true", help="ignore the config's lr decay")
    p.add_argument("--no_channels_last", action="store_true")
    p.add_argument("--ddp", action="store_true", help="DistributedDataParallel under torchrun")
    p.add_argument("--ddp_static_graph", type=int, choices=(0, 1), default=1,
                   help="with --ddp: DDP's static_graph (the same parameters used every step)")
    p.add_argument("--bucket_cap_mb", type=float, default=25,
                   help="with --ddp: DDP's gradient bucket size in MB")
    p.add_argument("--ddp_compile", choices=("outer", "inner"), default="outer",
                   help="with --ddp --capture compile_graph: torch.compile(DDP(model)) (outer: "
                        "the compiled graph split at DDP's buckets) or DDP(torch.compile(model))")
    p.add_argument("--capture", choices=("none", "graph", "compile_graph"), default="none",
                   help="none: eager; graph: the whole step in one CUDA graph; compile_graph: "
                        "torch.compile'd model, then the same")
    p.add_argument("--compile_mode", default="default",
                   help="torch.compile mode for compile_graph: default or "
                        "max-autotune-no-cudagraphs (not one with CUDA graphs of its own)")
    p.add_argument("--adam_impl", choices=("auto", "fused", "foreach"), default="auto",
                   help="capturable Adam under --capture; auto: fused, else foreach")
    p.add_argument("--warmup_steps", type=int, default=3,
                   help="eager steps before a capture (and before --target_accuracy's clock)")
    p.add_argument("--target_accuracy", type=float, default=0,
                   help="time to this test accuracy (a fraction, e.g. 0.9)")
    p.add_argument("--eval_every_examples", type=int, default=30000,
                   help="with --target_accuracy: evaluate after every this many examples")
    p.add_argument("--max_epochs", type=int, default=30,
                   help="with --target_accuracy: give up after this many epochs")
    p.add_argument("--describe", action="store_true",
                   help="print the layers and parameter count, and exit")
    a = p.parse_args()

    with open(a.model) as f:
        plan = Plan(parse_text_format(f.read()))
    if a.describe:
        print(plan.describe())
        return 0
    if torch is None:
        print("torch_cnn.py: PyTorch (and numpy) are not installed", file=sys.stderr)
        return 1
    if not a.data:
        p.error("--data is required")
    if a.ddp and a.epochs:
        p.error("--ddp measures speed or --target_accuracy, not --epochs")
    if a.epochs and a.target_accuracy:
        p.error("--epochs and --target_accuracy are different modes: choose one")
    if a.target_accuracy and not 0 < a.target_accuracy <= 1:
        p.error(f"--target_accuracy is a fraction in (0, 1], not {a.target_accuracy}")
    if a.eval_every_examples < 1 or a.max_epochs < 1 or a.warmup_steps < 0:
        p.error("--eval_every_examples and --max_epochs must be >= 1, --warmup_steps >= 0")
    capture = a.capture
    if capture != "none":
        if not a.device.startswith("cuda"):
            print(f"torch_cnn.py: --capture {capture} needs CUDA (CUDA graphs); --device is "
                  f"{a.device}", file=sys.stderr)
            return 2
        if a.compile_mode in ("reduce-overhead", "max-autotune"):
            p.error(f"--compile_mode {a.compile_mode} makes CUDA graphs of its own; use default "
                    f"or max-autotune-no-cudagraphs (the whole step is captured here)")
        if torch_version() < (2, 1):
            print(f"torch_cnn.py: --capture needs PyTorch 2.1 or newer (capturable Adam with a "
                  f"tensor learning rate), not {torch.__version__}", file=sys.stderr)
            return 1
    if capture == "compile_graph":
        if not hasattr(torch, "compile"):
            print(f"torch_cnn.py: --capture compile_graph: PyTorch {torch.__version__} has no "
                  f"torch.compile", file=sys.stderr)
            return 1
        try:
            importlib.import_module("triton")  # torch.compile's code generator for GPUs
        except ImportError as e:
            print(f"torch_cnn.py: --capture compile_graph: torch.compile needs Triton for the "
                  f"GPU, which does not import here ({e})", file=sys.stderr)
            return 1

    rank, world = 0, 1
    if a.ddp:
        import torch.distributed as dist
        cuda = a.device.startswith("cuda")  # --device=cpu: gloo, to try the logic
        if capture != "none":
            # PyTorch's documented condition for capturing DDP's collectives in a CUDA graph:
            # NCCL's asynchronous error handling off before the process group starts.
            os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
            os.environ.setdefault("NCCL_ASYNC_ERROR_HANDLING", "0")
        dist.init_process_group("nccl" if cuda else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        local = int(os.environ.get("LOCAL_RANK", rank))
        if cuda:
            torch.cuda.set_device(local)
        dev = torch.device("cuda", local) if cuda else torch.device("cpu")
    else:
        if not torch.cuda.is_available() and a.device.startswith("cuda"):
            print("torch_cnn.py: CUDA is not available to PyTorch", file=sys.stderr)
            return 1
        dev = torch.device(a.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(a.seed)

    x_np, y_np = load(a.data, "train", plan.input_dim)
    if a.max_train_examples:
        x_np, y_np = x_np[:a.max_train_examples], y_np[:a.max_train_examples]
    if world > 1:
        x_np, y_np = x_np[rank::world], y_np[rank::world]
    n = y_np.shape[0]
    x_all = torch.from_numpy(np.ascontiguousarray(x_np)).to(dev)
    y_all = torch.from_numpy(np.ascontiguousarray(y_np)).to(dev)

    model = build_model(plan).to(dev)
    if not a.no_channels_last:
        model = model.to(memory_format=torch.channels_last)
    params = sum(p_.numel() for p_ in model.parameters() if p_.requires_grad)
    if params != plan.params:
        print(f"torch_cnn.py: PyTorch has {params} parameters, the plan {plan.params}",
              file=sys.stderr)
        return 1
    net = model
    side = None  # the capture's stream; under --ddp DDP is built on it, as PyTorch documents
    if a.ddp:
        inner = model
        if capture == "compile_graph" and a.ddp_compile == "inner":
            inner = torch.compile(model, mode=None if a.compile_mode == "default" else
                                  a.compile_mode)
        ddp_args = dict(device_ids=[dev.index] if dev.type == "cuda" else None,
                        static_graph=bool(a.ddp_static_graph), bucket_cap_mb=a.bucket_cap_mb)
        if capture != "none":
            side = torch.cuda.Stream(dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                net = torch.nn.parallel.DistributedDataParallel(inner, **ddp_args)
            torch.cuda.current_stream(dev).wait_stream(side)
        else:
            net = torch.nn.parallel.DistributedDataParallel(inner, **ddp_args)
    lr, beta1, beta2, eps, decay_rate, decay_steps = plan.optimizer()
    if a.no_decay:
        decay_rate = 0
    loss_fn = torch.nn.CrossEntropyLoss()
    updates = 0

    aug = get(plan.config, "augmentation", None) if hasattr(plan, "config") else None
    max_shift = int(get(aug, "max_shift", 0) or 0) if aug else 0
    flip = str(get(aug, "horizontal_flip", "false")).lower() == "true" if aug else False

    def augment(x):
        """The config's augmentation, as the worker does it: per example a random shift in
        [-max_shift, max_shift] each way with zeros shifted in, and a left-right mirror with
        probability 1/2 (x is [B, H*W*C], NHWC rows)."""
        if not max_shift and not flip:
            return x
        h, w, c = plan.input_shape
        b = x.shape[0]
        img = x.view(b, h, w, c)
        if flip:
            mirror = torch.rand(b, device=x.device) < 0.5
            img = torch.where(mirror[:, None, None, None], img.flip(2), img)
        if max_shift:
            s = max_shift
            padded = F.pad(img, (0, 0, s, s, s, s))
            dy = torch.randint(0, 2 * s + 1, (b,), device=x.device)
            dx = torch.randint(0, 2 * s + 1, (b,), device=x.device)
            rows = torch.arange(h, device=x.device)[None, :] + dy[:, None]
            cols = torch.arange(w, device=x.device)[None, :] + dx[:, None]
            img = padded[torch.arange(b, device=x.device)[:, None, None], rows[:, :, None],
                         cols[:, None, :]]
        return img.reshape(b, h * w * c)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    batch = a.batch_size
    decay = "off" if decay_rate <= 0 or decay_steps <= 0 else f"{decay_rate}^(t/{decay_steps})"
    setup = ""  # the capture's figures for the output lines
    if capture == "none":
        opt = torch.optim.Adam(net.parameters(), lr=lr, betas=(beta1, beta2), eps=eps)

        def step(x, y):
            nonlocal updates
            updates += 1
            x = augment(x)
            if decay_rate > 0 and decay_steps > 0:
                # TensorFlow's exponential_decay, not staircase: the t-th update uses
                # lr * rate ^ ((t - 1) / steps) (our ps counts updates per variable shard).
                for g in opt.param_groups:
                    g["lr"] = lr * decay_rate ** ((updates - 1) / decay_steps)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(net(x), y)
            loss.backward()
            opt.step()
            return loss

        def epoch_steps(whole_only=False):
            """One epoch of a fresh permutation; yields (loss, examples) after each step.
            DDP: whole batches only, so that every rank takes the same number of steps."""
            perm = torch.randperm(n, device=dev)
            last = n - batch + 1 if whole_only else n
            for i in range(0, last, batch):
                idx = perm[i:i + batch]
                yield step(x_all[idx], y_all[idx]), idx.shape[0]

        steps_per_epoch = n // batch if a.ddp else -(-n // batch)
        epoch_examples = steps_per_epoch * batch if a.ddp else n
        adam = "default"
        last_batch = "dropped" if a.ddp and n % batch else "kept"
    else:
        fwd = net  # the model, or DDP around it
        if capture == "compile_graph" and not (a.ddp and a.ddp_compile == "inner"):
            fwd = torch.compile(net, mode=None if a.compile_mode == "default" else
                                a.compile_mode)
        captured = CapturedStep(model, fwd, augment, x_all, y_all, batch, lr, (beta1, beta2),
                                eps, decay_rate, decay_steps, side)
        # A retry with the other Adam on one rank only would leave the others waiting in a
        # collective: under DDP only the first implementation is tried.
        impls = ("fused", "foreach") if a.adam_impl == "auto" else (a.adam_impl,)
        if a.ddp:
            impls = impls[:1]
        t_setup = time.perf_counter()
        try:
            # PyTorch documents at least 11 eager DDP steps before DDP is captured.
            captured.capture(impls, max(a.warmup_steps, 11) if a.ddp else a.warmup_steps)
        except Exception as e:  # noqa: BLE001 -- reported with the mode, then exit 1
            what = "torch.compile or the capture" if capture == "compile_graph" else "the capture"
            print(f"torch_cnn.py: --capture {capture}: {what} failed: {type(e).__name__}: {e}",
                  file=sys.stderr)
            return 1
        setup_seconds = time.perf_counter() - t_setup
        print(f"torch_cnn.py: captured the whole step ({capture}, Adam {captured.adam}) in "
              f"{captured.capture_seconds:.3f} s; warm-up, compile and capture took "
              f"{setup_seconds:.1f} s; {n % batch} examples per epoch dropped (whole batches "
              f"only)", file=sys.stderr, flush=True)
        opt = captured.opt
        epoch_steps = captured.epoch_steps
        steps_per_epoch = captured.steps_per_epoch
        epoch_examples = steps_per_epoch * batch
        adam = captured.adam
        last_batch = "dropped" if n % batch else "kept"
        setup = (f" setup_seconds={setup_seconds:.1f} "
                 f"capture_seconds={captured.capture_seconds:.3f}")
        if capture == "compile_graph":
            setup += f" compile_mode={a.compile_mode}"
    augmented = "on" if max_shift or flip else "off"
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else str(dev)
    name = name.replace(" ", "_")
    # Fields the output lines of one-GPU training end with (after capture=<mode>).
    tags = f"adam={adam} augment={augmented} last_batch={last_batch}{setup}"

    if a.epochs or a.target_accuracy:
        xt_np, yt_np = load(a.data, "t10k", plan.input_dim)
        if a.max_test_examples:
            xt_np, yt_np = xt_np[:a.max_test_examples], yt_np[:a.max_test_examples]
        x_test = torch.from_numpy(np.ascontiguousarray(xt_np)).to(dev)
        y_test = torch.from_numpy(np.ascontiguousarray(yt_np)).to(dev)

        def evaluate():
            """(test loss, test accuracy) of the eager model (never the compiled one) in eval
            mode, with the moving batch-norm statistics."""
            model.eval()
            correct = torch.zeros((), dtype=torch.int64, device=dev)
            total_loss = torch.zeros((), dtype=torch.float64, device=dev)
            with torch.no_grad():
                for i in range(0, y_test.shape[0], 1000):
                    logits = model(x_test[i:i + 1000])
                    yb = y_test[i:i + 1000]
                    total_loss += F.cross_entropy(logits, yb, reduction="sum").double()
                    correct += (logits.argmax(1) == yb).sum()
            model.train()
            m = y_test.shape[0]
            return total_loss.item() / m, correct.item() / m

    if a.epochs:
        t0 = time.perf_counter()
        steps = 0
        acc = test_loss = float("nan")
        for epoch in range(1, a.epochs + 1):
            total = torch.zeros((), dtype=torch.float64, device=dev)
            for loss, b in epoch_steps():
                total += loss.detach().double() * b
                steps += 1
            train_loss = total.item() / epoch_examples
            if a.eval or epoch == a.epochs:
                test_loss, acc = evaluate()
                print(f"TORCH_CNN_EPOCH model={plan.name} epoch={epoch} steps={steps} "
                      f"train_loss={train_loss:.4f} test_loss={test_loss:.4f} "
                      f"test_accuracy={acc:.4f} seconds={time.perf_counter() - t0:.1f}",
                      flush=True)
        print(f"TORCH_CNN_ACCURACY device={name} model={plan.name} "
              f"epochs={a.epochs} batch={batch} steps={steps} test_loss={test_loss:.4f} "
              f"test_accuracy={acc:.4f} seconds={time.perf_counter() - t0:.1f} params={params} "
              f"decay={decay} torch={torch.__version__}"
              f"{'' if capture == 'none' else f' capture={capture} {tags}'}", flush=True)
        return 0

    if a.target_accuracy:
        if capture == "none":
            # Warm-up steps (cuDNN's autotuning, lazy initialization; the short last batch's
            # shape too), then the initial weights and a fresh Adam state again, in place.
            saved = snapshot(model)
            perm = torch.randperm(n, device=dev)
            sizes = [batch] * min(a.warmup_steps, n // batch)
            if n % batch and a.warmup_steps and not a.ddp:
                sizes.append(n % batch)
            for b in sizes:
                step(x_all[perm[:b]], y_all[perm[:b]])
            restore(model, saved, opt)
            updates = 0
        steps_fn = epoch_steps
        if a.ddp and capture == "none":
            def steps_fn():
                return epoch_steps(whole_only=True)
        share = None
        if a.ddp:
            def share(*values):
                """Rank 0's values on every rank: each rank evaluates its own copy of the model
                (batch norm's moving statistics are each rank's own), rank 0's result decides,
                so every rank stops at the same step."""
                t = torch.tensor(values, dtype=torch.float64, device=dev)
                dist.broadcast(t, 0)
                return t.tolist()
        tags = f"gpus={world} {tags}"
        rc = time_to_accuracy(a, plan.name, capture, batch, f"device={name} decay={decay} {tags}",
                              steps_fn, steps_per_epoch, evaluate, sync, world, rank, share)
        if a.ddp:
            dist.barrier()
            dist.destroy_process_group()
        return rc

    # Speed.
    def forever():
        while True:
            if a.ddp and capture == "none":
                yield from epoch_steps(whole_only=True)
            else:
                yield from epoch_steps()

    it = forever()
    # Steps between clock reads: enough to keep the GPU's queue full (a replay is one launch:
    # more of them), one on the CPU.
    chunk = (20 if capture == "none" else 100) if dev.type == "cuda" else 1
    start = time.perf_counter()
    while time.perf_counter() - start < a.warmup_seconds:
        for _ in range(chunk):
            loss, _ = next(it)
        sync()
    steps = examples = 0
    if a.ddp:
        dist.barrier()
    sync()
    t0 = time.perf_counter()
    stop = torch.zeros(1, device=dev)
    while True:
        for _ in range(chunk):
            loss, b = next(it)
            steps += 1
            examples += b
        if a.ddp:
            # Every rank runs the same number of steps: rank 0 decides when to stop.
            if rank == 0 and time.perf_counter() - t0 >= a.seconds:
                stop.fill_(1)
            dist.broadcast(stop, 0)
            if stop.item() > 0:
                break
        elif time.perf_counter() - t0 >= a.seconds:
            break
    sync()
    if a.ddp:
        dist.barrier()
    seconds = time.perf_counter() - t0
    if a.ddp:
        if rank == 0:
            examples = steps * batch * world
            print(f"TORCH_DDP_CNN model={plan.name} gpus={world} batch_per_gpu={batch} "
                  f"steps={steps} seconds={seconds:.3f} "
                  f"examples_per_second={examples / seconds:.1f} "
                  f"step_ms={1e3 * seconds / steps:.4f} params={params} "
                  f"loss={loss.item():.4f} torch={torch.__version__} capture={capture} "
                  f"static_graph={a.ddp_static_graph} bucket_cap_mb={a.bucket_cap_mb}"
                  f"{f' ddp_compile={a.ddp_compile}' if capture == 'compile_graph' else ''} "
                  f"{tags}", flush=True)
        dist.destroy_process_group()
        return 0
    final_loss = loss.item()
    print(f"TORCH_CNN device={name} model={plan.name} batch={batch} "
          f"steps={steps} examples={examples} seconds={seconds:.3f} "
          f"examples_per_second={examples / seconds:.1f} step_ms={1e3 * seconds / steps:.4f} "
          f"params={params} loss={final_loss:.4f} torch={torch.__version__} capture={capture} "
          f"decay={decay} {tags}", flush=True)
    if capture != "none" and not math.isfinite(final_loss):
        print(f"torch_cnn.py: the captured training's loss is {final_loss}", file=sys.stderr)
        return 1
    return 0


def time_to_accuracy(a, model_name, capture, batch, tags, epoch_steps, steps_per_epoch, evaluate,
                     sync, world=1, rank=0, share=None):
    """--target_accuracy: trains from the initial weights, evaluating the test set after every
    --eval_every_examples training examples with the clock stopped (sync() before stopping and
    before starting it again), until the test accuracy reaches the target or --max_epochs end.
    Prints TORCH_CNN_EVAL per evaluation and one TORCH_CNN_TTA; returns the exit status.
    Under DDP (world > 1) every rank runs this: examples count every rank's (each step is
    `world` batches), share(values...) gives every rank rank 0's evaluation, and only rank 0
    prints."""
    every = a.eval_every_examples
    examples = steps = 0
    next_eval = every
    train_seconds = 0.0
    acc = best = float("nan")
    evaluated_at = -1
    head = f"model={model_name} capture={capture}"

    def evaluation(loss, epochs):
        """Evaluates and prints; returns (accuracy, train loss) (the clock must be stopped)."""
        nonlocal evaluated_at
        test_loss, accuracy = evaluate()
        train_loss = loss.item()
        if share is not None:
            test_loss, accuracy, train_loss = share(test_loss, accuracy, train_loss)
        evaluated_at = examples
        if rank != 0:
            return accuracy, train_loss
        print(f"TORCH_CNN_EVAL {head} examples={examples} train_seconds={train_seconds:.3f} "
              f"test_accuracy={accuracy:.4f} epochs={epochs:.3f} steps={steps} "
              f"train_loss={train_loss:.4f} test_loss={test_loss:.4f}", flush=True)
        return accuracy, train_loss

    def result(seconds, epochs, reached):
        if rank != 0:
            return
        print(f"TORCH_CNN_TTA {head} batch={batch} target={a.target_accuracy} "
              f"seconds={seconds} examples={examples} epochs={epochs:.3f} "
              f"test_accuracy={acc:.4f} reached={'true' if reached else 'false'} "
              f"train_seconds={train_seconds:.3f} best_accuracy={best:.4f} steps={steps} "
              f"eval_every_examples={every} max_epochs={a.max_epochs} "
              f"torch={torch.__version__} {tags}", flush=True)

    loss = None
    sync()
    t0 = time.perf_counter()
    for epoch in range(a.max_epochs):
        for j, (loss, b) in enumerate(epoch_steps(), 1):
            examples += b * world
            steps += 1
            if examples < next_eval:
                continue
            sync()
            train_seconds += time.perf_counter() - t0
            while next_eval <= examples:
                next_eval += every
            epochs = epoch + j / steps_per_epoch
            acc, train_loss = evaluation(loss, epochs)
            best = acc if math.isnan(best) else max(best, acc)
            if not math.isfinite(train_loss):
                print(f"torch_cnn.py: the training loss is {train_loss} after {steps} steps",
                      file=sys.stderr)
                result("inf", epochs, False)
                return 1
            if acc >= a.target_accuracy:
                result(f"{train_seconds:.3f}", epochs, True)
                return 0
            sync()
            t0 = time.perf_counter()
    sync()
    train_seconds += time.perf_counter() - t0
    if loss is None:
        print("torch_cnn.py: no training step ran", file=sys.stderr)
        return 1
    if evaluated_at != examples:
        acc, _ = evaluation(loss, float(a.max_epochs))
        best = acc if math.isnan(best) else max(best, acc)
        if acc >= a.target_accuracy:
            result(f"{train_seconds:.3f}", float(a.max_epochs), True)
            return 0
    result("inf", float(a.max_epochs), False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
