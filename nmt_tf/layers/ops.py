"""Small tensor helpers shared by the layers."""

from __future__ import annotations

import tensorflow as tf


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
