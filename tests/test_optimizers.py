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

    from nmt_tf.training.optimizers import FusedAdadelta, FusedAdam

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

    from nmt_tf.training.optimizers import FusedAdadelta

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

    from nmt_tf.training.optimizers import FusedAdadelta, FusedAdam

    optimizer = {"adam": FusedAdam, "adadelta": FusedAdadelta}[name](learning_rate=0.1)
    variable = keras.Variable(np.ones((3, 2), "float32"))

    @tf.function
    def apply(gradient):
        optimizer.apply_gradients([(gradient, variable)])

    graph = apply.get_concrete_function(tf.TensorSpec((3, 2), tf.float32)).graph
    op_types = {op.type for op in graph.get_operations()}
    assert {"adam": "ResourceApplyAdam", "adadelta": "ResourceApplyAdadelta"}[name] in op_types
    assert "Sqrt" not in op_types


def test_the_moving_average_decay_grows_with_the_step_up_to_the_decay():
    from nmt_tf.training.optimizers import moving_average_decay

    got = [float(moving_average_decay(0.9999, t)) for t in (0, 1, 2, 90, 100_000, 10_000_000)]
    np.testing.assert_allclose(got, [0.0, 2 / 11, 3 / 12, 91 / 100, 0.9999, 0.9999], rtol=1e-6)


def _averaging_sgd(steps, decay=0.5, use_ema=True):
    """SGD (learning rate 0.1) on one weight with fixed random gradients, keeping
    the weights' moving average; returns the optimizer, the weight and the gradients."""
    import keras
    import tensorflow as tf

    from nmt_tf.training.optimizers import SGD

    rng = np.random.default_rng(3)
    weight = keras.Variable(rng.normal(size=(4, 3)).astype("float32"), name="weight")
    grads = rng.normal(size=(steps, 4, 3)).astype("float32")
    optimizer = SGD(learning_rate=0.1, use_ema=use_ema, ema_momentum=decay)

    @tf.function
    def apply(gradient):
        optimizer.apply_gradients([(gradient, weight)], global_norm=tf.norm(gradient))

    for g in grads:
        apply(tf.constant(g))
    return optimizer, weight, grads


def test_the_weights_moving_average_is_updated_with_the_growing_decay():
    """After every update t (from 0): average = d_t average + (1 - d_t) weight,
    d_t = 0, 2/11, 3/12, ... up to the decay (0.5 from update 9 on)."""
    from nmt_tf.training.optimizers import moving_averages

    optimizer, weight, grads = _averaging_sgd(steps=14)
    expected_weight = np.array(weight.numpy())   # replayed below from the start
    start = expected_weight + 0.1 * grads.sum(axis=0)
    w, average = start.copy(), np.zeros_like(start)
    for t, g in enumerate(grads):
        w = w - 0.1 * g
        d = 0.0 if t == 0 else min(0.5, (1 + t) / (10 + t))
        average = d * average + (1 - d) * w
    np.testing.assert_allclose(weight.numpy(), w, rtol=1e-5, atol=1e-6)
    [(var, stored)] = moving_averages(optimizer)
    assert var is weight
    np.testing.assert_allclose(stored.numpy(), average, rtol=1e-5, atol=1e-6)
    assert not np.allclose(average, w, atol=1e-3)      # the average lags the weight


def test_averaged_weights_swaps_the_averages_in_and_back_out():
    from nmt_tf.training.optimizers import averaged_weights

    optimizer, weight, _ = _averaging_sgd(steps=6)
    [average] = [a for a in optimizer._model_variables_moving_average if a is not None]
    trained, averaged = weight.numpy().copy(), average.numpy().copy()
    with averaged_weights(optimizer) as swapped:
        assert swapped
        np.testing.assert_array_equal(weight.numpy(), averaged)
    np.testing.assert_array_equal(weight.numpy(), trained)
    np.testing.assert_array_equal(average.numpy(), averaged)
    with pytest.raises(RuntimeError):              # back out when what ran inside fails, too
        with averaged_weights(optimizer):
            raise RuntimeError("a failed dev evaluation")
    np.testing.assert_array_equal(weight.numpy(), trained)

    plain, weight, _ = _averaging_sgd(steps=2, use_ema=False)
    before = weight.numpy().copy()
    with averaged_weights(plain) as swapped:
        assert not swapped
        np.testing.assert_array_equal(weight.numpy(), before)


def test_weight_decay_shrinks_the_matrices_by_the_current_learning_rate_and_leaves_vectors():
    """--weight_decay through make_optimizer: with zero gradients (Adam's step
    is then 0) each update multiplies a matrix by 1 - lr * decay, with the rate
    the schedule set last; a bias-like vector keeps its values."""
    import keras
    import tensorflow as tf

    from nmt_tf.config import TrainingConfig
    from nmt_tf.training.job import make_optimizer

    optimizer = make_optimizer(TrainingConfig(optimizer="adam", learning_rate=0.01, weight_decay=0.5))
    matrix = keras.Variable(np.full((3, 2), 2.0, "float32"), name="kernel")
    vector = keras.Variable(np.full((2,), 2.0, "float32"), name="bias")

    @tf.function
    def apply():
        zeros = [tf.zeros((3, 2)), tf.zeros((2,))]
        optimizer.apply_gradients(zip(zeros, [matrix, vector]), global_norm=tf.constant(0.0))

    apply()
    np.testing.assert_allclose(matrix.numpy(), 2.0 * (1 - 0.01 * 0.5), rtol=1e-6)
    optimizer.learning_rate.assign(0.1)          # as the plateau / budget schedules do
    apply()
    np.testing.assert_allclose(matrix.numpy(), 2.0 * (1 - 0.01 * 0.5) * (1 - 0.1 * 0.5), rtol=1e-6)
    np.testing.assert_array_equal(vector.numpy(), [2.0, 2.0])
    assert make_optimizer(TrainingConfig(optimizer="adam")).weight_decay is None
