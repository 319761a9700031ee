"""The RNNsearch model: equations end to end, masking, size, and learning."""

import keras
import numpy as np
import pytest
import reference as ref
import tensorflow as tf

from conftest import memorization_batch, memorize, padded
from nmt_tf.config import TrainingConfig
from nmt_tf.models.rnnsearch import RNNSearch
from nmt_tf.training import job as training

RNG = np.random.default_rng(3)


def tiny_model(**kw):
    sizes = dict(embedding_size=5, hidden_size=4, attention_size=6, maxout_size=3)
    sizes.update(kw)
    model = RNNSearch(13, 11, **sizes)
    model.build()
    for w in model.weights:   # large random weights so that every term matters
        w.assign(RNG.normal(0, 0.5, size=w.shape).astype("float32"))
    return model


SOURCES = [[5, 6, 7, 3], [8, 3], [4, 9, 10, 11, 12, 3]]
TARGETS = [[2, 5, 6], [2, 7, 8, 9, 10], [2, 4]]


@pytest.mark.parametrize("encoder_layers,decoder,depth", [(1, "bahdanau", 2), (3, "bahdanau", 2), (1, "cgru", 2),
                                                          (1, "cgru", 4)])
def test_rnnsearch_matches_numpy_reference_per_sentence(encoder_layers, decoder, depth):
    """3 encoder layers: h^(k) = h^(k-1) + BiGRU_k(h^(k-1)) above the first;
    cgru: s'_i = GRU_1(s_{i-1}, E y_{i-1}), attention from s'_i, s_i = GRU_2(s'_i, c_i);
    depth 4: s_i = GRU_4(GRU_3(GRU_2(s'_i, c_i))), GRUs without input."""
    model = tiny_model(encoder_layers=encoder_layers, decoder=decoder, decoder_transition_depth=depth)
    logits, alignment = model({"source_ids": padded(SOURCES), "target_ids": padded(TARGETS)},
                              return_alignment=True)
    w = ref.rnnsearch_weights(model)
    for i, (src, tgt) in enumerate(zip(SOURCES, TARGETS)):
        want_logits, want_alpha = ref.rnnsearch_forward(w, np.array(src), np.array(tgt))
        np.testing.assert_allclose(logits[i, :len(tgt)].numpy(), want_logits, rtol=2e-4, atol=2e-4)
        np.testing.assert_allclose(alignment[i, :len(tgt), :len(src)].numpy(), want_alpha,
                                   rtol=2e-4, atol=1e-5)
        assert np.all(alignment[i, :, len(src):].numpy() == 0.0)


@pytest.mark.parametrize("deep", [False, True])
def test_padding_never_changes_a_result(deep):
    """Each sentence alone gives the same logits as inside a padded batch (also
    with residual encoder layers over padded annotations, layer-normalised)."""
    model = tiny_model(encoder_layers=3, layer_norm=True) if deep else tiny_model()
    batch = model({"source_ids": padded(SOURCES), "target_ids": padded(TARGETS)}).numpy()
    for i, (src, tgt) in enumerate(zip(SOURCES, TARGETS)):
        alone = model({"source_ids": np.array([src], "int32"), "target_ids": np.array([tgt], "int32")})
        np.testing.assert_allclose(batch[i, :len(tgt)], alone[0].numpy(), rtol=1e-5, atol=1e-5)


def test_loss_ignores_padding_labels():
    model = tiny_model()
    x = {"source_ids": padded(SOURCES), "target_ids": padded(TARGETS)}
    labels = padded([t[1:] + [3] for t in TARGETS])
    nll, tokens, sentences = (float(v) for v in model.batch_nll(x, labels))
    assert tokens == sum(len(t) for t in TARGETS) and sentences == 3
    total = 0.0
    for i, (src, tgt) in enumerate(zip(SOURCES, TARGETS)):
        one = {"source_ids": np.array([src], "int32"), "target_ids": np.array([tgt], "int32")}
        total += float(model.batch_nll(one, np.array([tgt[1:] + [3]], "int32"))[0])
    np.testing.assert_allclose(nll, total, rtol=1e-5)


@pytest.mark.parametrize("options", [{}, {"encoder_layers": 2}, {"decoder": "cgru", "layer_norm": True},
                                     {"decoder": "cgru", "decoder_transition_depth": 3, "layer_norm": True}],
                         ids=["paper", "encoder_layers", "cgru", "deep_transition"])
