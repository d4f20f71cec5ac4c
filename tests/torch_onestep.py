#!/usr/bin/env python3
"""One SGD step of mptc against PyTorch from the same safetensors weights.

Run by tests/torch_onestep.t.sh (issue 37): python3 tests/torch_onestep.py
--mptc build/mptc --tmp DIR. For each model under tests/models/torch_*.mpt

  1. mptc writes its initial state (one step at a learning rate of 1e-30,
     which leaves every weight as initialised), giving the names, shapes
     and Keras layouts of the weights;
  2. this script makes the starting weights w0: mptc's kernels and
     recurrent kernels as initialised, embeddings uniform in [-1, 1)
     (Keras' 0.05 would leave the LSTM's input kernel almost without a
     gradient), and random biases, betas and gammas (mptc initialises them
     to 0 and 1, where a bias added in the wrong place would go unseen),
     and writes them as safetensors (by hand: 8-byte header length, JSON
     header, raw little-endian data);
  3. mptc trains one step from w0 (--init-weights) on a fixed batch, SGD
     without momentum, and saves w1; its JSON log gives the step's loss;
  4. PyTorch builds the same model with Keras' semantics from w0, in
     float64 (the reference) and float32, on the same batch: the loss
     (mean sparse categorical crossentropy over every sample and position,
     Keras' sum_over_batch_size) and its gradient;
  5. compared: mptc's loss, its gradient g = (w0 - w1) / lr and its w1
     against the float64 reference.

The learning rate is 1024, a power of two (lr * g and (w0 - w1) / lr are
exact in binary): with it lr * g outweighs w0, so w1's rounding to f32 is
about an ulp of lr * g and (w0 - w1) / lr recovers mptc's gradient to f32
precision; at lr = 1 a gradient of 1e-3 on a weight of 0.5 would only be
seen to 3e-5 of itself. It is one step, so its size is harmless.

The batch is the whole training part of the data (batch_size = the number
of training samples), so mptc's shuffling cannot change what the step sees
(only the order of a sum). Data: text(...) on a file written here (8
windows of 8 bytes, test_fraction=0.5: 4 train windows) for the GPT block
and the LSTM language model; idx(...) files written here (4 records of
[6, 5] bytes, scaled by 1/255 in f32 as mptc does, 3 classes) for the
LSTM and GRU classifiers.

PyTorch's own layers do the work where they express Keras' layer:
F.embedding, F.layer_norm (eps=1e-3, Keras' default), F.gelu
(approximate='none': mptc's and Keras' gelu is the exact erf form),
F.scaled_dot_product_attention (is_causal=True, its default scale
1/sqrt(key_dim) as Keras), nn.LSTM through torch.func.functional_call with
weight_ih = kernel.T, weight_hh = recurrent_kernel.T, bias_ih = bias,
bias_hh = 0 (PyTorch's gate order i, f, g, o is Keras' i, f, c, o), nn.GRU
likewise with Keras' gates z, r, h put in PyTorch's order r, z, n and
bias[0], bias[1] as bias_ih, bias_hh (PyTorch's GRU is Keras'
reset_after=true), and F.cross_entropy. Keras' einsum projections of
MultiHeadAttention (query, key, value kernels [d, heads, dim], biases
[heads, dim], output kernel [heads, value_dim, d]) are torch.einsum.
Gradients come out in Keras' layouts because the leaves are the
Keras-layout tensors.

Bounds (float32), each tensor's largest error against the tensor's own
largest gradient element (its scale), G the largest over every tensor:
    loss:      |L_mptc - L_ref| <= 1e-6 |L_ref|
    gradient:  max|g_mptc - g_ref| <= 5e-5 scale + 5e-8 G + q / lr
    weights:   max|w1_mptc - w1_ref| <= lr (5e-5 scale + 5e-8 G) + q
where q = 2^-24 max(|w0|, |w1|) is half an ulp of w1 (its rounding).
Why these: f32's unit roundoff is u = 6e-8. The loss is a mean of 32
log-softmaxes over 256 classes of values a few layers deep, with sums of
at most a few hundred terms and exp/log/erf/tanh accurate to a few ulp:
its relative error is a few u (measured: up to 1.2e-7, PyTorch's own
float32 1.4e-7), and 1e-6 leaves a factor of 8. A gradient element is a
sum over the batch and steps of products through the same depth; its
error is a small multiple of u times the tensor's scale (measured: up to
7e-7 of the scale for mptc, 1.2e-6 for PyTorch's float32), and 5e-5
leaves a factor of 40 or more. The 5e-8 G term is for tensors whose exact
gradient is 0 (the attention's key bias: softmax ignores a shift of every
score of a row): their f32 gradient is rounding noise of terms the size of
the others' gradients (measured 2e-9 G), not of their own zero scale.
What the bounds catch is checked on every run: the same comparison
against deliberately wrong references (the tanh GELU instead of the erf
one, layer norm's epsilon 1e-5 (PyTorch's default) instead of 1e-3, no
causal mask, the LSTM's i and f gates swapped, its recurrent kernel read
untransposed, the GRU's z and r gates in Keras' order) must fail, or this
script fails. Made to fail from mptc's side (by hand, not committed): the
LSTM's i and f gates swapped in lang/lower_layers.c, or the attention's
scale 1/sqrt(key_dim + 0.01), fail with 22 times the bound or more.

Under mixed_bfloat16 (Keras' policy: bfloat16 compute, f32 master weights;
the attention's scores f32) the reference stays float64 and the bounds are
bfloat16's, u = 2^-8 = 3.9e-3: loss 1e-2 relative, gradients 1e-1 scale +
1e-3 G. They catch gross errors only; the float32 run checks the
semantics. PyTorch's bfloat16 autocast (bfloat16 matmuls, the rest in the
dtype they are given) is measured beside it for scale, not compared.

Exit status: 0 agreement, 1 disagreement (each failing tensor named with
its errors), 2 a run of mptc, or this script, failed.
"""
import argparse
import json
import os
import struct
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F

