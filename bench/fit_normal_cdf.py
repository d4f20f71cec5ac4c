#!/usr/bin/env python3
"""Fits the polynomial of the GEMM epilogue's f32 normal CDF
(codegen/cpu/gemm_epi.c, vnormal_cdf): Phi(-a) = exp(-a^2/2) t f(t) with
t = 1 / (1 + p a), so f(t) = Q(a) / t, Q(a) = erfcx(a / sqrt 2) / 2.
A least-squares fit on the relative error at Chebyshev nodes in t,
reweighted toward minimax; then f is evaluated as the kernel does (f32
coefficients, t rounded to f32, Horner in f32) on a dense grid of a.
Needs numpy and scipy (not a build dependency).

    python3 bench/fit_normal_cdf.py [--degree 8] [--p 0.265625]
"""
import argparse

import numpy as np
from scipy.special import erfcx


def q(a):
    return 0.5 * erfcx(a / np.sqrt(2))


def fit(p, deg, amax, npts=6000):
    tmin = 1 / (1 + p * amax)
    k = np.arange(npts)
    t = (tmin + 1) / 2 + (1 - tmin) / 2 * np.cos(np.pi * (k + 0.5) / npts)
    y = q((1 / t - 1) / p) / t
    v = np.vander(t, deg + 1)
    w = np.ones_like(t)
    for _ in range(30):
        c, *_ = np.linalg.lstsq(v * (w / y)[:, None], w, rcond=None)
        e = (v @ c) / y - 1
        w = w * (np.abs(e) / np.abs(e).max()) ** 0.3 + 1e-12
    return c, np.abs(e).max()


def f32_error(c, p, amax):
    a = np.linspace(0, amax, 200001)
    t = (1 / (1 + np.float32(p) * a.astype(np.float32))).astype(np.float32)
    f = np.zeros_like(t)
    for ci in c.astype(np.float32):
        f = (f * t + ci).astype(np.float32)
    return np.abs((t * f).astype(np.float64) / q(a) - 1).max()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--degree", type=int, default=8)
    ap.add_argument("--p", type=float, default=0.265625)
    ap.add_argument("--amax", type=float, default=13.3)
    o = ap.parse_args()
    c, e = fit(o.p, o.degree, o.amax)
    err = f32_error(c, o.p, o.amax)
    print(f"degree {o.degree}, p = {o.p}: fit error {e:.3g}, in f32 {err:.3g} (2^{np.log2(err):.2f})")
    print(", ".join(f"{ci:.9e}" for ci in c))


if __name__ == "__main__":
    main()
