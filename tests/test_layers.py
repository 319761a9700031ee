"""Layers against NumPy implementations of the equations of docs/SPEC.md, and masking."""

import functools

import numpy as np
import pytest
import tensorflow as tf

import reference as ref
from nmt_tf.layers import (AdditiveAttention, AttentionDecoder, BidirectionalGRU, BlockOrthogonal, CGRUDecoder,
                           ConditionalGRUCell, GRUCell, MaxoutReadout, TransitionGRUCell, gru_update, score_bias)
from nmt_tf.layers.ops import layer_norm, sigmoid, tanh

RNG = np.random.default_rng(7)
TOL = dict(rtol=1e-4, atol=1e-5)


def randomize(layer, scale=0.5):
    """Replaces every weight by N(0, scale^2) so that all terms matter in the comparison."""
    for w in layer.weights:
        w.assign(RNG.normal(0, scale, size=w.shape).astype("float32"))


def test_gru_update_matches_spec_equations():
    n, d, b = 5, 3, 4
    W, U, bias = RNG.normal(size=(d, 3 * n)), RNG.normal(size=(n, 3 * n)), RNG.normal(size=3 * n)
    x, h = RNG.normal(size=(b, d)), RNG.normal(size=(b, n))
    got = gru_update(tf.constant(x @ W + bias), tf.constant(h), tf.constant(h @ U[:, :2 * n]),
                     tf.constant(U[:, 2 * n:]))
    want = np.stack([ref.gru_step(x[i], h[i], W, U, bias) for i in range(b)])
    np.testing.assert_allclose(got.numpy(), want, **TOL)


def test_bfloat16_gates_are_the_float32_values_rounded():
    """Under bfloat16 the GRU's sigmoid and tanh are computed in float32 and
    rounded once: the exact values rounded to bfloat16 on 4,001 inputs
    (TensorFlow's own bfloat16 sigmoid, slower, misses 645 of them by one
    bfloat16 step; its tanh gives the same values); float32 inputs
    take TensorFlow's op as they are. A bfloat16 gru_update then stays
    within bfloat16 rounding of the float32 one, gradients included."""
    x = tf.constant(np.linspace(-12, 12, 4001), tf.float32)
    for f, exact in ((sigmoid, lambda v: 1 / (1 + np.exp(-v))), (tanh, np.tanh)):
        got = f(tf.cast(x, tf.bfloat16))
        assert got.dtype == tf.bfloat16
        inputs = tf.cast(tf.cast(x, tf.bfloat16), tf.float64).numpy()
        want = tf.cast(tf.cast(exact(inputs), tf.float32), tf.bfloat16)     # the exact value, rounded once
        np.testing.assert_array_equal(tf.cast(got, tf.float32).numpy(), tf.cast(want, tf.float32).numpy())
        assert f(x).dtype == tf.float32
        np.testing.assert_array_equal(f(x).numpy(), (tf.sigmoid if f is sigmoid else tf.tanh)(x).numpy())

    n, b = 8, 6
    x_proj, h, u = (RNG.normal(size=shape).astype("float32") for shape in ((b, 3 * n), (b, n), (n, 3 * n)))
    outputs = {}
    for dtype in (tf.float32, tf.bfloat16):
        args = [tf.constant(v, dtype) for v in (x_proj, h)]
        with tf.GradientTape() as tape:
            tape.watch(args)
            out = gru_update(args[0], args[1], args[1] @ tf.constant(u[:, :2 * n], dtype),
                             tf.constant(u[:, 2 * n:], dtype))
        outputs[dtype] = [tf.cast(t, tf.float32).numpy() for t in (out, *tape.gradient(out, args))]
    for low, full in zip(outputs[tf.bfloat16], outputs[tf.float32]):
        np.testing.assert_allclose(low, full, rtol=0.05, atol=0.05)