LR = 1024.0   # see the header: (w0 - w1) / LR recovers g to f32 precision
T = 8          # text windows
B = 4          # the whole train part: 4 windows, or 4 idx records

# ---- safetensors by hand ---------------------------------------------------

DT = {"F32": np.float32, "I32": np.int32, "F16": np.float16}


def st_read(path):
    b = open(path, "rb").read()
    (n,) = struct.unpack("<Q", b[:8])
    head = json.loads(b[8:8 + n])
    meta = head.pop("__metadata__", {})
    out = {}
    for k, v in head.items():
        s, e = v["data_offsets"]
        out[k] = np.frombuffer(b[8 + n + s:8 + n + e], dtype=DT[v["dtype"]]).reshape(v["shape"]).copy()
    return out, meta


def st_write(path, tensors):
    head, off, blobs = {"__metadata__": {"note": "written by tests/torch_onestep.py"}}, 0, []
    for k, v in tensors.items():
        v = np.ascontiguousarray(v, dtype=np.float32)
        head[k] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [off, off + v.nbytes]}
        off += v.nbytes
        blobs.append(v.tobytes())
    h = json.dumps(head).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def is_weight(name, names):
    if name.startswith(("optimizer/", "loss_scale/", "rng/")):
        return False
    return not any(name.startswith(o + "/") for o in names if o != name)

# ---- data -------------------------------------------------------------------


def write_text(path):
    rng = np.random.default_rng(7)
    alphabet = np.frombuffer(b"etaoin shrdlu\ncmfwyp,.ETAOIN", dtype=np.uint8)
    data = alphabet[rng.integers(0, len(alphabet), 8 * T + 1)]
    open(path, "wb").write(data.tobytes())
    x = np.stack([data[i * T:i * T + T] for i in range(B)]).astype(np.int64)
    y = np.stack([data[i * T + 1:i * T + T + 1] for i in range(B)]).astype(np.int64)
    return x, y


