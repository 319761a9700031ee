"""Greedy and beam search: agreement with each other, with exhaustive search,
and with forced decoding; length limits, [UNK] suppression, alignments."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from nmt_tf.data.text import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from nmt_tf.inference.search import (
    NEG,
    SearchOptions,
    _best_extensions,
    _block_size,
    _token_penalties,
    beam_search,
    greedy_search,
    search,
)
from nmt_tf.layers.ops import frozen_values
from nmt_tf.models.rnnsearch import RNNSearch

RNG = np.random.default_rng(11)


def model_with_random_weights(target_vocab=12, scale=0.8, seed=0, **options):
    """A tiny RNNsearch with N(0, scale^2) weights; `options`: layer_norm, tied_embeddings, ..."""
    rng = np.random.default_rng(seed)
    maxout = 6 if options.get("tied_embeddings", "none") != "none" else 4
    model = RNNSearch(10 if options.get("tied_embeddings") != "all" else target_vocab, target_vocab,
                      embedding_size=6, hidden_size=5, attention_size=7, maxout_size=maxout, **options)
    model.build()
    for w in model.weights:
        w.assign(rng.normal(0, scale, size=w.shape).astype("float32"))
    return model


SOURCES = np.array([[5, 6, 7, 3, 0], [8, 3, 0, 0, 0], [4, 9, 5, 6, 3]], "int32")


def forced_log_prob(model, source, tokens):
    """log p(tokens | source) by teacher forcing (tokens end with [EOS])."""
    x = {"source_ids": np.array([source], "int32"), "target_ids": np.array([[BOS_ID] + tokens[:-1]], "int32")}
    return float(tf.reduce_sum(model.target_log_probs(x, np.array([tokens], "int32"))))


def strip(tokens):
    return [int(t) for t in tokens if t != PAD_ID]


def test_beam_of_one_equals_greedy():
    model = model_with_random_weights()
    options = SearchOptions(beam_size=1, min_length_ratio=0.0)
    greedy = greedy_search(model, SOURCES, options)
    beam = beam_search(model, SOURCES, options)
    for i in range(len(SOURCES)):
        assert strip(beam["tokens"][i, 0].numpy()) == strip(greedy["tokens"][i].numpy())
    np.testing.assert_allclose(beam["log_probs"][:, 0].numpy(), greedy["log_probs"].numpy(), rtol=1e-5)
    np.testing.assert_array_equal(beam["lengths"][:, 0].numpy(), greedy["lengths"].numpy())
    np.testing.assert_allclose(beam["alignments"][:, 0].numpy(), greedy["alignments"].numpy(), atol=1e-6)


@pytest.mark.parametrize("suppress_unk", [False, True])
def test_wide_beam_finds_the_exhaustive_best(suppress_unk):
    """Tiny vocabulary, length <= 4: a beam wider than every hypothesis set is exact."""
    model = model_with_random_weights(target_vocab=6, scale=1.5, seed=4)   # words: [UNK], 4, 5
    words = [4, 5] if suppress_unk else [UNK_ID, 4, 5]
    options = SearchOptions(beam_size=64, n_best=5, max_length=4, min_length_ratio=0.0,
                            suppress_unk=suppress_unk)
    out = beam_search(model, SOURCES, options)
    for i, source in enumerate(SOURCES):
        candidates = []
        for n in range(0, 4):      # n words, then [EOS]; the 4th position can only be [EOS]
            for seq in itertools.product(words, repeat=n):
                tokens = list(seq) + [EOS_ID]
                lp = forced_log_prob(model, source, tokens)
                candidates.append((lp / len(tokens), lp, tokens))
        candidates.sort(key=lambda c: -c[0])
        for rank in range(5):
            assert strip(out["tokens"][i, rank].numpy()) == candidates[rank][2], (i, rank)
            assert out["scores"][i, rank].numpy() == pytest.approx(candidates[rank][0], rel=1e-4, abs=1e-5)
            assert out["log_probs"][i, rank].numpy() == pytest.approx(candidates[rank][1], rel=1e-4, abs=1e-5)


@pytest.mark.parametrize("options", [{}, {"layer_norm": True}, {"tied_embeddings": "target"},
                                     {"encoder_layers": 2}, {"decoder": "cgru", "layer_norm": True},
                                     {"decoder": "cgru", "decoder_transition_depth": 3, "layer_norm": True}],
                         ids=["paper", "layer_norm", "tied", "encoder_layers", "cgru", "deep_transition"])
def test_paper_beam_of_10_scores_match_forced_decoding_and_are_sorted(options):
    """Search's own step (fused, sliced, projected matrices) computes the
    teacher-forced model's probabilities, also with the recipe options."""
    model = model_with_random_weights(**options)
    out = beam_search(model, SOURCES, SearchOptions(beam_size=10, n_best=10))
    scores = out["scores"].numpy()
    assert np.all(np.diff(scores, axis=1) <= 1e-6)                      # best first
    for i, source in enumerate(SOURCES):
        for rank in range(10):
            if scores[i, rank] <= NEG / 2:
                continue
            tokens = strip(out["tokens"][i, rank].numpy())
            assert tokens[-1] == EOS_ID and EOS_ID not in tokens[:-1]
            assert len(tokens) == out["lengths"][i, rank]
            lp = forced_log_prob(model, source, tokens)
            assert out["log_probs"][i, rank].numpy() == pytest.approx(lp, rel=1e-4, abs=1e-4)
            assert scores[i, rank] == pytest.approx(lp / len(tokens), rel=1e-4, abs=1e-4)


