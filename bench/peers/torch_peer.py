"""PyTorch peer: eager and torch.compile; float32, autocast bf16, autocast f16
with GradScaler. Parameters stay f32 (autocast casts per op, as Keras'
mixed policies do); the softmax and the loss run in f32."""
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

    layers = [nn.ZeroPad2d(3), *conv_bn(3, 64, 7, 2), nn.ReLU(), nn.ZeroPad2d(1),
              nn.MaxPool2d(3, 2)]  # after a relu, zero padding equals -inf padding
    cin = 64
    for filters, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for b in range(blocks):
            layers.append(Block(cin, filters, stride if b == 0 else 1, b == 0))
            cin = 4 * filters
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def build(torch, name, args):
    nn = torch.nn
    F = torch.nn.functional
    m = common.MODELS[name]
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
        """conv2d(padding=same, strides=s) as Keras computes it, then relu."""

        def __init__(self, cin, cout, k, s, n):
            super().__init__()
            self.conv = nn.Conv2d(cin, cout, k, stride=s)
            ph, pw = same_pad(n, k, s), same_pad(n, k, s)
            self.pad = (pw[0], pw[1], ph[0], ph[1])

        def forward(self, x):
            return F.relu(self.conv(F.pad(x, self.pad)))

    layers, cin, n = [], 3, common.image_size(name, args)
    for filters, k in m["convs"]:
        layers += [SameConv(cin, filters, k, 2, n),
                   nn.BatchNorm2d(filters, eps=1e-3, momentum=0.01)]  # Keras' 0.99 moving average
        cin, n = filters, -(-n // 2)
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, m["classes"])]
    return nn.Sequential(*layers)


def optimizer(torch, name, params):
    m = common.MODELS[name]
    # Keras' defaults where PyTorch's differ: epsilon 1e-7, rmsprop rho 0.9.
    if m["optimizer"] == "adam":
        return torch.optim.Adam(params, lr=m["lr"], eps=1e-7)
    if m["optimizer"] == "rmsprop":
        return torch.optim.RMSprop(params, lr=m["lr"], alpha=0.9, eps=1e-7)
    return torch.optim.SGD(params, lr=m["lr"], momentum=m["momentum"])


def run_one(torch, np, name, policy, batch, variant, args):
    dev = torch.device(args.device)
    model = build(torch, name, args).to(dev)
    conv = common.MODELS[name]["kind"] != "mlp"
    if conv:
        model = model.to(memory_format=torch.channels_last)
    opt = optimizer(torch, name, model.parameters())
    fwd = torch.compile(model) if variant == "compile" else model
    x, y = common.synthetic(np, name, args, batch)
    xt = torch.from_numpy(x).to(dev)
    if conv:
        xt = xt.permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
    yt = torch.from_numpy(y).long().to(dev)
    low = {"float32": None, "mixed_float16": torch.float16, "mixed_bfloat16": torch.bfloat16}[policy]
    scaler = torch.amp.GradScaler(args.device) if low is torch.float16 else None

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(args.device, dtype=low or torch.float32, enabled=low is not None):
            logits = fwd(xt)
        loss = torch.nn.functional.cross_entropy(logits.float(), yt)
        if scaler:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()

    def sync():
        if args.device == "cuda":
            torch.cuda.synchronize()

    return common.time_steps(step, sync, args.warmup, args.steps)


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
    # float32 is true fp32 unless --tf32 (PyTorch's own default lets cuDNN's
    # convolutions use TF32 while its matmuls do not)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    common.log(f"pytorch {torch.__version__}, {args.threads} threads, {args.device}")
    for name, policy, batch, variant in common.configurations(args):
        try:
            ms, _ = run_one(torch, np, name, policy, batch, variant, args)
            common.emit("pytorch", variant, name, policy, batch, args, ms, version=torch.__version__)
        except Exception as e:  # any failure is a cell that says so, as mptc's are
            common.emit("pytorch", variant, name, policy, batch, args, error=e, version=torch.__version__)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
