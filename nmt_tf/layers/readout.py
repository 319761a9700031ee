"""The deep output of RNNsearch: a maxout layer (paper 000 App. A.2.2; docs/SPEC.md §2).

    t~_i = U_o s_i + V_o E y_{i-1} + C_o c_i + b_o        size 2l
    t_i  = [max(t~_{i,2k-1}, t~_{i,2k})]_{k=1..l}          size l
    p(y_i | y_<i, x) = softmax(W_o t_i)

The appendix writes s_{i-1} in t~_i while eq. (4) conditions on s_i; like the
reference implementation (GroundHog) we use the new state s_i. Because none
of these terms feeds back into the recurrence, the decoder applies this layer
to all target positions at once, after its time loop.

Search keeps t~'s columns in another order (`search_layout`): the pair
(2k-1, 2k) at (k, l + k), so that its maxout is max(t~[:l], t~[l:]), one
elementwise maximum of two halves. Reducing adjacent pairs of a [rows, l, 2]
reshape has no vector path in TensorFlow's CPU kernels: at [800, 512] on one
thread of a Zen 4, 3,018 us in bfloat16 and 775 us in float32, against 108 and
64 us for the halves (BUILD_NOTES.md, "Decoding speed"). The values are the
same.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from nmt_tf.layers.initializers import weight_init
from nmt_tf.layers.ops import project


@keras.saving.register_keras_serializable(package="nmt_tf")
class MaxoutReadout(keras.layers.Layer):
    """Maxout over pairs of the combined readout t~ (pool size 2).

    Call arguments:
      state: [..., n] decoder state s_i.
      previous_embedding: [..., m] E y_{i-1}.
      context: [..., 2n] context vector c_i.

    Returns:
      [..., units] the maxout features t_i.
    """

    def __init__(self, units: int, **kwargs):
        super().__init__(**kwargs)
        self.units = units

    def build(self, state_shape, previous_embedding_shape=None, context_shape=None):
        self.build_for(state_shape[-1], previous_embedding_shape[-1], context_shape[-1])

    def build_for(self, state_dim: int, embedding_dim: int, context_dim: int):
        if self.built:
            return
        width = 2 * self.units
        self.state_kernel = self.add_weight(name="state_kernel", shape=(state_dim, width),
                                            initializer=weight_init())
        self.embedding_kernel = self.add_weight(name="embedding_kernel",
                                                shape=(embedding_dim, width),
                                                initializer=weight_init())
        self.context_kernel = self.add_weight(name="context_kernel", shape=(context_dim, width),
                                              initializer=weight_init())
        self.bias = self.add_weight(name="bias", shape=(width,), initializer="zeros")
        self.built = True

    def fused_kernel(self):
        """[U_o; V_o; C_o] [n + m + 2n, 2l] in the compute dtype: one matmul
        over [s; E y; c] instead of three."""
        return tf.cast(tf.concat([self.state_kernel, self.embedding_kernel, self.context_kernel], 0),
                       self.compute_dtype)

    @staticmethod
    def search_layout(x):
        """x [..., 2l] (a kernel's columns, the bias, or t~ terms) in search's
        column order: the pairs (2k-1, 2k) of maxout moved to (k, l + k)."""
        return tf.concat([x[..., 0::2], x[..., 1::2]], axis=-1)

    def step_weights(self) -> dict:
        """U_o, V_o and b_o for `step` and `embedding_term`, in the compute
        dtype and in `search_layout` (search loops take them once, outside).
        U_o and V_o are kept apart, not stacked as [U_o; V_o], so that the
        V_o E y_{i-1} product, which does not wait for s_i, can run earlier."""
        dtype = self.compute_dtype
        return {"state": tf.cast(self.search_layout(self.state_kernel), dtype),
                "embedding": tf.cast(self.search_layout(self.embedding_kernel), dtype),
                "bias": tf.cast(self.search_layout(self.bias), dtype)}

    def search_context_kernel(self):
        """C_o in the compute dtype and in `search_layout`: search projects
        the context (or the annotations, once per sentence) with it."""
        return tf.cast(self.search_layout(self.context_kernel), self.compute_dtype)

    def _maxout(self, pre):
        if pre.shape.rank == 2:      # a static shape: no shape ops
            pairs = tf.reshape(pre, [-1, self.units, 2])
        else:
            pairs = tf.reshape(pre, tf.concat([tf.shape(pre)[:-1], [self.units, 2]], 0))
        return tf.reduce_max(pairs, axis=-1)

    def call(self, state, previous_embedding, context):
        dtype = self.compute_dtype
        features = tf.concat([tf.cast(state, dtype), tf.cast(previous_embedding, dtype),
                              tf.cast(context, dtype)], axis=-1)
        return self._maxout(project(features, self.fused_kernel(), self.bias))

    def embedding_term(self, previous_embedding, kernels):
        """V_o E y_{i-1} + b_o [N, 2l] in `search_layout` for `step`
        (`kernels`: `step_weights()`; an export looks it up per word instead:
        `Seq2SeqModel.token_products`)."""
        return project(tf.cast(previous_embedding, self.compute_dtype), kernels["embedding"], kernels["bias"])

    def step(self, state, embedding_term, context_proj, kernels):
        """One search step with V_o E y_{i-1} + b_o and C_o c_i already computed
        (`embedding_term` [N, 2l], from `embedding_term` or an export's token
        products; `context_proj` [N, 2l]: search gets it as
        sum_j alpha_ij (C_o h_j), from products taken once per sentence);
        `kernels` is `step_weights()`. All three terms are in `search_layout`.

        U_o s_i and V_o E y_{i-1} + b_o are two products: the second depends
        only on the previous word, so TensorFlow's executor runs it while the
        step's attention and GRU (which s_i waits for) are still running."""
        dtype = self.compute_dtype
        pre = tf.matmul(tf.cast(state, dtype), kernels["state"]) + embedding_term + tf.cast(context_proj, dtype)
        first, second = tf.split(pre, 2, axis=-1)
        return tf.maximum(first, second)

    def compute_output_shape(self, state_shape, previous_embedding_shape=None, context_shape=None):
        return tuple(state_shape[:-1]) + (self.units,)

    def get_config(self):
        return {**super().get_config(), "units": self.units}