def test_length_limits_and_unk_suppression():
    model = model_with_random_weights()
    src_len = (SOURCES != PAD_ID).sum(1)
    options = SearchOptions(beam_size=5, n_best=5, max_length_ratio=1.5, min_length_ratio=1.0,
                            suppress_unk=True)
    out = beam_search(model, SOURCES, options)
    lengths, tokens = out["lengths"].numpy(), out["tokens"].numpy()
    for i in range(len(SOURCES)):
        found = lengths[i] > 0
        assert np.all(lengths[i][found] <= np.ceil(1.5 * src_len[i]))
        assert np.all(lengths[i][found] > src_len[i])                     # EOS not before the source length
        assert UNK_ID not in tokens[i]
        assert BOS_ID not in tokens[i]


def test_gnmt_length_penalty_and_raw_log_probability():
    model = model_with_random_weights()
    out = beam_search(model, SOURCES, SearchOptions(beam_size=4, n_best=4, length_penalty="gnmt", length_alpha=0.6))
    lengths = out["lengths"].numpy().astype("float32")
    found = lengths > 0
    np.testing.assert_allclose(out["scores"].numpy()[found],
                               (out["log_probs"].numpy() / ((5 + lengths) / 6) ** 0.6)[found], rtol=1e-5)
    raw = beam_search(model, SOURCES, SearchOptions(beam_size=4, n_best=4, length_alpha=0.0))
    np.testing.assert_allclose(raw["scores"].numpy(), raw["log_probs"].numpy(), rtol=1e-6)


def test_alignments_are_distributions_over_the_real_source():
    model = model_with_random_weights()
    out = beam_search(model, SOURCES, SearchOptions(beam_size=3, n_best=3))
    align, lengths = out["alignments"].numpy(), out["lengths"].numpy()
    src_len = (SOURCES != PAD_ID).sum(1)
    for i in range(len(SOURCES)):
        for r in range(3):
            n = lengths[i, r]
            np.testing.assert_allclose(align[i, r, :n].sum(-1), 1.0, rtol=1e-5)
            assert np.all(align[i, r, :n, src_len[i]:] == 0.0)
            assert np.all(align[i, r, n:] == 0.0)


def test_graph_mode_equals_eager_and_empty_batch_works():
    model = model_with_random_weights()
    options = SearchOptions(beam_size=4, n_best=2)
    compiled = tf.function(lambda s: search(model, s, options),
                           input_signature=[tf.TensorSpec([None, None], tf.int32)])
    eager = search(model, SOURCES, options)
    graph = compiled(tf.constant(SOURCES))
    for key in ("tokens", "lengths"):
        np.testing.assert_array_equal(eager[key].numpy(), graph[key].numpy())
    np.testing.assert_allclose(eager["scores"].numpy(), graph["scores"].numpy(), rtol=1e-5)
    empty = compiled(tf.zeros([0, 1], tf.int32))
    assert empty["tokens"].shape[:2] == (0, 2) and empty["scores"].shape == (0, 2)
    greedy_empty = tf.function(lambda s: search(model, s, SearchOptions(beam_size=1)))(tf.zeros([0, 1], tf.int32))
    assert greedy_empty["tokens"].shape[0] == 0


PREFIXES = np.array([[4, 5, 0], [0, 0, 0], [UNK_ID, 6, 7]], "int32")     # sentence 1: no prefix