def test_weights_only_checkpoint_holds_every_weight(tmp_path, options):
    """Export and the best-checkpoint copy save the model alone: nothing may be left out."""
    model = tiny_model(**options)
    path = tf.train.Checkpoint(model=model).write(str(tmp_path / "w"))
    saved = [k for k in tf.train.list_variables(path) if k[0].startswith("model/")]
    assert len(saved) == len(model.weights)
    fresh = RNNSearch.from_config(model.get_config())
    fresh.build()
    tf.train.Checkpoint(model=fresh).read(path).assert_consumed()
    for a, b in zip(model.weights, fresh.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)


@pytest.mark.parametrize("transposed", [False, True])
def test_training_gives_its_layers_the_machines_step_products_choice(monkeypatch, transposed):
    """Issue 94: the layers no longer read the CPU while they run; training
    builds them with the choice this machine's kernels make
    (nmt_tf.core.hardware.transposed_step_products), and a model built
    elsewhere (translation, export) multiplies as stored."""
    monkeypatch.setattr(training, "transposed_step_products", lambda: transposed)
    config = TrainingConfig(src_vocab_size=13, tgt_vocab_size=11, embedding_size=5, hidden_size=4, attention_size=6,
                            maxout_size=3, encoder_layers=2, decoder="cgru")
    model = training.build_model(config, 13, 11)
    layers = [*model.encoders, model.decoder]
    assert [layer.transposed_products for layer in layers] == [transposed] * 3
    assert not any(layer.transposed_products for layer in RNNSearch(13, 11, **{
        k: getattr(config, k) for k in ("embedding_size", "hidden_size", "attention_size", "maxout_size")}).encoders)


def test_paper_sized_model_has_80_4_million_parameters():
    config = TrainingConfig(src_vocab_size=30000, tgt_vocab_size=30000)
    lines = []
    total = training.dry_run(config, log=lines.append)
    assert 80.3e6 < total < 80.5e6, total
    text = "\n".join(lines)
    for part, count in [("source embedding", "18,600,000"), ("encoder forward GRU", "4,863,000"),
                        ("decoder GRU", "10,863,000"), ("attention", "3,002,000"),
                        ("maxout readout", "3,621,000"), ("output layer", "15,030,000")]:
        assert any(part in l and count in l for l in lines), (part, text)


@pytest.mark.parametrize("layer_norm", [False, True])
def test_the_cgru_decoder_adds_a_transition_gru_to_the_parameters(layer_norm):
    """The cGRU's GRU_2 reads c_i as its input (W_2 [2n, 3n], the size of the
    paper's C); GRU_1 adds U_1 [n, 3n], b_1 and its W_1 [m, 3n] replaces the
    paper's W: n·3n + 3n more weights (with layer_norm one (gain, bias) pair
    more: four terms instead of three). The groups of --dry_run add up."""
    paper, cgru = (tiny_model(decoder=decoder, layer_norm=layer_norm) for decoder in ("bahdanau", "cgru"))
    n = 4
    assert cgru.count_params() - paper.count_params() == n * 3 * n + 3 * n + layer_norm * 2 * 3 * n
    groups = cgru.parameter_groups()
    assert "decoder GRU" not in groups and sum(groups.values()) == cgru.count_params()
    assert groups["decoder GRU 2 (context)"] == 2 * n * 3 * n + n * 3 * n + 3 * n + layer_norm * 4 * 3 * n
    assert cgru.search_state_size == 3 * n and paper.search_state_size == 3 * n + 6


@pytest.mark.parametrize("layer_norm", [False, True])
def test_a_deep_transition_adds_gru_without_input_to_the_parameters(layer_norm):
    """Each GRU_k, k > 2, has U_k [n, 3n] and b_k (with layer_norm the h-terms'
    gain and bias; no W, no x-terms' norm); --dry_run lists each; the search
    state stays [s ; U_1rz s]."""
    cgru, deep = (tiny_model(decoder="cgru", decoder_transition_depth=d, layer_norm=layer_norm) for d in (2, 4))
    n = 4
    one = n * 3 * n + 3 * n + layer_norm * 2 * 3 * n
    assert deep.count_params() - cgru.count_params() == 2 * one
    groups = deep.parameter_groups()
    assert groups["decoder GRU 3 (deep transition)"] == groups["decoder GRU 4 (deep transition)"] == one
    assert sum(groups.values()) == deep.count_params()
    assert deep.search_state_size == cgru.search_state_size == 3 * n


