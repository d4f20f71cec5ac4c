"""Shared by the peer benchmarks: the models (the same shapes, batch sizes and
optimizers as the .mpt files in examples/), the command line, synthetic data
and the timing loop. Every peer prints one JSON line per configuration on
stdout; diagnostics go to stderr.

Models (what examples/*.mpt describe):
  mlp_cpu    784 -> 1024 -> 1024 -> 10, batch 512, adam(1e-3)
  mnist_mlp  784 -> 4096 -> 4096 -> 10, batch 8192, rmsprop(1e-3)   (the Keras guide's)
  convnet    conv 32 5x5 s2, BN, conv 64 7x7 s2, BN, conv 128 11x11 s2, BN,
             global average pool, dense 10, softmax in f32; adam(1e-3), batch 32;
             64x64x3 inputs on the CPU, 256x256x3 on a GPU (seed 000)
  resnet50   keras.applications.ResNet50 / torchvision resnet50, 224x224x3,
             1000 classes, sgd(0.1, momentum 0.9), batch 256 on a GPU, 8 on the CPU
  gpt_tiny   examples/gpt_tiny.mpt at a context of 512 byte ids: token embedding
             256x128 plus a learned position table, 4 pre-layer-norm blocks
             (causal attention, 4 heads of 32; dense 512 GELU (erf), dense 128;
             residual adds), final layer norm, dense 256, softmax in f32 at
             every position; layer norms eps 1e-3 as Keras; batch 4;
             adamw(weight_decay 0.01, not on biases, gammas, betas and the
             embedding tables), global_clipnorm 1.0, and the file's learning
             rate schedule (cosine_decay with a linear warm-up)
All use sparse categorical cross-entropy on the f32 softmax output (gpt_tiny:
one class id per position, averaged over batch and positions).
"""
import argparse
import json
import os
import statistics
import sys
import time

MODELS = {
    "mlp_cpu": dict(kind="mlp", units=[1024, 1024], inputs=784, classes=10, batch=512,
                    optimizer="adam", lr=1e-3),
    "mnist_mlp": dict(kind="mlp", units=[4096, 4096], inputs=784, classes=10, batch=8192,
                      optimizer="rmsprop", lr=1e-3),
    "convnet": dict(kind="convnet", classes=10, batch=32, optimizer="adam", lr=1e-3,
                    convs=[(32, 5), (64, 7), (128, 11)]),
    "resnet50": dict(kind="resnet50", size=224, classes=1000, batch=256, cpu_batch=8,
                     optimizer="sgd", lr=0.1, momentum=0.9),
    # examples/gpt_tiny.mpt with `input bytes: [512]` and max_length=512
    # (bench/run_peers.sh writes that file); its train block's optimizer
    "gpt_tiny": dict(kind="gpt", vocab=256, width=128, heads=4, blocks=4, context=512,
                     classes=256, batch=4, optimizer="adamw", lr=3e-4, weight_decay=0.01,
                     global_clipnorm=1.0, eps=1e-3,
                     schedule=dict(initial=3e-4, decay_steps=3000, alpha=0.1,
                                   warmup_target=1e-3, warmup_steps=100)),
}

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")


def learning_rate(name, step):
    """The model's learning rate at optimizer step `step` (counting from 0),
    as Keras' schedules (and mptc's cosine_decay) compute it."""
    m = MODELS[name]
    sc = m.get("schedule")
    if not sc:
        return m["lr"]
    import math
    w = sc["warmup_steps"]
    if step < w:  # linear from initial to warmup_target
        return sc["initial"] + (sc["warmup_target"] - sc["initial"]) * step / w
    s = min(step - w, sc["decay_steps"])
    cos = (1 - sc["alpha"]) * 0.5 * (1 + math.cos(math.pi * s / sc["decay_steps"])) + sc["alpha"]
    return sc["warmup_target"] * cos


def is_decayed(var_name):
    """Whether adamw decays a variable: not biases, layer-norm gammas and
    betas, nor the embedding tables (gpt_tiny.mpt's exclude_from_weight_decay,
    searched in the variable's name as Keras does)."""
    return not any(k in var_name for k in ("bias", "gamma", "beta", "embeddings"))


def image_size(name, args):
    """Side of the square input image for the conv models."""
    if name == "resnet50":
        return args.image_size or 224
    return args.image_size or (256 if args.device == "cuda" else 64)


def default_batch(name, args):
    """The model's batch size on this device (a CPU-sized one where it has one)."""
    m = MODELS[name]
    return m.get("cpu_batch", m["batch"]) if args.device == "cpu" else m["batch"]