@pytest.mark.parametrize("beam_size", [1, 4])
def test_a_target_prefix_starts_every_hypothesis_and_the_search_is_free_after_it(beam_size):
    """The prefix is forced (also [UNK] under suppress_unk, and past the
    source's length limit); scores are the whole output's forced-decoding
    log-probabilities; a sentence without a prefix is searched as without."""
    model = model_with_random_weights()
    options = SearchOptions(beam_size=beam_size, n_best=beam_size, max_length_ratio=0.5, suppress_unk=True)
    out = search(model, SOURCES, options, target_prefix=PREFIXES)
    free = search(model, SOURCES, options)
    for i, source in enumerate(SOURCES):
        prefix = strip(PREFIXES[i])
        for rank in range(beam_size):
            if out["scores"][i, rank] <= NEG / 2:
                continue
            tokens = strip(out["tokens"][i, rank].numpy())
            assert tokens[:len(prefix)] == prefix and tokens[-1] == EOS_ID
            assert len(tokens) <= max(np.ceil(0.5 * (source != PAD_ID).sum()), len(prefix) + 1)
            assert out["log_probs"][i, rank].numpy() == pytest.approx(forced_log_prob(model, source, tokens),
                                                                       rel=1e-4, abs=1e-4)
            assert UNK_ID not in tokens[len(prefix):]
    assert strip(out["tokens"][1, 0].numpy()) == strip(free["tokens"][1, 0].numpy())
    assert out["scores"][1, 0].numpy() == pytest.approx(free["scores"][1, 0].numpy(), rel=1e-6)


def test_a_prefixed_beam_finds_the_exhaustive_best_continuation():
    model = model_with_random_weights(target_vocab=6, scale=1.5, seed=4)   # words: [UNK], 4, 5
    options = SearchOptions(beam_size=64, n_best=3, max_length=5, min_length_ratio=0.0)
    prefix = np.array([[5, 4]] * len(SOURCES), "int32")
    out = tf.function(lambda s, p: beam_search(model, s, options, target_prefix=p))(SOURCES, prefix)
    for i, source in enumerate(SOURCES):
        candidates = []
        for n in range(0, 3):
            for seq in itertools.product([UNK_ID, 4, 5], repeat=n):
                tokens = [5, 4, *seq, EOS_ID]
                lp = forced_log_prob(model, source, tokens)
                candidates.append((lp / len(tokens), tokens))
        candidates.sort(key=lambda c: -c[0])
        assert [strip(t) for t in out["tokens"][i].numpy()] == [c[1] for c in candidates[:3]]


def test_a_target_prefix_needs_the_whole_vocabulary():
    model = model_with_random_weights()
    with pytest.raises(ValueError, match="shortlist_size=0"):
        beam_search(model, SOURCES, SearchOptions(shortlist_size=16), target_prefix=PREFIXES)


def contains(tokens, term):
    return any(tokens[i:i + len(term)] == term for i in range(len(tokens)))


TERMS = np.array([[[4, 0], [6, 7]], [[0, 0], [0, 0]], [[9, 0], [0, 0]]], "int32")     # sentence 1: none


@pytest.mark.parametrize("beam_size", [1, 5])
def test_every_hypothesis_holds_every_required_term(beam_size):
    """Single- and two-token terms; the scores are the hypotheses' forced-
    decoding log-probabilities; a sentence without terms is searched as
    without them."""
    model = model_with_random_weights()
    options = SearchOptions(beam_size=beam_size, n_best=beam_size, max_length_ratio=3.0)
    out = search(model, SOURCES, options, required_terms=TERMS)
    free = search(model, SOURCES, options)
    met = out["terms_met"].numpy()
    for i, source in enumerate(SOURCES):
        for rank in range(beam_size):
            if out["scores"][i, rank] <= NEG / 2:
                continue
            tokens = strip(out["tokens"][i, rank].numpy())
            assert met[i, rank] and all(contains(tokens, strip(term)) for term in TERMS[i] if strip(term))   # only
            # complete hypotheses are returned when there is one
            assert tokens[-1] == EOS_ID and EOS_ID not in tokens[:-1]
            lp = forced_log_prob(model, source, tokens)
            assert out["log_probs"][i, rank].numpy() == pytest.approx(lp, rel=1e-4, abs=1e-4)
            assert out["scores"][i, rank].numpy() == pytest.approx(lp / len(tokens), rel=1e-4, abs=1e-4)
    for key in ("tokens", "lengths"):
        np.testing.assert_array_equal(out[key][1].numpy(), free[key][1].numpy())


