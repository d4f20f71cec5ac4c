"""TensorFlow/Keras peer: the Keras mixed precision policy (the loss scale
optimizer comes with mixed_float16), model.compile(jit_compile=True) for XLA
and False for TensorFlow's own kernels; timed with train_on_batch."""
import os

import common

VARIANTS = ("xla", "noxla")


def gpt(keras, m):
    """examples/gpt_tiny.mpt in Keras layers: Embedding, a learned position
    table added to it (the mptc layer, as keras-hub's TokenAndPositionEmbedding),
    pre-layer-norm blocks of MultiHeadAttention(use_causal_mask=True) and a
    GELU MLP, Keras' own defaults elsewhere."""
    L = keras.layers
    d = m["width"]

    class PositionEmbedding(L.Layer):
        def build(self, shape):
            self.embeddings = self.add_weight(name="embeddings", shape=(m["context"], d),
                                              initializer="glorot_uniform")

        def call(self, x):
            return x + keras.ops.cast(self.embeddings[: x.shape[1]], x.dtype)

    ids = keras.Input(shape=(m["context"],), dtype="int32")
    h = PositionEmbedding(name="positions")(L.Embedding(m["vocab"], d, name="tokens")(ids))
    for b in range(m["blocks"]):
        a = L.LayerNormalization(epsilon=m["eps"])(h)
        a = L.MultiHeadAttention(m["heads"], d // m["heads"])(a, a, use_causal_mask=True)
        h = L.Add()([h, a])
        u = L.Dense(4 * d, activation="gelu")(L.LayerNormalization(epsilon=m["eps"])(h))
        h = L.Add()([h, L.Dense(d)(u)])
    h = L.Dense(m["classes"])(L.LayerNormalization(epsilon=m["eps"])(h))
    return keras.Model(ids, L.Activation("softmax", dtype="float32")(h))


def build(keras, name, args):
    m = common.MODELS[name]
    L = keras.layers
    if m["kind"] == "gpt":
        return gpt(keras, m)
    if m["kind"] == "resnet50":
        return keras.applications.ResNet50(weights=None, classes=m["classes"],
                                           input_shape=common.input_shape(name, args))
    inputs = keras.Input(shape=common.input_shape(name, args))
    h = inputs
    if m["kind"] == "mlp":
        for u in m["units"]:
            h = L.Dense(u, activation="relu")(h)
    else:
        for filters, k in m["convs"]:
            h = L.Conv2D(filters, k, strides=2, padding="same", activation="relu")(h)
            h = L.BatchNormalization()(h)
        h = L.GlobalAveragePooling2D()(h)
    h = L.Dense(m["classes"])(h)
    # As the guide says: the output softmax in float32 under any policy.
    outputs = L.Activation("softmax", dtype="float32")(h)
    return keras.Model(inputs, outputs)


def optimizer(keras, name):
    m = common.MODELS[name]
    if m["optimizer"] == "adamw":
        sc = m["schedule"]
        lr = keras.optimizers.schedules.CosineDecay(
            sc["initial"], sc["decay_steps"], alpha=sc["alpha"],
            warmup_target=sc["warmup_target"], warmup_steps=sc["warmup_steps"])
        opt = keras.optimizers.AdamW(lr, weight_decay=m["weight_decay"], global_clipnorm=m["global_clipnorm"])
        opt.exclude_from_weight_decay(var_names=["bias", "gamma", "beta", "embeddings"])
        return opt
    if m["optimizer"] == "adam":
        return keras.optimizers.Adam(m["lr"])
    if m["optimizer"] == "rmsprop":
        return keras.optimizers.RMSprop(m["lr"])
    return keras.optimizers.SGD(m["lr"], momentum=m["momentum"])


def run_one(tf, keras, np, name, policy, batch, variant, args):
    keras.backend.clear_session()
    keras.mixed_precision.set_global_policy(policy)
    try:
        model = build(keras, name, args)
        model.compile(optimizer=optimizer(keras, name), loss="sparse_categorical_crossentropy",
                      jit_compile=(variant == "xla"))
        device = "/GPU:0" if args.device == "cuda" else "/CPU:0"
        with tf.device(device):  # mptc bench's two batches, alternated
            batches = [(tf.constant(x), tf.constant(y)) for x, y in common.synthetic(np, name, args, batch)]
        # train_on_batch returns the loss as a number: the step has finished.
        ms, times = common.time_steps(lambda i: model.train_on_batch(*batches[i % 2]), lambda: None,
                                      args.warmup, args.steps)
        return ms, times, model.count_params()
    finally:
        keras.mixed_precision.set_global_policy("float32")


def main():
    args = common.parse_args("tensorflow", VARIANTS)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        import numpy as np
        import tensorflow as tf
    except ImportError as e:
        common.log(f"tensorflow peer: skipped: {e}")
        return 3
    keras = tf.keras
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.random.set_seed(args.seed)
    # float32 is true fp32 unless --tf32 (TensorFlow's default is TF32 on
    # Ampere and later)
    tf.config.experimental.enable_tensor_float_32_execution(args.tf32)
    common.log(f"tensorflow {tf.__version__} (keras {keras.__version__}), {args.threads} threads, {args.device}")
    for name, policy, batch, variant in common.configurations(args):
        try:
            ms, _, n_params = run_one(tf, keras, np, name, policy, batch, variant, args)
            common.emit("tensorflow", variant, name, policy, batch, args, ms, version=tf.__version__,
                        setup=f"model.compile(jit_compile={variant == 'xla'}), train_on_batch" + (
                            f"; {n_params} parameters; keras.layers.MultiHeadAttention(use_causal_mask=True)"
                            if common.MODELS[name]["kind"] == "gpt" else "") + (
                            "; denormals flushed (TensorFlow's default)" if args.device == "cpu" else ""))
        except Exception as e:  # any failure is a cell that says so, as mptc's are
            common.emit("tensorflow", variant, name, policy, batch, args, error=e, version=tf.__version__)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
