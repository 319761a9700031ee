"""Small tensor helpers shared by the layers."""

from __future__ import annotations

import tensorflow as tf


def project(x, kernel, bias=None):
    """x [..., d] @ kernel [d, k] (+ bias [k]) as one 2-D matmul.

    Reshaping to 2-D lets TensorFlow use a single GEMM instead of a
    broadcasting batched matmul, which is markedly faster on CPU.
    """
    dtype = x.dtype
    kernel = tf.cast(kernel, dtype)
    if x.shape.rank == 2:
        y = tf.matmul(x, kernel)
    else:
        shape = tf.shape(x)
        y = tf.matmul(tf.reshape(x, [-1, shape[-1]]), kernel)
        y = tf.reshape(y, tf.concat([shape[:-1], [tf.shape(kernel)[-1]]], 0))
    if bias is not None:
        y = y + tf.cast(bias, dtype)
    return y