def test_a_term_followed_by_a_piece_of_the_same_word_is_not_met():
    """With word_continuation (sub-word pieces), "chien" inside "chiens" does
    not count: every returned hypothesis has the term followed by a word
    start or the end."""
    model = model_with_random_weights()
    continuation = np.zeros(12, bool)
    continuation[[4, 5, 6]] = True          # the random model's favourite tokens continue a word
    options = SearchOptions(beam_size=5, n_best=5, max_length_ratio=3.0)
    terms = np.array([[[9, 0]], [[8, 7]], [[10, 0]]], "int32")
    out = search(model, SOURCES, options, required_terms=terms, word_continuation=continuation)
    for i in range(3):
        term = strip(terms[i, 0])
        for rank in range(5):
            if out["scores"][i, rank] <= NEG / 2:
                continue
            tokens = strip(out["tokens"][i, rank].numpy())
            assert out["terms_met"][i, rank] and any(
                tokens[j:j + len(term)] == term and not continuation[tokens[j + len(term)]]
                for j in range(len(tokens) - len(term))), (i, rank, tokens)


def test_a_wide_constrained_beam_finds_the_exhaustive_best_with_the_terms():
    model = model_with_random_weights(target_vocab=6, scale=1.5, seed=4)   # words: [UNK], 4, 5
    options = SearchOptions(beam_size=64, n_best=3, max_length=4, min_length_ratio=0.0)
    terms = np.array([[[5, 4]], [[4, 0]], [[UNK_ID, 0]]], "int32")
    out = tf.function(lambda s, c: beam_search(model, s, options, required_terms=c))(SOURCES, terms)
    for i, source in enumerate(SOURCES):
        candidates = []
        for n in range(0, 4):
            for seq in itertools.product([UNK_ID, 4, 5], repeat=n):
                if contains(list(seq), strip(terms[i, 0])):
                    tokens = list(seq) + [EOS_ID]
                    candidates.append((forced_log_prob(model, source, tokens) / len(tokens), tokens))
        candidates.sort(key=lambda c: -c[0])
        assert [strip(t) for t in out["tokens"][i].numpy()] == [c[1] for c in candidates[:3]], i


def test_terms_that_do_not_fit_give_the_best_partial_hypothesis_and_say_so():
    model = model_with_random_weights()
    options = SearchOptions(beam_size=4, n_best=2, max_length=3)
    terms = np.array([[[4, 5, 6, 7]], [[8, 0, 0, 0]], [[4, 5, 6, 7]]], "int32")     # 4 tokens + [EOS] > 3
    out = search(model, SOURCES, options, required_terms=terms)
    assert out["terms_met"].numpy()[:, 0].tolist() == [False, True, False]
    assert (out["scores"].numpy()[:, 0] > NEG / 2).all() and (out["lengths"].numpy()[:, 0] <= 3).all()


def test_no_terms_and_no_prefix_search_as_before():
    model = model_with_random_weights()
    options = SearchOptions(beam_size=4, n_best=4)
    plain = search(model, SOURCES, options)
    steered = search(model, SOURCES, options, target_prefix=np.zeros([3, 0], "int32"),
                     required_terms=np.zeros([3, 0, 0], "int32"))
    for key in plain:
        np.testing.assert_array_equal(plain[key].numpy(), steered[key].numpy(), err_msg=key)
    both = search(model, SOURCES, options, target_prefix=PREFIXES, required_terms=TERMS)
    for i in range(3):
        tokens = strip(both["tokens"][i, 0].numpy())
        assert tokens[:len(strip(PREFIXES[i]))] == strip(PREFIXES[i]) and both["terms_met"][i, 0]


def test_options_are_validated():
    with pytest.raises(ValueError, match="n_best"):
        SearchOptions(beam_size=2, n_best=3)
    with pytest.raises(ValueError, match="length_penalty"):
        SearchOptions(length_penalty="none")


def test_search_defaults_equal_the_flag_defaults():
    from nmt_tf import flags

    f = flags.FLAGS
    d = SearchOptions()
    assert (d.beam_size, d.n_best, d.length_penalty, d.length_alpha, d.max_length_ratio, d.min_length_ratio,
            d.max_length, d.suppress_unk) == (
        f["beam_size"].default, f["n_best"].default, f["length_penalty"].default, f["length_alpha"].default,
        f["max_length_ratio"].default, f["min_length_ratio"].default, f["max_output_length"].default,
        f["suppress_unk"].default)


