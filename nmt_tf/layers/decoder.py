"""The RNNsearch decoder recurrence (paper 000 §3.1, App. A.2.2; docs/SPEC.md §2).

For target position i, with s_{i-1} the previous state and E y_{i-1} the
embedded previous word:

    e_ij = v_a^T tanh(W_a s_{i-1} + U_a h_j + b_a),  alpha_i = softmax_j(e_i)
    c_i  = sum_j alpha_ij h_j
    s_i  = GRU(s_{i-1}, E y_{i-1}, c_i)         (c_i enters all three gates)

Only what depends on s_{i-1} runs inside the time loop. Per step that is one
matmul of s_{i-1} by [W_a | U_r | U_z] (fused), the attention over the
precomputed keys U_a h_j, one matmul of c_i by [C_r | C_z | C] and one of
r * s_{i-1} by U. The input projections W E y_{i-1} of all steps are one
matmul before the loop; the maxout readout and softmax of all steps run after
it (nmt_tf.layers.readout).

Search (`step`) goes one step further: C c_i = sum_j alpha_ij (C h_j), and
C h_j is computed once per sentence (`project_annotations`), so a search step
has no [context_dim, 3n] matmul per hypothesis, only alpha_i times a
[Tx, 3n] matrix. And search's state carries its own products: [s_i ; W_a s_i ;
U_rz s_i] (`search_state`), taken as soon as s_i exists. That product is the
first thing step i + 1 needs; taken at the end of step i (before the beam is
reordered: a row of the product follows its row of s_i), it runs while the
readout, output layer and top-k of step i run, instead of after them.

`CGRUDecoder` is Nematus' conditional GRU (not in the paper), a subclass
that shares this loop: a first GRU reads E y_{i-1}, the attention reads its
state, and a second GRU reads c_i (then, with a deep transition, GRUs
without input).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from nmt_tf.layers.attention import AdditiveAttention, score_bias
from nmt_tf.layers.gru import ConditionalGRUCell, GRUCell, TransitionGRUCell, gru_update, recurrent_dropout_mask
from nmt_tf.layers.ops import AfterLoopGradient, project, step_kernel, step_matmul


def step_loop_weights(weights: dict, state_kernels, transposed: bool) -> dict:
    """`step_weights()` for a teacher-forcing loop: where `transposed` (in
    training, on a machine where `nmt_tf.core.hardware.transposed_step_products()`
    says so), the matrices that multiply the state as `StepKernel`s;
    `state_kernels` are their key paths in `weights` (tuples of keys into
    nested dicts)."""
    if not transposed:
        return weights

    def replaced(tree: dict, path: tuple) -> dict:
        key, rest = path[0], path[1:]
        return {**tree, key: replaced(tree[key], rest) if rest else step_kernel(tree[key], True)}

    for path in state_kernels:
        weights = replaced(weights, path)
    return weights


@keras.saving.register_keras_serializable(package="nmt_tf")
class AttentionDecoder(keras.layers.Layer):
    """GRU decoder with additive attention over the source annotations.

    Args:
      units: decoder state size n.
      attention_units: alignment-model size n'.
      context_dim: size of an annotation h_j (2n for the bidirectional encoder).
      recurrent_dropout: in training, s_{i-1} times one dropout mask per
        sequence wherever it is multiplied (W_a, U_rz, U: nmt_tf.layers.gru).
      layer_norm: a layer-normalised GRU (nmt_tf.layers.gru); the attention
        is unchanged.

    Call arguments (teacher forcing over a whole target batch):
      target_embeddings: [batch, Ty, m] E y_{i-1} for i = 1..Ty (y_0 = [BOS]).
      initial_state: [batch, n] s_0.
      annotations: [batch, Tx, context_dim] encoder annotations h_j.
      mask: [batch, Tx] bool, True at real source positions.
      keys: optional [batch, Tx, n'] from `precompute` (computed if absent).

    Returns:
      (states [batch, Ty, n] s_i, contexts [batch, Ty, context_dim] c_i,
       alignments [batch, Ty, Tx] float32 alpha_ij).
    """

    def __init__(self, units: int, attention_units: int, context_dim: int, recurrent_dropout: float = 0.0,
                 layer_norm: bool = False, transposed_products: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.attention_units = attention_units
        self.context_dim = context_dim
        self.recurrent_dropout = recurrent_dropout
        self.layer_norm = layer_norm
        self.transposed_products = transposed_products      # as nmt_tf.layers.gru.BidirectionalGRU's
        self.seed_generator = keras.random.SeedGenerator() if recurrent_dropout else None
        self.cell = self._make_cell()
        self.attention = AdditiveAttention(attention_units, name="attention")

    # Key paths in `step_weights()` of the matrices that multiply a state in
    # the teacher-forcing loop (`step_loop_weights`).
    LOOP_STATE_KERNELS = (("state",), ("cell", "recurrent_candidate"))

    def loop_state_kernels(self) -> tuple:
        """`LOOP_STATE_KERNELS`, and those of layers a subclass adds."""
        return self.LOOP_STATE_KERNELS

    def _make_cell(self):
        """The GRU that reads the context: s_i = GRU(s_{i-1}, E y_{i-1}, c_i)."""
        return ConditionalGRUCell(self.units, self.context_dim, layer_norm=self.layer_norm, name="gru")

    def build(self, target_embeddings_shape, *args, **kwargs):
        self.cell.build((None, target_embeddings_shape[-1]))
        self.attention.build_for(self.units, self.context_dim)
        self.built = True

    def gru_cells(self) -> dict:
        """The decoder's GRUs by what `--dry_run` calls them."""
        return {"decoder GRU": self.cell}

    @property
    def search_state_size(self) -> int:
        """Width of `search_state`: [s ; W_a s ; U_rz s], n + n' + 2n."""
        return 3 * self.units + self.attention_units

    def _annotation_kernel(self, weights):
        """The matrix the context enters the GRU by, C [context_dim, 3n]: the
        annotations are multiplied by it once per sentence (`project_annotations`)."""
        return weights["cell"]["context"]

    def _state_mask(self, batch, dtype, training):
        """The recurrent dropout mask of the teacher-forcing loop (None outside training)."""
        return recurrent_dropout_mask(tf.stack([batch, self.units]), self.recurrent_dropout,
                                      self.seed_generator, dtype, training)

    def _attend(self, query_proj, keys, projected_annotations, bias, tap=None):
        """The attention of a teacher-forcing step: (sum_j alpha_ij (h_j C)
        [B, 3n], alpha_i [B, Tx]); with `tap` (`AfterLoopGradient`), the
        gradient of the projected annotations is taken after the loop."""
        if tap is not None:
            # (inside the loop's body, so that its gradient builds no per-step share at all)
            projected_annotations = tf.stop_gradient(projected_annotations)
        context_proj, alpha = self.attention.attend(query_proj, keys, projected_annotations, bias)
        return (context_proj if tap is None else context_proj + tap), alpha

    def _search_attend(self, query_proj, keys, projected_annotations, bias, beam):
        """The attention of a search step, the hypotheses' queries W_a s
        [N, n'] grouped by sentence (`beam` each): (sum_j alpha_ij (h_j C)
        [N, 3n], sum_j alpha_ij (h_j R) [N, r], alpha_i [batch, beam, Tx]);
        `projected_annotations` are h_j [C | R] (`project_annotations`)."""
        n, units = self.units, self.attention_units
        weighted, alpha = self.attention.attend(tf.reshape(query_proj, [-1, beam, units]), keys,
                                                projected_annotations, bias)
        width = projected_annotations.shape[-1]
        context_proj, readout_context = tf.split(tf.reshape(weighted, [-1, width]), [3 * n, width - 3 * n], axis=1)
        return context_proj, readout_context, alpha

    def precompute(self, annotations):
        """Per-sentence work shared by every step: the keys U_a h_j + b_a."""
        return self.attention.precompute_keys(annotations)

    def step_weights(self) -> dict:
        """The matrices of a step, fused, sliced and cast once per sequence.

        "state": [W_a | U_r | U_z], everything multiplying s_{i-1} before the
        reset gate; "cell": the GRU's `step_weights()` but its U_rz, which is
        in "state" (every step here passes U_rz s_{i-1} to the cell, so a
        second copy would only be built, or stored by a frozen export, for
        nothing). Building them copies megabytes, so time loops (teacher
        forcing, search) take them outside.
        """
        n = self.units
        state_kernel = tf.concat([self.attention.query_kernel, self.cell.recurrent_kernel[:, :2 * n]], axis=1)
        cell = {key: value for key, value in self.cell.step_weights().items() if key != "recurrent_rz"}
        return {"state": tf.cast(state_kernel, self.compute_dtype), "cell": cell}

    def _step(self, x_proj, state, weights, keys, projected_annotations, bias, state_mask=None, tap=None):
        """Teacher forcing's step: x_proj = W E y_{i-1} + b [B, 3n]; state s_{i-1} [B, n];
        projected_annotations: C h_j [B, Tx, 3n]; state_mask: the recurrent
        dropout mask (training) or None; tap: None, or this step's zero
        [B, 3n] of an `AfterLoopGradient` of projected_annotations (training:
        their gradient is then taken after the loop).
        Returns (s_i [B, n], alpha_i [B, Tx])."""
        dropped = state if state_mask is None else state * state_mask
        query_proj, state_rz = tf.split(step_matmul(dropped, weights["state"]),
                                        [self.attention_units, 2 * self.units], axis=1)
        context_proj, alpha = self._attend(query_proj, keys, projected_annotations, bias, tap)
        new_state = self.cell.step(x_proj, state, state_rz=state_rz, kernels=weights["cell"],
                                   context_proj=context_proj, state_dropped=None if state_mask is None else dropped)
        return new_state, alpha

    def project_annotations(self, annotations, extra_kernel, weights=None):
        """h_j [C | R] for every source position: [batch, Tx, 3n + r], for `step`.

        C c_i = sum_j alpha_ij (C h_j), so with these products (once per
        sentence) a search step needs no [context_dim, 3n] matmul per
        hypothesis. R [context_dim, r] are columns the caller wants weighted
        the same way (RNNsearch: the readout's C_o).
        """
        weights = weights or self.step_weights()
        dtype = self.compute_dtype
        annotations = tf.cast(annotations, dtype)
        # Two products, then one concat of the (small) results: concatenating
        # the matrices instead would copy megabytes per call.
        return tf.concat([project(annotations, self._annotation_kernel(weights)),
                          project(annotations, tf.cast(extra_kernel, dtype))], axis=-1)

    def search_state(self, state, weights=None):
        """s [N, n] -> search's state [N, n + n' + 2n]: [s ; W_a s ; U_rz s]
        (the products `step` needs from it, taken once here)."""
        weights = weights or self.step_weights()
        state = tf.cast(state, self.compute_dtype)
        return tf.concat([state, tf.matmul(state, weights["state"])], axis=-1)

    def project_inputs(self, previous_embedding, weights=None):
        """The GRU's input term W E y_{i-1} + b [N, 3n] (layer-normalised with
        layer_norm) that `step` takes; `weights` is `step_weights()`."""
        return self.cell.project_inputs(previous_embedding, (weights or self.step_weights())["cell"])

    def step(self, x_proj, state, keys, projected_annotations, bias, weights=None, beam=1):
        """One decoding step for search.

        Args:
          x_proj: [N, 3n] `project_inputs(E y_{i-1})` (or an export's token
            products, `Seq2SeqModel.token_products`), N = batch x beam
            hypotheses grouped by sentence (rows k*beam .. k*beam + beam-1
            belong to sentence k).
          state: [N, n + n' + 2n] `search_state` of s_{i-1}.
          keys: [batch, Tx, n'] from `precompute`.
          projected_annotations: [batch, Tx, 3n + r] from `project_annotations`.
          bias: [batch, Tx] `score_bias(mask)`.
          weights: `step_weights()`, taken once outside the search loop
            (built here when None).
          beam: hypotheses per sentence (static).

        Returns:
          (s_i [N, n], its `search_state` [N, n + n' + 2n] for the next step,
           sum_j alpha_ij (h_j R) [N, r], alpha_i [batch, beam, Tx] float32).
          (s_i is returned by itself so that what needs only s_i does not
          wait for the product in its search state.)
        """
        dtype = self.compute_dtype
        weights = weights or self.step_weights()
        n, units = self.units, self.attention_units
        state = tf.cast(state, dtype)
        previous_state, query_proj, state_rz = tf.split(state, [n, units, 2 * n], axis=1)
        context_proj, readout_context, alpha = self._search_attend(query_proj, keys, projected_annotations, bias,
                                                                   beam)
        new_state = self.cell.step(x_proj, previous_state, state_rz=state_rz,
                                   kernels=weights["cell"], context_proj=context_proj)
        return new_state, self.search_state(new_state, weights), readout_context, alpha

    def call(self, target_embeddings, initial_state, annotations, mask, keys=None, training=False):
        dtype = self.compute_dtype
        annotations = tf.cast(annotations, dtype)
        if keys is None:
            keys = self.precompute(annotations)
        bias = score_bias(mask)
        weights = step_loop_weights(self.step_weights(), self.loop_state_kernels(),
                                    training and self.transposed_products)
        # C c_i = sum_j alpha_ij (C h_j), as in search: the annotations are
        # multiplied by C once, as one large product, instead of every step's
        # context by C (same products, the loop's share done in bulk; its
        # gradient too). c_i itself, for the readout, is alpha_i h after the loop.
        projected = project(annotations, self._annotation_kernel(weights))               # [B, Tx, 3n]
        # [Ty, B, 3n], time-major for the loop.
        x_proj = self.project_inputs(tf.transpose(tf.cast(target_embeddings, dtype), [1, 0, 2]), weights)
        state_mask = self._state_mask(tf.shape(annotations)[0], dtype, training)

        init = (tf.cast(initial_state, dtype), tf.zeros(tf.shape(mask), tf.float32))
        if training:
            # The gradient of C h_j as one product after the loop, from all
            # steps' alpha_i and d(C c_i) (AfterLoopGradient): +4 % tokens/s
            # for the reference configuration on an AVX2 CPU (Zen 3), +3 % in
            # float32 and +1 % in bfloat16 on an AVX-512 one (Zen 4; BUILD_NOTES).
            after_loop = AfterLoopGradient(
                projected, tf.concat([tf.shape(x_proj)[:2], tf.shape(projected)[-1:]], 0),
                lambda alphas, d_context_proj: tf.einsum("tbx,tbk->bxk", tf.cast(alphas, dtype), d_context_proj))
            states, alphas = tf.scan(
                lambda carry, elems: self._step(elems[0], carry[0], weights, keys, projected, bias, state_mask,
                                                tap=elems[1]),
                (x_proj, after_loop.taps), initializer=init)
            after_loop.set_left_operands(alphas)
        else:
            states, alphas = tf.scan(lambda carry, x_t: self._step(x_t, carry[0], weights, keys, projected, bias,
                                                                   state_mask), x_proj, initializer=init)
        states, alphas = tf.transpose(states, [1, 0, 2]), tf.transpose(alphas, [1, 0, 2])
        contexts = tf.matmul(tf.cast(alphas, dtype), annotations)                       # [B, Ty, 2n]
        return states, contexts, alphas

    def get_config(self):
        return {**super().get_config(), "units": self.units, "attention_units": self.attention_units,
                "context_dim": self.context_dim, "recurrent_dropout": self.recurrent_dropout,
                "layer_norm": self.layer_norm}


@keras.saving.register_keras_serializable(package="nmt_tf")
class CGRUDecoder(AttentionDecoder):
    """The conditional GRU with attention ("cGRU") of Nematus (Sennrich et
    al. 2017, §2), the decoder of Nematus, of Marian's RNN models and of
    nmtpytorch's Multi30k systems; not in paper 000:

        s'_i = GRU_1(s_{i-1}, E y_{i-1})                      (the transition)
        e_ij = v_a^T tanh(W_a s'_i + U_a h_j + b_a),  alpha_i = softmax_j(e_i)
        c_i  = sum_j alpha_ij h_j
        s_i  = GRU_2(s'_i, c_i)                      (c_i is GRU_2's input x)

    With `transition_depth` d > 2 (Nematus' dec_base_recurrence_transition_depth,
    a deep transition: Miceli Barone et al. 2017), GRUs without input follow
    GRU_2 within the step, and the last one's state is s_i:

        s_i = GRU_d(... GRU_3(GRU_2(s'_i, c_i)))        (`TransitionGRUCell`)

    The attention reads s'_i, which has seen y_{i-1}, where RNNsearch's reads
    s_{i-1}, which has not. The readout and the output layer read s_i, c_i
    and E y_{i-1} as before. GRU_1 has W_1 [m, 3n], U_1 [n, 3n], b_1; GRU_2
    has W_2 [context_dim, 3n], U_2 [n, 3n], b_2: n·3n + 3n more weights than
    the paper's one GRU (U_1, b_1), and one more [n, 3n] product per step.

    Same arguments (and `transition_depth`, d >= 2), call and outputs as
    `AttentionDecoder`, whose time loop it shares. Per step that is
    U_1 [r, z] s_{i-1} and U_1 (r * s_{i-1}), then one product of s'_i by [W_a | U_2r | U_2z] (fused), the attention
    over the precomputed keys (and W_2 c_i = sum_j alpha_ij (W_2 h_j), with
    h_j W_2 taken once per sentence), and U_2 (r * s'_i); each GRU_k, k > 2,
    adds U_krz and U_k products of its own. Recurrent dropout draws one mask
    per sentence for the state each GRU reads: s_{i-1}, s'_i, and GRU_k's.
    Search's state is [s_i ; U_1rz s_i] (`search_state`) at any depth.
    """

    LOOP_STATE_KERNELS = AttentionDecoder.LOOP_STATE_KERNELS + (("transition", "recurrent_rz"),
                                                                ("transition", "recurrent_candidate"))

    def __init__(self, units: int, attention_units: int, context_dim: int, recurrent_dropout: float = 0.0,
                 layer_norm: bool = False, transition_depth: int = 2, transposed_products: bool = False, **kwargs):
        if transition_depth < 2:
            raise ValueError(f"transition_depth must be at least 2 (GRU_1 and GRU_2), got {transition_depth}")
        super().__init__(units, attention_units, context_dim, recurrent_dropout=recurrent_dropout,
                         layer_norm=layer_norm, transposed_products=transposed_products, **kwargs)
        self.transition_depth = transition_depth
        self.transition = GRUCell(units, layer_norm=layer_norm, name="transition")
        # Plain attributes gru_3, ... (a checkpoint follows attributes), so a
        # depth-2 decoder's checkpoints are what they were before deep transitions.
        for name in self._deep_names():
            setattr(self, name, TransitionGRUCell(units, layer_norm=layer_norm, name=name))

    def _deep_names(self) -> list:
        """The attributes (and `step_weights()` keys) of GRU_3 .. GRU_d."""
        return [f"gru_{k}" for k in range(3, self.transition_depth + 1)]

    def loop_state_kernels(self) -> tuple:
        return self.LOOP_STATE_KERNELS + tuple((name, part) for name in self._deep_names()
                                               for part in ("recurrent_rz", "recurrent_candidate"))

    def _deep_transition(self, state, weights, masks=None):
        """s_i from GRU_2's state: GRU_3 .. GRU_d in turn (none at depth 2);
        `masks`: their recurrent dropout masks (training) or None."""
        for k, name in enumerate(self._deep_names()):
            mask = None if masks is None else masks[k]
            state = getattr(self, name).step(state, kernels=weights[name],
                                             state_dropped=None if mask is None else state * mask)
        return state

    def _make_cell(self):
        """GRU_2, whose input x is the context: s_i = GRU_2(s'_i, c_i)."""
        return GRUCell(self.units, layer_norm=self.layer_norm, name="gru")

    def build(self, target_embeddings_shape, *args, **kwargs):
        self.transition.build((None, target_embeddings_shape[-1]))
        self.cell.build((None, self.context_dim))
        for name in self._deep_names():
            getattr(self, name).build()
        self.attention.build_for(self.units, self.context_dim)
        self.built = True

    def gru_cells(self) -> dict:
        return {"decoder GRU 1 (transition)": self.transition, "decoder GRU 2 (context)": self.cell,
                **{f"decoder GRU {k} (deep transition)": getattr(self, name)
                   for k, name in enumerate(self._deep_names(), start=3)}}

    @property
    def search_state_size(self) -> int:
        """Width of `search_state`: [s ; U_1rz s], n + 2n."""
        return 3 * self.units

    def _annotation_kernel(self, weights):
        return weights["cell"]["input"]

    def _state_mask(self, batch, dtype, training):
        """(mask of s_{i-1}, mask of s'_i, masks of GRU_3 .. GRU_d's states),
        or None outside training."""
        masks = recurrent_dropout_mask(tf.stack([self.transition_depth, batch, self.units]),
                                       self.recurrent_dropout, self.seed_generator, dtype, training)
        return None if masks is None else tuple(tf.unstack(masks))

    def step_weights(self) -> dict:
        """`AttentionDecoder.step_weights()` ("state": [W_a | U_2rz], what
        multiplies s'_i before the reset gate; "cell": GRU_2's but its U_rz),
        "transition": GRU_1's `step_weights()` and "gru_3" .. "gru_d": the
        deep transition's."""
        return {**super().step_weights(), "transition": self.transition.step_weights(),
                **{name: getattr(self, name).step_weights() for name in self._deep_names()}}

    def _step(self, x_proj, state, weights, keys, projected_annotations, bias, state_mask=None, tap=None):
        """Teacher forcing's step (`AttentionDecoder._step`); x_proj is GRU_1's
        input term, state_mask the pair of `_state_mask`."""
        mask_1, mask_2 = (None, None) if state_mask is None else state_mask[:2]
        intermediate = self.transition.step(x_proj, state, kernels=weights["transition"],
                                            state_dropped=None if mask_1 is None else state * mask_1)
        dropped = intermediate if mask_2 is None else intermediate * mask_2
        query_proj, state_rz = tf.split(step_matmul(dropped, weights["state"]),
                                        [self.attention_units, 2 * self.units], axis=1)
        context_proj, alpha = self._attend(query_proj, keys, projected_annotations, bias, tap)
        new_state = self.cell.step(self.cell.input_term(context_proj, weights["cell"]), intermediate,
                                   state_rz=state_rz, kernels=weights["cell"],
                                   state_dropped=None if mask_2 is None else dropped)
        return self._deep_transition(new_state, weights, None if state_mask is None else state_mask[2:]), alpha

    def search_state(self, state, weights=None):
        """s [N, n] -> search's state [N, 3n]: [s ; U_1rz s], the product the
        next step's GRU_1 needs first, taken once here."""
        weights = weights or self.step_weights()
        state = tf.cast(state, self.compute_dtype)
        return tf.concat([state, tf.matmul(state, weights["transition"]["recurrent_rz"])], axis=-1)

    def project_inputs(self, previous_embedding, weights=None):
        """GRU_1's input term W_1 E y_{i-1} + b_1 [N, 3n] (layer-normalised
        with layer_norm) that `step` takes; `weights` is `step_weights()`."""
        return self.transition.project_inputs(previous_embedding, (weights or self.step_weights())["transition"])

    def step(self, x_proj, state, keys, projected_annotations, bias, weights=None, beam=1):
        """One decoding step for search, as `AttentionDecoder.step`; `state` is
        the [N, 3n] `search_state` of s_{i-1}, `projected_annotations` are
        h_j [W_2 | R] (`project_annotations`)."""
        dtype = self.compute_dtype
        weights = weights or self.step_weights()
        n, units = self.units, self.attention_units
        previous_state, state_rz_1 = tf.split(tf.cast(state, dtype), [n, 2 * n], axis=1)
        intermediate = self.transition.step(x_proj, previous_state, state_rz=state_rz_1,
                                            kernels=weights["transition"])
        query_proj, state_rz = tf.split(tf.matmul(intermediate, weights["state"]), [units, 2 * n], axis=1)
        context_proj, readout_context, alpha = self._search_attend(query_proj, keys, projected_annotations, bias,
                                                                   beam)
        new_state = self._deep_transition(self.cell.step(self.cell.input_term(context_proj, weights["cell"]),
                                                         intermediate, state_rz=state_rz, kernels=weights["cell"]),
                                          weights)
        return new_state, self.search_state(new_state, weights), readout_context, alpha

    def get_config(self):
        return {**super().get_config(), "transition_depth": self.transition_depth}


@keras.saving.register_keras_serializable(package="nmt_tf")
class ContextDecoder(keras.layers.Layer):
    """The RNN Encoder-Decoder's decoder (paper 004 §2; docs/SPEC.md §3).

    A GRU whose three gates all see the same summary c of the source at every
    step: s_i = GRU(s_{i-1}, E y_{i-1}, c). Because c does not change, its
    projection C c is computed once per sentence (`precompute`), so a step
    costs only the state's own products.

    Args:
      units: decoder state size n.
      context_dim: size of c.
      recurrent_dropout: in training, s_{i-1} times one dropout mask per
        sequence where it enters U_rz and U (nmt_tf.layers.gru).
      layer_norm: a layer-normalised GRU (nmt_tf.layers.gru).

    Call arguments (teacher forcing):
      target_embeddings: [batch, Ty, m] E y_{i-1} (y_0 = [BOS]).
      initial_state: [batch, n] s_0.
      context: [batch, context_dim] c.

    Returns:
      states [batch, Ty, n] s_i.
    """

    def __init__(self, units: int, context_dim: int, recurrent_dropout: float = 0.0, layer_norm: bool = False,
                 transposed_products: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.context_dim = context_dim
        self.recurrent_dropout = recurrent_dropout
        self.layer_norm = layer_norm
        self.transposed_products = transposed_products      # as nmt_tf.layers.gru.BidirectionalGRU's
        self.seed_generator = keras.random.SeedGenerator() if recurrent_dropout else None
        self.cell = ConditionalGRUCell(units, context_dim, layer_norm=layer_norm, name="gru")

    def build(self, target_embeddings_shape, *args, **kwargs):
        self.cell.build((None, target_embeddings_shape[-1]))
        self.built = True

    def precompute(self, context):
        """C c for all three gates (layer-normalised with layer_norm): [batch, context_dim] -> [batch, 3n]."""
        dtype = self.compute_dtype
        context_proj = tf.matmul(tf.cast(context, dtype), tf.cast(self.cell.context_kernel, dtype))
        return self.cell.normalize_context(context_proj)

    def step_weights(self) -> dict:
        """The GRU's `step_weights()` (W, b, U_rz, U, C), sliced and cast once per sequence."""
        return self.cell.step_weights()

    def _step(self, x_proj, state, context_proj, kernels, state_mask=None):
        dropped = state if state_mask is None else state * state_mask
        return gru_update(x_proj, state, step_matmul(dropped, kernels["recurrent_rz"]),
                          kernels["recurrent_candidate"], extra=context_proj,
                          h_dropped=None if state_mask is None else dropped,
                          recurrent_norm=kernels.get("recurrent_norm"))

    def project_inputs(self, previous_embedding, weights=None):
        """The GRU's input term W E y_{i-1} + b [N, 3n] (layer-normalised with
        layer_norm) that `step` takes; `weights` is `step_weights()`."""
        return self.cell.project_inputs(previous_embedding, weights or self.step_weights())

    def step(self, x_proj, state, context_proj, weights=None):
        """One step for search: `project_inputs(E y_{i-1})` [batch, 3n] (or an
        export's token products), s_{i-1} [batch, n], C c [batch, 3n] -> s_i.

        `weights` is `step_weights()`, taken once outside the search loop.
        """
        dtype = self.compute_dtype
        weights = weights or self.step_weights()
        return self._step(x_proj, tf.cast(state, dtype), context_proj, weights)

    def call(self, target_embeddings, initial_state, context, training=False):
        dtype = self.compute_dtype
        context_proj = self.precompute(context)
        kernels = step_loop_weights(self.step_weights(), [("recurrent_rz",), ("recurrent_candidate",)],
                                    training and self.transposed_products)
        x_proj = self.cell.project_inputs(tf.transpose(tf.cast(target_embeddings, dtype), [1, 0, 2]))
        state_mask = recurrent_dropout_mask(tf.shape(initial_state), self.recurrent_dropout,
                                            self.seed_generator, dtype, training)
        states = tf.scan(lambda s, x: self._step(x, s, context_proj, kernels, state_mask), x_proj,
                         initializer=tf.cast(initial_state, dtype))
        return tf.transpose(states, [1, 0, 2])

    def compute_output_shape(self, target_embeddings_shape, *args, **kwargs):
        return tuple(target_embeddings_shape[:-1]) + (self.units,)

    def get_config(self):
        return {**super().get_config(), "units": self.units, "context_dim": self.context_dim,
                "recurrent_dropout": self.recurrent_dropout, "layer_norm": self.layer_norm}