def test_initialisation_follows_appendix_b1():
    keras.utils.set_random_seed(0)
    model = RNNSearch(500, 500, embedding_size=64, hidden_size=64, attention_size=64, maxout_size=32)
    model.build()
    std = lambda w: float(np.std(w.numpy()))
    assert abs(std(model.source_embedding.embeddings) - 0.01) < 0.001
    assert abs(std(model.decoder.attention.key_kernel) - 0.001) < 0.0002
    assert abs(std(model.decoder.attention.query_kernel) - 0.001) < 0.0002
    assert not np.any(model.decoder.attention.score_vector.numpy())
    assert not np.any(model.decoder.cell.bias.numpy())
    u = model.encoder.recurrent_kernels[0].numpy()[:, :64]
    np.testing.assert_allclose(u.T @ u, np.eye(64), atol=1e-4)


def test_tiny_model_overfits_20_pairs():
    """20 random pairs, memorized: the per-token NLL falls close to zero."""
    keras.utils.set_random_seed(1)
    x, y = memorization_batch(RNG)
    model = RNNSearch(30, 30, embedding_size=32, hidden_size=48, attention_size=32, maxout_size=32)
    nll_per_token = memorize(model, x, y, updates=300)
    assert nll_per_token < 0.05, nll_per_token
    # Every real target token is the model's first choice given the reference prefix.
    predicted = np.argmax(model(x).numpy(), axis=-1)
    np.testing.assert_array_equal(predicted[y > 0], y[y > 0])


def test_mixed_bfloat16_forward_close_to_float32():
    model = tiny_model()
    x = {"source_ids": padded(SOURCES), "target_ids": padded(TARGETS)}
    want = model(x).numpy()
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    try:
        bf16 = RNNSearch.from_config(model.get_config())
        bf16.build()
        bf16.set_weights(model.get_weights())
        got = bf16(x)
        assert got.dtype == tf.float32
        assert bf16.encoder.compute_dtype == "bfloat16"
        np.testing.assert_allclose(got.numpy(), want, rtol=0.1, atol=0.15)
    finally:
        keras.mixed_precision.set_dtype_policy("float32")


@pytest.mark.parametrize("layer_norm", [False, True])
def test_a_bfloat16_search_scores_its_attention_in_float32(layer_norm):
    """Search passes float32 keys, so a bfloat16 model's beam step computes
    the tanh of the attention scores in float32 (bfloat16 tanh is slow on
    CPU), and float32 layer-norm weights, so that it normalises in float32;
    its log-probabilities stay close to the float32 model's."""
    from nmt_tf.core.precision import dtype_policy

    model = tiny_model(layer_norm=layer_norm)
    with dtype_policy("mixed_bfloat16"):
        bf16 = RNNSearch(13, 11, embedding_size=5, hidden_size=4, attention_size=6, maxout_size=3,
                         layer_norm=layer_norm)
    bf16.build()
    bf16.set_weights(model.get_weights())
    sources = padded(SOURCES)
    outputs = []
    for m in (model, bf16):
        weights = m.step_weights()
        norms = weights["decoder"]["cell"]
        assert ("context_norm" in norms) == layer_norm
        assert all(w.dtype == tf.float32 for key, pair in norms.items() if key.endswith("_norm") for w in pair)
        assert bf16.decoder.step_weights()["cell"].get("context_norm", [tf.zeros([], tf.bfloat16)])[0].dtype == \
            tf.bfloat16                                     # training's own stay in the compute dtype
        inputs = m.search_inputs(tf.constant(sources), weights)
        state = inputs.pop("state")[:, None]
        assert inputs["keys"].dtype == tf.float32
        outputs.append(m.decode_step(tf.fill([len(SOURCES), 1], 2), state, inputs, weights))
    # An export's per-token products (freeze_step_weights) normalise as the step does.
    embeddings = tf.cast(bf16.target_embedding.embeddings, tf.bfloat16)
    np.testing.assert_array_equal(
        tf.cast(bf16.token_products()["input"], tf.float32).numpy(),
        tf.cast(bf16.decoder.project_inputs(embeddings, bf16.step_weights()["decoder"]), tf.float32).numpy())
    assert bf16.compute_dtype == "bfloat16" and outputs[1][0].dtype == tf.float32
    np.testing.assert_allclose(outputs[1][0].numpy(), outputs[0][0].numpy(), rtol=0.1, atol=0.15)
    np.testing.assert_allclose(outputs[1][2].numpy(), outputs[0][2].numpy(), atol=0.05)