@pytest.mark.parametrize("vocab", [6, 97, 1003, 10000])
def test_best_extensions_equal_a_top_k_over_all_candidates(vocab):
    """The blocked selection is exact, also when the vocabulary is not a
    multiple of the block width (97 is prime: padded) and with dead slots."""
    assert 1 <= _block_size(vocab) <= vocab
    rng = np.random.default_rng(vocab)
    batch, beam = 3, 4
    log_probs = rng.normal(-5, 3, size=(batch, beam, vocab)).astype("float32")
    log_probs[:, :, PAD_ID] = NEG                                   # a forbidden token
    alive = rng.normal(-4, 2, size=(batch, beam)).astype("float32")
    alive[0, 1:] = NEG                                              # one live hypothesis
    alive[1, 2] = NEG
    score, token, parent = (t.numpy() for t in _best_extensions(tf.constant(log_probs), tf.constant(alive), beam))
    flat = (alive[:, :, None] + log_probs).reshape(batch, beam * vocab)
    want = np.argsort(-flat, axis=1, kind="stable")[:, :beam]
    np.testing.assert_array_equal(parent * vocab + token, want)
    np.testing.assert_allclose(score, np.take_along_axis(flat, want, 1), rtol=1e-6)


@pytest.mark.parametrize("vocab", [6, 97, 1003, 10000])
def test_best_extensions_apply_the_token_penalties_as_if_added_first(vocab):
    """The masks (`_token_penalties`) reach only the blocks holding special
    tokens token by token and the others as one value per block: the same
    extensions and the same scores, bit for bit, as adding the sentence's mask
    row to every log-probability first. Sentence b uses row b: any token but
    [PAD], [BOS] and [UNK]; not [EOS] either; only [EOS] (then fewer than k
    extensions are allowed, and the rest score below NEG / 2)."""
    rng = np.random.default_rng(vocab)
    batch, beam = 3, 4
    penalties = _token_penalties(vocab, SearchOptions(suppress_unk=True))
    kind = np.arange(batch, dtype="int32")
    log_probs = rng.normal(-5, 3, size=(batch, beam, vocab)).astype("float32")
    log_probs[:, :, [PAD_ID, BOS_ID, UNK_ID, EOS_ID]] = 3.0        # the best tokens before the masks
    alive = rng.normal(-4, 2, size=(batch, beam)).astype("float32")
    alive[1, 2] = NEG
    score, token, parent = (t.numpy() for t in _best_extensions(
        tf.constant(log_probs), tf.constant(alive), beam, penalties, tf.constant(kind)))
    flat = (alive[:, :, None] + (log_probs + penalties[kind][:, None, :])).reshape(batch, -1)
    for b in range(batch):
        valid = score[b] > NEG / 2
        want = np.argsort(-flat[b], kind="stable")[:valid.sum()]
        assert valid.sum() == min(beam, (flat[b] > NEG / 2).sum())
        np.testing.assert_array_equal((parent[b] * vocab + token[b])[valid], want)
        np.testing.assert_array_equal(score[b][valid], flat[b][want])
    assert set(token[0]).isdisjoint({PAD_ID, BOS_ID, UNK_ID})
    assert EOS_ID not in token[1] and (token[2][score[2] > NEG / 2] == EOS_ID).all()


@pytest.mark.parametrize("token_products", [False, True])
def test_frozen_step_weights_give_the_same_search(token_products):
    """Exports keep the step matrices as variables of their own
    (`freeze_step_weights`), and the previous word's products per word
    (`token_products`): the same hypotheses, scores and alignments, also for
    a layer-normalised GRU (whose input term is normalised in the table), for
    every layer of a deeper encoder and for the cGRU decoder with a deep
    transition."""
    for options in ({}, {"layer_norm": True}, {"encoder_layers": 2},
                    {"decoder": "cgru", "decoder_transition_depth": 3, "layer_norm": True}):
        model = model_with_random_weights(**options)
        search_options = SearchOptions(beam_size=4, n_best=2)
        before = beam_search(model, SOURCES, search_options)
        greedy_before = greedy_search(model, SOURCES)
        plain = len(tf.nest.flatten(model.step_weights()))
        variables = model.freeze_step_weights(token_products)
        # The step matrices (with the two per-word tables instead of the
        # embeddings), and (U_rz, U) of each encoder layer's direction, split once.
        assert len(variables) == plain + token_products + 4 * options.get("encoder_layers", 1)
        assert ("token_products" in model.step_weights()) == token_products
        assert ("target_embedding" in model.step_weights()) != token_products
        assert all(isinstance(v, tf.Variable) and not v.trainable for v in variables)
        for encoder in model.encoders:
            for (u_rz, u_candidate), kernel in zip(frozen_values(encoder, "recurrent_splits"),
                                                   encoder.recurrent_kernels):
                np.testing.assert_array_equal(np.concatenate([u_rz.numpy(), u_candidate.numpy()], -1),
                                              kernel.numpy())
        after = beam_search(model, SOURCES, search_options), greedy_search(model, SOURCES)
        for want, got in zip((before, greedy_before), after):
            for key in want:
                if want[key].dtype.is_integer or not token_products:
                    np.testing.assert_array_equal(want[key].numpy(), got[key].numpy(), err_msg=key)
                else:    # the tables' products may round differently from a step's
                    np.testing.assert_allclose(want[key].numpy(), got[key].numpy(), rtol=1e-5, atol=1e-6,
                                               err_msg=key)


