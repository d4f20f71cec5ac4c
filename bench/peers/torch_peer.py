"""PyTorch peer: eager and torch.compile; float32, autocast bf16, autocast f16
with GradScaler. Parameters stay f32 (autocast casts per op, as Keras'
mixed policies do); the softmax and the loss run in f32.

Set up as PyTorch's own guides would (issue 36):
- convolutions and their inputs in channels_last;
- TF's "same" padding in the convolution's own `padding=` where it is
  symmetric; where TF's is asymmetric (stride 2 on an even size with an odd
  kernel: every convnet layer), the convolution takes the symmetric part and
  F.pad only the odd row and column at the bottom and right (same_pad says
  which); ResNet-50's 3-pixel input padding and its pooling padding are in
  the Conv2d and the MaxPool2d;
- the optimizer fused (`fused=True`, one kernel for every parameter) where
  this PyTorch has it for the device, else `foreach=True`;
- variant "compile": torch.compile over the whole training step (forward,
  loss, backward, optimizer update), with fullgraph=True where that traces,
  else with graph breaks, else (with a note) the model alone.
Every row says what ran in its "setup" field, which report.py lists in the
table's notes."""
import os

import common

VARIANTS = ("eager", "compile")


def same_pad(n, k, s):
    """TensorFlow's 'same' padding (before, after) for one spatial dim."""
    out = -(-n // s)
    total = max((out - 1) * s + k - n, 0)
    return total // 2, total - total // 2


def resnet50(torch, classes):
    """ResNet-50 v1 as keras.applications builds it (and examples/resnet50.mpt):
    the stride on each stage's first 1x1 convolution, biases on the
    convolutions, batch norm eps 1.001e-5; written out here so that the peer
    needs nothing beyond torch."""
    nn = torch.nn

    def conv_bn(cin, cout, k, s, p=0):
        return [nn.Conv2d(cin, cout, k, stride=s, padding=p),
                nn.BatchNorm2d(cout, eps=1.001e-5, momentum=0.01)]

    class Block(nn.Module):
        def __init__(self, cin, filters, stride, project):
            super().__init__()
            self.short = nn.Sequential(*conv_bn(cin, 4 * filters, 1, stride)) if project else None
            self.body = nn.Sequential(*conv_bn(cin, filters, 1, stride), nn.ReLU(),
                                      *conv_bn(filters, filters, 3, 1, 1), nn.ReLU(),
                                      *conv_bn(filters, 4 * filters, 1, 1))

        def forward(self, x):
            return torch.relu((self.short(x) if self.short is not None else x) + self.body(x))

    # Keras pads 3 then convolves "valid", and pads 1 with zeros before the
    # pooling: the same as the layers' own symmetric padding (after a relu,
    # MaxPool2d's -inf padding gives what zeros give).
    layers = [*conv_bn(3, 64, 7, 2, 3), nn.ReLU(), nn.MaxPool2d(3, 2, padding=1)]
    cin = 64
    for filters, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for b in range(blocks):
            layers.append(Block(cin, filters, stride if b == 0 else 1, b == 0))
            cin = 4 * filters
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def gpt(torch, m):
    """examples/gpt_tiny.mpt as PyTorch's own guides write a GPT: one fused
    query/key/value Linear (the parameters of Keras' three projections and
    their biases), F.scaled_dot_product_attention(is_causal=True), exact
    GELU, pre-layer-norm blocks with eps 1e-3 as Keras'; the position table
    added to the token embeddings."""
    nn = torch.nn
    F = torch.nn.functional
    d, heads = m["width"], m["heads"]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(d, eps=m["eps"])
            self.qkv = nn.Linear(d, 3 * d)
            self.out = nn.Linear(d, d)
            self.ln2 = nn.LayerNorm(d, eps=m["eps"])
            self.up = nn.Linear(d, 4 * d)
            self.down = nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.out(a.transpose(1, 2).reshape(b, t, d))
            return x + self.down(F.gelu(self.up(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens = nn.Embedding(m["vocab"], d)
            self.positions = nn.Parameter(torch.empty(m["context"], d))
            nn.init.xavier_uniform_(self.positions)  # Keras' glorot uniform
            self.blocks = nn.Sequential(*[Block() for _ in range(m["blocks"])])
            self.final_ln = nn.LayerNorm(d, eps=m["eps"])
            self.head = nn.Linear(d, m["classes"])

        def forward(self, ids):
            h = self.tokens(ids) + self.positions[: ids.shape[1]]
            return self.head(self.final_ln(self.blocks(h)))

    return GPT()


def build(torch, name, args):
    nn = torch.nn
    F = torch.nn.functional
    m = common.MODELS[name]
    if m["kind"] == "gpt":
        return gpt(torch, m)
    if m["kind"] == "mlp":
        layers, fan_in = [], m["inputs"]
        for u in m["units"]:
            layers += [nn.Linear(fan_in, u), nn.ReLU()]
            fan_in = u
        layers.append(nn.Linear(fan_in, m["classes"]))
        return nn.Sequential(*layers)
    if m["kind"] == "resnet50":
        return resnet50(torch, m["classes"])

    class SameConv(nn.Module):
        """conv2d(padding=same, strides=s) as Keras computes it, then relu:
        the symmetric part of TF's padding in the convolution, and F.pad only
        for what TF adds at the bottom/right beyond it (none where TF's
        padding is symmetric)."""

        def __init__(self, cin, cout, k, s, n):
            super().__init__()
            lo, hi = same_pad(n, k, s)  # square images: the same for both dims
            self.conv = nn.Conv2d(cin, cout, k, stride=s, padding=lo)
            self.extra = (0, hi - lo, 0, hi - lo) if hi != lo else None

        def forward(self, x):
            if self.extra:
                x = F.pad(x, self.extra)
            return F.relu(self.conv(x))

    layers, cin, n = [], 3, common.image_size(name, args)
    for filters, k in m["convs"]:
        layers += [SameConv(cin, filters, k, 2, n),
                   nn.BatchNorm2d(filters, eps=1e-3, momentum=0.01)]  # Keras' 0.99 moving average
        cin, n = filters, -(-n // 2)
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, m["classes"])]
    return nn.Sequential(*layers)


def padding_note(model):
    """How the model pads, for the row's setup field."""
    convs = [c for c in model.modules() if type(c).__name__ == "SameConv"]
    if convs:
        odd = sum(1 for c in convs if c.extra)
        return (f"TF 'same' padding: its symmetric part in Conv2d(padding=), F.pad only for TF's extra "
                f"bottom/right row and column ({odd} of {len(convs)} convolutions asymmetric)")
    return ""


def optimizer(torch, name, model, device):
    """The model's optimizer, fused where this PyTorch has a fused kernel for
    it on this device, else foreach; returns (optimizer, 'fused'|'foreach')."""
    m = common.MODELS[name]
    params = list(model.parameters())
    # Keras' defaults where PyTorch's differ: epsilon 1e-7, rmsprop rho 0.9.
    if m["optimizer"] == "adamw":
        # weight decay on the Linear weights only: what Keras' exclusion of
        # bias, gamma, beta and embeddings leaves; the learning rate a
        # tensor, set before every step (a float would recompile the
        # compiled step each time it changes)
        decay = [p for mod in model.modules() if isinstance(mod, torch.nn.Linear) for p in [mod.weight]]
        ids = {id(p) for p in decay}
        params = [dict(params=decay, weight_decay=m["weight_decay"]),
                  dict(params=[p for p in params if id(p) not in ids], weight_decay=0.0)]
        cls, kw = torch.optim.AdamW, dict(lr=torch.tensor(m["lr"], device=device), eps=1e-7)
    elif m["optimizer"] == "adam":
        cls, kw = torch.optim.Adam, dict(lr=m["lr"], eps=1e-7)
    elif m["optimizer"] == "rmsprop":
        cls, kw = torch.optim.RMSprop, dict(lr=m["lr"], alpha=0.9, eps=1e-7)
    else:
        cls, kw = torch.optim.SGD, dict(lr=m["lr"], momentum=m["momentum"])
    try:
        opt = cls(params, fused=True, **kw)
        # some versions accept fused=True and refuse the device at the first step
        probe = torch.nn.Parameter(torch.zeros(1, device=device))
        probe.grad = torch.zeros(1, device=device)
        cls([probe], fused=True, **kw).step()
        return opt, "fused"
    except (TypeError, RuntimeError, ValueError):
        return cls(params, foreach=True, **kw), "foreach"


def run_one(torch, np, name, policy, batch, variant, args):
    dev = torch.device(args.device)
    model = build(torch, name, args).to(dev)
    m = common.MODELS[name]
    conv = m["kind"] in ("convnet", "resnet50")
    if conv:
        model = model.to(memory_format=torch.channels_last)
    opt, opt_kind = optimizer(torch, name, model, dev)
    batches = []
    for x, y in common.synthetic(np, name, args, batch):
        xt = torch.from_numpy(x).to(dev)
        if conv:
            xt = xt.permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
        batches.append((xt, torch.from_numpy(y).long().to(dev)))
    low = {"float32": None, "mixed_float16": torch.float16, "mixed_bfloat16": torch.bfloat16}[policy]
    scaler = torch.amp.GradScaler(args.device) if low is torch.float16 else None

    # opt.zero_grad stays outside: torch.compile refuses to trace it (it sets
    # every .grad to None, nothing to compile)
    def train_step(fwd, x, y):
        with torch.autocast(args.device, dtype=low or torch.float32, enabled=low is not None):
            logits = fwd(x)
        # one class per sample, or per position (gpt_tiny): the mean over all
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, -2), y.flatten())
        clip = m.get("global_clipnorm")
        if scaler:
            scaler.scale(loss).backward()
            if clip:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
        return loss

    setup = [f"optimizer {opt_kind}"] + ([padding_note(model)] if padding_note(model) else [])
    if name == "resnet50":
        setup.append("stem and pooling padding in Conv2d(padding=3) and MaxPool2d(padding=1)")
    if conv:
        setup.append("channels_last")
    if variant == "compile":
        # The whole step under torch.compile: fullgraph where it traces, else
        # with graph breaks (Dynamo compiles the pieces: forward and backward
        # through AOTAutograd, the optimizer update), else the model alone.
        # (PyTorch 2.15 breaks the graph at loss.backward() and, on purpose,
        # around every torch.optim step: fullgraph does not trace there.)
        # The first call of each is a warm-up step; a failed try is not timed.
        x0, y0 = batches[0]
        tries = [("the whole train step (fullgraph)", lambda: torch.compile(train_step, fullgraph=True)),
                 ("the whole train step (with graph breaks)", lambda: torch.compile(train_step)),
                 ("the model only (the whole step did not compile)", None)]
        step_fn, why = None, []
        for what, make in tries:
            torch._dynamo.reset()
            if make is None:
                fwd = torch.compile(model)
                step_fn = lambda x, y: train_step(fwd, x, y)
                opt.zero_grad(set_to_none=True)
                step_fn(x0, y0)
            else:
                try:
                    fn = make()
                    opt.zero_grad(set_to_none=True)
                    fn(model, x0, y0)
                    step_fn = lambda x, y, fn=fn: fn(model, x, y)
                except Exception as e:  # noqa: BLE001 -- any failure: the next try
                    # a try that failed part way may have stepped or half
                    # set up the optimizer (and the scaler): start them again
                    opt, opt_kind = optimizer(torch, name, model, dev)
                    if scaler:
                        scaler = torch.amp.GradScaler(args.device)
                    text = str(e).strip()
                    why.append(f"{'fullgraph' if 'fullgraph' in what else 'with graph breaks'}: "
                               f"{type(e).__name__}: {text.splitlines()[0][:100] if text else ''}")
                    common.log(f"pytorch compile: {what} did not compile: {why[-1]}")
                    continue
            setup.append("torch.compile over " + what + (f" [{'; '.join(why)}]" if why else ""))
            break
    else:
        step_fn = lambda x, y: train_step(model, x, y)

    if m["kind"] == "gpt":
        setup.append(f"{sum(p.numel() for p in model.parameters())} parameters")
    if "schedule" in m:
        setup.append("the learning rate schedule computed in Python, written into the optimizer's "
                     "lr tensor before each step")
    if m.get("global_clipnorm"):
        setup.append("clip_grad_norm_ in the step")

    def step(i):
        x, y = batches[i % 2]
        if "schedule" in m:
            for g in opt.param_groups:
                g["lr"].fill_(common.learning_rate(name, i))
        opt.zero_grad(set_to_none=True)
        step_fn(x, y)

    def sync():
        if args.device == "cuda":
            torch.cuda.synchronize()

    ms, times = common.time_steps(step, sync, args.warmup, args.steps)
    return ms, times, "; ".join(setup)


def main():
    args = common.parse_args("pytorch", VARIANTS)
    try:
        import numpy as np
        import torch
    except ImportError as e:
        common.log(f"pytorch peer: skipped: {e}")
        return 3
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    # Denormals flushed to zero on the CPU, as mptc's kernels run (MXCSR
    # FTZ/DAZ unless MPTC_DENORMALS=keep) and TensorFlow's do: the data is
    # learnable, the loss falls towards 0 and gradients become tiny.
    flush = args.device == "cpu" and torch.set_flush_denormal(True)
    # float32 is true fp32 unless --tf32 (PyTorch's own default lets cuDNN's
    # convolutions use TF32 while its matmuls do not)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    common.log(f"pytorch {torch.__version__}, {args.threads} threads, {args.device}")
    for name, policy, batch, variant in common.configurations(args):
        try:
            ms, _, setup = run_one(torch, np, name, policy, batch, variant, args)
            if flush:
                setup += "; denormals flushed (torch.set_flush_denormal)"
            if args.device == "cpu":
                # what ATEN_CPU_CAPABILITY (run_peers.sh --isa) left PyTorch's own kernels
                setup += "; ATen CPU capability " + torch.backends.cpu.get_cpu_capability()
                if os.environ.get("ONEDNN_MAX_CPU_ISA"):
                    setup += ", ONEDNN_MAX_CPU_ISA=" + os.environ["ONEDNN_MAX_CPU_ISA"]
            common.emit("pytorch", variant, name, policy, batch, args, ms, version=torch.__version__,
                        setup=setup)
        except Exception as e:  # any failure is a cell that says so, as mptc's are
            common.emit("pytorch", variant, name, policy, batch, args, error=e, version=torch.__version__)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