def test_search_step_log_probs_in_output_blocks_equal_one_output_layer():
    """Search's output layer, in column blocks, gives the softmax of the whole
    layer; the blocks tile the vocabulary."""
    from nmt_tf.models.search_step import OUTPUT_BLOCKS, output_block_bounds

    for vocab in (1, 3, 11, 10_000):
        bounds = output_block_bounds(vocab)
        assert len(bounds) == min(OUTPUT_BLOCKS, vocab)
        assert [a for a, _ in bounds[1:]] == [b for _, b in bounds[:-1]] and bounds[0][0] == 0
        assert bounds[-1][1] == vocab and all(b > a for a, b in bounds)
    model = tiny_model()
    weights = model.step_weights()
    state, embedded, context = (RNG.normal(size=(7, d)).astype("float32") for d in (4, 5, 6))
    # Search's readout terms are in the readout's search layout (maxout pairs
    # (2k, 2k + 1) at (k, l + k)); the reference below is in the paper's.
    got = model.step_log_probs(state, model.readout.embedding_term(embedded, weights["readout"]),
                               model.readout.search_layout(context), weights).numpy()
    ro = model.readout
    pre = state @ ro.state_kernel.numpy() + embedded @ ro.embedding_kernel.numpy() + context + ro.bias.numpy()
    logits = pre.reshape(7, 3, 2).max(-1) @ model.output_projection.kernel.numpy() + \
        model.output_projection.bias.numpy()
    np.testing.assert_allclose(got, logits - np.log(np.exp(logits).sum(-1, keepdims=True)), rtol=1e-5, atol=1e-5)


def test_tied_embeddings_hold_one_variable_and_follow_the_equations():
    """--tied_embeddings=target: W_o is E_y^T, one [K_y, m] variable; =all: the
    source embeddings are that variable too. Both still match the NumPy model."""
    untied = tiny_model(maxout_size=5)
    n_untied = untied.count_params()
    for tied in ("target", "all"):
        model = RNNSearch(11, 11, embedding_size=5, hidden_size=4, attention_size=6, maxout_size=5,
                          tied_embeddings=tied)
        model.build()
        for w in model.weights:
            w.assign(RNG.normal(0, 0.5, size=w.shape).astype("float32"))
        embedding_like = [w for w in model.weights if tuple(w.shape) == (11, 5)]
        assert len(embedding_like) == (2 if tied == "target" else 1), [w.path for w in model.weights]
        assert len({id(w) for w in model.weights}) == len(model.weights)
        assert not hasattr(model, "output_projection")
        # Untied: 13 x 5 source embeddings and a 5 x 11 output matrix; tied: 11 source words
        # ("all": none of their own) and no output matrix.
        assert model.count_params() == n_untied - 13 * 5 + 11 * 5 * (tied == "target") - 5 * 11, tied
        assert sum(model.parameter_groups().values()) == model.count_params()
        src = [[5, 6, 7, 3], [8, 3], [4, 9, 10, 3]]
        logits = model({"source_ids": padded(src), "target_ids": padded(TARGETS)}).numpy()
        w = ref.rnnsearch_weights(model)
        np.testing.assert_array_equal(w["Wo"], w["tgt_emb"].T)
        for i, (s, t) in enumerate(zip(src, TARGETS)):
            want, _ = ref.rnnsearch_forward(w, np.array(s), np.array(t))
            np.testing.assert_allclose(logits[i, :len(t)], want, rtol=2e-4, atol=2e-4)
    with np.testing.assert_raises(ValueError):
        RNNSearch(13, 11, embedding_size=5, hidden_size=4, attention_size=6, maxout_size=3, tied_embeddings="target")


