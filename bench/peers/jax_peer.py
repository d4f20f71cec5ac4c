"""JAX peer: the whole training step under jax.jit (XLA). Parameters are f32;
mixed policies cast them and the inputs to f16/bf16 for compute, keep batch
norm statistics, the softmax and the loss in f32, and (f16) scale the loss
dynamically as Keras does: start 2^15, halve on overflow and skip the
update, double after 2000 finite steps. The optimizers are written out here
(Keras' adam, rmsprop, sgd with momentum), so optax is not needed."""
import os

import common

VARIANTS = ("jit",)


class Params:
    """Parameters and batch-norm state by name. While initialising, get()
    creates what it is asked for; afterwards it only reads."""

    def __init__(self, jnp, key=None, params=None, state=None):
        self.jnp, self.key = jnp, key
        self.params = {} if params is None else params
        self.state = {} if state is None else state
        self.new_state = {}

    def get(self, name, shape, init):
        if name not in self.params:
            import jax
            self.key, k = jax.random.split(self.key)
            self.params[name] = init(k, shape)
        return self.params[name]


def glorot(jax, jnp):
    def init(k, shape):
        fan_in = 1
        for d in shape[:-1]:
            fan_in *= d
        lim = (6.0 / (fan_in + shape[-1])) ** 0.5
        return jax.random.uniform(k, shape, jnp.float32, -lim, lim)
    return init


def forward(jax, jnp, P, x, name, cdt, args):
    """Logits in f32 and, through P.new_state, the batch-norm moving statistics."""
    m = common.MODELS[name]
    g = glorot(jax, jnp)
    zeros = lambda k, s: jnp.zeros(s, jnp.float32)
    ones = lambda k, s: jnp.ones(s, jnp.float32)

    def dense(tag, h, units):
        w = P.get(tag + "/kernel", (h.shape[-1], units), g).astype(cdt)
        return h @ w + P.get(tag + "/bias", (units,), zeros).astype(cdt)

    def conv(tag, h, filters, k, s, bias=True, padding="SAME"):
        w = P.get(tag + "/kernel", (k, k, h.shape[-1], filters), g).astype(cdt)
        out = jax.lax.conv_general_dilated(h, w, (s, s), padding,
                                           dimension_numbers=("NHWC", "HWIO", "NHWC"))
        if bias:
            out = out + P.get(tag + "/bias", (filters,), zeros).astype(cdt)
        return out

    def bn(tag, h, eps=1e-3):
        c = h.shape[-1]
        h32 = h.astype(jnp.float32)  # statistics in f32, as Keras computes them
        mean = h32.mean(axis=(0, 1, 2))
        var = h32.var(axis=(0, 1, 2))
        for stat, v, init in (("moving_mean", mean, 0.0), ("moving_variance", var, 1.0)):
            old = P.state.get(tag + "/" + stat, jnp.full((c,), init, jnp.float32))
            P.new_state[tag + "/" + stat] = 0.99 * old + 0.01 * jax.lax.stop_gradient(v)
        y = (h32 - mean) * jax.lax.rsqrt(var + eps) * P.get(tag + "/gamma", (c,), ones) \
            + P.get(tag + "/beta", (c,), zeros)
        return y.astype(cdt)

    if m["kind"] == "gpt":
        return gpt(jax, jnp, P, x, m, cdt, dense, g)
    h = x.astype(cdt)
    relu = jax.nn.relu
    if m["kind"] == "mlp":
        for i, u in enumerate(m["units"]):
            h = relu(dense(f"dense_{i + 1}", h, u))
    elif m["kind"] == "convnet":
        for i, (filters, k) in enumerate(m["convs"]):
            h = bn(f"bn_{i + 1}", relu(conv(f"conv_{i + 1}", h, filters, k, 2)))
        h = h.mean(axis=(1, 2))
    else:  # ResNet-50 v1 as keras.applications builds it
        h = jnp.pad(h, ((0, 0), (3, 3), (3, 3), (0, 0)))
        h = relu(bn("conv1_bn", conv("conv1", h, 64, 7, 2, padding="VALID"), 1.001e-5))
        h = jnp.pad(h, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=-jnp.inf)
        h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "VALID")
        for stage, (filters, blocks, stride) in enumerate(((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))):
            for b in range(blocks):
                tag, s = f"conv{stage + 2}_block{b + 1}", stride if b == 0 else 1
                short = h
                if b == 0:
                    short = bn(tag + "_0_bn", conv(tag + "_0", h, filters * 4, 1, s), 1.001e-5)
                r = relu(bn(tag + "_1_bn", conv(tag + "_1", h, filters, 1, s), 1.001e-5))
                r = relu(bn(tag + "_2_bn", conv(tag + "_2", r, filters, 3, 1), 1.001e-5))
                r = bn(tag + "_3_bn", conv(tag + "_3", r, filters * 4, 1, 1), 1.001e-5)
                h = relu(short + r)
        h = h.mean(axis=(1, 2))
    return dense("logits", h, m["classes"]).astype(jnp.float32)


