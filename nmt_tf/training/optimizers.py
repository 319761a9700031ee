"""Optimizers for `model.fit`: Keras' Adam and Adadelta with fused updates.

Keras 3 writes an optimizer's update as a dozen elementwise ops per weight
(m, v, their bias corrections, the step), each a separate pass over the
weight's memory. On a CPU, where those passes are bound by memory traffic,
that cost 8 % of a training step's op time for the 14.8M-parameter reference
model (BUILD_NOTES.md, "Profile of a training step"). TensorFlow's own
`ResourceApplyAdam` / `ResourceApplyAdadelta` kernels do the same arithmetic
in one vectorised pass per weight. The classes here are Keras' Adam and
Adadelta (same variables, same checkpoints, same hyper-parameters and
learning-rate schedules) with only `update_step` replaced by those kernels;
what they compute is Keras' formula, checked against Keras' own update in
tests/test_optimizers.py.

All four optimizers of `--optimizer` (Adam, Adadelta, RMSprop, SGD) take
two things from `Seq2SeqModel.train_step` (`apply_gradients(...,
global_norm=..., summed=...)`):

- the global gradient norm, which the step computes anyway for its log, and
  which `global_clipnorm` would otherwise compute a second time;
- under a `tf.distribute` strategy with several replicas, the news that the
  gradients are already summed over the replicas. The step sums them itself
  so that it clips with the norm of the whole batch's gradient, as one
  device would; Keras would sum them (again) after clipping each replica's
  share with that share's own norm.

Outside plain TensorFlow variables (another Keras backend, or a strategy's
mirrored variables, where `update_step` receives per-replica values), Keras'
own update formula runs.

With `--weight_decay` all four apply Keras' decoupled weight decay (AdamW's
w -= learning rate * decay * w before each update) to the weight matrices
and embedding tables only (`_use_weight_decay`).

With `--ema_decay` all four keep an exponential moving average of the
weights (Polyak & Juditsky 1992; Marian's --exponential-smoothing) in
Keras' `use_ema` variables, updated after every update with a decay that
grows with the step as TensorFlow's ExponentialMovingAverage lets it
(`moving_average_decay`), so that a short run's average does not hold on
to its first updates. `averaged_weights` swaps the averages into the model
for a while (the dev evaluation and the best/ checkpoints, nmt_tf.training.callbacks)
and back.
"""

from __future__ import annotations

import contextlib

import keras
import numpy as np
import tensorflow as tf


def _value(variable):
    """A Keras variable's TensorFlow variable (plain or mirrored), else the variable."""
    return variable.value if isinstance(variable, keras.Variable) else variable


def _resource_handle(variable):
    """The resource handle of a plain TensorFlow variable (a Keras variable's
    value), or None for anything else (mirrored / sharded variables)."""
    value = _value(variable)
    if isinstance(value, tf.Variable) and not isinstance(value, tf.distribute.DistributedValues):
        try:
            return value.handle
        except (AttributeError, ValueError):
            return None
    return None


def moving_average_decay(decay: float, step):
    """The decay of the weights' moving average at update `step` (counted from
    0): 0 at the first update, which copies the weights, then
    min(decay, (1 + step) / (10 + step)) (TensorFlow's ExponentialMovingAverage
    with num_updates), so the average of a run of t updates reaches back over
    at most about t / 9 of them until the decay's own horizon, 1 / (1 - decay),
    is the shorter."""
    step = tf.cast(step, tf.float32)
    return tf.where(step > 0, tf.minimum(tf.cast(decay, tf.float32), (1.0 + step) / (10.0 + step)), 0.0)


def _dense(gradient):
    """IndexedSlices (embedding gradients) to a dense tensor; the fused kernels
    take dense gradients, as Keras' Adam turns them dense too."""
    return tf.convert_to_tensor(gradient)