def test_reset_gate_applies_before_U():
    """With U = I on the candidate, h~ = tanh(r*h); Keras' reset_after variant would give r*tanh(h)."""
    n = 3
    h = np.array([[0.9, -0.7, 0.5]])
    x_proj = np.zeros((1, 3 * n))
    x_proj[0, :n] = -1.0                      # r = sigmoid(-1)
    x_proj[0, n:2 * n] = 50.0                 # z = 1: h_t = h~
    got = gru_update(tf.constant(x_proj), tf.constant(h), tf.zeros((1, 2 * n), tf.float64),
                     tf.constant(np.eye(n)))
    r = 1 / (1 + np.exp(1.0))
    np.testing.assert_allclose(got.numpy(), np.tanh(r * h), rtol=1e-6)


def test_conditional_gru_cell_matches_spec():
    n, m, k, b = 4, 3, 6, 2
    cell = ConditionalGRUCell(n, k)
    cell.build((None, m))
    randomize(cell)
    x, s, c = (RNG.normal(size=(b, dim)).astype("float32") for dim in (m, n, k))
    got = cell(x, s, c).numpy()
    W, U, C, bias = (w.numpy() for w in (cell.kernel, cell.recurrent_kernel, cell.context_kernel, cell.bias))
    want = np.stack([ref.gru_step(x[i], s[i], W, U, bias, C, c[i]) for i in range(b)])
    np.testing.assert_allclose(got, want, **TOL)


def _padded(lengths, d):
    xs = [RNG.normal(size=(t, d)).astype("float32") for t in lengths]
    batch = np.zeros((len(lengths), max(lengths), d), "float32")
    mask = np.zeros((len(lengths), max(lengths)), bool)
    for i, x in enumerate(xs):
        batch[i, :len(x)] = x
        mask[i, :len(x)] = True
    return xs, batch, mask


@pytest.mark.parametrize("separate_loops", [False, True])
def test_bidirectional_gru_matches_reference_per_sentence_with_padding(separate_loops):
    """A padded batch gives, at real positions, exactly each sentence's own
    unpadded result, with the directions in one batched loop (training) or in
    two loops (search)."""
    n, d = 4, 3
    layer = BidirectionalGRU(n)
    xs, batch, mask = _padded([5, 2, 7, 1], d)
    layer.build(batch.shape)
    randomize(layer)
    got = layer(batch, mask, separate_loops=separate_loops).numpy()
    fw = tuple(w.numpy() for w in (layer.kernels[0], layer.recurrent_kernels[0], layer.biases[0]))
    bw = tuple(w.numpy() for w in (layer.kernels[1], layer.recurrent_kernels[1], layer.biases[1]))
    for i, x in enumerate(xs):
        np.testing.assert_allclose(got[i, :len(x)], ref.bidirectional_gru(x, fw, bw), **TOL)


def test_bidirectional_gru_padding_values_are_irrelevant():
    layer = BidirectionalGRU(3)
    _, batch, mask = _padded([4, 2], 2)
    layer.build(batch.shape)
    randomize(layer)
    noisy = batch.copy()
    noisy[~mask] = 100.0
    np.testing.assert_allclose(layer(batch, mask).numpy()[mask], layer(noisy, mask).numpy()[mask], **TOL)


def test_attention_matches_reference_and_ignores_padding():
    n, k, units = 4, 6, 5
    att = AdditiveAttention(units)
    Hs, H, mask = _padded([3, 6, 1], k)
    att.build((None, n), H.shape)
    randomize(att)
    s = RNG.normal(size=(3, n)).astype("float32")
    context, alpha = (t.numpy() for t in att(s, H, mask))
    weights = [w.numpy() for w in (att.query_kernel, att.key_kernel, att.bias, att.score_vector)]
    for i, h in enumerate(Hs):
        c_ref, a_ref = ref.attention(s[i], h, *weights)
        np.testing.assert_allclose(context[i], c_ref, **TOL)
        np.testing.assert_allclose(alpha[i, :len(h)], a_ref, **TOL)
        assert np.all(alpha[i, len(h):] == 0.0)
    # Garbage in padded annotations changes nothing.
    H2 = H.copy()
    H2[~mask] = 50.0
    np.testing.assert_allclose(att(s, H2, mask)[0].numpy(), context, **TOL)


