"""Small tensor helpers shared by the layers."""

from __future__ import annotations

import tensorflow as tf


class StepKernel:
    """A matrix that a training time loop multiplies by at every step (a
    GRU's U_rz and U, the decoder's [W_a | U_rz]), with its transpose taken
    once, outside the loop, so that `step_matmul` can run the forward product
    as x [B, n] times (kernel^T)^T.

    Why: oneDNN's matmul at a time step's shape (80 rows) ran at 121 GFLOP/s
    with the kernel as stored (x K) and at 161-165 with a stored transpose
    (x (K^T)^T) on an AVX2 CPU (Zen 3, 2026-11-25); the backward's input
    gradient dy K^T is already of the fast kind. Eigen is the other way round
    (156 against 62), so `nmt_tf.core.hardware.transposed_step_products` decides.
    """

    def __init__(self, kernel):
        self.kernel = kernel
        self.transposed = tf.linalg.matrix_transpose(kernel)

    @property
    def shape(self):
        return self.kernel.shape


def step_kernel(kernel, transposed: bool):
    """`kernel` for `step_matmul`: a `StepKernel` when `transposed`, else itself."""
    return StepKernel(kernel) if transposed else kernel


def step_matmul(x, kernel):
    """x [..., n] @ kernel [..., n, k] (batched like tf.matmul), where kernel
    is a tensor or a `StepKernel`. For a StepKernel the forward product reads
    the stored transpose, and the gradient is written out so that it is the
    one of x @ kernel: dx = dy kernel^T, dkernel = x^T dy (the transpose gets
    none; autodiff through it would make dx a product by the transpose as
    stored, the slow kind again)."""
    if not isinstance(kernel, StepKernel):
        return tf.matmul(x, kernel)
    transposed = kernel.transposed

    @tf.custom_gradient
    def product(x, kernel):
        def grad(dy):
            return tf.matmul(dy, kernel, transpose_b=True), tf.matmul(x, dy, transpose_a=True)

        return tf.matmul(x, transposed, transpose_b=True), grad

    return product(x, kernel.kernel)


class AfterLoopGradient:
    """The gradient of a loop invariant M that every step of a training
    time loop multiplies by, as one computation after the loop instead of a
    per-step share summed up inside it.

    Automatic differentiation of a while loop gives a tensor captured by the
    loop a gradient accumulator: every backward step writes its share of dM
    and adds it in (AddN), passes over M's memory at every step. For the
    decoder's projected annotations (M = C h_j, [batch, Tx, 3n], 2M values
    in the reference configuration) that share is an outer product
    alpha_i^T dy_i as large as M. Here the steps use M without a gradient
    (`tf.stop_gradient(M)` inside the loop's body) and add `taps[i]`, a zero
    tensor of the shape of their product y_i = f(a_i, M), to it. The loop's
    gradient with respect to `taps` is then every step's dy_i, stacked
    ([T, ...], as for any per-step input). After the loop the caller hands
    over the stacked left operands A = [a_i] (`set_left_operands`), and M's
    gradient is `gradient(A, dY)`, one product for all steps.

    (For the recurrent weight matrices this did not pay: their per-step
    gradient products run at nearly the rate of one large product, and the
    taps and stacked operands cost more than the accumulation they save;
    nor did the decoder's [W_a | U_rz] in bfloat16, whose per-step sums are
    bfloat16; BUILD_NOTES.md, "Measured and not taken" and "The Zen 4".)

    Args:
      operand: M.
      taps_shape: [T, ...] the steps' products, stacked.
      gradient: (A, dY) -> dM.
    """

    def __init__(self, operand, taps_shape, gradient):
        self._left = None

        @tf.custom_gradient
        def taps(operand):
            def grad(d_taps):
                if self._left is None:
                    raise ValueError("AfterLoopGradient: set_left_operands() was not called after the loop")
                return gradient(self._left, d_taps)

            return tf.zeros(taps_shape, operand.dtype), grad

        self.taps = taps(operand)

    def set_left_operands(self, stacked):
        """The steps' left operands a_i, stacked as the loop outputs them."""
        self._left = stacked


def project(x, kernel, bias=None, transpose_kernel=False):
    """x [..., d] @ kernel [d, k] (+ bias [k]) as one 2-D matmul
    (`transpose_kernel`: kernel is [k, d] and used transposed, with no copy).

    Reshaping to 2-D lets TensorFlow use a single GEMM instead of a
    broadcasting batched matmul, which is markedly faster on CPU; the bias is
    a BiasAdd on that GEMM, which Grappler fuses into it (one pass over the
    output instead of two).
    """
    dtype = x.dtype
    kernel = tf.cast(kernel, dtype)
    flat = x if x.shape.rank == 2 else tf.reshape(x, [-1, tf.shape(x)[-1]])
    y = tf.matmul(flat, kernel, transpose_b=transpose_kernel)
    if bias is not None:
        y = tf.nn.bias_add(y, tf.cast(bias, dtype))
    if x.shape.rank == 2:
        return y
    return tf.reshape(y, tf.concat([tf.shape(x)[:-1], [tf.shape(y)[-1]]], 0))


