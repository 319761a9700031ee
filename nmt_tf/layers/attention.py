"""The alignment model of RNNsearch (paper 000 §3.1, App. A.1.2; docs/SPEC.md §2).

    e_ij = v_a^T tanh(W_a s_{i-1} + U_a h_j + b_a)
    alpha_ij = exp(e_ij) / sum_k exp(e_ik)      over real source positions only
    c_i = sum_j alpha_ij h_j

This is additive ("Bahdanau") attention with the *previous* decoder state as
the query. U_a h_j does not depend on i, so `precompute_keys` runs once per
sentence; each decoder step then costs one [n, n'] matmul for the query, an
elementwise tanh over [batch, Tx, n'] and a batched product for c_i. A beam's
hypotheses query their sentence's keys together ([batch, K, n'] queries).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from nmt_tf.layers.initializers import alignment_init
from nmt_tf.layers.ops import project

MASKED = -1e9    # added to the scores of padding: exp() of it is exactly 0


def score_bias(mask):
    """[batch, Tx] bool mask -> [batch, Tx] float32: 0 at real source
    positions, MASKED at padding. Added to the alignment scores before the
    softmax, it gives padding a weight of exactly 0 (one add per step instead
    of masking ops); computed once per sentence."""
    return tf.where(mask, 0.0, MASKED)


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

    def attend(self, query_proj, keys, annotations, bias):
        """One decoder step given W_a s_{i-1} (`query_proj`).

        `query_proj` is [batch, units] (one query per sentence) or
        [batch, K, units] (K queries per sentence: the hypotheses of a beam,
        which all read their sentence's keys and annotations, untiled).
        `bias` is `score_bias(mask)` [batch, Tx].

        Returns (context [batch, (K,) key_dim], alpha [batch, (K,) Tx] float32).
        """
        with tf.name_scope("attention"):     # benchmarks/profile_step.py counts its ops by this scope
            return self._attend(query_proj, keys, annotations, bias)

    def _attend(self, query_proj, keys, annotations, bias):
        dtype = self.compute_dtype
        grouped = query_proj.shape.rank == 3
        # expand_dims / squeeze, not x[:, None] / x[:, 0]: inside a training
        # loop a strided slice's gradient copies into a zero tensor.
        query = query_proj if grouped else tf.expand_dims(query_proj, 1)
        # The scores are computed in the keys' dtype: search under bfloat16
        # passes float32 keys (RNNSearch.search_inputs), because TensorFlow's
        # bfloat16 tanh and adds over [B, K, Tx, n'] run at half the float32
        # speed on CPU (BUILD_NOTES.md, "Decoding speed").
        score_dtype = keys.dtype
        hidden = tf.tanh(tf.expand_dims(keys, 1) + tf.expand_dims(tf.cast(query, score_dtype), 2))  # [B, K, Tx, n']
        # v_a^T hidden as one [B K Tx, n'] x [n', 1] product: one pass over
        # hidden (a multiply then a sum makes two and writes a copy), and its
        # gradient is an outer product and one more such product instead of a
        # broadcast multiply and a reduction over three axes.
        scores = tf.reshape(tf.matmul(tf.reshape(hidden, [-1, self.units]),
                                      tf.cast(self.score_vector, score_dtype)[:, None]),
                            tf.shape(hidden)[:-1])                                    # [B, K, Tx]
        alpha = tf.nn.softmax(tf.cast(scores, tf.float32) + tf.expand_dims(bias, 1))
        context = tf.matmul(tf.cast(alpha, dtype), annotations)                     # [B, K, key_dim]
        if not grouped:
            return tf.squeeze(context, 1), tf.squeeze(alpha, 1)
        return context, alpha

    def call(self, query, annotations, mask):
        dtype = self.compute_dtype
        query_proj = tf.matmul(tf.cast(query, dtype), tf.cast(self.query_kernel, dtype))
        annotations = tf.cast(annotations, dtype)
        return self.attend(query_proj, self.precompute_keys(annotations), annotations, score_bias(mask))

    def get_config(self):
        return {**super().get_config(), "units": self.units}
