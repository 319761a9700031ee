"""The alignment model of RNNsearch (paper 000 §3.1, App. A.1.2).

    e_ij = v_a^T tanh(W_a s_{i-1} + U_a h_j + b_a)
    alpha_ij = exp(e_ij) / sum_k exp(e_ik)      over real source positions only
    c_i = sum_j alpha_ij h_j

This is additive ("Bahdanau") attention with the *previous* decoder state as
the query. U_a h_j does not depend on i, so `precompute_keys` runs once per
sentence; each decoder step then costs one [n, n'] matmul for the query, an
elementwise tanh over [batch, Tx, n'] and two batched products.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from nmt_tf.layers.initializers import alignment_init
from nmt_tf.layers.ops import project


def masked_softmax(scores, mask):
    """Softmax over the last axis where `mask` is True; exactly 0 elsewhere.

    Args:
      scores: [batch, Tx] (any float dtype; computed in float32).
      mask: [batch, Tx] bool.

    Returns:
      [batch, Tx] float32 weights summing to 1 over the masked-in positions.
    """
    scores = tf.cast(scores, tf.float32)
    scores = tf.where(mask, scores, tf.float32.min)
    scores = scores - tf.reduce_max(scores, axis=-1, keepdims=True)
    weights = tf.exp(scores) * tf.cast(mask, tf.float32)
    return weights / tf.maximum(tf.reduce_sum(weights, axis=-1, keepdims=True), 1e-30)


@keras.saving.register_keras_serializable(package="nmt_tf")
class AdditiveAttention(keras.layers.Layer):
    """Bahdanau's alignment model: an MLP scoring (s_{i-1}, h_j) pairs.

    Weights: W_a [query_dim, units], U_a [key_dim, units] ~ N(0, 0.001^2);
    v_a [units] and b_a [units] zero (App. B.1).

    Call arguments:
      query: [batch, query_dim] previous decoder state s_{i-1}.
      annotations: [batch, Tx, key_dim] encoder annotations h_j.
      mask: [batch, Tx] bool, True at real source positions.

    Returns:
      (context [batch, key_dim], alpha [batch, Tx] float32).
    """

    def __init__(self, units: int, **kwargs):
        super().__init__(**kwargs)
        self.units = units

    def build(self, query_shape, annotations_shape=None, mask_shape=None):
        key_dim = annotations_shape[-1] if annotations_shape is not None else None
        self.build_for(query_shape[-1], key_dim)

    def build_for(self, query_dim: int, key_dim: int):
        """Creates the weights from plain sizes (the decoder builds it so)."""
        if self.built:
            return
        self.query_kernel = self.add_weight(name="query_kernel", shape=(query_dim, self.units),
                                            initializer=alignment_init())
        self.key_kernel = self.add_weight(name="key_kernel", shape=(key_dim, self.units),
                                          initializer=alignment_init())
        self.bias = self.add_weight(name="bias", shape=(self.units,), initializer="zeros")
        self.score_vector = self.add_weight(name="score_vector", shape=(self.units,),
                                            initializer="zeros")
        self.built = True

    def precompute_keys(self, annotations):
        """U_a h_j + b_a for all j: [batch, Tx, key_dim] -> [batch, Tx, units]."""
        dtype = self.compute_dtype
        return project(tf.cast(annotations, dtype), self.key_kernel, self.bias)

    def attend(self, query_proj, keys, annotations, mask):
        """One decoder step given W_a s_{i-1} (`query_proj`, [batch, units]).

        Returns (context [batch, key_dim], alpha [batch, Tx] float32).
        """
        dtype = self.compute_dtype
        hidden = tf.tanh(keys + query_proj[:, None, :])                        # [B, Tx, n']
        scores = tf.linalg.matvec(hidden, tf.cast(self.score_vector, dtype))    # [B, Tx]
        alpha = masked_softmax(scores, mask)
        context = tf.linalg.matvec(annotations, tf.cast(alpha, dtype), transpose_a=True)
        return context, alpha

    def call(self, query, annotations, mask):
        dtype = self.compute_dtype
        query_proj = tf.matmul(tf.cast(query, dtype), tf.cast(self.query_kernel, dtype))
        annotations = tf.cast(annotations, dtype)
        return self.attend(query_proj, self.precompute_keys(annotations), annotations, mask)

    def get_config(self):
        return {**super().get_config(), "units": self.units}