def gpt(jax, jnp, P, ids, m, cdt, dense, glorot_init):
    """examples/gpt_tiny.mpt: Keras' layers written out (the query, key and
    value projections [d, heads, key_dim] with biases, the output projection),
    the attention core jax.nn.dot_product_attention(is_causal=True); layer
    norms in f32 (Keras computes them in f32 under mixed policies)."""
    d, heads = m["width"], m["heads"]
    kd = d // heads
    zeros = lambda k, s: jnp.zeros(s, jnp.float32)
    ones = lambda k, s: jnp.ones(s, jnp.float32)
    uniform = lambda k, s: jax.random.uniform(k, s, jnp.float32, -0.05, 0.05)  # Keras' Embedding

    def ln(tag, h):
        h32 = h.astype(jnp.float32)
        mean = h32.mean(-1, keepdims=True)
        var = ((h32 - mean) ** 2).mean(-1, keepdims=True)
        y = (h32 - mean) * jax.lax.rsqrt(var + m["eps"])
        return (y * P.get(tag + "/gamma", (d,), ones) + P.get(tag + "/beta", (d,), zeros)).astype(cdt)

    def proj(tag, h):  # [B, T, d] -> [B, T, heads, kd], Keras' EinsumDense
        w = P.get(tag + "/kernel", (d, heads, kd), lambda k, s: glorot_init(k, (d, d)).reshape(s))
        return jnp.einsum("btd,dnh->btnh", h, w.astype(cdt)) + P.get(tag + "/bias", (heads, kd), zeros).astype(cdt)

    t = ids.shape[1]
    h = P.get("tokens/embeddings", (m["vocab"], d), uniform)[ids]
    h = (h + P.get("positions/embeddings", (m["context"], d), glorot_init)[:t]).astype(cdt)
    for b in range(m["blocks"]):
        tag = f"dec_{b + 1}"
        a = ln(tag + "/ln1", h)
        q, k, v = (proj(f"{tag}/attn/{w}", a) for w in ("query", "key", "value"))
        o = jax.nn.dot_product_attention(q, k, v, is_causal=True)  # [B, T, heads, kd]
        wo = P.get(tag + "/attn/attention_output/kernel", (heads, kd, d),
                   lambda k_, s: glorot_init(k_, (d, d)).reshape(s))
        o = jnp.einsum("btnh,nhd->btd", o, wo.astype(cdt)) + P.get(tag + "/attn/attention_output/bias",
                                                                   (d,), zeros).astype(cdt)
        h = h + o
        u = jax.nn.gelu(dense(tag + "/up", ln(tag + "/ln2", h), 4 * d), approximate=False)
        h = h + dense(tag + "/down", u, d)
    return dense("next_byte", ln("final_ln", h), m["classes"]).astype(jnp.float32)


def make_step(jax, jnp, name, cdt, scaled, args):
    m = common.MODELS[name]
    lr = m["lr"]

    def loss_fn(params, state, x, y, scale):
        P = Params(jnp, params=params, state=state)
        logits = forward(jax, jnp, P, x, name, cdt, args)
        logp = jax.nn.log_softmax(logits)
        # one class per sample, or per position (gpt_tiny): the mean over all
        loss = -jnp.take_along_axis(logp, y[..., None], axis=-1).mean()
        return loss * scale, (loss, P.new_state)

    def schedule(it):
        """common.learning_rate in the graph: Keras' cosine_decay with a
        linear warm-up, at optimizer step it."""
        sc = m.get("schedule")
        if not sc:
            return lr
        w = sc["warmup_steps"]
        warm = sc["initial"] + (sc["warmup_target"] - sc["initial"]) * it / w
        s = jnp.minimum(it - w, sc["decay_steps"])
        cos = (1 - sc["alpha"]) * 0.5 * (1 + jnp.cos(jnp.pi * s / sc["decay_steps"])) + sc["alpha"]
        return jnp.where(it < w, warm, sc["warmup_target"] * cos)

    def update(params, slots, grads, it):
        # Keras: adam epsilon 1e-7, rmsprop rho 0.9, sgd momentum m.
        if m["optimizer"] in ("adam", "adamw"):
            t = it + 1.0
            rate = schedule(it)
            if m.get("global_clipnorm"):  # Keras: on the unscaled gradients, before the update
                norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree_util.tree_leaves(grads)))
                c = m["global_clipnorm"]
                grads = jax.tree_util.tree_map(lambda g: g * (c / jnp.maximum(norm, c)), grads)
            if m["optimizer"] == "adamw":  # decoupled: w - w * weight_decay * lr first
                wd = m["weight_decay"]
                params = {k: p - p * wd * rate if common.is_decayed(k) else p for k, p in params.items()}
            a = rate * jnp.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
            mm = jax.tree_util.tree_map(lambda s, g: 0.9 * s + 0.1 * g, slots["m"], grads)
            vv = jax.tree_util.tree_map(lambda s, g: 0.999 * s + 0.001 * g * g, slots["v"], grads)
            new = jax.tree_util.tree_map(lambda p, m1, v1: p - a * m1 / (jnp.sqrt(v1) + 1e-7), params, mm, vv)
            return new, {"m": mm, "v": vv}
        if m["optimizer"] == "rmsprop":
            rr = jax.tree_util.tree_map(lambda s, g: 0.9 * s + 0.1 * g * g, slots["rms"], grads)
            new = jax.tree_util.tree_map(lambda p, g, r: p - lr * g / (jnp.sqrt(r) + 1e-7), params, grads, rr)
            return new, {"rms": rr}
        mo = jax.tree_util.tree_map(lambda s, g: m["momentum"] * s - lr * g, slots["momentum"], grads)
        return jax.tree_util.tree_map(lambda p, v: p + v, params, mo), {"momentum": mo}

    def step(params, slots, state, ls, it, x, y):
        scale, good = ls
        grads, (loss, new_state) = jax.grad(loss_fn, has_aux=True)(params, state, x, y, scale)
        grads = jax.tree_util.tree_map(lambda g: g / scale, grads)
        finite = jnp.all(jnp.array([jnp.all(jnp.isfinite(g)) for g in jax.tree_util.tree_leaves(grads)]))
        new_params, new_slots = update(params, slots, grads, it)
        pick = lambda a, b: jax.tree_util.tree_map(lambda u, v: jnp.where(finite, u, v), a, b)
        params, slots = pick(new_params, params), pick(new_slots, slots)
        state = pick(new_state, state)
        if scaled:
            grow = finite & (good + 1 >= 2000)
            scale = jnp.where(finite, jnp.where(grow, scale * 2, scale), scale / 2)
            good = jnp.where(finite & ~grow, good + 1, 0)
        return params, slots, state, (scale, good), it + jnp.where(finite, 1.0, 0.0), loss

    return jax.jit(step, donate_argnums=(0, 1, 2))