def input_shape(name, args):
    """Per-sample input shape, channels last (PyTorch transposes)."""
    m = MODELS[name]
    if m["kind"] == "mlp":
        return (m["inputs"],)
    if m["kind"] == "gpt":
        return (m["context"],)
    s = image_size(name, args)
    return (s, s, 3)


def parse_args(peer, variants, default_variants=None):
    p = argparse.ArgumentParser(description=f"{peer} peer benchmark (one JSON line per configuration)")
    p.add_argument("--model", action="append", choices=sorted(MODELS), help="repeatable (default mlp_cpu)")
    p.add_argument("--policy", default="float32,mixed_bfloat16", help="comma list of " + ",".join(POLICIES))
    p.add_argument("--batch", default="", help="comma list of batch sizes (default: the model's)")
    p.add_argument("--variant", default=",".join(default_variants or variants),
                   help="comma list of " + ",".join(variants))
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation happens here)")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--image-size", type=int, default=0, help="side of the conv models' input images")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tf32", action="store_true",
                   help="on a GPU, f32 matmuls and convolutions on TF32 Tensor Cores (default: true fp32)")
    a = p.parse_args()
    a.model = a.model or ["mlp_cpu"]
    a.policy = [x for x in a.policy.split(",") if x]
    for pol in a.policy:
        if pol not in POLICIES:
            p.error(f"unknown policy {pol!r} (use {', '.join(POLICIES)})")
    a.variant = [x for x in a.variant.split(",") if x]
    for v in a.variant:
        if v not in variants:
            p.error(f"unknown variant {v!r} (use {', '.join(variants)})")
    a.batch = [int(x) for x in a.batch.split(",") if x]
    return a


def configurations(args):
    """(model, policy, batch, variant) in a stable order."""
    for name in args.model:
        for pol in args.policy:
            for batch in args.batch or [default_batch(name, args)]:
                for v in args.variant:
                    yield name, pol, batch, v


# ---- mptc's synthetic(...) data, bit for bit ------------------------------
# A port of runtime/data (data.c open_synthetic, source_label; inputs.c
# mpt_data_synthetic_values): splitmix64's mix, xoshiro256** seeded through
# it, each element half a per-class centroid and half uniform noise, both in
# [-1, 1) on a grid of 2^-15 (exact in f32). `mptc bench` makes two batches
# of this (samples 0..2B-1 of synthetic(shape=..., samples=2B, seed=S)) and
# alternates them step by step; the peers do the same, so every side trains
# on the same values, which a model can learn (the loss falls towards 0).

_M64 = (1 << 64) - 1


def _mix64(np, x):
    """splitmix64's output function on a uint64 array (wrapping)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _rotl(np, x, k):
    return (x << np.uint64(k)) | (x >> np.uint64(64 - k))


def _grid(np, words, numel):
    """Four 16-bit values per 64-bit word, low bits first, as x / 32768 - 1."""
    shifts = np.arange(4, dtype=np.uint64) * np.uint64(16)
    v = (words[..., None] >> shifts) & np.uint64(0xFFFF)
    v = v.reshape(words.shape[:-1] + (-1,))[..., :numel]
    return v.astype(np.float32) * np.float32(1.0 / 65536.0) * np.float32(2) - np.float32(1)


def mptc_synthetic(np, shape, classes, seed, first, count):
    """Samples first..first+count-1 of mptc's synthetic(shape=..., classes=...,
    seed=...) training part: (x f32 [count, *shape], y i32 [count]), the values
    runtime/data computes for them."""
    numel = 1
    for d in shape:
        numel *= d
    words = -(-numel // 4)
    with np.errstate(over="ignore"):
        key = _mix64(np, np.array([(seed ^ 0x73796E7468657469) & _M64], dtype=np.uint64))[0]
        i = np.arange(first, first + count, dtype=np.uint64)
        labels = (_mix64(np, key + _mix64(np, i)) % np.uint64(classes)).astype(np.int64)
        # centroids: word g of class c is mix64(key + c * numel + g)
        g = np.arange(words, dtype=np.uint64)
        base = key + labels.astype(np.uint64) * np.uint64(numel)
        centroid = _grid(np, _mix64(np, base[:, None] + g[None, :]), numel)
        # noise: sample i's own xoshiro256** stream, one draw per word
        k = key ^ _mix64(np, i + np.uint64(0x51))
        s = _xoshiro_seed(np, k)
        draws = np.empty((count, words), dtype=np.uint64)
        for w in range(words):
            draws[:, w] = _xoshiro_next(np, s)
        noise = _grid(np, draws, numel)
    x = (np.float32(0.5) * (centroid + noise)).astype(np.float32)
    return x.reshape((count,) + tuple(shape)), labels.astype(np.int32)


def _xoshiro_seed(np, k):
    """xoshiro256** state seeded through splitmix64's stream from uint64 keys k."""
    return [_mix64(np, k + np.uint64((0x9E3779B97F4A7C15 * j) & _M64)) for j in range(4)]


