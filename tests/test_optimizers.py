"""The fused optimizers compute what Keras' Adam and Adadelta compute."""

import numpy as np
import pytest


def _run(optimizer, steps=5, clip_norm_given=False, seed=0):
    """Applies `steps` updates of fixed random gradients (one dense weight and
    one embedding-like weight with IndexedSlices gradients) and returns the
    weights and the optimizer's variables afterwards."""
    import keras
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    dense = keras.Variable(rng.normal(size=(7, 5)).astype("float32"), name="dense")
    table = keras.Variable(rng.normal(size=(11, 3)).astype("float32"), name="table")
    grads = [(rng.normal(size=(7, 5)).astype("float32") * 3,
              tf.IndexedSlices(tf.constant(rng.normal(size=(4, 3)).astype("float32")),
                               tf.constant([1, 5, 5, 9]), tf.constant([11, 3])))
             for _ in range(steps)]

    @tf.function
    def apply(g_dense, g_table):
        pairs = [(g_dense, dense), (g_table, table)]
        if clip_norm_given:
            norm = tf.linalg.global_norm([g_dense, g_table])    # as Seq2SeqModel.train_step computes it
            optimizer.apply_gradients(pairs, global_norm=norm)
        else:
            optimizer.apply_gradients(pairs)

    for g_dense, g_table in grads:
        apply(tf.constant(g_dense), g_table)
    return [np.array(v) for v in [dense, table] + list(optimizer.variables)]


@pytest.mark.parametrize("name", ["adam", "adadelta"])
@pytest.mark.parametrize("given_norm", [False, True])
def test_fused_updates_equal_keras_updates(name, given_norm):
    import keras

    from nmt_tf.optimizers import FusedAdadelta, FusedAdam

    make = {"adam": (lambda cls: cls(learning_rate=0.01, global_clipnorm=1.0), keras.optimizers.Adam, FusedAdam),
            "adadelta": (lambda cls: cls(learning_rate=1.0, rho=0.95, epsilon=1e-6, global_clipnorm=1.0),
                         keras.optimizers.Adadelta, FusedAdadelta)}[name]
    build, keras_class, fused_class = make
    expected = _run(build(keras_class))
    got = _run(build(fused_class), clip_norm_given=given_norm)
    assert len(got) == len(expected)
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e, rtol=2e-5, atol=1e-6)
    # The updates moved the weights (the comparison is not of untouched values).
    assert not np.allclose(got[0], _run(build(fused_class), steps=0)[0])


def test_a_given_norm_is_the_one_clipped_with():
    """apply_gradients(global_norm=...) uses the caller's norm: a norm 10x too
    large scales the gradients down 10x more than Keras' own clipping."""
    import tensorflow as tf

    from nmt_tf.optimizers import FusedAdadelta

    optimizer = FusedAdadelta(learning_rate=1.0, global_clipnorm=1.0)
    grads = [tf.constant([3.0, 4.0])]     # norm 5
    clipped = optimizer._clip_gradients(grads)
    np.testing.assert_allclose(clipped[0], [0.6, 0.8], rtol=1e-6)
    optimizer._given_norm = tf.constant(50.0)
    np.testing.assert_allclose(optimizer._clip_gradients(grads)[0], [0.06, 0.08], rtol=1e-6)


@pytest.mark.parametrize("name", ["adam", "adadelta"])
def test_the_fused_kernel_is_what_runs(name):
    """The update is the one TensorFlow op, not Keras' elementwise ops (which
    would give the same numbers: the comparison above cannot tell them apart)."""
    import keras
    import tensorflow as tf

    from nmt_tf.optimizers import FusedAdadelta, FusedAdam

    optimizer = {"adam": FusedAdam, "adadelta": FusedAdadelta}[name](learning_rate=0.1)
    variable = keras.Variable(np.ones((3, 2), "float32"))

    @tf.function
    def apply(gradient):
        optimizer.apply_gradients([(gradient, variable)])

    graph = apply.get_concrete_function(tf.TensorSpec((3, 2), tf.float32)).graph
    op_types = {op.type for op in graph.get_operations()}
    assert {"adam": "ResourceApplyAdam", "adadelta": "ResourceApplyAdadelta"}[name] in op_types
    assert "Sqrt" not in op_types
