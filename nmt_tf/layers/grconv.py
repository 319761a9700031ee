"""The gated recursive convolutional encoder, grConv (Cho et al. 2014b, paper 002 §2.2;
docs/SPEC.md §4).

Level 0: h_j^(0) = U x_j. Level t = 1..T-1 has one node fewer than level t-1:

    h~_j^(t) = phi(W^l h_{j-1}^(t-1) + W^r h_j^(t-1))             phi = rectifier
    [w_c, w_l, w_r] = softmax(G^l h_{j-1}^(t-1) + G^r h_j^(t-1))    three gates
    h_j^(t) = w_c h~_j^(t) + w_l h_{j-1}^(t-1) + w_r h_j^(t-1)

(nodes indexed from 0 here: node j of level t covers words j..j+t, its left
child is node j and its right child node j+1 of level t-1). The single node
of level T-1 represents the sentence. The gates are a soft choice between a
new node and either child, i.e. a soft parse (paper 002 Fig. 6);
`call(..., return_gates=True)` exposes them.

Over a right-padded batch every level is computed for the longest sentence;
a node is real when it covers real words only (j + t < length), which makes
both its children real too, so padding never mixes into a real node, and
each sentence takes its root at its own level length-1. Other nodes are
zeroed. Initialisation (paper 002 §4.2): W^l and W^r orthogonal scaled to
spectral radius 0.4; U, G^l, G^r ~ N(0, 0.01^2); biases zero.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from nmt_tf.layers.initializers import weight_init
from nmt_tf.layers.ops import project


@keras.saving.register_keras_serializable(package="nmt_tf")
class ScaledOrthogonal(keras.initializers.Initializer):
    """A random orthogonal square matrix times `gain` (its spectral radius)."""

    def __init__(self, gain: float = 0.4, seed=None):
        self.gain, self.seed = gain, seed

    def __call__(self, shape, dtype=None):
        return keras.initializers.Orthogonal(gain=self.gain, seed=self.seed)(shape, dtype=dtype)

    def get_config(self):
        return {"gain": self.gain, "seed": self.seed}


@keras.saving.register_keras_serializable(package="nmt_tf")
class GatedRecursiveConvolution(keras.layers.Layer):
    """grConv: a binary tree of gated recursive convolutions over each sentence.

    Args:
      units: size d of every node.

    Call arguments:
      inputs: [batch, T, m] embedded words.
      mask: [batch, T] bool, True at real words (right-padded).
      return_gates: also return the gates of every level.

    Returns:
      root [batch, d], the node of level length-1 of each sentence; with
      return_gates, also gates [T-1, batch, T-1, 3] float32 (level t-1,
      node j, [w_c, w_l, w_r]; zero for nodes that are not real).
    """

    def __init__(self, units: int, **kwargs):
        super().__init__(**kwargs)
        self.units = units

    def build(self, input_shape):
        d = self.units
        self.input_kernel = self.add_weight(name="input_kernel", shape=(input_shape[-1], d),
                                            initializer=weight_init())
        self.input_bias = self.add_weight(name="input_bias", shape=(d,), initializer="zeros")
        self.left_kernel = self.add_weight(name="left_kernel", shape=(d, d), initializer=ScaledOrthogonal(0.4))
        self.right_kernel = self.add_weight(name="right_kernel", shape=(d, d), initializer=ScaledOrthogonal(0.4))
        self.bias = self.add_weight(name="bias", shape=(d,), initializer="zeros")
        self.left_gate_kernel = self.add_weight(name="left_gate_kernel", shape=(d, 3), initializer=weight_init())
        self.right_gate_kernel = self.add_weight(name="right_gate_kernel", shape=(d, 3), initializer=weight_init())
        self.gate_bias = self.add_weight(name="gate_bias", shape=(3,), initializer="zeros")

    def level(self, nodes, real, left_kernel, right_kernel):
        """One recursion: nodes [B, k, d] -> (nodes [B, k-1, d], gates [B, k-1, 3]); `real` [B, k-1].

        left_kernel / right_kernel: [W^l | G^l] and [W^r | G^r], [d, d + 3] (built once per call).
        """
        dtype = self.compute_dtype
        d = self.units
        left, right = nodes[:, :-1], nodes[:, 1:]
        pre = project(left, left_kernel) + project(right, right_kernel)      # each child in one matmul
        candidate = tf.nn.relu(pre[..., :d] + tf.cast(self.bias, dtype))
        gates = tf.nn.softmax(tf.cast(pre[..., d:], tf.float32) + tf.cast(self.gate_bias, tf.float32), axis=-1)
        g = tf.cast(gates, dtype)
        new = g[..., 0:1] * candidate + g[..., 1:2] * left + g[..., 2:3] * right
        keep = tf.cast(real, dtype)[..., None]
        return new * keep, gates * tf.cast(real, tf.float32)[..., None]

    def call(self, inputs, mask, return_gates=False):
        dtype = self.compute_dtype
        lengths = tf.reduce_sum(tf.cast(mask, tf.int32), axis=1)                              # [B]
        nodes = project(tf.cast(inputs, dtype), self.input_kernel, self.input_bias)
        nodes = nodes * tf.cast(mask, dtype)[..., None]                                        # level 0
        batch, width = tf.shape(inputs)[0], tf.shape(inputs)[1]
        # A one-word sentence has its root at level 0.
        root = tf.where((lengths == 1)[:, None], nodes[:, 0], tf.zeros_like(nodes[:, 0]))
        levels = tf.maximum(width - 1, 0)
        gates_all = tf.zeros(tf.stack([levels, batch, levels, 3]) if return_gates else [0], tf.float32)
        left_kernel = tf.cast(tf.concat([self.left_kernel, self.left_gate_kernel], axis=1), dtype)
        right_kernel = tf.cast(tf.concat([self.right_kernel, self.right_gate_kernel], axis=1), dtype)

        def body(t, nodes, root, gates_all):
            k = tf.shape(nodes)[1] - 1
            real = (tf.range(k)[None, :] + t) < lengths[:, None]                               # j + t < length
            nodes, gates = self.level(nodes, real, left_kernel, right_kernel)
            root = tf.where((lengths == t + 1)[:, None], nodes[:, 0], root)
            if return_gates:   # training does not keep them
                gates = tf.pad(gates, [[0, 0], [0, levels - k], [0, 0]])
                gates_all = tf.where(tf.equal(tf.range(levels), t - 1)[:, None, None, None], gates[None], gates_all)
            return t + 1, nodes, root, gates_all

        _, _, root, gates_all = tf.while_loop(
            lambda t, *_: t < width, body, (tf.constant(1), nodes, root, gates_all),
            shape_invariants=(tf.TensorShape([]), tf.TensorShape([None, None, self.units]),
                              root.shape, gates_all.shape))
        if return_gates:
            return root, gates_all
        return root

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.units)

    def get_config(self):
        return {**super().get_config(), "units": self.units}