def write_idx(xpath, ypath):
    rng = np.random.default_rng(11)
    px = rng.integers(0, 256, (B, 30), dtype=np.uint8)
    labels = np.array([0, 2, 1, 2], dtype=np.uint8)
    with open(xpath, "wb") as f:
        f.write(bytes([0, 0, 8, 2]) + struct.pack(">II", B, 30) + px.tobytes())
    with open(ypath, "wb") as f:
        f.write(bytes([0, 0, 8, 1]) + struct.pack(">I", B) + labels.tobytes())
    # as mptc: (float)px / 255.0f, in f32
    x = (px.astype(np.float32) / np.float32(255.0)).reshape(B, 6, 5)
    return x, labels.astype(np.int64)

# ---- the models in PyTorch, Keras' semantics ----------------------------------


def layer_norm(x, w, name, eps):
    return F.layer_norm(x, x.shape[-1:], w[name + "/gamma"], w[name + "/beta"], eps)


def lstm(x, w, name, return_sequences, swap_if=False, untransposed=False):
    """Keras LSTM through PyTorch's nn.LSTM (same gate order i, f, c/g, o)."""
    k, r, b = w[name + "/kernel"], w[name + "/recurrent_kernel"], w[name + "/bias"]
    units = r.shape[0]
    if swap_if:   # a wrong reading of the layout: i and f exchanged
        perm = torch.cat([torch.arange(units, 2 * units), torch.arange(0, units),
                          torch.arange(2 * units, 4 * units)])
        k, r, b = k[:, perm], r[:, perm], b[perm]
    mod = torch.nn.LSTM(k.shape[0], units, batch_first=True).to(x.dtype)
    rt = r.reshape(4 * units, units) if untransposed else r.t()
    params = {"weight_ih_l0": k.t(), "weight_hh_l0": rt, "bias_ih_l0": b,
              "bias_hh_l0": torch.zeros_like(b)}
    out, (h, _) = torch.func.functional_call(mod, params, (x,))
    return out if return_sequences else h[0]


def gru(x, w, name, keras_order=False):
    """Keras GRU (reset_after=true: bias [2, 3u], an input and a recurrent
    row) through PyTorch's nn.GRU, whose gate order is r, z, n where Keras'
    is z, r, h; PyTorch applies r to (W_hn h + b_hn) as reset_after does."""
    k, r, b = w[name + "/kernel"], w[name + "/recurrent_kernel"], w[name + "/bias"]
    units = r.shape[0]
    perm = torch.arange(3 * units) if keras_order else torch.cat(
        [torch.arange(units, 2 * units), torch.arange(0, units), torch.arange(2 * units, 3 * units)])
    mod = torch.nn.GRU(k.shape[0], units, batch_first=True).to(x.dtype)
    params = {"weight_ih_l0": k[:, perm].t(), "weight_hh_l0": r[:, perm].t(),
              "bias_ih_l0": b[0, perm], "bias_hh_l0": b[1, perm]}
    _, h = torch.func.functional_call(mod, params, (x,))
    return h[0]


def gpt(w, x, br):
    eps = 1e-5 if br == "ln_eps" else 1e-3
    h0 = F.embedding(x, w["tokens/embeddings"]) + w["positions/embeddings"][: x.shape[1]]
    h = layer_norm(h0, w, "ln1", eps)
    q = torch.einsum("btd,dhk->bhtk", h, w["attn/query/kernel"]) + w["attn/query/bias"][None, :, None, :]
    k = torch.einsum("btd,dhk->bhtk", h, w["attn/key/kernel"]) + w["attn/key/bias"][None, :, None, :]
    v = torch.einsum("btd,dhk->bhtk", h, w["attn/value/kernel"]) + w["attn/value/bias"][None, :, None, :]
    o = F.scaled_dot_product_attention(q, k, v, is_causal=(br != "no_causal"))
    a = torch.einsum("bhtv,hvd->btd", o, w["attn/attention_output/kernel"]) + w["attn/attention_output/bias"]
    r1 = h0 + a
    h = layer_norm(r1, w, "ln2", eps)
    u = F.gelu(h @ w["up/kernel"] + w["up/bias"], approximate="tanh" if br == "gelu_tanh" else "none")
    r2 = r1 + u @ w["down/kernel"] + w["down/bias"]
    h = layer_norm(r2, w, "final_ln", eps)
    return h @ w["next_byte/kernel"] + w["next_byte/bias"]