def test_score_bias_zeroes_padding_even_against_huge_scores():
    scores = tf.constant([[80.0, 1e4, -3.0], [0.0, 0.0, 0.0]])
    bias = score_bias(tf.constant([[True, False, True], [True, True, False]]))
    alpha = tf.nn.softmax(scores + bias).numpy()
    assert alpha[0, 1] == 0.0 and alpha[1, 2] == 0.0
    np.testing.assert_allclose(alpha.sum(1), [1.0, 1.0], rtol=1e-6)


def test_maxout_matches_reference():
    n, m, k, l = 4, 3, 6, 5
    layer = MaxoutReadout(l)
    layer.build_for(n, m, k)
    randomize(layer)
    s, e, c = (RNG.normal(size=(2, 3, dim)).astype("float32") for dim in (n, m, k))
    got = layer(s, e, c).numpy()
    assert got.shape == (2, 3, l)
    weights = [w.numpy() for w in (layer.state_kernel, layer.embedding_kernel, layer.context_kernel, layer.bias)]
    np.testing.assert_allclose(got, ref.maxout(s, e, c, *weights), **TOL)


def test_maxout_search_step_equals_the_layer():
    """Search's readout step, whose weights and terms are in the readout's
    search layout (maxout of two halves), gives the layer's maxout of
    adjacent pairs."""
    n, m, k, l = 4, 3, 6, 5
    layer = MaxoutReadout(l)
    layer.build_for(n, m, k)
    randomize(layer)
    s, e, c = (RNG.normal(size=(7, dim)).astype("float32") for dim in (n, m, k))
    weights = layer.step_weights()
    got = layer.step(s, layer.embedding_term(e, weights), tf.matmul(c, layer.search_context_kernel()), weights)
    ref_weights = [w.numpy() for w in (layer.state_kernel, layer.embedding_kernel, layer.context_kernel, layer.bias)]
    np.testing.assert_allclose(got.numpy(), ref.maxout(s, e, c, *ref_weights), **TOL)
    np.testing.assert_allclose(got.numpy(), layer(s, e, c).numpy(), **TOL)


DECODERS = [AttentionDecoder, CGRUDecoder, functools.partial(CGRUDecoder, transition_depth=3)]
DECODER_IDS = ["bahdanau", "cgru", "cgru_depth_3"]


@pytest.mark.parametrize("decoder_class", DECODERS, ids=DECODER_IDS)
def test_decoder_step_equals_teacher_forced_loop(decoder_class):
    """The search's single step and the training loop compute the same states."""
    n, m, k, units = 4, 3, 6, 5
    dec = decoder_class(n, units, k)
    _, H, mask = _padded([3, 5], k)
    emb = RNG.normal(size=(2, 4, m)).astype("float32")
    dec.build(emb.shape)
    randomize(dec)
    s0 = RNG.normal(size=(2, n)).astype("float32")
    states, contexts, alphas = (t.numpy() for t in dec(emb, s0, H, mask))
    keys, bias = dec.precompute(tf.constant(H)), score_bias(mask)
    projected = dec.project_annotations(H, np.eye(k, dtype="float32"))     # h_j [C | I]: c_i comes back
    search_state = dec.search_state(tf.constant(s0))
    weights = dec.step_weights()
    for i in range(4):
        s, search_state, c, a = dec.step(dec.project_inputs(emb[:, i]), search_state, keys, projected, bias)
        np.testing.assert_allclose(s.numpy(), states[:, i], **TOL)
        np.testing.assert_allclose(c.numpy(), contexts[:, i], **TOL)
        np.testing.assert_allclose(a.numpy()[:, 0], alphas[:, i], **TOL)
        # The search state is [s_i ; W_a s_i ; U_rz s_i]; the cGRU's [s_i ; U_1rz s_i].
        kernel = (weights["transition"]["recurrent_rz"] if isinstance(dec, CGRUDecoder) else weights["state"])
        np.testing.assert_allclose(search_state.numpy(), np.concatenate([s, s @ kernel.numpy()], -1), **TOL)
        assert search_state.shape[-1] == dec.search_state_size