def test_label_smoothing_loss_is_the_smoothed_cross_entropy():
    from nmt_tf.models.training_step import smoothed_token_loss, token_nll

    logits = RNG.normal(0, 2, size=(2, 3, 7)).astype("float32")
    labels = np.array([[4, 2, 0], [6, 3, 5]], "int32")                   # one padding position
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    for eps in (0.0, 0.1, 0.3):
        want = -(1 - eps) * np.take_along_axis(log_p, labels[..., None], -1)[..., 0] - eps * log_p.mean(-1)
        want[0, 2] = 0.0
        np.testing.assert_allclose(smoothed_token_loss(labels, logits, eps).numpy(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(smoothed_token_loss(labels, logits, 0.0).numpy(),
                               token_nll(labels, logits)[0].numpy(), rtol=1e-5, atol=1e-6)
    # The written-out gradient is automatic differentiation's of the same formula.
    from nmt_tf.models.training_step import smoothed_token_losses
    logits_t = tf.constant(logits)
    d_nll, d_loss = (tf.constant(RNG.normal(size=labels.shape).astype("float32")) for _ in range(2))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(logits_t)
        nll, loss = smoothed_token_losses(labels, logits_t, 0.1)
        lse = tf.reduce_logsumexp(logits_t, -1)
        label_logit = tf.gather(logits_t, labels, batch_dims=2)
        mask = tf.cast(labels != 0, tf.float32)
        want_nll = (lse - label_logit) * mask
        want_loss = want_nll + 0.1 * (label_logit - tf.reduce_mean(logits_t, -1)) * mask
        got, want = (tf.reduce_sum(a * d_nll) + tf.reduce_sum(b * d_loss) for a, b in
                     ((nll, loss), (want_nll, want_loss)))
        loss_only, want_loss_only = tf.reduce_sum(loss), tf.reduce_sum(want_loss)    # nll unconnected
        nll_only, want_nll_only = tf.reduce_sum(nll), tf.reduce_sum(want_nll)        # loss unconnected
    for a, b in ((got, want), (loss_only, want_loss_only), (nll_only, want_nll_only)):
        np.testing.assert_allclose(tape.gradient(a, logits_t).numpy(), tape.gradient(b, logits_t).numpy(),
                                   rtol=1e-5, atol=1e-6)
    # Training optimises the smoothed loss; reported NLL stays plain.
    model = tiny_model()
    model.label_smoothing = 0.2
    x = {"source_ids": padded(SOURCES), "target_ids": padded(TARGETS)}
    y = padded([t[1:] + [3] for t in TARGETS])
    nll, tokens, _, smoothed = model.batch_nll(x, y, return_loss=True)
    # (The NLL comes from the smoothed loss's log-sum-exp here, from a softmax
    # cross-entropy without smoothing: the same value to float32 rounding.)
    assert float(nll) == pytest.approx(float(model.batch_nll(x, y)[0]), rel=1e-6)
    assert float(smoothed) == pytest.approx(float(tf.reduce_sum(smoothed_token_loss(y, model(x), 0.2))), rel=1e-6)
    assert float(smoothed) != pytest.approx(float(nll), rel=1e-4)


def test_rdrop_loss_is_the_papers_objective_halved():
    """R-drop: in training the batch runs twice in one pass with masks of its
    own per copy; the loss is the copies' mean smoothed cross-entropy plus
    alpha / 4 x their symmetric KL per token, from the logits the model made;
    NLL, tokens and sentences count each pair once; evaluation runs it once."""
    from nmt_tf.models.training_step import symmetric_kl

    a, b = RNG.normal(0, 2, size=(2, 4, 7)).astype("float32")
    p, q = (np.exp(v) / np.exp(v).sum(-1, keepdims=True) for v in (a, b))
    want = (p * np.log(p / q)).sum(-1) + (q * np.log(q / p)).sum(-1)
    np.testing.assert_allclose(symmetric_kl(a, b).numpy(), want, rtol=1e-5, atol=1e-6)

    model = tiny_model(dropout=0.3, recurrent_dropout=0.3, label_smoothing=0.1, rdrop_alpha=5.0)
    x = {"source_ids": padded(SOURCES), "target_ids": padded(TARGETS)}
    labels = [t[1:] + [3] for t in TARGETS]
    y = padded(labels)
    seen = []
    call = model.call
    model.call = lambda *args, **kw: seen.append(call(*args, **kw)) or seen[-1]
    nll, tokens, sentences, loss = (float(v) for v in model.batch_nll(x, y, training=True, return_loss=True))
    logits = seen[-1].numpy()
    n = sum(map(len, labels))
    assert logits.shape == (2 * n, 11) and (tokens, sentences) == (n, 3)
    first, second = logits[:n], logits[n:]
    assert not np.allclose(first, second, atol=1e-3)          # each copy its own dropout masks
    ids = np.concatenate(labels)
    log_p = [v - np.log(np.exp(v).sum(-1, keepdims=True)) for v in (first, second)]
    nlls = [-np.take_along_axis(lp, ids[:, None], -1)[:, 0] for lp in log_p]
    smoothed = [0.9 * v - 0.1 * lp.mean(-1) for v, lp in zip(nlls, log_p)]
    kl = symmetric_kl(first, second).numpy()
    assert nll == pytest.approx((nlls[0].sum() + nlls[1].sum()) / 2, rel=1e-5)
    assert loss == pytest.approx((smoothed[0].sum() + smoothed[1].sum()) / 2 + 5.0 / 4 * kl.sum(), rel=1e-5)
    assert kl.sum() > 0.01
    # Evaluation and batch_nll without the training loss: one copy.
    assert model.batch_nll(x, y, training=True)[1] == n and seen[-1].shape[0] == n
    assert model.batch_nll(x, y, return_loss=True)[1] == n and seen[-1].shape[0] == n
    # Without dropout the two copies agree and R-drop adds nothing to the loss or its gradient.
    plain = tiny_model(label_smoothing=0.1)
    twice = tiny_model(label_smoothing=0.1, rdrop_alpha=5.0)
    for w, v in zip(twice.weights, plain.weights):
        w.assign(v)
    results = []
    for model in (plain, twice):
        with tf.GradientTape() as tape:
            nll, tokens, _, loss = model.batch_nll(x, y, training=True, return_loss=True)
        results.append((nll, tokens, loss, tape.gradient(loss, model.trainable_variables)))
    for got, want in zip(results[1][:3], results[0][:3]):
        assert float(got) == pytest.approx(float(want), rel=1e-5)
    for got, want in zip(results[1][3], results[0][3]):
        np.testing.assert_allclose(tf.convert_to_tensor(got).numpy(), tf.convert_to_tensor(want).numpy(),
                                   rtol=1e-4, atol=1e-6)


def test_rdrop_training_makes_dropout_passes_agree():
    """Trained through Keras' fit and the train step, R-drop does what it is for:
    two passes with different dropout masks disagree several times less than
    after the same training without it, while the batch is still learned
    (memorize's NLL per token starts near log 30 = 3.4)."""
    from nmt_tf.models.training_step import symmetric_kl

    def disagreement(model, x, y):
        positions = tf.where(y != 0)
        return np.mean([float(tf.reduce_mean(symmetric_kl(model(x, training=True, positions=positions),
                                                         model(x, training=True, positions=positions))))
                        for _ in range(5)])

    results = {}
    for alpha in (0.0, 5.0):
        keras.utils.set_random_seed(1)
        x, y = memorization_batch(np.random.default_rng(5), pairs=8)
        model = RNNSearch(30, 30, embedding_size=16, hidden_size=16, attention_size=16, maxout_size=8,
                          dropout=0.2, rdrop_alpha=alpha)
        results[alpha] = memorize(model, x, y, updates=150), disagreement(model, x, y)
    (plain_nll, plain_kl), (rdrop_nll, rdrop_kl) = results[0.0], results[5.0]
    assert rdrop_kl < plain_kl / 2.5, results          # measured: 0.27 against 1.31
    assert plain_nll < rdrop_nll < 2.0, results        # measured: 0.40 and 1.33


def test_annotation_dropout_acts_only_in_training():
    model = tiny_model()
    dropped = RNNSearch.from_config({**model.get_config(), "annotation_dropout": 0.5})
    dropped.build()
    dropped.set_weights(model.get_weights())
    x = {"source_ids": padded(SOURCES), "target_ids": padded(TARGETS)}
    np.testing.assert_allclose(dropped(x).numpy(), model(x).numpy(), rtol=1e-6)
    assert np.abs(dropped(x, training=True).numpy() - model(x).numpy()).max() > 1e-3


@pytest.mark.parametrize("side", ["source", "target"])
def test_word_dropout_zeroes_whole_embeddings_in_training_only(side):
    """--source_word_dropout / --target_word_dropout: in training each token's
    embedding vector is either zero or the whole vector scaled by 1 / (1 - p);
    outside training the embeddings are untouched, and the setting survives
    get_config."""
    model = tiny_model(embedding_size=64, **{f"{side}_word_dropout": 0.5})
    assert RNNSearch.from_config(model.get_config()).get_config()[f"{side}_word_dropout"] == 0.5
    ids = tf.constant(RNG.integers(4, 11, size=(8, 25)), tf.int32)
    embed, table = ((model.embed_source, model.source_embedding) if side == "source"
                    else (model.embed_target, model.target_embedding))
    plain = table(ids).numpy()
    np.testing.assert_array_equal(embed(ids).numpy(), plain)
    dropped = embed(ids, training=True).numpy()
    zero = np.all(dropped == 0, axis=-1)
    np.testing.assert_allclose(dropped[~zero], plain[~zero] / 0.5, rtol=1e-6)
    assert 0.3 < zero.mean() < 0.7           # 200 draws of p = 0.5
    other = model.embed_target if side == "source" else model.embed_source
    np.testing.assert_array_equal(other(ids, training=True).numpy(),
                                  (model.target_embedding if side == "source" else model.source_embedding)(ids))


@pytest.mark.parametrize("options", [{"encoder_layers": 2}, {"decoder": "cgru", "layer_norm": True}],
                         ids=["encoder_layers", "cgru"])
def test_scale_dropout_reaches_every_dropout_rate(options):
    """--early_dropout_epochs: scale_dropout(0) leaves no dropout anywhere, so
    training logits equal inference logits; scale_dropout(f) sets each rate
    to f times its own, and 1 restores them (get_config keeps them all)."""
    rates = dict(dropout=0.4, annotation_dropout=0.5, recurrent_dropout=0.2, source_word_dropout=0.1,
                 target_word_dropout=0.3)
    model = tiny_model(**rates, **options)
    x = {"source_ids": padded(SOURCES), "target_ids": padded(TARGETS)}
    plain = model(x).numpy()
    assert np.abs(model(x, training=True).numpy() - plain).max() > 1e-3
    model.scale_dropout(0.0)
    np.testing.assert_allclose(model(x, training=True).numpy(), plain, rtol=1e-6, atol=1e-6)
    model.scale_dropout(0.5)
    recurrent = lambda: [layer.recurrent_dropout for layer in model._flatten_layers(include_self=False)
                         if hasattr(layer, "recurrent_dropout")]
    assert recurrent() == [0.1] * (options.get("encoder_layers", 1) + 1)      # each encoder layer's, the decoder's
    assert [model.embedding_dropout.rate, model.readout_dropout.rate, model.annotation_dropout.rate,
            model.source_word_dropout.rate, model.target_word_dropout.rate] == [0.2, 0.2, 0.25, 0.05, 0.15]
    model.scale_dropout(1.0)
    assert model.target_word_dropout.rate == 0.3 and recurrent() == [0.2] * (options.get("encoder_layers", 1) + 1)
    assert {name: model.get_config()[name] for name in rates} == rates
    assert np.abs(model(x, training=True).numpy() - plain).max() > 1e-3


def test_loss_at_real_tokens_equals_the_masked_loss_over_all_positions():
    """batch_nll computes the output layer at real target tokens only; the sum
    and its gradient are those of the per-position losses masked afterwards."""
    from nmt_tf.models.training_step import token_nll

    model = tiny_model(layer_norm=True)
    x = {"source_ids": padded(SOURCES), "target_ids": padded(TARGETS)}
    y = padded([t[1:] + [3] for t in TARGETS])
    with tf.GradientTape(persistent=True) as tape:
        packed = model.batch_nll(x, y, training=True)[0]
        masked = tf.reduce_sum(token_nll(y, model(x, training=True))[0])
    np.testing.assert_allclose(float(packed), float(masked), rtol=1e-6)
    for got, want in zip(tape.gradient(packed, model.trainable_variables),
                         tape.gradient(masked, model.trainable_variables)):
        np.testing.assert_allclose(tf.convert_to_tensor(got).numpy(), tf.convert_to_tensor(want).numpy(),
                                   rtol=1e-4, atol=1e-6)


def test_token_losses_gradient_and_no_underflow():
    """The NLL's written-out gradient is softmax - one-hot, and a label far
    below the row's largest logit still gets its exact NLL (a log of its
    underflowed probability would be inf)."""
    from nmt_tf.models.training_step import token_losses

    rng = np.random.default_rng(11)
    logits = tf.constant(rng.normal(0, 2, size=(4, 7)).astype("float32"))
    labels = tf.constant([1, 0, 6, 3])
    d_nll = tf.constant(rng.normal(size=4).astype("float32"))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(logits)
        nll = token_losses(labels, logits)
        want_nll = tf.reduce_logsumexp(logits, -1) - tf.gather(logits, labels, batch_dims=1)
        got, want = tf.reduce_sum(nll * d_nll), tf.reduce_sum(want_nll * d_nll)
    np.testing.assert_allclose(nll.numpy(), want_nll.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tape.gradient(got, logits).numpy(), tape.gradient(want, logits).numpy(),
                               rtol=1e-5, atol=1e-6)
    far = tf.constant([[200.0, 0.0, -300.0]])
    np.testing.assert_allclose(token_losses(tf.constant([2]), far).numpy(), [500.0], rtol=1e-6)


@pytest.mark.parametrize("layer_norm,decoder,transposed", [(False, "bahdanau", False), (True, "bahdanau", False),
                                                            (True, "cgru", False), (True, "cgru", True)])
def test_projected_annotations_gradient_after_the_loop_is_autodiffs(layer_norm, decoder, transposed):
    """In training, the decoder takes the gradient of C h_j after its loop,
    from all steps' alpha_i and d(C c_i) (nmt_tf.layers.ops.AfterLoopGradient;
    the cGRU's W_2 h_j likewise), and with `transposed` multiplies its states
    by stored transposes (`StepKernel`, every state product of both cGRU
    GRUs); outside training the loop is differentiated as it is. Without
    dropout the two compute the same loss, and every gradient must agree too,
    traced as model.fit traces the step and eagerly (to 1e-3 with the
    transposes, whose products round in another order: 2e-4 was seen)."""
    model = tiny_model(layer_norm=layer_norm, decoder=decoder, transposed_products=transposed)
    x = {"source_ids": padded(SOURCES), "target_ids": padded(TARGETS)}
    y = padded([t[1:] + [3] for t in TARGETS])

    def loss_and_gradients(training):
        with tf.GradientTape() as tape:
            loss = model.batch_nll(x, y, training=training)[0]
        return loss, tape.gradient(loss, model.trainable_variables)

    for run in (loss_and_gradients, tf.function(loss_and_gradients)):
        (plain, plain_grads), (after, after_grads) = run(False), run(True)
        np.testing.assert_allclose(float(after), float(plain), rtol=1e-6)
        for variable, got, want in zip(model.trainable_variables, after_grads, plain_grads):
            np.testing.assert_allclose(tf.convert_to_tensor(got).numpy(), tf.convert_to_tensor(want).numpy(),
                                       rtol=1e-3 if transposed else 1e-4, atol=1e-6, err_msg=variable.path)


def test_after_loop_gradient_needs_the_left_operands():
    """An AfterLoopGradient whose caller forgot set_left_operands fails by name
    when the gradient is taken, instead of returning a wrong one."""
    from nmt_tf.layers.ops import AfterLoopGradient

    m = tf.constant([[1.0, 2.0]])
    with tf.GradientTape() as tape:
        tape.watch(m)
        taps = AfterLoopGradient(m, [3, 2], lambda a, d: tf.matmul(a, d, transpose_a=True)).taps
        loss = tf.reduce_sum(taps)
    with pytest.raises(ValueError, match="set_left_operands"):
        tape.gradient(loss, m)


@pytest.mark.parametrize("model_type", ["rnnsearch", "rnnencdec"])
def test_transposed_step_products_change_no_gradient(model_type):
    """Training's loops may multiply by stored transposes of their step
    matrices (nmt_tf.layers.ops.StepKernel, chosen by the CPU's kernels):
    the loss and every gradient are those of the plain products."""
    from nmt_tf.models.rnnencdec import RNNEncDec

    def make(transposed):
        if model_type == "rnnsearch":
            return tiny_model(layer_norm=True, transposed_products=transposed)
        model = RNNEncDec(13, 11, embedding_size=5, hidden_size=4, maxout_size=3, transposed_products=transposed)
        model.build()
        for w in model.weights:   # large random weights, as tiny_model's
            w.assign(RNG.normal(0, 0.5, size=w.shape).astype("float32"))
        return model

    x = {"source_ids": padded(SOURCES), "target_ids": padded(TARGETS)}
    y = padded([t[1:] + [3] for t in TARGETS])
    results = []
    plain = make(False)
    for transposed in (False, True):
        model = make(True) if transposed else plain
        if transposed:              # the same weights, multiplied by their stored transposes
            for w, v in zip(model.weights, plain.weights):
                w.assign(v)
        with tf.GradientTape() as tape:
            loss = model.batch_nll(x, y, training=True)[0]
        results.append((loss, tape.gradient(loss, model.trainable_variables)))
    (plain, plain_grads), (transposed, transposed_grads) = results
    np.testing.assert_allclose(float(transposed), float(plain), rtol=1e-6)
    for got, want in zip(transposed_grads, plain_grads):
        np.testing.assert_allclose(tf.convert_to_tensor(got).numpy(), tf.convert_to_tensor(want).numpy(),
                                   rtol=1e-4, atol=1e-6)


def test_freezing_the_encoder_freezes_every_encoder_layer():
    from nmt_tf.training import fine_tune

    model = tiny_model(encoder_layers=3)
    names = fine_tune.freeze(model, ["encoder"])
    assert names == ["encoder", "encoder_2", "encoder_3"]
    encoder_weights = {id(w) for layer in model.encoders for w in layer.weights}
    assert len(encoder_weights) == len(model.weights) - len(model.trainable_weights) > 0
    assert not encoder_weights & {id(w) for w in model.trainable_weights}