def sigmoid(x):
    """tf.sigmoid, evaluated in float32 when x is bfloat16 (the result is
    bfloat16 again): the exact sigmoid rounded to bfloat16 (tested).
    TensorFlow's CPU kernel for bfloat16 sigmoid has no vector path: on a
    Zen 4 it took 2.6 times as long as casting to float32, the float32
    sigmoid and casting back ([800, 1024], one thread), and it is one
    bfloat16 step off in a quarter of the values (BUILD_NOTES.md, "Decoding
    speed")."""
    if x.dtype != tf.bfloat16:
        return tf.sigmoid(x)
    return tf.cast(tf.sigmoid(tf.cast(x, tf.float32)), tf.bfloat16)


def tanh(x):
    """tf.tanh, evaluated in float32 when x is bfloat16: the same values as
    TensorFlow's bfloat16 tanh, which took 1.4 times as long as this route
    on the Zen 4 (see `sigmoid`)."""
    if x.dtype != tf.bfloat16:
        return tf.tanh(x)
    return tf.cast(tf.tanh(tf.cast(x, tf.float32)), tf.bfloat16)


LAYER_NORM_EPSILON = 1e-5


def _unbroadcast_axes(shape, weight_shape) -> list[int]:
    """The axes of a [..., k] gradient to sum for a weight of `weight_shape`
    that was broadcast against `shape` (static shapes; None dims count as
    broadcast only where the weight's dim is 1 or missing)."""
    rank, offset = len(shape), len(shape) - len(weight_shape)
    return [i for i in range(rank) if i < offset or (weight_shape[i - offset] == 1 and shape[i] != 1)]


def layer_norm(x, gain, bias):
    """Layer normalisation (Ba et al. 2016) over the last axis: (x - mean) /
    sqrt(variance + 1e-5) * gain + bias; gain and bias [k] (or broadcastable).

    Its gradient is written out (x^ = (x - mean) / sigma, g = dy * gain):
    dx = (g - mean(g) - x^ mean(g x^)) / sigma, dgain = sum(dy x^),
    dbias = sum(dy). Automatic differentiation of the four forward ops builds
    about three times as many ops, and a layer-normalised GRU runs two of
    these per time step in training's loops.

    With gain and bias in another dtype than x, x is normalised in theirs
    and the result cast back: a bfloat16 search passes float32 ones
    (`Seq2SeqModel.step_weights`), because TensorFlow's bfloat16 squares,
    broadcast subtractions and products ran at half the float32 speed on a
    Zen 4 (BUILD_NOTES.md, "Decoding speed")."""
    if gain.dtype != x.dtype:
        return tf.cast(layer_norm(tf.cast(x, gain.dtype), gain, tf.cast(bias, gain.dtype)), x.dtype)
    weight_shape = tf.broadcast_static_shape(gain.shape, bias.shape).as_list()
    if None in weight_shape:       # weights of unknown shape: automatic differentiation
        return _layer_norm_forward(x)[0] * gain + bias
    return _layer_norm_with_gradient(x, gain, bias)


def _layer_norm_forward(x):
    """(x^ = (x - mean) / sqrt(variance + eps), 1 / sqrt(variance + eps))."""
    mean = tf.reduce_mean(x, axis=-1, keepdims=True)
    centered = x - mean
    variance = tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True)
    inverse_std = tf.math.rsqrt(variance + LAYER_NORM_EPSILON)
    return centered * inverse_std, inverse_std


@tf.custom_gradient
def _layer_norm_with_gradient(x, gain, bias):
    normalized, inverse_std = _layer_norm_forward(x)

    def grad(dy):
        g = dy * gain
        dx = inverse_std * (g - tf.reduce_mean(g, axis=-1, keepdims=True)
                            - normalized * tf.reduce_mean(g * normalized, axis=-1, keepdims=True))
        sums = []
        for weight, term in ((gain, dy * normalized), (bias, dy)):
            axes = _unbroadcast_axes(dy.shape.as_list(), weight.shape.as_list())
            sums.append(tf.reshape(tf.reduce_sum(term, axis=axes) if axes else term, tf.shape(weight)))
        return (dx, *sums)

    return normalized * gain + bias, grad


def gate_layer_norm(x, norm):
    """Layer normalisation of GRU pre-activations [..., 3n] in two blocks, the
    [r, z] gates (2n) and the candidate (n), each normalised on its own;
    `norm` = (gain, bias), each [..., 3n]."""
    n = x.shape[-1] // 3
    blocks = [tf.split(t, [2 * n, n], axis=-1) for t in (x, *norm)]     # split: see gru.gru_update
    return tf.concat([layer_norm(*parts) for parts in zip(*blocks)], axis=-1)


def freeze_values(owner, name: str, values) -> list:
    """Keeps `values` (a nested structure of tensors) as non-trainable
    tf.Variables in `owner._frozen_<name>`, which `frozen_values` returns from
    then on; for exports, whose weights never change, so that matrices built
    from the weights (sliced, concatenated, cast) are built once instead of on
    every call. Returns the variables, flat (a SavedModel must track them)."""
    frozen = tf.nest.map_structure(lambda t: tf.Variable(t, trainable=False), values)
    object.__setattr__(owner, f"_frozen_{name}", frozen)    # not a Keras-tracked weight
    return tf.nest.flatten(frozen)


def frozen_values(owner, name: str):
    """What `freeze_values(owner, name, ...)` kept, read as tensors; None before."""
    frozen = getattr(owner, f"_frozen_{name}", None)
    return None if frozen is None else tf.nest.map_structure(tf.convert_to_tensor, frozen)