def test_an_ensemble_of_one_model_or_of_its_twin_is_that_model():
    from nmt_tf.models.ensemble import Ensemble

    model = model_with_random_weights()
    options = SearchOptions(beam_size=4, n_best=2, min_length_ratio=0.0)
    want = beam_search(model, SOURCES, options)
    for ensemble in (Ensemble([model]), Ensemble([model, model])):
        got = beam_search(ensemble, SOURCES, options)
        np.testing.assert_array_equal(got["tokens"].numpy(), want["tokens"].numpy())
        np.testing.assert_allclose(got["scores"].numpy(), want["scores"].numpy(), rtol=1e-5)
        np.testing.assert_allclose(got["alignments"].numpy(), want["alignments"].numpy(), atol=1e-6)
    x = {"source_ids": SOURCES, "target_ids": np.array([[BOS_ID, 5, 6], [BOS_ID, 4, 0], [BOS_ID, 7, 8]], "int32")}
    y = np.array([[5, 6, EOS_ID], [4, EOS_ID, 0], [7, 8, EOS_ID]], "int32")
    np.testing.assert_allclose(Ensemble([model, model]).target_log_probs(x, y).numpy(),
                               model.target_log_probs(x, y).numpy(), rtol=1e-5, atol=1e-6)


def test_an_ensemble_averages_its_members_log_probabilities_at_every_step():
    from nmt_tf.models.ensemble import Ensemble

    a, b = model_with_random_weights(seed=1), model_with_random_weights(seed=2)
    ensemble = Ensemble([a, b])
    weights = ensemble.step_weights()
    inputs = ensemble.search_inputs(tf.constant(SOURCES), weights)
    state = tf.repeat(inputs.pop("state")[:, None], 2, axis=1)           # two hypotheses per sentence
    previous = tf.constant([[BOS_ID, 5], [BOS_ID, 6], [7, 8]])
    log_probs, new_state, alpha = ensemble.decode_step(previous, state, inputs, weights)
    width = a.search_state_size
    members = []
    for i, member in enumerate((a, b)):
        member_inputs = {k.split("/", 1)[1]: v for k, v in inputs.items() if k.startswith(f"{i}/")}
        members.append(member.decode_step(previous, state[..., i * width:(i + 1) * width], member_inputs,
                                          weights[i]))
    np.testing.assert_allclose(log_probs.numpy(), (members[0][0] + members[1][0]).numpy() / 2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new_state.numpy(), tf.concat([members[0][1], members[1][1]], -1).numpy(), atol=1e-6)
    np.testing.assert_allclose(alpha.numpy(), (members[0][2] + members[1][2]).numpy() / 2, atol=1e-6)
    # The same averaged distribution drives a whole search: greedy picks its argmax.
    greedy = greedy_search(ensemble, SOURCES, SearchOptions(beam_size=1, min_length_ratio=0.0))
    first = ensemble.decode_step(tf.fill([3, 1], BOS_ID), ensemble.search_inputs(tf.constant(SOURCES), weights)
                                 ["state"][:, None], inputs, weights)[0][:, 0].numpy()
    first[:, [PAD_ID, BOS_ID]] = -np.inf
    np.testing.assert_array_equal(greedy["tokens"][:, 0].numpy(), first.argmax(-1))


class ScriptedModel:
    """A stand-in model for search: after [BOS] it says [UNK] while attending to
    source position 1, then word 4 attending to position 0, then [EOS]."""

    target_vocab_size = 6
    search_state_size = 1

    def step_weights(self):
        return {}

    def search_inputs(self, source_ids, weights):
        rows = tf.shape(source_ids)[0]
        return {"state": tf.zeros([rows, 1]), "length": tf.fill([rows], tf.shape(source_ids)[1])}

    def decode_step(self, previous_ids, state, inputs, weights):
        next_token = tf.where(previous_ids == BOS_ID, UNK_ID, tf.where(previous_ids == UNK_ID, 4, EOS_ID))
        log_probs = tf.math.log(tf.one_hot(next_token, self.target_vocab_size) * 0.9 + 0.1 / self.target_vocab_size)
        position = tf.where(previous_ids == BOS_ID, 1, 0)
        alpha = tf.one_hot(position, tf.reduce_max(inputs["length"]))
        return log_probs, state, alpha


