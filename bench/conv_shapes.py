#!/usr/bin/env python3
"""PyTorch's convolutions, one shape at a time: forward, data gradient and
filter gradient, in bf16 (channels_last, as autocast runs them through
oneDNN) or f32, on a given number of threads. The figures to hold mptc's
per-kernel profile (`mptc train ... --profile`) against, kernel by kernel.

    taskset -c 1 python3 bench/conv_shapes.py --model convnet64 --threads 1
    taskset -c 1 python3 bench/conv_shapes.py --model resnet50 --dtype f32

Padding: mptc (like Keras) pads "same" stride-2 convolutions asymmetrically
(the extra row and column at the bottom and right); here each convolution
takes the symmetric padding that gives the same output size, which does the
same number of products to within a row of taps.
"""
import argparse
import time

import torch

# (name, batch, H, W, C, O, kernel, stride, padding)
CONVNET64 = [
    ("conv_1", 32, 64, 64, 3, 32, 5, 2, 2),
    ("conv_2", 32, 32, 32, 32, 64, 7, 2, 3),
    ("conv_3", 32, 16, 16, 64, 128, 11, 2, 5),
]


def resnet50(batch):
    """The distinct convolutions of examples/resnet50.mpt (Keras' ResNet-50 v1:
    the stride of a stage on its first 1x1 convolution), with their counts."""
    s = [("conv1_conv", batch, 224, 224, 3, 64, 7, 2, 3, 1)]
    size, cin = 56, 64
    for st, (f, blocks, stride) in enumerate([(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]):
        out = size // stride
        n = "conv%d" % (st + 2)
        s.append((n + " proj 1x1 s%d" % stride, batch, size, size, cin, 4 * f, 1, stride, 0, 1))
        s.append((n + " 1x1 in s%d" % stride, batch, size, size, cin, f, 1, stride, 0, 1))
        s.append((n + " 3x3", batch, out, out, f, f, 3, 1, 1, blocks))
        s.append((n + " 1x1 out", batch, out, out, f, 4 * f, 1, 1, 0, blocks))
        if blocks > 1:
            s.append((n + " 1x1 in", batch, out, out, 4 * f, f, 1, 1, 0, blocks - 1))
        size, cin = out, 4 * f
    return s


def best_ms(fn, reps):
    fn()
    best = 1e30
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["convnet64", "resnet50"], default="convnet64")
    ap.add_argument("--batch", type=int, default=0, help="default: 32 (convnet64), 8 (resnet50)")
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.set_flush_denormal(True)
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    if a.model == "convnet64":
        shapes = [s + (1,) for s in CONVNET64]
        if a.batch:
            shapes = [(s[0], a.batch) + s[2:] for s in shapes]
    else:
        shapes = resnet50(a.batch or 8)
    print("pytorch %s, %s, %d thread(s), best of %d, ms per call" % (torch.__version__, a.dtype,
                                                                     a.threads, a.reps))
    print("%-22s %5s %9s %9s %9s %9s %9s" % ("conv", "count", "fwd", "dgrad", "wgrad", "fwd GF/s",
                                              "sum x cnt"))
    total = 0.0
    for name, n, h, w, c, o, k, st, pad, count in shapes:
        x = torch.randn(n, c, h, w).to(dt).contiguous(memory_format=torch.channels_last)
        wt = torch.randn(o, c, k, k).to(dt).contiguous(memory_format=torch.channels_last)
        y = torch.nn.functional.conv2d(x, wt, None, st, pad)
        dy = torch.randn_like(y).contiguous(memory_format=torch.channels_last)
        args = (None, [st, st], [pad, pad], [1, 1], False, [0, 0], 1)

        def fwd():
            torch.nn.functional.conv2d(x, wt, None, st, pad)

        def grad(mask):
            return lambda: torch.ops.aten.convolution_backward(dy, x, wt, *args, mask)

        with torch.no_grad():
            tf = best_ms(fwd, a.reps)
            # a first layer's data gradient is not computed (mptc skips it too)
            td = best_ms(grad([True, False, False]), a.reps) if c > 3 else 0.0
            tw = best_ms(grad([False, True, False]), a.reps)
        flops = 2.0 * n * y.shape[2] * y.shape[3] * o * c * k * k
        total += (tf + td + tw) * count
        print("%-22s %5d %9.3f %9.3f %9.3f %9.1f %9.2f" % (name, count, tf, td, tw,
                                                           flops / tf * 1e-6,
                                                           (tf + td + tw) * count))
    print("total (forward + both gradients, x count): %.2f ms" % total)


if __name__ == "__main__":
    main()