def _xoshiro_next(np, s):
    """One xoshiro256** draw per stream (s: four uint64 arrays, updated)."""
    out = _rotl(np, s[1] * np.uint64(5), 7) * np.uint64(9)
    t = s[1] << np.uint64(17)
    s[2] ^= s[0]
    s[3] ^= s[1]
    s[1] ^= s[2]
    s[0] ^= s[3]
    s[2] ^= t
    s[3] = _rotl(np, s[3], 45)
    return out


def mptc_synthetic_tokens(np, steps, vocab, classes, seed, first, count):
    """Samples first..first+count-1 of mptc's synthetic(shape=[steps],
    dtype=i32, vocab=V, classes=C, ids=[steps], seed=S) training part, what
    `mptc bench` feeds a model of token inputs with a class at every
    position (gpt_tiny): (x i32 [count, steps], y i32 [count, steps]).
    runtime/data: position j's class is mix64(key + mix64(i) + j) % C (j 0
    is the sample's class c); token j is, by the low bit of the sample's
    j-th xoshiro256** draw u, the class's own token mix64(key + c * steps + j)
    or u >> 1, modulo V."""
    with np.errstate(over="ignore"):
        key = _mix64(np, np.array([(seed ^ 0x73796E7468657469) & _M64], dtype=np.uint64))[0]
        i = np.arange(first, first + count, dtype=np.uint64)
        j = np.arange(steps, dtype=np.uint64)
        h = key + _mix64(np, i)
        labels = _mix64(np, h[:, None] + j[None, :]) % np.uint64(classes)
        base = key + labels[:, 0] * np.uint64(steps)
        own = _mix64(np, base[:, None] + j[None, :])
        s = _xoshiro_seed(np, key ^ _mix64(np, i + np.uint64(0x51)))
        draws = np.empty((count, steps), dtype=np.uint64)
        for p in range(steps):
            draws[:, p] = _xoshiro_next(np, s)
        v = np.where((draws & np.uint64(1)) != 0, own, draws >> np.uint64(1))
        x = v % np.uint64(vocab)
    return x.astype(np.int32), labels.astype(np.int32)


def synthetic(np, name, args, batch):
    """The two batches `mptc bench` trains on for this model, seed and batch
    size: [(x, y), (x, y)], x f32 [batch, *input_shape] (channels last) or
    i32 token ids, y i32 class ids ([batch], or [batch, steps] for gpt_tiny).
    Step i uses batch i % 2, warm-up steps included, as mptc's timing loop
    does."""
    m = MODELS[name]
    if m["kind"] == "gpt":
        x, y = mptc_synthetic_tokens(np, m["context"], m["vocab"], m["classes"], args.seed, 0, 2 * batch)
    else:
        x, y = mptc_synthetic(np, input_shape(name, args), m["classes"], args.seed, 0, 2 * batch)
    return [(x[:batch], y[:batch]), (x[batch:], y[batch:])]


def time_steps(step, sync, warmup, steps):
    """Runs warmup then timed steps; step(i) runs training step i (i counts
    from 0 over warm-up and timed steps: batch i % 2, as mptc bench) and
    sync() waits for it to finish. Returns the median and all times in ms."""
    for i in range(warmup):
        step(i)
    sync()
    ms = []
    for i in range(warmup, warmup + steps):
        t0 = time.perf_counter()
        step(i)
        sync()
        ms.append(1000 * (time.perf_counter() - t0))
    return statistics.median(ms), ms


def emit(peer, variant, name, policy, batch, args, ms=None, error=None, **extra):
    row = dict(peer=peer, variant=variant, model=name, policy=policy, batch=batch,
               device=args.device, threads=args.threads)
    if name in ("convnet", "resnet50"):
        row["image_size"] = image_size(name, args)
    if MODELS[name]["kind"] == "gpt":
        row["context"] = MODELS[name]["context"]
    if error is None:
        row.update(status="ok", ms_per_step=round(ms, 4), samples_per_s=round(1000.0 * batch / ms, 2))
    else:
        text = str(error).strip().splitlines()
        row.update(status="oom" if "out of memory" in str(error).lower() else "failed",
                   reason=(text[0] if text else type(error).__name__)[:300])
    row.update(extra)
    print(json.dumps(row), flush=True)


def log(*a):
    print(*a, file=sys.stderr, flush=True)