class TrainStepGradients:
    """Mixin of a Keras optimizer: `apply_gradients(grads_and_vars,
    global_norm=None, summed=False)`. With `global_clipnorm` set and
    `global_norm` given, clip with that norm instead of computing it again
    (the same scaling as Keras' `clip_by_global_norm`, NaN for a non-finite
    norm included); with `summed`, the gradients are already the sum over a
    strategy's replicas and are not all-reduced again. `given(...)` sets the
    same for an `apply_gradients` made through a wrapper (Keras'
    LossScaleOptimizer)."""

    _given_norm = None
    _summed = False
    accepts_global_norm = True

    @contextlib.contextmanager
    def given(self, global_norm=None, summed=False):
        self._given_norm, self._summed = global_norm, summed
        try:
            yield
        finally:
            self._given_norm, self._summed = None, False

    def apply_gradients(self, grads_and_vars, global_norm=None, summed=False):
        if global_norm is None and not summed:
            return super().apply_gradients(grads_and_vars)
        with self.given(global_norm, summed):
            return super().apply_gradients(grads_and_vars)

    def _clip_gradients(self, grads):
        if self._given_norm is None or not self.global_clipnorm or self.global_clipnorm <= 0:
            return super()._clip_gradients(grads)
        norm = tf.cast(self._given_norm, tf.float32)
        clip = float(self.global_clipnorm)
        scale = clip * tf.minimum(1.0 / norm, 1.0 / clip) + (norm - norm)
        return [g if g is None else g * tf.cast(scale, g.dtype) for g in grads]

    def _all_reduce_sum_gradients(self, grads_and_vars):
        if self._summed:
            return list(grads_and_vars)
        return super()._all_reduce_sum_gradients(grads_and_vars)

    def _use_weight_decay(self, variable):
        """--weight_decay decays weight matrices and embedding tables only: not
        biases, layer-norm gains and biases or the attention's score vector
        (every weight of rank < 2), which decay would pull toward 0 where their
        neutral value is not 0 (a gain's is 1); the rule of nanoGPT's
        `configure_optimizers`. Keras calls this with the
        Keras variable or, under TensorFlow, its tf.Variable: both have a shape."""
        return len(variable.shape) >= 2

    def finalize_variable_values(self, var_list):
        """Nothing: Keras calls this at the end of every `model.fit`, which with
        `use_ema` would overwrite the trained weights with their averages (and
        nmt_tf.train calls fit once per epoch); the averages are swapped in only
        where they are used (`averaged_weights`)."""

    def _update_model_variables_moving_average(self, trainable_variables):
        """Keras' `use_ema` update with `moving_average_decay`'s decay instead of a
        fixed one; each average is updated where its variable lives, through
        the strategy (in a merge call from a replica's step), as the weights are."""
        if not self.use_ema:
            return
        decay = moving_average_decay(self.ema_momentum, self.iterations)
        pairs = [(_value(var), _value(average))
                 for var, average in zip(trainable_variables, self._model_variables_moving_average)
                 if average is not None]

        def update(average, var, decay):
            decay = tf.cast(decay, average.dtype)
            return average.assign(decay * average + (1.0 - decay) * tf.cast(var, average.dtype))

        def update_all(distribution, pairs, decay):
            for var, average in pairs:
                distribution.extended.update(average, update, args=(var, decay), group=False)

        tf.__internal__.distribute.interim.maybe_merge_call(update_all, tf.distribute.get_strategy(), pairs, decay)


def moving_averages(optimizer) -> list:
    """(weight, its moving average) for every trained weight of an optimizer built
    with `use_ema` (or a LossScaleOptimizer around one); [] without."""
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)
    if optimizer is None or not getattr(optimizer, "use_ema", False) or not optimizer.built:
        return []
    return [(var, average) for var, average in zip(optimizer._trainable_variables,
                                                     optimizer._model_variables_moving_average)
            if average is not None]