def lstm_seq(w, x, br):
    h = F.embedding(x, w["tokens/embeddings"])
    h = lstm(h, w, "seq", True, swap_if=br == "lstm_if", untransposed=br == "lstm_rk")
    return h @ w["next_byte/kernel"] + w["next_byte/bias"]


def lstm_cls(w, x, br):
    h = lstm(x, w, "last", False, swap_if=br == "lstm_if", untransposed=br == "lstm_rk")
    return h @ w["logits/kernel"] + w["logits/bias"]


def gru_cls(w, x, br):
    h = gru(x, w, "last", keras_order=br == "gru_zr")
    return h @ w["logits/kernel"] + w["logits/bias"]


MODELS = {
    # name: (forward, data kind, the wrong references that must be caught)
    "torch_gpt": (gpt, "text", ["gelu_tanh", "ln_eps", "no_causal"]),
    "torch_lstm_seq": (lstm_seq, "text", ["lstm_if", "lstm_rk"]),
    "torch_lstm_cls": (lstm_cls, "idx", ["lstm_if", "lstm_rk"]),
    "torch_gru_cls": (gru_cls, "idx", ["gru_zr"]),
}


def torch_step(fwd, w0, x, y, dtype, br=None, autocast=False):
    """Loss and gradients (float64 numpy) of one step from w0."""
    w = {k: torch.tensor(v, dtype=dtype, requires_grad=True) for k, v in w0.items()}
    xt = torch.tensor(x) if x.dtype == np.int64 else torch.tensor(x, dtype=dtype)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = fwd(w, xt, br)
    logits = logits.float() if autocast else logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.tensor(y).reshape(-1))
    loss.backward()
    return loss.item(), {k: (t.grad if t.grad is not None else torch.zeros_like(t)).double().numpy()
                         for k, t in w.items()}

# ---- mptc -------------------------------------------------------------------