@pytest.mark.parametrize("decoder_class", DECODERS, ids=DECODER_IDS)
def test_decoder_step_with_a_beam_of_hypotheses_per_sentence(decoder_class):
    """Rows grouped by sentence (beam 3) read their own sentence's annotations
    and equal the one-hypothesis step row by row."""
    n, m, k, units, beam = 4, 3, 6, 5, 3
    dec = decoder_class(n, units, k)
    _, H, mask = _padded([3, 5], k)
    dec.build((2, 1, m))
    randomize(dec)
    keys, bias = dec.precompute(tf.constant(H)), score_bias(mask)
    projected = dec.project_annotations(H, np.eye(k, dtype="float32"))
    emb = RNG.normal(size=(2 * beam, m)).astype("float32")
    s = dec.search_state(tf.constant(RNG.normal(size=(2 * beam, n)).astype("float32"))).numpy()
    x_proj = dec.project_inputs(emb)
    s_all, _, c_all, a_all = (t.numpy() for t in dec.step(x_proj, s, keys, projected, bias, beam=beam))
    assert a_all.shape == (2, beam, 5)
    for row in range(2 * beam):
        sentence = row // beam
        one = dec.step(x_proj[row:row + 1], s[row:row + 1], keys[sentence:sentence + 1],
                       projected[sentence:sentence + 1], bias[sentence:sentence + 1])
        np.testing.assert_allclose(s_all[row], one[0].numpy()[0], **TOL)
        np.testing.assert_allclose(c_all[row], one[2].numpy()[0], **TOL)
        np.testing.assert_allclose(a_all[sentence, row % beam], one[3].numpy()[0, 0], **TOL)


def test_block_orthogonal_blocks_are_orthogonal():
    w = BlockOrthogonal()((6, 18)).numpy()
    for k in range(3):
        block = w[:, 6 * k:6 * (k + 1)]
        np.testing.assert_allclose(block.T @ block, np.eye(6), atol=1e-5)


def every_layer_and_initializer():
    """One instance of every layer and initializer class of nmt_tf.layers, with
    non-default arguments; a class added to the package without one here
    fails test_every_layer_is_in_the_round_trip."""
    from nmt_tf.layers.decoder import ContextDecoder
    from nmt_tf.layers.grconv import GatedRecursiveConvolution, ScaledOrthogonal
    from nmt_tf.layers.gru import GRU

    return [BidirectionalGRU(3, recurrent_dropout=0.2, layer_norm=True), GRU(4, recurrent_dropout=0.1, layer_norm=True),
            GRUCell(3, layer_norm=True), ConditionalGRUCell(3, 4, layer_norm=True), AdditiveAttention(5),
            MaxoutReadout(2), AttentionDecoder(3, 4, 6, recurrent_dropout=0.3, layer_norm=True),
            CGRUDecoder(3, 4, 6, recurrent_dropout=0.3, layer_norm=True, transition_depth=3),
            TransitionGRUCell(3, layer_norm=True),
            ContextDecoder(3, 5, recurrent_dropout=0.2, layer_norm=True), GatedRecursiveConvolution(7),
            BlockOrthogonal(seed=3), ScaledOrthogonal(gain=0.3, seed=5)]


@pytest.mark.parametrize("layer", every_layer_and_initializer(), ids=lambda layer: type(layer).__name__)
def test_get_config_round_trip(layer):
    clone = type(layer).from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()