def test_unk_replacement_copies_the_attended_source_word_or_its_dictionary_translation(tmp_path):
    from nmt_tf.data import text
    from nmt_tf.inference.translation_graph import TranslationGraph, UnkReplacement

    vocab = list(text.SPECIAL_TOKENS) + ["le", "chat"]
    src_tok = text.make_tokenizer(list(text.SPECIAL_TOKENS) + ["Hello", "."], "word", "en")
    tgt_tok = text.make_tokenizer(vocab, "word", "fr")
    sentences = tf.constant(["Hello Ziegler .", "Dr Who ."])
    options = SearchOptions(beam_size=1, min_length_ratio=0.0)
    plain = TranslationGraph(ScriptedModel(), src_tok, tgt_tok, options, 20).translate(sentences)
    assert plain["translation"].numpy().tolist() == [b"[UNK] le", b"[UNK] le"]
    copied = TranslationGraph(ScriptedModel(), src_tok, tgt_tok, options, 20, UnkReplacement()).translate(sentences)
    assert copied["translation"].numpy().tolist() == [b"Ziegler le", b"Who le"]
    assert copied["target_tokens"].numpy()[0].tolist()[:3] == [b"[UNK]", b"le", b"[EOS]"]     # the model's own
    dictionary = tmp_path / "dict.tsv"
    dictionary.write_text("Ziegler\tZieglère\nHello\tBonjour\n", encoding="utf-8")
    translated = TranslationGraph(ScriptedModel(), src_tok, tgt_tok, options, 20,
                            UnkReplacement(str(dictionary))).translate(sentences)
    assert [t.decode() for t in translated["translation"].numpy()] == ["Zieglère le", "Who le"]
    for content, problem in (("Ziegler\tA\nZiegler\tB\n", "line 2: 'Ziegler' has an entry already"),
                             ("Ziegler Zieglère\n", "line 1: expected")):
        dictionary.write_text(content, encoding="utf-8")
        with pytest.raises(ValueError, match=problem):
            UnkReplacement(str(dictionary))


