"""Vocabulary shortlists (nmt_tf.shortlist): the lexical table IBM Model 1
learns, the candidates a batch gets, and that a search over them is the full
search of a model that can produce only them."""

import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
from test_export import _op_types, _unregistered
from test_search import SOURCES, model_with_random_weights

from conftest import REPO, run_cli
from nmt_tf.config import ExportConfig
from nmt_tf.data import lexicon as shortlist
from nmt_tf.data.text import EOS_ID, PAD_ID, SPECIAL_TOKENS, with_eos
from nmt_tf.exporting import saved_model as exporter
from nmt_tf.inference.restore import restore_model
from nmt_tf.inference.saved_models import load_signature
from nmt_tf.inference.search import SearchOptions, _block_size, beam_search, greedy_search, search
from nmt_tf.models.ensemble import Ensemble

SPECIALS = len(SPECIAL_TOKENS)


def test_the_lexicon_knows_the_special_tokens_without_importing_tensorflow():
    assert shortlist.SPECIALS == SPECIALS and PAD_ID == 0 and EOS_ID < SPECIALS


def test_ibm_model1_table_ranks_each_source_tokens_translation_first():
    """Sentences made of source tokens 4..11, each translated by token + 10 and
    shuffled, with a frequent target token 30 in every sentence: the
    translation comes first, the frequent token only after it."""
    rng = np.random.default_rng(0)
    pairs = []
    for _ in range(300):
        source = rng.choice(np.arange(4, 12), size=rng.integers(2, 6), replace=False)
        target = np.concatenate([source + 10, [30]])
        pairs.append((source.astype(np.int32), rng.permutation(target).astype(np.int32)))
    table = shortlist.lexical_table(pairs, source_vocab_size=12, target_vocab_size=32, keep=3, iterations=8,
                                    chunk_pairs=70)         # several chunks per iteration
    np.testing.assert_array_equal(table["candidates"][4:, 0], np.arange(14, 22))
    assert (table["candidates"][:SPECIALS] == PAD_ID).all()             # [PAD] (the NULL word) and specials
    probabilities = table["probabilities"][4:]
    assert (np.diff(probabilities, axis=1) <= 0).all() and (probabilities[:, 0] > 0.5).all()
    assert table["target_counts"][30] == 300
    assert table["target_counts"].sum() == sum(len(t) for _, t in pairs)