def swap_moving_averages(optimizer) -> bool:
    """Exchanges the values of the trained weights and of their moving averages
    (nothing without `use_ema`); returns whether it did. Twice is the identity."""
    pairs = moving_averages(optimizer)
    for var, average in pairs:
        # host copies: the values exchanged are the ones read, whatever the assignments do
        weights = np.array(keras.ops.convert_to_numpy(var))
        var.assign(np.array(keras.ops.convert_to_numpy(average)))
        average.assign(weights)
    return bool(pairs)


@contextlib.contextmanager
def averaged_weights(optimizer):
    """Inside, the model's trained weights are their moving averages (with
    `use_ema`; as they are without); on exit, as it raises too, they are the
    trained weights again and the averages the averages. Yields whether the
    averages are in."""
    swapped = swap_moving_averages(optimizer)
    try:
        yield swapped
    finally:
        if swapped:
            swap_moving_averages(optimizer)


@keras.saving.register_keras_serializable(package="nmt_tf")
class FusedAdam(TrainStepGradients, keras.optimizers.Adam):
    """keras.optimizers.Adam whose per-weight update is TensorFlow's fused
    `ResourceApplyAdam` kernel (Kingma & Ba 2015, with Keras' epsilon placement:
    w -= lr sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)). amsgrad falls
    back to Keras' update."""

    def update_step(self, gradient, variable, learning_rate):
        var = _resource_handle(variable)
        index = self._get_variable_index(variable)
        m, v = self._momentums[index], self._velocities[index]
        handles = [var, _resource_handle(m), _resource_handle(v)]
        if self.amsgrad or any(h is None for h in handles) or variable.dtype != tf.float32:
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        step = tf.cast(self.iterations + 1, dtype)
        return tf.raw_ops.ResourceApplyAdam(
            var=handles[0], m=handles[1], v=handles[2],
            beta1_power=tf.pow(tf.cast(self.beta_1, dtype), step),
            beta2_power=tf.pow(tf.cast(self.beta_2, dtype), step),
            lr=tf.cast(learning_rate, dtype), beta1=tf.cast(self.beta_1, dtype),
            beta2=tf.cast(self.beta_2, dtype), epsilon=tf.cast(self.epsilon, dtype),
            grad=tf.cast(_dense(gradient), dtype), use_locking=False)


@keras.saving.register_keras_serializable(package="nmt_tf")
class FusedAdadelta(TrainStepGradients, keras.optimizers.Adadelta):
    """keras.optimizers.Adadelta (Zeiler 2012; the paper's optimizer) whose
    per-weight update is TensorFlow's fused `ResourceApplyAdadelta` kernel:
    the same formula as Keras' (E[g^2], then the step
    sqrt(E[dx^2] + eps) / sqrt(E[g^2] + eps) * g, then E[dx^2])."""

    def update_step(self, grad, variable, learning_rate):
        var = _resource_handle(variable)
        index = self._get_variable_index(variable)
        accum, accum_update = self._accumulated_grads[index], self._accumulated_delta_vars[index]
        handles = [var, _resource_handle(accum), _resource_handle(accum_update)]
        if any(h is None for h in handles) or variable.dtype != tf.float32:
            return super().update_step(grad, variable, learning_rate)
        dtype = variable.dtype
        return tf.raw_ops.ResourceApplyAdadelta(
            var=handles[0], accum=handles[1], accum_update=handles[2],
            lr=tf.cast(learning_rate, dtype), rho=tf.cast(self.rho, dtype),
            epsilon=tf.cast(self.epsilon, dtype), grad=tf.cast(_dense(grad), dtype), use_locking=False)


@keras.saving.register_keras_serializable(package="nmt_tf")
class RMSprop(TrainStepGradients, keras.optimizers.RMSprop):
    """keras.optimizers.RMSprop taking the train step's norm and summed gradients."""


@keras.saving.register_keras_serializable(package="nmt_tf")
class SGD(TrainStepGradients, keras.optimizers.SGD):
    """keras.optimizers.SGD taking the train step's norm and summed gradients."""