def test_every_layer_is_in_the_round_trip():
    import inspect

    import keras

    import nmt_tf.layers.attention, nmt_tf.layers.decoder, nmt_tf.layers.grconv  # noqa: E401
    import nmt_tf.layers.gru, nmt_tf.layers.initializers, nmt_tf.layers.readout  # noqa: E401

    defined = {cls for module in (nmt_tf.layers.attention, nmt_tf.layers.decoder, nmt_tf.layers.grconv,
                                  nmt_tf.layers.gru, nmt_tf.layers.initializers, nmt_tf.layers.readout)
               for _, cls in inspect.getmembers(module, inspect.isclass)
               if cls.__module__ == module.__name__
               and issubclass(cls, (keras.layers.Layer, keras.initializers.Initializer))}
    assert len(defined) >= 10
    assert defined == {type(layer) for layer in every_layer_and_initializer()}


def test_recurrent_dropout_keeps_one_mask_per_sentence_for_all_steps():
    """masked_gru_scan with a state mask m is the GRU of docs/SPEC.md §1 with m * h_{t-1} in
    every recurrent product (the same m at every step), and the state update
    keeps h_{t-1} itself."""
    from nmt_tf.layers.gru import masked_gru_scan

    n, d, b, t = 4, 3, 2, 5
    W, U, bias = RNG.normal(size=(d, 3 * n)), RNG.normal(size=(n, 3 * n)), RNG.normal(size=3 * n)
    xs = RNG.normal(size=(t, b, d))
    m = (RNG.random((b, n)) > 0.4) / 0.6
    got = masked_gru_scan(tf.constant(xs @ W + bias), tf.ones((t, b, 1), tf.float64), tf.constant(U),
                          tf.zeros((b, n), tf.float64), tf.constant(m)).numpy()
    h = np.zeros((b, n))
    for step in range(t):
        h = np.stack([ref.gru_step(xs[step, i], h[i], W, U, bias, m=m[i]) for i in range(b)])
        np.testing.assert_allclose(got[step], h, **TOL)


def test_recurrent_dropout_acts_only_in_training_and_draws_one_mask_per_sequence():
    lengths = [4, 2]
    _, x, mask = _padded(lengths, 3)
    plain, dropped = BidirectionalGRU(5), BidirectionalGRU(5, recurrent_dropout=0.5)
    plain.build(x.shape)
    dropped.build(x.shape)
    randomize(plain)
    dropped.set_weights(plain.get_weights())
    np.testing.assert_allclose(dropped(x, mask).numpy(), plain(x, mask).numpy(), rtol=1e-6)
    assert np.abs(dropped(x, mask, training=True).numpy() - plain(x, mask).numpy()).max() > 1e-3
    decoder = AttentionDecoder(4, 5, 10, recurrent_dropout=0.5)
    decoder.build((None, None, 3))
    randomize(decoder)
    args = (RNG.normal(size=(2, 3, 3)).astype("float32"), RNG.normal(size=(2, 4)).astype("float32"),
            plain(x, mask), mask)
    np.testing.assert_allclose(decoder(*args)[0].numpy(), decoder(*args)[0].numpy())
    assert np.abs(decoder(*args, training=True)[0].numpy() - decoder(*args)[0].numpy()).max() > 1e-3