def reference_shortlist(table, sources, size, per_word, multiple=1):
    """`shortlist_ids` in NumPy."""
    rank = shortlist.frequency_rank(table["target_counts"])
    translations = set(table["candidates"][np.asarray(sources).ravel(), :per_word].ravel().tolist())
    order = sorted(range(len(rank)), key=lambda i: (i >= SPECIALS, i not in translations, rank[i]))
    needed = len(set(range(SPECIALS)) | translations)
    return sorted(order[:max(size, -(-needed // multiple) * multiple)])


@pytest.mark.parametrize("size, multiple", [(6, 1), (9, 1), (16, 1), (6, 4), (5, 3), (18, 4)])
def test_a_batch_shortlist_is_the_specials_then_translations_then_frequent_tokens(size, multiple):
    candidates = np.zeros((10, 3), np.int32)
    candidates[5] = [12, 15, 7]
    candidates[6] = [15, 17, 8]
    candidates[7] = [9, 0, 0]
    counts = np.arange(20)[::-1].copy()         # token 0 most frequent ... 19 least
    counts[17] = 100                            # one frequent translation
    table = {"candidates": candidates, "target_counts": counts}
    sources = np.array([[5, 6, EOS_ID, 0], [7, EOS_ID, 0, 0]], np.int32)
    got = shortlist.LexicalShortlist(table).select(tf.constant(sources), size, per_word=2, multiple=multiple).numpy()
    want = reference_shortlist(table, sources, size, per_word=2, multiple=multiple)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got[:SPECIALS], np.arange(SPECIALS))         # specials at their own ids
    # The specials and translations 9, 12, 15, 17 (8 tokens) are never cut,
    # however small the size: the list grows; then 4, the most frequent other
    # token, and so on until the size (in multiples of `multiple`).
    expected = {(6, 1): [0, 1, 2, 3, 9, 12, 15, 17], (9, 1): [0, 1, 2, 3, 4, 9, 12, 15, 17],
                (5, 3): [0, 1, 2, 3, 4, 9, 12, 15, 17], (6, 4): [0, 1, 2, 3, 9, 12, 15, 17]}
    if (size, multiple) in expected:
        np.testing.assert_array_equal(got, expected[(size, multiple)])
    assert len(got) == max(size, -(-8 // multiple) * multiple)


def only_the_shortlist_can_win(model, ids):
    """`model` with the output bias of every token outside `ids` at -1e9: its
    softmax over the whole vocabulary is the softmax over `ids`."""
    bias = model.output_bias if model.tied_embeddings != "none" else model.output_projection.bias
    outside = np.ones(model.target_vocab_size, bool)
    outside[ids] = False
    bias.assign(np.where(outside, -1e9, bias.numpy()).astype(np.float32))
    return model


@pytest.mark.parametrize("tied, size, per_word, length", [("none", 18, 2, 18), ("all", 16, 3, 24)])
def test_search_over_a_shortlist_is_the_full_search_of_a_model_limited_to_it(tied, size, per_word, length):
    """The shortlist's positions map back to the right tokens, its masks are
    the full vocabulary's, and its output layer is the model's columns: the
    results equal a full search of the same model whose other tokens have
    probability 0. Also with frozen step weights (exports) and as an
    ensemble (the frozen one as a graph of unknown batch and length, whose
    shortlist width is known only when it runs); and with a list longer
    than shortlist_size (24 > 16: the batch's translations need 21 places,
    rounded up to the block width 4)."""
    vocab = 40
    table = {"candidates": np.random.default_rng(2).integers(SPECIALS, vocab, size=(vocab, 4)).astype(np.int32),
             "target_counts": np.random.default_rng(3).integers(1, 100, size=vocab)}
    lexical = shortlist.LexicalShortlist(table)
    ids = lexical.select(tf.constant(SOURCES), size, per_word, multiple=_block_size(size)).numpy()
    assert len(ids) == length
    make = lambda: model_with_random_weights(target_vocab=vocab, scale=1.2, seed=5, tied_embeddings=tied,
                                             layer_norm=True)
    limited = only_the_shortlist_can_win(make(), ids)
    options = SearchOptions(beam_size=4, n_best=3, shortlist_size=size, shortlist_per_word=per_word)
    full = SearchOptions(beam_size=4, n_best=3)
    want = beam_search(limited, SOURCES, full), greedy_search(limited, SOURCES, full)
    model = make()
    for candidate in (model, Ensemble([model, model]), "frozen"):
        run = lambda f, m: f(m, SOURCES, options, lexical)
        if isinstance(candidate, str):          # as a shortlist's export: no output blocks kept, a graph
            model.freeze_step_weights(token_products=True, output_layer=False)
            assert "output" not in model.step_weights()
            candidate = model
            run = lambda f, m: tf.function(lambda ids: f(m, ids, options, lexical), input_signature=[
                tf.TensorSpec([None, None], tf.int32)])(tf.constant(SOURCES, tf.int32))
        got = run(beam_search, candidate), run(greedy_search, candidate)
        for w, g in zip(want, got):
            np.testing.assert_array_equal(g["tokens"].numpy(), w["tokens"].numpy())
            assert set(np.unique(g["tokens"].numpy())) <= set(ids)
            np.testing.assert_allclose(g["scores"].numpy(), w["scores"].numpy(), rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(g["alignments"].numpy(), w["alignments"].numpy(), atol=1e-5)
    with pytest.raises(ValueError, match="lexical shortlist"):
        search(model, SOURCES, options)
    with pytest.raises(ValueError, match="shortlist_size"):
        SearchOptions(shortlist_size=SPECIALS)


@pytest.fixture(scope="module")
def model_dir_with_table(trained_model_dir, tmp_path_factory):
    """A copy of the tiny trained model with the lexical table `python -m
    nmt_tf.shortlist` made for it, and that command's output."""
    model_dir = str(tmp_path_factory.mktemp("shortlisted") / "model")
    shutil.copytree(trained_model_dir[0], model_dir)
    done = run_cli("-m", "nmt_tf.shortlist", f"--model_dir={model_dir}", "--shortlist_keep=8")
    assert done.returncode == 0, done.stderr
    return model_dir, done.stderr


def test_the_shortlist_command_writes_a_table_for_the_model_and_reports_dev_coverage(model_dir_with_table):
    model_dir, stderr = model_dir_with_table
    model = restore_model(model_dir, log=lambda *a: None).model
    with np.load(shortlist.lexical_table_path(model_dir)) as f:
        assert f["candidates"].shape == (model.source_vocab_size, 8)
        assert f["target_counts"].shape == (model.target_vocab_size,)
        assert f["target_counts"].sum() > 0
    assert "IBM Model 1 on 40 pairs" in stderr
    assert "inside their sentence's shortlist" in stderr and "%" in stderr


def test_an_export_with_a_shortlist_translates_as_the_search_in_process(model_dir_with_table, tmp_path):
    model_dir = model_dir_with_table[0]
    model, src_tok, tgt_tok = restore_model(model_dir, log=lambda *a: None)[:3]
    size = model.target_vocab_size // 2
    options = SearchOptions(beam_size=3, shortlist_size=size, shortlist_per_word=4)
    path = exporter.export(model_dir, str(tmp_path / "e"), ExportConfig(options, max_input_length=20),
                           log=lambda *a: None)
    text = tf.constant(["A man in a blue shirt.", "Two dogs run .", ""])
    ids = with_eos(src_tok.encode(text)).to_tensor()
    lexical = shortlist.for_search(model_dir, model, options)
    want = tgt_tok.decode(search(model, ids, options, lexical)["tokens"][:, 0])
    got = load_signature(path)(text=text)
    assert got["translation"].numpy().tolist()[:2] == want.numpy().tolist()[:2]
    assert got["translation"].numpy()[2] == b""
    # Core TensorFlow ops only, and it loads and runs as tensorflow_model_server loads it.
    assert _unregistered(_op_types(path))["core"] == set()
    result = run_cli(os.path.join(REPO, "tests", "load_with_tensorflow_only.py"), path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "translation ok" in result.stdout and "session ok" in result.stdout


def test_a_shortlist_search_needs_the_table_and_a_fitting_one(model_dir_with_table, trained_model_dir, tiny_corpus,
                                                              tmp_path):
    model = restore_model(trained_model_dir[0], log=lambda *a: None).model
    options = SearchOptions(shortlist_size=16)
    with pytest.raises(FileNotFoundError, match="python -m nmt_tf.shortlist --model_dir="):
        shortlist.for_search(trained_model_dir[0], model, options)
    assert shortlist.for_search(trained_model_dir[0], model, SearchOptions()) is None
    with_table = model_dir_with_table[0]
    with pytest.raises(ValueError, match="keeps 8 translations"):
        shortlist.for_search(with_table, model, SearchOptions(shortlist_size=16, shortlist_per_word=9))
    other = str(tmp_path / "other")
    shutil.copytree(with_table, other)
    table = dict(np.load(shortlist.lexical_table_path(other)))
    np.savez(shortlist.lexical_table_path(other), candidates=table["candidates"][:-1],
             target_counts=table["target_counts"])
    with pytest.raises(ValueError, match="make it again for this model"):
        shortlist.for_search(other, model, options)
    with open(shortlist.lexical_table_path(other), "wb") as f:
        f.write(b"not a table")
    with pytest.raises(ValueError, match="not a lexical table"):
        shortlist.for_search(other, model, options)
    _, src_tok, tgt_tok = restore_model(with_table, log=lambda *a: None)[:3]
    (tmp_path / "a.en").write_text("A dog runs.\nTwo men.\n\nA cat.\n")
    (tmp_path / "b.fr").write_text("Un chien court.\nDeux hommes.\nVide.\n")
    with pytest.raises(ValueError, match="b.fr has fewer lines than"):
        shortlist.encoded_pairs(str(tmp_path / "a.en"), str(tmp_path / "b.fr"), src_tok, tgt_tok, 50)
    pairs, skipped = shortlist.encoded_pairs(str(tmp_path / "a.en"), str(tmp_path / "b.fr"), src_tok, tgt_tok,
                                             50, limit=2, batch_lines=1)
    assert len(pairs) == 2 and skipped == 0 and pairs[0][0].dtype == np.int32
    done = run_cli("-m", "nmt_tf.evaluate", f"--model_dir={trained_model_dir[0]}", "--shortlist_size=16",
                   f"--src={tiny_corpus['dev_src']}", f"--ref={tiny_corpus['dev_tgt']}", f"--out_dir={tmp_path / 'ev'}")
    assert done.returncode == 1 and "python -m nmt_tf.shortlist" in done.stderr.splitlines()[-1]