def test_unk_dictionary_learns_word_translations_from_a_corpus(tmp_path):
    """IBM Model 1 both ways: each source word gets its translation, a word
    seen once included; the CLI counts what it skips."""
    from conftest import run_cli
    from nmt_tf.core.files import InputError
    from nmt_tf.data.alignment import learn_dictionary, split_corpus

    animals = [("dog", "chien"), ("cat", "chat"), ("horse", "cheval"), ("bird", "oiseau")]
    verbs = [("runs", "court"), ("sleeps", "dort"), ("eats", "mange")]
    stop = {"runs": " .", "sleeps": " .", "eats": ""}         # "The" and "." do not always go together
    src = [f"The {a} {v}{stop[v]}" for a, _ in animals for v, _ in verbs] + ["The zebra sleeps ."]
    tgt = [f"Le {a} {fv}{stop[v]}" for _, a in animals for v, fv in verbs] + ["Le zèbre dort ."]
    src += [f"A {a} {v} ." for a, _ in animals for v, _ in verbs]
    tgt += [f"Un {a} {v} ." for _, a in animals for _, v in verbs]
    pairs, skipped = split_corpus([s.encode() for s in src], [t.encode() for t in tgt], "en", "fr", 50, 1000)
    assert len(pairs) == len(src) and not skipped
    dictionary = dict(learn_dictionary(pairs, iterations=10, log=lambda _: None))
    assert dictionary == {"The": "Le", "A": "Un", ".": ".", "zebra": "zèbre", **dict(animals), **dict(verbs)}

    src_file, tgt_file, out = tmp_path / "train.en", tmp_path / "train.fr", tmp_path / "dict.tsv"
    src_file.write_text("\n".join(src + ["", "a " * 60]) + "\n", encoding="utf-8")
    tgt_file.write_text("\n".join(tgt + ["Rien", "un " * 3]) + "\n", encoding="utf-8")
    done = run_cli("-m", "nmt_tf.unk_dictionary", f"--train_src={src_file}", f"--train_tgt={tgt_file}",
                   "--src_lang=en", "--tgt_lang=fr", f"--output={out}", timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Skipped 1 pairs with an empty side, 1 pairs with more than 50 words" in done.stderr
    lines = out.read_text(encoding="utf-8").splitlines()
    assert lines[:3] == [".\t.", "The\tLe", "A\tUn"] and "zebra\tzèbre" in lines and len(lines) == len(dictionary)

    for src_end, tgt_end, shorter in ((None, -1, "train.fr"), (-1, None, "train.en")):   # one line missing
        with pytest.raises(InputError, match=rf"{shorter} \(--train_.+\) has fewer lines than the other side"):
            split_corpus([s.encode() for s in src[:src_end]], [t.encode() for t in tgt[:tgt_end]], "en", "fr",
                         50, 1000, names=("train.en (--train_src)", "train.fr (--train_tgt)"))


class WalkingModel(ScriptedModel):
    """A stand-in model for search whose attention walks the source: at
    step t it attends to position t (0.9, the rest spread evenly) and wants
    word 4 ("w") for three steps, then [EOS]: p = 0.9 after [BOS] or "w",
    0.5 after another word (an unlikely word mid-sentence upsets what
    follows), the rest spread evenly over the other tokens."""

    target_vocab_size = 8

    def decode_step(self, previous_ids, state, inputs, weights):
        step = tf.cast(state[..., 0], tf.int32)
        wanted = tf.where(step < 3, 4, EOS_ID)
        p = tf.where((previous_ids == BOS_ID) | (previous_ids == 4), 0.9, 0.5)[..., None]
        log_probs = tf.math.log(tf.where(tf.one_hot(wanted, self.target_vocab_size) > 0, p,
                                         (1 - p) / (self.target_vocab_size - 1)))
        width = tf.reduce_max(inputs["length"])
        alpha = (tf.one_hot(tf.minimum(step, width - 1), width) * 0.9 + 0.1 / tf.cast(width, tf.float32))
        return log_probs, state + 1, alpha


def test_a_term_with_its_source_term_is_written_where_the_attention_is_on_it():
    """Issue 93: Post & Vilar's search appends an unlikely term after the
    sentence ("w w w z": the length penalty pays for the extra token); given
    as "b|||z", the term costs -log(attention on "b") when started, and is
    written at the step that attends to "b". The scores stay the model's."""
    from nmt_tf.data import text
    from nmt_tf.inference.translation_graph import TranslationGraph

    src_tok = text.make_tokenizer(list(text.SPECIAL_TOKENS) + ["a", "b", "c", "d"], "word", "en")
    tgt_tok = text.make_tokenizer(list(text.SPECIAL_TOKENS) + ["w", "x", "y", "z"], "word", "fr")
    sentences = tf.constant(["a b c d", "a b c d", "a b c d", "a c d d"])
    terms = tf.constant(["b|||z", "z", "b c ||| z", "b|||z"])      # the last sentence has no "b"

    def translate(weight):
        graph = TranslationGraph(WalkingModel(), src_tok, tgt_tok,
                                 SearchOptions(beam_size=4, min_length_ratio=0.0, term_placement=weight), 20)
        return graph.translate_constrained(sentences, tf.constant([""] * 4), terms)

    placed, anywhere = translate(1.0), translate(0.0)
    assert [t.decode() for t in anywhere["translation"].numpy()] == ["w w w z"] * 4
    translations = [t.decode() for t in placed["translation"].numpy()]
    assert translations[:2] == ["w z w", "w w w z"] and translations[3] == "w w w z"
    assert translations[2] in ("w z w", "w w z")                        # "b c": either step attends to it
    assert placed["terms_met"].numpy().all()
    good, upset, low = np.log(0.9), np.log(0.5), np.log(0.1 / 7)
    np.testing.assert_allclose(placed["log_prob"].numpy(), [2 * good + low + upset, 3 * good + low + upset,
                                                            2 * good + low + upset, 3 * good + low + upset], rtol=1e-5)
    np.testing.assert_allclose(placed["score"].numpy(), placed["log_prob"].numpy() / [4, 5, 4, 5], rtol=1e-5)
    graph = TranslationGraph(WalkingModel(), src_tok, tgt_tok, SearchOptions(), 20)
    source = src_tok.lookup(src_tok.tokenize(tf.constant(["a b c b d", "d"]))).to_tensor(0)
    # "x" and "q" are not in the source vocabulary: [UNK] would match any unknown word, so they place nothing
    spans = graph._term_spans(tf.ragged.constant([["b", "", "c b", "x"], ["d"]]), source, 5).numpy()
    assert spans[0].tolist() == [[0, 1, 0, 1, 0], [0] * 5, [0, 0, 1, 1, 0], [0] * 5, [0] * 5]
    unknown = src_tok.lookup(src_tok.tokenize(tf.constant(["a q b"]))).to_tensor(0)
    assert graph._term_spans(tf.ragged.constant([["q", "b"]]), unknown, 2).numpy().tolist() == [[[0, 0, 0],
                                                                                                 [0, 0, 1]]]
    assert spans[1].tolist() == [[1, 0, 0, 0, 0]] + [[0] * 5] * 4
