#!/usr/bin/env python3
"""PyTorch's convolutions, one shape at a time: forward, data gradient and
filter gradient, in bf16 (channels_last, as autocast runs them through
oneDNN) or f32, on a given number of threads. The figures to hold mptc's
per-kernel profile (`mptc train ... --profile`) against, kernel by kernel.

    taskset -c 1 python3 bench/conv_shapes.py --model convnet64 --threads 1
    taskset -c 1 python3 bench/conv_shapes.py --model resnet50 --dtype f32

Rates (GF/s and the shares below) count the products that do not
multiply padding (useful_flops), as conv_profile.py does for mptc.

--mptc BUILD/mptc adds each direction's share of this host's ceiling, as
`mptc devices` measures it on the cores this process may run on (per
thread, times --threads): the bf16 peak for bf16 (the path mptc takes:
AMX, vdpbf16ps, or f32 FMAs where vdpbf16ps is slower), the f32 FMA peak
for f32; with MPTC_CPU_ISA=avx2 in the environment (the peers limited to
AVX2 too: ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2, and
MKL_ENABLE_INSTRUCTIONS=AVX2 for the stride-1 1x1 convolutions that
PyTorch hands to MKL's sgemm), the AVX2 FMA peak for both.

Padding: mptc (like Keras) pads "same" stride-2 convolutions asymmetrically
(the extra row and column at the bottom and right); here each convolution
takes the symmetric padding that gives the same output size, which does the
same number of products to within a row of taps.
"""
import argparse
import os
import re
import subprocess
import sys
import time

# (name, batch, H, W, C, O, kernel, stride, padding)
CONVNET64 = [
    ("conv_1", 32, 64, 64, 3, 32, 5, 2, 2),
    ("conv_2", 32, 32, 32, 32, 64, 7, 2, 3),
    ("conv_3", 32, 16, 16, 64, 128, 11, 2, 5),
]


def shapes_of(model, batch=0):
    """The model's convolutions, each with its count."""
    if model == "convnet64":
        return [(s[0], batch or s[1]) + s[2:] + (1,) for s in CONVNET64]
    return resnet50(batch or 8)


def taps(size, k, stride, before, after):
    """Sum over the outputs of one spatial dim of the taps that fall inside
    the image (not on its padding), given the padding before and after it."""
    out = (size + before + after - k) // stride + 1
    return sum(sum(1 for t in range(k) if 0 <= o * stride - before + t < size) for o in range(out))


def useful_flops(n, h, w, c, o, k, stride, before, after=None):
    """2 x the products of one direction that do not multiply padding: the
    same set of (output, tap) pairs in the forward pass and both gradients.
    The rate of a convolution is taken over these, not over every tap of
    every window: mptc skips the padding's products (a gathered
    convolution's kernel-row segments), so a count with them could go
    over the ceiling (convnet64's conv_3, 11x11 on 16x16: 31% of its taps
    are padding). after: the padding after each dim, where it is not before's."""
    after = before if after is None else after
    return 2.0 * n * o * c * taps(h, k, stride, before, after) * taps(w, k, stride, before, after)


def tf_same_pad(size, k, stride):
    """TensorFlow's (and mptc's) 'same' padding (before, after) of a dim: the
    smaller half before when the total is odd."""
    out = -(-size // stride)
    total = max((out - 1) * stride + k - size, 0)
    return total // 2, total - total // 2


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


def ceiling_gflops(mptc, dtype, threads):
    """The ceiling per `mptc devices` (see the module's comment), GFLOP/s on
    `threads` threads, and how it was measured."""
    out = subprocess.run([mptc, "devices"], capture_output=True, text=True, check=True).stdout
    isa = os.environ.get("MPTC_CPU_ISA", "")
    if isa and isa != "host":
        m = re.search(r"measured peak at MPTC_CPU_ISA=\S+: f32 ([\d.]+) GFLOP/s \((.*?)\).*?, (\d+) threads",
                      out)
        if not m:
            sys.exit("conv_shapes: `%s devices` printed no peak for MPTC_CPU_ISA=%s" % (mptc, isa))
        peak, how, n = float(m.group(1)), m.group(2), int(m.group(3))
    else:
        m = re.search(r"measured peaks: f32 ([\d.]+) GFLOP/s \((.*?)\), bf16 ([\d.]+) GFLOP/s "
                      r"\((.*?)\), (\d+) threads", out)
        if not m:
            sys.exit("conv_shapes: `%s devices` printed no measured peaks" % mptc)
        i = 3 if dtype == "bf16" else 1
        peak, how, n = float(m.group(i)), m.group(i + 1), int(m.group(5))
    return peak / n * threads, how


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
    ap.add_argument("--mptc", help="mptc binary: add each direction's share of its measured ceiling")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    torch.set_flush_denormal(True)
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    shapes = shapes_of(a.model, a.batch)
    ceil = ceiling_gflops(a.mptc, a.dtype, a.threads) if a.mptc else None
    # what ran: ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA, where set, limit it
    print("pytorch %s (ATen CPU capability %s; ONEDNN_MAX_CPU_ISA=%s, MKL_ENABLE_INSTRUCTIONS=%s), %s, "
          "%d thread(s), best of %d, ms per call" %
          (torch.__version__, torch.backends.cpu.get_cpu_capability(),
           os.environ.get("ONEDNN_MAX_CPU_ISA", "unset"), os.environ.get("MKL_ENABLE_INSTRUCTIONS", "unset"),
           a.dtype, a.threads, a.reps))
    if ceil:
        print("ceiling: %.0f GFLOP/s on %d thread(s) (%s, `%s devices`)" % (ceil[0], a.threads, ceil[1],
                                                                             a.mptc))
    print("%-22s %5s %9s %9s %9s %9s %9s%s" % ("conv", "count", "fwd", "dgrad", "wgrad", "fwd GF/s",
                                                "sum x cnt",
                                                "  %6s %6s %6s  (of ceiling)" % ("fwd", "dgrad", "wgrad")
                                                if ceil else ""))
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
        flops = useful_flops(n, h, w, c, o, k, st, pad)
        total += (tf + td + tw) * count
        share = ""
        if ceil:
            share = "  " + " ".join("%5.1f%%" % (flops / t * 1e-4 / ceil[0]) if t > 0 else "%6s" % "-"
                                    for t in (tf, td, tw))
        print("%-22s %5d %9.3f %9.3f %9.3f %9.1f %9.2f%s" % (name, count, tf, td, tw,
                                                             flops / tf * 1e-6,
                                                             (tf + td + tw) * count, share))
    print("total (forward + both gradients, x count): %.2f ms" % total)


if __name__ == "__main__":
    main()