@pytest.mark.parametrize("layer_norm,depth", [(False, 2), (True, 2), (True, 4)])
def test_cgru_decoder_matches_the_reference_with_its_dropout_masks(layer_norm, depth):
    """Training's loop of the cGRU: s'_i = GRU_1(s_{i-1}, E y_{i-1}) with mask
    m_1 on s_{i-1}, the attention from m_2 * s'_i, s_i = GRU_2(s'_i, c_i) with
    m_2 on s'_i (the same masks at every step), layer-normalised or not; at
    depth 4 then GRU_3 and GRU_4 (no input) with masks m_3 and m_4 of their own."""
    n, m, k, units = 4, 3, 6, 5
    dec = CGRUDecoder(n, units, k, recurrent_dropout=0.5, layer_norm=layer_norm, transition_depth=depth)
    lengths = [3, 5]
    _, H, mask = _padded(lengths, k)
    emb = RNG.normal(size=(2, 4, m)).astype("float32")
    dec.build(emb.shape)
    randomize(dec)
    s0 = RNG.normal(size=(2, n)).astype("float32")
    masks = [((RNG.random((2, n)) > 0.5) / 0.5).astype("float32") for _ in range(depth)]
    dec._state_mask = lambda batch, dtype, training: tuple(tf.constant(mk) for mk in masks) if training else None
    states, contexts, alphas = (t.numpy() for t in dec(emb, s0, H, mask, training=True))
    g = lambda v: v.numpy().astype(np.float64)
    att = [g(w) for w in (dec.attention.query_kernel, dec.attention.key_kernel, dec.attention.bias,
                          dec.attention.score_vector)]
    gru = lambda cell: [g(w) for w in (cell.kernel, cell.recurrent_kernel, cell.bias)]
    norms = lambda cell: _norms(cell, "", ("input", "recurrent")) if layer_norm else None
    for b, length in enumerate(lengths):
        s = s0[b].astype(np.float64)
        for i in range(4):
            s_mid = ref.gru_step(emb[b, i], s, *gru(dec.transition), m=masks[0][b], norms=norms(dec.transition))
            c, alpha = ref.attention(s_mid * masks[1][b], H[b, :length], *att)
            s = ref.gru_step(c, s_mid, *gru(dec.cell), m=masks[1][b], norms=norms(dec.cell))
            for j, name in enumerate(dec._deep_names(), start=2):
                cell = getattr(dec, name)
                s = ref.transition_gru_step(s, g(cell.recurrent_kernel), g(cell.bias), m=masks[j][b],
                                            norms=_norms(cell, "", ("recurrent",)) if layer_norm else None)
            np.testing.assert_allclose(states[b, i], s, **TOL)
            np.testing.assert_allclose(contexts[b, i], c, **TOL)
            np.testing.assert_allclose(alphas[b, i, :length], alpha, **TOL)


def test_a_transition_gru_has_no_input_terms():
    """GRUCell's x-term methods, inherited by the GRU without input, say so
    clearly instead of failing on a missing kernel."""
    cell = TransitionGRUCell(3)
    cell.build()
    for method, arg in (("project_inputs", tf.zeros((2, 3))), ("input_term", tf.zeros((2, 9)))):
        with pytest.raises(TypeError, match=f"{method}: a TransitionGRUCell has no input"):
            getattr(cell, method)(arg)
    assert cell(tf.ones((2, 3))).shape == (2, 3)


def _norms(layer, prefix, terms):
    return {term: tuple(getattr(layer, f"{prefix}{term}_norm_{part}").numpy() for part in ("gain", "bias"))
            for term in terms}


@pytest.mark.parametrize("x_shape, weight_shape", [((6, 8), (8,)), ((3, 5, 8), (8,)), ((3, 5, 8), (1, 1, 8)),
                                                    ((3, 5, 8), (5, 8))])
def test_layer_norm_gradient_equals_automatic_differentiation(x_shape, weight_shape):
    """layer_norm's written-out gradient against TensorFlow's differentiation
    of the plain formula, for x and for gains and biases broadcast over
    leading axes in several ways; the forward values are bit-identical."""
    x, dy = (tf.constant(RNG.normal(1, 2, size=x_shape).astype("float32")) for _ in range(2))
    gain, bias = (tf.constant(RNG.normal(size=weight_shape).astype("float32")) for _ in range(2))

    def plain(x, gain, bias):
        centered = x - tf.reduce_mean(x, axis=-1, keepdims=True)
        variance = tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True)
        return centered * tf.math.rsqrt(variance + 1e-5) * gain + bias

    results = []
    for f in (layer_norm, plain):
        with tf.GradientTape() as tape:
            tape.watch([x, gain, bias])
            y = f(x, gain, bias)
        results.append((y, *tape.gradient(y, [x, gain, bias], output_gradients=dy)))
    np.testing.assert_array_equal(results[0][0].numpy(), results[1][0].numpy())
    for got, want in zip(results[0][1:], results[1][1:]):
        assert got.shape == want.shape
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


