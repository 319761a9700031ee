"""Initializers of the RNNsearch paper (Bahdanau et al. 2015, paper 000 App. B.1; docs/SPEC.md §2).

Recurrent matrices (U, U_z, U_r) are random orthogonal; W_a and U_a are drawn
from N(0, 0.001^2); v_a and all biases are zero; every other weight matrix is
drawn from N(0, 0.01^2).
"""

from __future__ import annotations

import keras
from keras import ops


def weight_init():
    """N(0, 0.01^2): embeddings, input / context kernels, readout, output layer."""
    return keras.initializers.RandomNormal(mean=0.0, stddev=0.01)


def alignment_init():
    """N(0, 0.001^2): the alignment model's W_a and U_a."""
    return keras.initializers.RandomNormal(mean=0.0, stddev=0.001)


@keras.saving.register_keras_serializable(package="nmt_tf")
class BlockOrthogonal(keras.initializers.Initializer):
    """Random orthogonal [n, n] blocks side by side: an [n, k*n] matrix.

    A GRU keeps U_r, U_z and U in one [n, 3n] matrix; the paper makes each of
    them orthogonal, which an orthogonal init of the whole [n, 3n] matrix
    would not do.
    """

    def __init__(self, seed=None):
        self.seed = seed

    def __call__(self, shape, dtype=None):
        rows, cols = shape
        if cols % rows:
            raise ValueError(f"BlockOrthogonal needs a [n, k*n] shape, got {shape}")
        blocks = []
        for k in range(cols // rows):
            seed = None if self.seed is None else self.seed + k
            blocks.append(keras.initializers.Orthogonal(seed=seed)((rows, rows), dtype=dtype))
        return ops.concatenate(blocks, axis=1)

    def get_config(self):
        return {"seed": self.seed}
