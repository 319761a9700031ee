"""The gated recurrent unit of Cho et al. (2014a, paper 004 §2.3), as RNNsearch uses it
(paper 000 App. A.1.1; docs/SPEC.md §1).

For input x_t, previous state h_{t-1} and (decoder only) context c:

    r_t = sigmoid(W_r x_t + U_r h_{t-1} + C_r c + b_r)
    z_t = sigmoid(W_z x_t + U_z h_{t-1} + C_z c + b_z)
    h~_t = tanh(W x_t + U (r_t * h_{t-1}) + C c + b)
    h_t = (1 - z_t) * h_{t-1} + z_t * h~_t

The reset gate multiplies h_{t-1} *before* U (Keras' GRU default,
``reset_after=True``, applies it after). Kernels keep the three gates side by
side in the order [r, z, candidate]. Everything that does not depend on the
previous state (W x_t + b for all t) is computed outside the time loop.

Recurrent dropout (not in the papers; Gal & Ghahramani 2016, Nematus'
dropout_hidden, Marian's dropout-rnn): in training, h_{t-1} is multiplied by
one dropout mask m, drawn once per sequence and kept at every step, where it
enters the recurrent products: U_r (m * h_{t-1}), U_z (m * h_{t-1}) and
U (r_t * m * h_{t-1}); the update h_t = (1 - z_t) h_{t-1} + z_t h~_t keeps
the state itself.

Layer normalisation (`layer_norm=True`; not in the papers; Ba et al. 2016, as
Nematus and Marian apply it to their GRUs): each kind of term is normalised
on its own, with a gain and a bias per unit, the [r, z] part (2n) apart from
the candidate part (n):

    x-terms  LN(W x_t + b)          computed outside the time loop
    h-terms  LN(U_rz h_{t-1}),  LN(U (r_t * h_{t-1}))
    c-terms  LN(C c)                (the decoder's context)

and the gates and candidate add the normalised terms.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from nmt_tf.layers.initializers import BlockOrthogonal, weight_init
from nmt_tf.layers.ops import (
    freeze_values,
    frozen_values,
    gate_layer_norm,
    layer_norm,
    project,
    sigmoid,
    step_kernel,
    step_matmul,
    tanh,
)


def recurrent_dropout_mask(shape, rate: float, seed_generator, dtype, training: bool = True):
    """A variational dropout mask (kept entries 1 / (1 - rate), others 0),
    drawn once per sequence: the same mask at every time step; None outside
    training or when `rate` is 0 (no dropout)."""
    if not (training and rate):
        return None
    keep = keras.random.uniform(shape, seed=seed_generator) >= rate
    return tf.cast(keep, dtype) / (1.0 - rate)


def add_norm_weights(layer, name: str, width: int):
    """A layer normalisation's gain (ones) and bias (zeros), [width] each, as
    attributes `<name>_gain` / `<name>_bias` of `layer` (checkpoints follow
    attributes); returns (gain, bias)."""
    gain = layer.add_weight(name=f"{name}_gain", shape=(width,), initializer="ones")
    bias = layer.add_weight(name=f"{name}_bias", shape=(width,), initializer="zeros")
    setattr(layer, f"{name}_gain", gain)
    setattr(layer, f"{name}_bias", bias)
    return gain, bias


def add_gru_weights(layer, input_dim: int | None, context_dim: int | None = None):
    """One GRU's weights as attributes of `layer` (with its `units` n and
    `layer_norm`): with layer_norm the x- and h-terms' (gain, bias), then
    kernel W [input_dim, 3n], recurrent_kernel U [n, 3n] (block-orthogonal)
    and bias b [3n]. With `context_dim` (the conditional GRU) also C
    [context_dim, 3n] ("context_kernel", before b) and, with layer_norm, the
    C c terms' (gain, bias) ("context_norm", after the h-terms'). With
    `input_dim` None (a GRU without input, `TransitionGRUCell`) no W and no
    x-terms' (gain, bias). The order is the order of creation, which decides
    the initial values a seed gives."""
    n = layer.units
    if layer.layer_norm:
        terms = (("input",) if input_dim is not None else ()) + ("recurrent",) + (("context",) if context_dim else ())
        for term in terms:
            add_norm_weights(layer, f"{term}_norm", 3 * n)
    if input_dim is not None:
        layer.kernel = layer.add_weight(name="kernel", shape=(input_dim, 3 * n), initializer=weight_init())
    layer.recurrent_kernel = layer.add_weight(name="recurrent_kernel", shape=(n, 3 * n),
                                              initializer=BlockOrthogonal())
    if context_dim:
        layer.context_kernel = layer.add_weight(name="context_kernel", shape=(context_dim, 3 * n),
                                                initializer=weight_init())
    layer.bias = layer.add_weight(name="bias", shape=(3 * n,), initializer="zeros")


def norm_weights(layer, name: str, dtype) -> tuple:
    """The (gain, bias) that `add_norm_weights(layer, name, ...)` created, in `dtype`."""
    return tuple(tf.cast(getattr(layer, f"{name}_{part}"), dtype) for part in ("gain", "bias"))


def gru_update(x_proj, h, h_rz, u_h, extra=None, h_dropped=None, recurrent_norm=None):
    """One GRU step from precomputed projections.

    Args:
      x_proj: [..., 3n] W x_t + b, gates in the order [r, z, candidate].
      h: [..., n] previous state h_{t-1}.
      h_rz: [..., 2n] U_rz h_{t-1}, the state's contribution to the r and z
        gates (computed by the caller, possibly fused with another matmul).
      u_h: [n, n] (or batched [k, n, n]) recurrent kernel U of the candidate,
        or its `StepKernel` (training loops; `step_matmul`).
      extra: optional [..., 3n] added to all pre-activations (the decoder's
        context terms C_r c, C_z c, C c).
      h_dropped: h_{t-1} with recurrent dropout applied (training), for the
        candidate's product U (r * h); h_rz must then be U_rz h_dropped.
      recurrent_norm: (gain, bias) [..., 3n] of the layer normalisation of the
        h-terms (x_proj and extra come normalised), or None.

    Returns:
      [..., n] the new state h_t.
    """
    n = u_h.shape[-1]
    pre = x_proj if extra is None else x_proj + extra
    # tf.split rather than slicing: a slice's gradient is a zero tensor of the
    # whole input with the slice copied in, then summed with its sibling's
    # (StridedSliceGrad + AddN, 12 % of a training step's op time); a
    # split's gradient is one concat.
    pre_rz, pre_candidate = tf.split(pre, [2 * n, n], axis=-1)
    if recurrent_norm is not None:
        (gain_rz, gain_candidate), (bias_rz, bias_candidate) = (
            tf.split(w, [2 * n, n], axis=-1) for w in recurrent_norm)
        h_rz = layer_norm(h_rz, gain_rz, bias_rz)
    r, z = tf.split(sigmoid(pre_rz + h_rz), 2, axis=-1)
    h_candidate = step_matmul(r * (h if h_dropped is None else h_dropped), u_h)
    if recurrent_norm is not None:
        h_candidate = layer_norm(h_candidate, gain_candidate, bias_candidate)
    candidate = tanh(pre_candidate + h_candidate)
    return h + z * (candidate - h)


def split_recurrent_kernel(kernel):
    """U [..., n, 3n] -> (U_rz [..., n, 2n], U candidate [..., n, n]): a
    column split, which copies the matrix (3 MB for n = 512)."""
    n = kernel.shape[-1] // 3
    return tuple(tf.split(kernel, [2 * n, n], axis=-1))


class FrozenRecurrentSplits:
    """For encoder GRUs: `recurrent_splits` gives each direction's (U_rz, U
    candidate), split per call, or, after `freeze_recurrent_splits` (exports,
    whose weights never change), read from non-trainable variables of their
    own. A one-sentence search spent about 1 ms of its ~9 (greedy) splitting
    the two encoder directions' U per request, before either loop could
    start. The subclass provides `recurrent_kernels` (a list, one per direction)."""

    def recurrent_splits(self, dtype) -> list:
        frozen = frozen_values(self, "recurrent_splits")
        if frozen is not None:
            return frozen
        return [split_recurrent_kernel(tf.cast(kernel, dtype)) for kernel in self.recurrent_kernels]

    def freeze_recurrent_splits(self) -> list:
        """Keeps `recurrent_splits()` as non-trainable tf.Variables from now on
        (`freeze_values`; as `Seq2SeqModel.freeze_step_weights`, training must
        not follow); returns them, for a SavedModel to track."""
        return freeze_values(self, "recurrent_splits", self.recurrent_splits(self.compute_dtype))


def masked_gru_scan(x_proj, mask, recurrent_kernel, h0, state_mask=None, recurrent_norm=None,
                    transposed_products=False):
    """Runs GRU steps over time; a masked (padded) step leaves the state unchanged.

    Args:
      x_proj: [T, ..., 3n] input projections W x_t + b, time first.
      mask: [T, ..., 1] 1 at real positions, 0 at padding (x_proj's dtype).
      recurrent_kernel: [n, 3n] (or batched [k, n, 3n]) U, in x_proj's dtype,
        or the pair (U_rz, U candidate) of `split_recurrent_kernel`.
      h0: [..., n] initial state.
      state_mask: optional recurrent dropout mask [..., n] (training).
      recurrent_norm: optional (gain, bias) [..., 3n] of the h-terms' layer
        normalisation (x_proj comes normalised).
      transposed_products: multiply by stored transposes of U_rz and U
        (`nmt_tf.layers.ops.StepKernel`; training, where
        `nmt_tf.core.hardware.transposed_step_products` says it is faster).

    Returns:
      [T, ..., n] the states.
    """
    if isinstance(recurrent_kernel, (tuple, list)):
        u_rz, u_h = recurrent_kernel
    else:
        u_rz, u_h = split_recurrent_kernel(recurrent_kernel)
    u_rz, u_h = (step_kernel(u, transposed_products) for u in (u_rz, u_h))

    def step(h, elems):
        xp, mt = elems
        hd = h if state_mask is None else h * state_mask
        new = gru_update(xp, h, step_matmul(hd, u_rz), u_h, h_dropped=None if state_mask is None else hd,
                         recurrent_norm=recurrent_norm)
        return h + mt * (new - h)

    return tf.scan(step, (x_proj, mask), initializer=h0)


@keras.saving.register_keras_serializable(package="nmt_tf")
class BidirectionalGRU(FrozenRecurrentSplits, keras.layers.Layer):
    """A forward and a backward GRU over a right-padded batch (paper 000 §3.2).

    In training both directions advance in the same time loop (one batched
    matmul per gate group and step), which halves the loop's length compared
    with two separate RNNs; search asks for two loops (`separate_loops`),
    which run side by side. Padded positions never change a state: the backward GRU
    starts at each sentence's own last word, and the forward states past the
    end are copies of the last real one.

    Args:
      units: n, per direction.
      recurrent_dropout: rate of the recurrent (variational) dropout of both
        directions in training (module docstring).
      layer_norm: layer-normalised GRUs (module docstring), with gains and
        biases of their own per direction.

    Call arguments:
      inputs: [batch, time, input_dim] embedded source words.
      mask: [batch, time] bool, True at real (unpadded) positions.

    Returns:
      [batch, time, 2 * units] annotations h_j = [->h_j ; <-h_j].
    """

    def __init__(self, units: int, recurrent_dropout: float = 0.0, layer_norm: bool = False,
                 transposed_products: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.recurrent_dropout = recurrent_dropout
        self.layer_norm = layer_norm
        # In training, multiply the state by stored transposes of U (a choice of the machine, made by whoever
        # builds the model: nmt_tf.core.hardware.transposed_step_products; not part of the layer's config).
        self.transposed_products = transposed_products
        self.seed_generator = keras.random.SeedGenerator() if recurrent_dropout else None

    def build(self, input_shape):
        d, n = input_shape[-1], self.units
        if self.layer_norm:
            for direction in ("forward", "backward"):
                for term in ("input", "recurrent"):
                    add_norm_weights(self, f"{direction}_{term}_norm", 3 * n)
        # Plain attributes (not lists): TensorFlow checkpoints follow attributes
        # only, and a weights-only checkpoint must hold every weight.
        for direction in ("forward", "backward"):
            setattr(self, f"{direction}_kernel", self.add_weight(
                name=f"{direction}_kernel", shape=(d, 3 * n), initializer=weight_init()))
            setattr(self, f"{direction}_recurrent_kernel", self.add_weight(
                name=f"{direction}_recurrent_kernel", shape=(n, 3 * n), initializer=BlockOrthogonal()))
            setattr(self, f"{direction}_bias", self.add_weight(
                name=f"{direction}_bias", shape=(3 * n,), initializer="zeros"))

    @property
    def kernels(self):
        """[W_forward, W_backward], each [input_dim, 3n]."""
        return [self.forward_kernel, self.backward_kernel]

    @property
    def recurrent_kernels(self):
        """[U_forward, U_backward], each [n, 3n]."""
        return [self.forward_recurrent_kernel, self.backward_recurrent_kernel]

    @property
    def biases(self):
        return [self.forward_bias, self.backward_bias]

    def direction_weights(self, direction: str) -> list:
        """Every weight of one direction ("forward" or "backward"): kernel,
        recurrent kernel, bias, and with layer_norm its norms' gains and biases."""
        return [w for w in self.weights if w.name.startswith(f"{direction}_")]

    def norms(self, term: str, dtype):
        """[(gain, bias) forward, (gain, bias) backward] of the x-terms
        ("input") or h-terms ("recurrent"), in `dtype`; None without layer_norm."""
        if not self.layer_norm:
            return None
        return [norm_weights(self, f"{direction}_{term}_norm", dtype) for direction in ("forward", "backward")]

    def call(self, inputs, mask, separate_loops=False, training=False):
        """`separate_loops`: run the two directions as two time loops instead
        of one (same results). Independent loops run side by side on
        TensorFlow's inter-op threads, which is faster when each op gets one
        thread (nmt_tf.serve's default) and needs no stacked copy of the two
        recurrent matrices per call; training keeps the one batched loop."""
        n = self.units
        dtype = self.compute_dtype
        inputs = tf.cast(inputs, dtype)
        time_major = tf.transpose(inputs, [1, 0, 2])
        forward_x, backward_x = (project(time_major, kernel, bias)                  # [T, B, 3n] each
                                 for kernel, bias in zip(self.kernels, self.biases))
        recurrent_norms = self.norms("recurrent", dtype)
        if self.layer_norm:
            forward_x, backward_x = (gate_layer_norm(x, norm) for x, norm in
                                     zip((forward_x, backward_x), self.norms("input", dtype)))
        m = tf.cast(tf.transpose(mask), dtype)[:, :, None]                # [T, B, 1]
        h0 = tf.zeros(tf.stack([tf.shape(inputs)[0], n]), dtype)
        drop = recurrent_dropout_mask(tf.stack([2, tf.shape(inputs)[0], n]), self.recurrent_dropout,
                                      self.seed_generator, dtype, training)                  # [2, B, n] or None
        if separate_loops:
            forward_u, backward_u = self.recurrent_splits(dtype)
            norm = recurrent_norms or (None, None)
            forward = masked_gru_scan(forward_x, m, forward_u, h0, None if drop is None else drop[0],
                                      norm[0])                                                   # [T, B, n]
            backward = tf.reverse(masked_gru_scan(tf.reverse(backward_x, [0]), tf.reverse(m, [0]),
                                                  backward_u, h0, None if drop is None else drop[1], norm[1]), [0])
        else:
            # [T, 2, B, 3n]: row 0 read left to right, row 1 right to left.
            x_proj = tf.stack([forward_x, tf.reverse(backward_x, [0])], axis=1)
            m = tf.concat([m[:, None], tf.reverse(m, [0])[:, None]], axis=1)             # [T, 2, B, 1]
            u = tf.cast(tf.stack([tf.convert_to_tensor(k) for k in self.recurrent_kernels]), dtype)  # [2, n, 3n]
            norm = None if recurrent_norms is None else tuple(                           # [2, 1, 3n] each
                tf.stack([recurrent_norms[0][i], recurrent_norms[1][i]])[:, None] for i in range(2))
            states = masked_gru_scan(x_proj, m, u, tf.stack([h0, h0]), drop, norm,     # [T, 2, B, n]
                                     transposed_products=training and self.transposed_products)
            forward, backward = tf.unstack(states, axis=1)
            backward = tf.reverse(backward, [0])
        return tf.transpose(tf.concat([forward, backward], axis=-1), [1, 0, 2])

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (2 * self.units,)

    def get_config(self):
        return {**super().get_config(), "units": self.units, "recurrent_dropout": self.recurrent_dropout,
                "layer_norm": self.layer_norm}


@keras.saving.register_keras_serializable(package="nmt_tf")
class GRU(FrozenRecurrentSplits, keras.layers.Layer):
    """A left-to-right GRU over a right-padded batch (RNNencdec's encoder, paper 004 §2).

    Padded positions never change the state, so the state at the last
    position is each sentence's own last real state h_T.

    Args:
      units: n.
      recurrent_dropout: rate of the recurrent (variational) dropout in
        training (module docstring).
      layer_norm: a layer-normalised GRU (module docstring).

    Call arguments:
      inputs: [batch, time, input_dim].
      mask: [batch, time] bool, True at real positions.

    Returns:
      (states [batch, time, units], last real state h_T [batch, units]).
    """

    def __init__(self, units: int, recurrent_dropout: float = 0.0, layer_norm: bool = False,
                 transposed_products: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.recurrent_dropout = recurrent_dropout
        self.layer_norm = layer_norm
        # In training, multiply the state by stored transposes of U (a choice of the machine, made by whoever
        # builds the model: nmt_tf.core.hardware.transposed_step_products; not part of the layer's config).
        self.transposed_products = transposed_products
        self.seed_generator = keras.random.SeedGenerator() if recurrent_dropout else None

    def build(self, input_shape):
        add_gru_weights(self, input_shape[-1])

    @property
    def recurrent_kernels(self):
        """[U] [n, 3n] (FrozenRecurrentSplits' one direction)."""
        return [self.recurrent_kernel]

    def call(self, inputs, mask, training=False):
        n = self.units
        dtype = self.compute_dtype
        x_proj = project(tf.transpose(tf.cast(inputs, dtype), [1, 0, 2]), self.kernel, self.bias)  # [T, B, 3n]
        norm = lambda term: norm_weights(self, f"{term}_norm", dtype) if self.layer_norm else None
        if self.layer_norm:
            x_proj = gate_layer_norm(x_proj, norm("input"))
        m = tf.cast(tf.transpose(mask), dtype)[:, :, None]                                           # [T, B, 1]
        h0 = tf.zeros(tf.stack([tf.shape(inputs)[0], n]), dtype)
        drop = recurrent_dropout_mask(tf.shape(h0), self.recurrent_dropout, self.seed_generator, dtype, training)
        states = masked_gru_scan(x_proj, m, self.recurrent_splits(dtype)[0], h0, drop, norm("recurrent"),
                                 transposed_products=training and self.transposed_products)  # [T, B, n]
        return tf.transpose(states, [1, 0, 2]), states[-1]

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.units,), (input_shape[0], self.units)

    def get_config(self):
        return {**super().get_config(), "units": self.units, "recurrent_dropout": self.recurrent_dropout,
                "layer_norm": self.layer_norm}


@keras.saving.register_keras_serializable(package="nmt_tf")
class GRUCell(keras.layers.Layer):
    """A GRU's weights and its step, for decoders that run their own time
    loop and fuse these matrices with others (the cGRU decoder's two GRUs).

    Holds W [input_dim, 3n], U [n, 3n] (block-orthogonal) and b [3n]; with
    layer_norm the (gain, bias) of the x-terms and of the h-terms.

    Call arguments (one step):
      inputs: [batch, input_dim] x_t.
      state: [batch, n] h_{t-1}.

    Returns:
      [batch, n] h_t.
    """

    # Whether the GRU has an input x_t (and W); `TransitionGRUCell` has none.
    TAKES_INPUT = True

    def __init__(self, units: int, layer_norm: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.layer_norm = layer_norm

    def build(self, input_shape):
        add_gru_weights(self, input_shape[-1])

    def project_inputs(self, inputs, kernels=None):
        """W x + b (layer-normalised with layer_norm) for inputs [..., input_dim]
        -> [..., 3n] (outside the loop for teacher forcing; per step in
        search, with `kernels`)."""
        kernels = kernels or self.step_weights()
        x_proj = project(tf.cast(inputs, self.compute_dtype), kernels["input"], kernels["bias"])
        return gate_layer_norm(x_proj, kernels["input_norm"]) if self.layer_norm else x_proj

    def input_term(self, product, kernels=None):
        """The x-term from W x [..., 3n] computed elsewhere (search: sum_j
        alpha_ij (W h_j), from products taken once per sentence): W x + b,
        layer-normalised with layer_norm, as `project_inputs` gives it."""
        kernels = kernels or self.step_weights()
        x_proj = product + kernels["bias"]
        return gate_layer_norm(x_proj, kernels["input_norm"]) if self.layer_norm else x_proj

    def step_weights(self) -> dict:
        """W, b, U_rz [n, 2n] and U [n, n] (candidate) in the compute dtype,
        and with layer_norm the (gain, bias) pairs "input_norm" and
        "recurrent_norm".

        Slicing and casting copy the matrices, so a time loop takes them once,
        outside, and passes them to every `step`.
        """
        dtype = self.compute_dtype
        u_rz, u_candidate = split_recurrent_kernel(tf.cast(self.recurrent_kernel, dtype))
        kernels = {"bias": tf.cast(self.bias, dtype), "recurrent_rz": u_rz, "recurrent_candidate": u_candidate}
        if self.TAKES_INPUT:
            kernels["input"] = tf.cast(self.kernel, dtype)
        if self.layer_norm:
            for term in ("input", "recurrent") if self.TAKES_INPUT else ("recurrent",):
                kernels[f"{term}_norm"] = norm_weights(self, f"{term}_norm", dtype)
        return kernels

    def step(self, x_proj, state, state_rz=None, kernels=None, state_dropped=None, extra=None):
        """One step from x_proj (`project_inputs` or `input_term`).

        `state_rz` is U_rz h_{t-1} when the caller computed it already (fused
        with another product); `kernels` is `step_weights()`, taken once per
        sequence; `state_dropped` is h_{t-1} with recurrent dropout (training;
        then `state_rz` must be U_rz of it); `extra` [..., 3n], normalised
        already, is added to every pre-activation (`ConditionalGRUCell`'s
        context terms)."""
        kernels = kernels or self.step_weights()
        if state_rz is None:
            state_rz = step_matmul(state if state_dropped is None else state_dropped, kernels["recurrent_rz"])
        return gru_update(x_proj, state, state_rz, kernels["recurrent_candidate"], extra=extra,
                          h_dropped=state_dropped, recurrent_norm=kernels.get("recurrent_norm"))

    def call(self, inputs, state):
        return self.step(self.project_inputs(inputs), tf.cast(state, self.compute_dtype))

    def get_config(self):
        return {**super().get_config(), "units": self.units, "layer_norm": self.layer_norm}


@keras.saving.register_keras_serializable(package="nmt_tf")
class TransitionGRUCell(GRUCell):
    """A GRU without input: a deep transition's step after its first
    (Pascanu et al. 2014; Nematus' deep transition, Miceli Barone et al.
    2017), as the cGRU decoder's GRU_3 .. GRU_d (`CGRUDecoder`) use it:

        r = sigmoid(U_r h + b_r),  z = sigmoid(U_z h + b_z)
        h~ = tanh(U (r * h) + b),   h' = (1 - z) * h + z * h~

    Holds U [n, 3n] (block-orthogonal) and b [3n]; with layer_norm the
    h-terms' (gain, bias), the bias b then standing where a GRU's
    normalised x-terms would.

    Call arguments (one step):
      state: [batch, n] h.

    Returns:
      [batch, n] h'.
    """

    TAKES_INPUT = False

    def build(self, input_shape=None):
        add_gru_weights(self, None)

    def step(self, state, state_rz=None, kernels=None, state_dropped=None):
        """One step of the state alone; `state_rz`, `kernels` and
        `state_dropped` as `GRUCell.step` takes them."""
        kernels = kernels or self.step_weights()
        return super().step(kernels["bias"], state, state_rz=state_rz, kernels=kernels, state_dropped=state_dropped)

    def call(self, state):
        return self.step(tf.cast(state, self.compute_dtype))

    def project_inputs(self, inputs, kernels=None):
        raise self._no_input("project_inputs")

    def input_term(self, product, kernels=None):
        raise self._no_input("input_term")

    def _no_input(self, method: str) -> TypeError:
        """GRUCell's x-term methods have nothing to work with here (no W, no
        "input" kernel): a clear error instead of a KeyError."""
        return TypeError(f"{self.name}.{method}: a TransitionGRUCell has no input, so no W x term; "
                         "its step reads the state alone.")


@keras.saving.register_keras_serializable(package="nmt_tf")
class ConditionalGRUCell(GRUCell):
    """The decoder's GRU: the context c_i enters all three gates (C_r, C_z, C).

    Holds W [input_dim, 3n], U [n, 3n] (block-orthogonal), C [context_dim, 3n]
    and b [3n]. The time loop lives in the decoder, which fuses these
    matrices with the attention's; this layer owns the weights and the math.

    Call arguments (one step):
      inputs: [batch, input_dim] embedded previous word E y_{i-1}.
      state: [batch, n] previous state s_{i-1}.
      context: [batch, context_dim] context vector c_i.

    Returns:
      [batch, n] new state s_i.
    """

    def __init__(self, units: int, context_dim: int, layer_norm: bool = False, **kwargs):
        super().__init__(units, layer_norm=layer_norm, **kwargs)
        self.context_dim = context_dim

    def build(self, input_shape):
        add_gru_weights(self, input_shape[-1], self.context_dim)

    def normalize_context(self, context_proj, kernels=None):
        """C c [..., 3n] as the gates add it: layer-normalised with layer_norm."""
        if not self.layer_norm:
            return context_proj
        return gate_layer_norm(context_proj, (kernels or self.step_weights())["context_norm"])

    def step_weights(self) -> dict:
        """`GRUCell.step_weights()` and C [context_dim, 3n] in the compute
        dtype, with layer_norm also its (gain, bias) "context_norm"."""
        dtype = self.compute_dtype
        kernels = {**super().step_weights(), "context": tf.cast(self.context_kernel, dtype)}
        if self.layer_norm:
            kernels["context_norm"] = norm_weights(self, "context_norm", dtype)
        return kernels

    def step(self, x_proj, state, context=None, state_rz=None, kernels=None, context_proj=None, state_dropped=None):
        """One step from x_proj = W x + b.

        `state_rz` is U_rz s_{i-1} when the caller computed it already (the
        decoder fuses it with the attention's W_a s_{i-1}); `context_proj` is
        C c_i when the caller has it (search: sum_j alpha_ij (C h_j) from
        products taken once per sentence), else C c_i is computed from
        `context`; `kernels` is `step_weights()`, taken once per sequence;
        `state_dropped` is s_{i-1} with recurrent dropout (training; then
        `state_rz` must be U_rz of it). With layer_norm, x_proj comes
        normalised (`project_inputs`); C c and the h-terms are normalised here.
        """
        kernels = kernels or self.step_weights()
        if context_proj is None:
            context_proj = tf.matmul(context, kernels["context"])
        return super().step(x_proj, state, state_rz=state_rz, kernels=kernels, state_dropped=state_dropped,
                            extra=self.normalize_context(context_proj, kernels))

    def call(self, inputs, state, context):
        dtype = self.compute_dtype
        return self.step(self.project_inputs(inputs), tf.cast(state, dtype), tf.cast(context, dtype))

    def get_config(self):
        return {**super().get_config(), "context_dim": self.context_dim}