def test_layer_norm_computes_in_the_dtype_of_its_weights():
    """bfloat16 inputs with float32 gain and bias (a bfloat16 search's step
    weights) are normalised in float32 and rounded once at the end."""
    x = tf.constant(RNG.normal(1, 2, size=(6, 8)).astype("float32"))
    gain, bias = (tf.constant(RNG.normal(size=8).astype("float32")) for _ in range(2))
    low = tf.cast(x, tf.bfloat16)
    got = layer_norm(low, gain, bias)
    assert got.dtype == tf.bfloat16
    want = tf.cast(layer_norm(tf.cast(low, tf.float32), gain, bias), tf.bfloat16)
    np.testing.assert_array_equal(tf.cast(got, tf.float32).numpy(), tf.cast(want, tf.float32).numpy())


@pytest.mark.parametrize("separate_loops", [False, True])
def test_layer_normalised_gru_matches_the_reference(separate_loops):
    """layer_norm: each term (input, recurrent, context) normalised on its own,
    [r, z] apart from the candidate, against the NumPy GRU; the decoder's
    search step still equals its teacher-forced loop."""
    n, d = 4, 3
    layer = BidirectionalGRU(n, layer_norm=True)
    xs, batch, mask = _padded([5, 2, 7], d)
    layer.build(batch.shape)
    randomize(layer)            # gains and biases too: every normalisation matters
    got = layer(batch, mask, separate_loops=separate_loops).numpy()
    fw = tuple(w.numpy() for w in (layer.kernels[0], layer.recurrent_kernels[0], layer.biases[0]))
    bw = tuple(w.numpy() for w in (layer.kernels[1], layer.recurrent_kernels[1], layer.biases[1]))
    for i, x in enumerate(xs):
        want = ref.bidirectional_gru(x, fw, bw, _norms(layer, "forward_", ("input", "recurrent")),
                                     _norms(layer, "backward_", ("input", "recurrent")))
        np.testing.assert_allclose(got[i, :len(x)], want, **TOL)

    cell = ConditionalGRUCell(n, 6, layer_norm=True)
    cell.build((None, d))
    randomize(cell)
    x, s, c = (RNG.normal(size=(2, dim)).astype("float32") for dim in (d, n, 6))
    W, U, C, bias = (w.numpy() for w in (cell.kernel, cell.recurrent_kernel, cell.context_kernel, cell.bias))
    norms = _norms(cell, "", ("input", "recurrent", "context"))
    want = np.stack([ref.gru_step(x[i], s[i], W, U, bias, C, c[i], norms=norms) for i in range(2)])
    np.testing.assert_allclose(cell(x, s, c).numpy(), want, **TOL)

    dec = AttentionDecoder(n, 5, 6, layer_norm=True)
    _, H, mask = _padded([3, 5], 6)
    emb = RNG.normal(size=(2, 4, d)).astype("float32")
    dec.build(emb.shape)
    randomize(dec)
    s0 = RNG.normal(size=(2, n)).astype("float32")
    states = dec(emb, s0, H, mask)[0].numpy()
    keys, score = dec.precompute(tf.constant(H)), score_bias(mask)
    projected = dec.project_annotations(H, np.eye(6, dtype="float32"))
    search_state = dec.search_state(tf.constant(s0))
    for i in range(4):
        s, search_state, _, _ = dec.step(dec.project_inputs(emb[:, i]), search_state, keys, projected, score)
        np.testing.assert_allclose(s.numpy(), states[:, i], **TOL)