def run_one(jax, jnp, np, name, policy, batch, args):
    cdt = {"float32": jnp.float32, "mixed_float16": jnp.float16, "mixed_bfloat16": jnp.bfloat16}[policy]
    data = common.synthetic(np, name, args, batch)  # mptc bench's two batches
    P = Params(jnp, key=jax.random.PRNGKey(args.seed))
    forward(jax, jnp, P, jnp.asarray(data[0][0][:2]), name, jnp.float32, args)
    params = P.params
    state = dict(P.new_state)
    kind = common.MODELS[name]["optimizer"]
    zero = lambda: jax.tree_util.tree_map(jnp.zeros_like, params)
    slots = {"adam": lambda: {"m": zero(), "v": zero()}, "adamw": lambda: {"m": zero(), "v": zero()}, "rmsprop": lambda: {"rms": zero()},
             "sgd": lambda: {"momentum": zero()}}[kind]()
    scaled = policy == "mixed_float16"
    ls = (jnp.float32(2.0 ** 15 if scaled else 1.0), jnp.int32(0))
    it = jnp.float32(0)
    step = make_step(jax, jnp, name, cdt, scaled, args)
    dev_data = [(jax.device_put(x), jax.device_put(y)) for x, y in data]
    box = {"v": (params, slots, state, ls, it)}
    last = {}

    def one(k):
        xd, yd = dev_data[k % 2]
        p, s, st, l, i = box["v"]
        p, s, st, l, i, loss = step(p, s, st, l, i, xd, yd)
        box["v"] = (p, s, st, l, i)
        last["loss"] = loss

    ms, times = common.time_steps(one, lambda: last["loss"].block_until_ready(), args.warmup, args.steps)
    return ms, times, sum(int(p.size) for p in params.values())


def main():
    args = common.parse_args("jax", VARIANTS)
    if args.device == "cpu":
        os.environ["JAX_PLATFORMS"] = "cpu"
        # XLA's CPU backend has no thread-count flag (an unknown XLA_FLAGS
        # entry is fatal); it sizes its pools from the cores the process may
        # use, so the driver pins every peer to --threads cores with taskset.
    try:
        import numpy as np
        import jax
        import jax.numpy as jnp
    except ImportError as e:
        common.log(f"jax peer: skipped: {e}")
        return 3
    # float32 is true fp32 unless --tf32 (XLA's default precision on a GPU
    # lets f32 dots and convolutions use TF32)
    if args.device == "cuda":
        jax.config.update("jax_default_matmul_precision", "tensorfloat32" if args.tf32 else "highest")
    common.log(f"jax {jax.__version__} on {jax.devices()[0].platform}, {args.threads} threads")
    for name, policy, batch, variant in common.configurations(args):
        try:
            ms, _, n_params = run_one(jax, jnp, np, name, policy, batch, args)
            common.emit("jax", variant, name, policy, batch, args, ms, version=jax.__version__,
                        setup="the whole step under jax.jit" + (
                            f"; {n_params} parameters; jax.nn.dot_product_attention(is_causal=True)"
                            if common.MODELS[name]["kind"] == "gpt" else "") + (
                            "; denormals kept (XLA's CPU default under JAX; "
                            "mptc, PyTorch here and TensorFlow flush them)" if args.device == "cpu" else ""))
        except Exception as e:  # any failure is a cell that says so, as mptc's are
            common.emit("jax", variant, name, policy, batch, args, error=e, version=jax.__version__)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
