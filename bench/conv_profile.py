#!/usr/bin/env python3
"""Groups the convolution kernels of an `mptc train|bench --profile` table
by layer and direction (forward, data gradient, filter gradient), to set
beside bench/conv_shapes.py's PyTorch figures, with each direction's share
of the ceiling its kernels ran against.

    mptc bench examples/convnet64.mpt --profile ... > prof.txt
    python3 bench/conv_profile.py prof.txt --model convnet64 [--batch 32]
    python3 bench/conv_profile.py prof.txt --model resnet50 [--batch 8]

A layer's first convolution kernel is its forward pass; of the later ones,
the one whose name holds the loss-scale finite check (is_finite) is the
filter gradient, the other the data gradient. The core's ms per step is
what is summed (the kernel's own epilogue loops aside). ResNet-50's
blocks are summed into bench/conv_shapes.py's rows (e.g. "conv3 3x3": the
3x3 convolutions of every block of stage 3).

"of ceiling": the direction's GFLOP/s as a share of the ceiling the
profile measured in the same process for the path its kernels took (the
"ceilings" line: the f32 FMA loop, the vdpbf16ps loop or AMX; where bf16
is multiplied in f32 FMAs, the bf16 ceiling is the FMA loop's). Which of
the two a kernel ran against is read back from its row's own percentage.
The flops are conv_shapes.useful_flops of the layer's shape (the products
that do not multiply padding, with mptc's "same" padding), not the
profile's 2MNK, which counts the padding's taps that mptc skips; a
group's share is the time its kernels would take at their ceilings over
the time they took.
Only the last profile table in the file is read (one per policy and batch).
"""
import argparse
import os
import re
import sys
from collections import OrderedDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import conv_shapes  # noqa: E402 -- the shapes and their useful products

ROW = re.compile(r"^\s*(\d+)\s+conv\s+([\d.]+)\s+[\d.]+\s+([\d.]+)\s+([\d.]+) GF/s\s+([\d.]+)%\s+"
                 r"(\S+)\s+(\S+)\s*$")
CEIL = re.compile(r"^ceilings on (\d+) threads?: f32 ([\d.]+) GFLOP/s \((.*?)\), bf16 ([\d.]+) "
                  r"GFLOP/s \((.*?)\), memory")


def resnet_class(layer):
    if layer == "conv1_conv":
        return "conv1_conv"
    m = re.match(r"(conv\d)/(proj|identity_\d+)/(\w+)", layer)
    if not m:
        return layer
    stage, block, conv = m.groups()
    stride = "s1" if stage == "conv2" else "s2"
    if conv == "shortcut_conv":
        return "%s proj 1x1 %s" % (stage, stride)
    if conv == "conv_1":
        return "%s 1x1 in %s" % (stage, stride) if block == "proj" else "%s 1x1 in" % stage
    if conv == "conv_2":
        return "%s 3x3" % stage
    return "%s 1x1 out" % stage


def read_table(path):
    """The last profile table's ceilings and conv rows."""
    ceil, rows, tables = None, [], 0
    for line in open(path):
        if line.startswith("cpu profile of"):
            tables += 1
            rows = []
        m = CEIL.match(line)
        if m:
            ceil = dict(threads=int(m.group(1)), f32=float(m.group(2)), f32_how=m.group(3),
                        bf16=float(m.group(4)), bf16_how=m.group(5))
            continue
        m = ROW.match(line)
        if m:
            k, _, core, rate, pct, layer, kernel = m.groups()
            rows.append((int(k), float(core), float(rate), float(pct), layer, kernel))
    if tables > 1:
        print("conv_profile: %d profile tables in %s; reading the last" % (tables, path), file=sys.stderr)
    return ceil, rows


def which_ceiling(ceil, rate, pct):
    """'f32' or 'bf16': the ceiling the row's percentage was taken against."""
    if pct <= 0:
        return "f32"
    implied = rate * 100.0 / pct
    return min(("f32", "bf16"), key=lambda c: abs(ceil[c] - implied))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("profile")
    ap.add_argument("--model", choices=["convnet64", "resnet50"], required=True)
    ap.add_argument("--batch", type=int, default=0, help="default: 32 (convnet64), 8 (resnet50)")
    a = ap.parse_args()
    resnet = a.model == "resnet50"
    shapes = {sh[0]: sh for sh in conv_shapes.shapes_of(a.model, a.batch)}
    ceil, krows = read_table(a.profile)
    if not krows:
        print("conv_profile: no conv rows in %s (hint: run mptc with --profile on --device cpu)" % a.profile,
              file=sys.stderr)
        return 1
    if not ceil:
        print("conv_profile: no 'ceilings on' line in %s (hint: a profile from an older mptc)" % a.profile,
              file=sys.stderr)
        return 1
    layers = OrderedDict()
    used = set()
    for k, core, rate, pct, layer, kernel in krows:
        c = which_ceiling(ceil, rate, pct)
        used.add(c)
        layers.setdefault(layer, []).append((k, core, ceil[c], kernel))
    rows = OrderedDict()
    for layer, ks in layers.items():
        key = resnet_class(layer) if resnet else layer
        if key not in shapes:
            print("conv_profile: layer %s (%s) is not a convolution of %s in bench/conv_shapes.py" %
                  (layer, key, a.model), file=sys.stderr)
            return 1
        name, n, h, w, cin, cout, kk, st, pad, _ = shapes[key]
        before, after = conv_shapes.tf_same_pad(h, kk, st) if a.model == "convnet64" else (pad, pad)
        flops = conv_shapes.useful_flops(n, h, w, cin, cout, kk, st, before, after)
        ks.sort()
        # per direction: [core ms, ms at the ceiling]; ms = flops / (GFLOP/s x 1e9) x 1e3
        acc = [[ks[0][1], flops * 1e-6 / ks[0][2]], [0.0, 0.0], [0.0, 0.0]]
        for _, core, top, kernel in ks[1:]:
            d = acc[2] if "is_finite" in kernel else acc[1]
            # a direction cut into several kernels (data gradient phases) shares the flops
            d[1] = d[1] or flops * 1e-6 / top
            d[0] += core
        r = rows.setdefault(key, [0, [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
        r[0] += 1
        for i in range(3):
            r[1 + i][0] += acc[i][0]
            r[1 + i][1] += acc[i][1]
    print("ceiling, as the profile measured it on %d thread%s: %s" %
          (ceil["threads"], "" if ceil["threads"] == 1 else "s",
           "; ".join("%s %.0f GFLOP/s (%s)" % (c, ceil[c], ceil[c + "_how"]) for c in sorted(used))))
    print("%-22s %5s %9s %9s %9s %9s  %6s %6s %6s  (of ceiling)" % ("conv", "count", "fwd", "dgrad",
                                                                    "wgrad", "sum", "fwd", "dgrad", "wgrad"))

    def frac(d):
        return "%5.1f%%" % (100.0 * d[1] / d[0]) if d[0] > 0 else "%6s" % "-"

    total, ideal = 0.0, 0.0
    for key, (n, f, d, w) in rows.items():
        s = f[0] + d[0] + w[0]
        total += s
        ideal += f[1] + d[1] + w[1]
        print("%-22s %5d %9.3f %9.3f %9.3f %9.2f  %s %s %s" % (key, n, f[0], d[0], w[0], s, frac(f),
                                                               frac(d), frac(w)))
    print("total core ms per step: %.2f (%.1f%% of the ceiling)" % (total, 100.0 * ideal / total))
    return 0


if __name__ == "__main__":
    sys.exit(main())
