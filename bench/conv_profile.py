#!/usr/bin/env python3
"""Groups the convolution kernels of an `mptc train|bench --profile` table
by layer and direction (forward, data gradient, filter gradient), to set
beside bench/conv_shapes.py's PyTorch figures.

    mptc train examples/resnet50.mpt --profile ... > prof.txt
    python3 bench/conv_profile.py prof.txt [--resnet]

A layer's first convolution kernel is its forward pass; of the later ones,
the one whose name holds the loss-scale finite check (is_finite) is the
filter gradient, the other the data gradient. The core's ms per step is
what is summed (the kernel's own epilogue loops aside). --resnet sums
ResNet-50's blocks into bench/conv_shapes.py's rows (e.g. "conv3 3x3": the
3x3 convolutions of every block of stage 3).
"""
import re
import sys
from collections import OrderedDict

ROW = re.compile(r"^\s*(\d+)\s+conv\s+([\d.]+)\s+[\d.]+\s+([\d.]+)\s+.*?%\s+(\S+)\s+(\S+)\s*$")


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


def main():
    path = sys.argv[1]
    resnet = "--resnet" in sys.argv
    layers = OrderedDict()
    for line in open(path):
        m = ROW.match(line)
        if not m:
            continue
        k, _, core, layer, kernel = m.groups()
        layers.setdefault(layer, []).append((int(k), float(core), kernel))
    rows = OrderedDict()
    for layer, ks in layers.items():
        ks.sort()
        fwd, dgrad, wgrad = ks[0][1], 0.0, 0.0
        for _, core, kernel in ks[1:]:
            if "is_finite" in kernel:
                wgrad += core
            else:
                dgrad += core
        key = resnet_class(layer) if resnet else layer
        r = rows.setdefault(key, [0, 0.0, 0.0, 0.0])
        r[0] += 1
        r[1] += fwd
        r[2] += dgrad
        r[3] += wgrad
    print("%-22s %5s %9s %9s %9s %9s" % ("conv", "count", "fwd", "dgrad", "wgrad", "sum"))
    total = 0.0
    for key, (n, f, d, w) in rows.items():
        total += f + d + w
        print("%-22s %5d %9.3f %9.3f %9.3f %9.2f" % (key, n, f, d, w, f + d + w))
    print("total core ms per step: %.2f" % total)


if __name__ == "__main__":
    main()