def mptc(args, log, *cmd):
    with open(log, "w") as f:
        r = subprocess.run([args.mptc, "train", *cmd], stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        sys.stdout.write(open(log).read())
        print(f"FAIL: mptc train {' '.join(cmd)} exited {r.returncode}")
        sys.exit(2)


def step_loss(path):
    for line in open(path):
        e = json.loads(line)
        if e.get("event") == "step":
            return e["loss"]
    raise SystemExit(f"FAIL: no step line in {path}")

# ---- comparison ----------------------------------------------------------------


class Bounds:
    def __init__(self, policy):
        if policy == "float32":
            self.loss, self.grad, self.floor = 1e-6, 5e-5, 5e-8
        else:
            self.loss, self.grad, self.floor = 1e-2, 1e-1, 1e-3


ZERO = 1e-12   # a gradient this small everywhere is 0 but for rounding (attn/key/bias)


def compare(w0, loss_ref, g_ref, loss_m, w1_m, bounds, report=None):
    """Problems (a list of strings) of mptc's step against the reference; rows
    (name, max abs error, error / tensor scale, scale, w1's max error over
    its largest element, fraction of the bound) appended to report when given."""
    bad = []
    # rounding noise of a gradient that is 0 in exact arithmetic is relative
    # to the gradients it is summed from, not to itself
    floor = bounds.floor * max(np.abs(g).max() for g in g_ref.values())
    rel = abs(loss_m - loss_ref) / abs(loss_ref)
    if rel > bounds.loss:
        bad.append(f"loss {loss_m:.9g} vs {loss_ref:.9g}: relative error {rel:.3g} > {bounds.loss:g}")
    if report is not None:
        report.append(("loss", abs(loss_m - loss_ref), rel, 0.0, 0.0, rel / bounds.loss))
    for k in w0:
        w0d, w1d = w0[k].astype(np.float64), w1_m[k].astype(np.float64)
        g_m = (w0d - w1d) / LR
        scale = np.abs(g_ref[k]).max()
        ge = np.abs(g_m - g_ref[k]).max()
        we = np.abs(w1d - (w0d - LR * g_ref[k])).max()
        # w1 is rounded to f32: up to half an ulp of w, 2^-24 |w|, in g * lr
        quant = 2.0 ** -24 * max(np.abs(w0d).max(), np.abs(w1d).max()) * 1.01
        gtol = bounds.grad * scale + floor + quant / LR
        wtol = LR * (bounds.grad * scale + floor) + quant
        if report is not None:
            report.append((k, ge, ge / scale if scale > ZERO else 0.0, scale,
                           we / np.abs(w0d - LR * g_ref[k]).max(), ge / gtol))
        if not ge <= gtol:
            bad.append(f"{k}: gradient max error {ge:.3g} > {gtol:.3g} (its largest element {scale:.3g})")
        elif not we <= wtol:
            bad.append(f"{k}: weights after the step max error {we:.3g} > {wtol:.3g}")
    return bad


def summary(rep):
    """loss relative error, the largest gradient error relative to its tensor's
    largest element (tensors with a nonzero gradient), that tensor, the
    largest w1 error and the largest fraction of a bound used."""
    g = max(rep[1:], key=lambda r: r[2])
    return (f"loss rel {rep[0][2]:.1e}  grad err/scale {g[2]:.1e} ({g[0]})  "
            f"w1 err/|w1| {max(r[4] for r in rep[1:]):.1e}  bound used {max(r[5] for r in rep):.2f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mptc", default=os.environ.get("MPTC", "build/mptc"))
    ap.add_argument("--models", default="tests/models")
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--devices", default="interp,cpu")
    ap.add_argument("--policies", default="float32")
    ap.add_argument("--only", default="", help="comma-separated model names")
    ap.add_argument("--break-weight", default="",
                    help="NAME: add 1e-3 to one element of this weight on the PyTorch side (the test must fail)")
    ap.add_argument("--verbose", action="store_true", help="every tensor's errors")
    args = ap.parse_args()
    torch.manual_seed(0)
    tmp = args.tmp
    os.makedirs(tmp, exist_ok=True)
    text = os.path.join(tmp, "torch_onestep.txt")
    idx_x, idx_y = os.path.join(tmp, "torch_onestep_x.idx"), os.path.join(tmp, "torch_onestep_y.idx")
    data = {"text": (write_text(text), f'text("{text}", seq_len={T}, test_fraction=0.5)'),
            "idx": (write_idx(idx_x, idx_y), f'idx("{idx_x}", "{idx_y}")')}
    failed = False
    for name, (fwd, kind, wrongs) in MODELS.items():
        if args.only and name not in args.only.split(","):
            continue
        (x, y), spec = data[kind]
        model = os.path.join(args.models, name + ".mpt")
        base = os.path.join(tmp, name)
        common = ["--data", spec, "--max-steps", "1", "--no-test", "--quiet", "--batch-size", str(B)]
        # 1. names, shapes and initial values
        mptc(args, base + ".init.out", model, *common, "--device", "interp",
             "--learning-rate", "1e-30", "--save", base + ".init.st")
        init, meta = st_read(base + ".init.st")
        names = list(init)
        # 2. w0: mptc's kernels, random biases, betas and gammas
        rng = np.random.default_rng(sum(name.encode()))
        w0 = {}
        for k in names:
            if not is_weight(k, names):
                continue
            v = init[k].astype(np.float32)
            if k.endswith(("/bias", "/beta")):
                v = rng.uniform(-0.5, 0.5, v.shape).astype(np.float32)
            elif k.endswith("/embeddings"):
                v = rng.uniform(-1.0, 1.0, v.shape).astype(np.float32)
            elif k.endswith("/gamma"):
                v = rng.uniform(0.5, 2.0, v.shape).astype(np.float32)
            w0[k] = v
        st_write(base + ".w0.st", w0)
        # 4. the references
        loss_ref, g_ref = torch_step(fwd, w0, x, y, torch.float64)
        loss_32, g_32 = torch_step(fwd, w0, x, y, torch.float32)
        wref = dict(w0)
        if args.break_weight:
            if args.break_weight in wref:
                wref[args.break_weight] = wref[args.break_weight].copy()
                wref[args.break_weight].flat[0] += 1e-3
                loss_ref, g_ref = torch_step(fwd, wref, x, y, torch.float64)
        print(f"{name}: {len(w0)} weights, batch of {B}, reference loss {loss_ref:.9f} (float64)")
        rep = []
        compare(w0, loss_ref, g_ref, loss_32, {k: (w0[k].astype(np.float64) - LR * g_32[k]) for k in w0},
                Bounds("float32"), rep)
        print(f"  {'torch float32':26s} {summary(rep)}")
        # the wrong references must be told apart from the right one
        for wr in wrongs:
            l_w, g_w = torch_step(fwd, w0, x, y, torch.float64, br=wr)
            w1_w = {k: (w0[k].astype(np.float64) - LR * g_w[k]).astype(np.float32) for k in w0}
            caught = compare(w0, loss_ref, g_ref, l_w, w1_w, Bounds("float32"))
            print(f"  {'wrong reference ' + wr:26s} {'caught' if caught else 'NOT CAUGHT'}"
                  f" ({len(caught)} problems{': ' + caught[0] if caught else ''})")
            if not caught:
                failed = True
        # 3 and 5. one mptc step per policy and device
        for policy in args.policies.split(","):
            bounds = Bounds(policy)
            if policy != "float32":
                la, ga = torch_step(fwd, w0, x, y, torch.float32, autocast=True)
                rep = []
                compare(w0, loss_ref, g_ref, la, {k: (w0[k].astype(np.float64) - LR * ga[k]) for k in w0},
                        bounds, rep)
                print(f"  {'torch autocast bfloat16':26s} {summary(rep)}")
            for dev in args.devices.split(","):
                tag = f"{base}.{policy}.{dev}"
                mptc(args, tag + ".out", model, *common, "--device", dev, "--policy", policy,
                     "--init-weights", base + ".w0.st", "--learning-rate", str(LR),
                     "--save", tag + ".w1.st", "--log", tag + ".jsonl")
                w1, _ = st_read(tag + ".w1.st")
                rep = []
                bad = compare(w0, loss_ref, g_ref, step_loss(tag + ".jsonl"), w1, bounds, rep)
                print(f"  {'mptc ' + policy + ' ' + dev:26s} {summary(rep)}  {'ok' if not bad else 'DISAGREES'}")
                if args.verbose:
                    for r in rep[1:]:
                        print(f"      {r[0]:30s} grad scale {r[3]:.3e} err {r[1]:.3e} rel {r[2]:.1e} w1 err/|w1| {r[4]:.1e} bound used {r[5]:.2f}")
                for p in bad:
                    print(f"    FAIL {name} {policy} {dev}: {p}")
                failed |= bool(bad)
    print("FAIL: mptc's step disagrees with PyTorch" if failed else "OK: mptc's step agrees with PyTorch")
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:   # a broken script is not a disagreement
        import traceback
        traceback.print_exc()
        print("FAIL: tests/torch_onestep.py itself failed")
        sys.exit(2)
