"""Paper 004's representation maps (Figs. 4, 5): word and phrase vectors, projector files, t-SNE maps, CLI."""

import collections
import os

import numpy as np
import pytest
import tensorflow as tf
from test_evaluate import png_shape, read_events

from conftest import run_cli, write_lines
from nmt_tf.core.files import read_lines
from nmt_tf.data.text import EOS_ID, SPECIAL_TOKENS, WordpieceTokenizer
from nmt_tf.evaluation import plots
from nmt_tf.evaluation import representations as reps
from nmt_tf.inference.restore import restore_model
from nmt_tf.models.rnnsearch import RNNSearch
from nmt_tf.training import job as training

# Phrases of different lengths (so a batch is padded); "zebrafoo" is in no vocabulary.
PHRASES = ["A man", "Two dogs play in the snow .", "A woman is riding a bike", "a man in a blue shirt",
           "zebrafoo man"]


@pytest.fixture(scope="module")
def rnnsearch(trained_model_dir):
    """(model, source tokenizer, config) of conftest's tiny trained RNNsearch."""
    restored = restore_model(trained_model_dir[0], log=lambda *a: None)
    return restored.model, restored.source_tokenizer, restored.config


@pytest.fixture(scope="module")
def rnnencdec(tiny_config, tmp_path_factory):
    """A tiny RNNencdec trained for 3 updates, as tests/test_rnnencdec.py trains one: (model, source tokenizer)."""
    model_dir = str(tmp_path_factory.mktemp("rnnencdec") / "m")
    training.train(tiny_config(model_dir=model_dir, model="rnnencdec", max_steps=3), log=lambda *a: None)
    restored = restore_model(model_dir, log=lambda *a: None)
    return restored.model, restored.source_tokenizer


def alone(tokenizer, phrase):
    """[1, T] ids of one phrase as the encoder reads it: its tokens, then [EOS], no padding."""
    return np.array([tokenizer.encode(tf.constant([phrase])).to_list()[0] + [EOS_ID]], "int32")


def test_rnnencdec_phrase_vector_is_its_own_summary_c(rnnencdec):
    model, tok = rnnencdec
    rep = reps.phrase_vectors(model, tok, PHRASES)
    assert rep.labels == PHRASES
    assert rep.vectors.shape == (len(PHRASES), model.hidden_size)
    assert rep.columns["vector"] == ["summary c = tanh(V h_T)"] * len(PHRASES)
    assert rep.columns["words"] == [2, 7, 6, 6, 2]
    for phrase, got in zip(PHRASES, rep.vectors):
        c = model.encode(alone(tok, phrase))["context"].numpy()[0]        # the model's own c, no padding
        np.testing.assert_allclose(got, c, rtol=1e-5, atol=1e-6)
    assert np.all(np.abs(rep.vectors) < 1.0)                                 # c = tanh(V h_T)
    assert np.ptp(rep.vectors, axis=0).max() > 1e-4                          # the phrases differ
    s0 = reps.phrase_vectors(model, tok, PHRASES, "initial_state").vectors   # s_0 = tanh(V' c)
    np.testing.assert_allclose(s0, model.initial_state(rep.vectors).numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(reps.RepresentationError, match="keeps no annotations"):
        reps.phrase_vectors(model, tok, PHRASES, "mean_annotation")


def test_rnnsearch_phrase_vector_is_the_mean_annotation_over_real_positions(rnnsearch):
    model, tok, _ = rnnsearch
    rep = reps.phrase_vectors(model, tok, PHRASES)                           # auto: mean_annotation
    assert rep.vectors.shape == (len(PHRASES), 2 * model.hidden_size)
    assert rep.description == "RNNSearch phrase mean annotation (1/T) sum_j h_j"
    s0 = reps.phrase_vectors(model, tok, PHRASES, "initial_state")
    assert s0.vectors.shape == (len(PHRASES), model.hidden_size)
    for i, phrase in enumerate(PHRASES):
        encoded = model.encode(alone(tok, phrase))          # every position real: [EOS] included, no padding
        np.testing.assert_allclose(rep.vectors[i], encoded["annotations"].numpy()[0].mean(axis=0),
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(s0.vectors[i], encoded["state"].numpy()[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(reps.RepresentationError, match="no summary c"):
        reps.resolve_phrase_vector(model, "summary")


def test_word_vectors_are_the_source_embedding_rows(rnnsearch):
    model, tok, _ = rnnsearch
    rep = reps.word_vectors(model, tok, PHRASES)
    words = list(dict.fromkeys(w for p in PHRASES for w in p.split()))
    known = [w for w in words if w in tok.vocabulary]
    assert rep.labels == known and rep.left_out == [w for w in words if w not in known]
    assert "zebrafoo" in rep.left_out and len(known) >= 10
    table = model.source_embedding.embeddings.numpy()
    assert rep.vectors.shape == (len(known), model.embedding_size)
    np.testing.assert_array_equal(rep.vectors, table[[tok.vocabulary.index(w) for w in known]])
    assert rep.columns["tokens"] == known and rep.columns["n_tokens"] == [1] * len(known)


def test_sub_word_models_map_a_word_to_the_mean_of_its_pieces():
    vocab = list(SPECIAL_TOKENS) + ["a", "man", "run", "##s", "##ning", "dog"]
    tok = WordpieceTokenizer(vocab)
    model = RNNSearch(len(vocab), 8, embedding_size=5, hidden_size=4, attention_size=4, maxout_size=3)
    model.build()
    table = model.source_embedding.embeddings.numpy()
    rep = reps.word_vectors(model, tok, ["a man runs", "running cats"])
    assert rep.labels == ["a", "man", "runs", "running"] and rep.left_out == ["cats"]    # no piece for "c..."
    assert rep.columns["tokens"] == ["a", "man", "run ##s", "run ##ning"]
    np.testing.assert_allclose(rep.vectors[2], (table[6] + table[7]) / 2, rtol=1e-6)
    np.testing.assert_allclose(rep.vectors[3], (table[6] + table[8]) / 2, rtol=1e-6)
    np.testing.assert_array_equal(rep.vectors[0], table[4])


def test_projector_files_are_what_tensorboards_projector_serves(rnnsearch, tmp_path):
    from tensorboard.plugins import projector
    from tensorboard.plugins.base_plugin import TBContext
    from tensorboard.plugins.projector.projector_plugin import ProjectorPlugin
    from werkzeug.test import Client

    model, tok, _ = rnnsearch
    maps = [reps.word_vectors(model, tok, PHRASES), reps.phrase_vectors(model, tok, PHRASES)]
    out = str(tmp_path / "proj")
    config_path = reps.write_projector(out, maps)
    assert config_path == os.path.join(out, "projector_config.pbtxt")

    from google.protobuf import text_format

    config = text_format.Parse(open(config_path).read(), projector.ProjectorConfig())
    assert [e.tensor_path for e in config.embeddings] == ["words.tsv", "phrases.tsv"]
    apps = ProjectorPlugin(TBContext(logdir=out)).get_plugin_apps()
    get = lambda route, **args: Client(apps[route]).get(route, query_string=args)
    assert get("/runs").get_json() == ["."]                 # `tensorboard --logdir OUT` finds the config
    for rep, embedding in zip(maps, config.embeddings):
        assert os.path.isfile(os.path.join(out, embedding.tensor_path))
        shown = np.frombuffer(get("/tensor", run=".", name=embedding.tensor_name).data, "float32")
        np.testing.assert_allclose(shown.reshape(rep.vectors.shape), rep.vectors, rtol=1e-5, atol=1e-6)
        rows = get("/metadata", run=".", name=embedding.tensor_name).get_data(as_text=True).splitlines()
        assert rows[0].split("\t") == ["label", *rep.columns]                # a header, then one row per vector
        assert [r.split("\t")[0] for r in rows[1:]] == rep.labels
        assert list(embedding.tensor_shape) == list(rep.vectors.shape)
    assert "mean annotation" in config.embeddings[1].tensor_name
    assert "A man in a blue shirt" not in open(os.path.join(out, "phrases_metadata.tsv")).read()
    assert "a man in a blue shirt\t" in open(os.path.join(out, "phrases_metadata.tsv")).read()


def test_the_default_list_is_the_most_frequent_words_and_ngrams(rnnsearch):
    _, tok, config = rnnsearch
    lines = reps.frequent_phrases(config.train_src, tok.words, 5)
    assert lines == reps.frequent_phrases(config.train_src, tok.words, 5)               # deterministic
    sentences = [[w.decode() for w in row] for row in tok.words(tf.constant(read_lines(config.train_src))).to_list()]
    words = collections.Counter(w for s in sentences for w in s if any(c.isalnum() for c in w))
    assert lines[:5] == [w for w, _ in sorted(words.items(), key=lambda wc: (-wc[1], wc[0]))[:5]]
    ngrams = lines[5:]
    assert [len(g.split()) for g in ngrams] == [2, 2, 3, 3, 4]                          # shares 2, 2, 1
    bigrams = collections.Counter(" ".join(s[i:i + 2]) for s in sentences for i in range(len(s) - 1))
    assert bigrams[ngrams[0]] == max(c for g, c in bigrams.items() if all(any(ch.isalnum() for ch in w)
                                                                           for w in g.split()))
    with pytest.raises(reps.RepresentationError, match="give --phrases"):
        reps.frequent_phrases("/no/such/train.en", tok.words, 5)


def test_read_phrases_reports_blank_and_repeated_lines(tmp_path):
    path = write_lines(tmp_path / "p.txt", ["a man", "", "two  dogs\t run", "a man", "   "])
    lines, notes = reps.read_phrases(path)
    assert lines == ["a man", "two dogs run"]
    assert notes == [f"2 blank lines of {path} left out", f"1 repeated line of {path} left out"]
    with pytest.raises(reps.RepresentationError, match="holds no words or phrases"):
        reps.read_phrases(write_lines(tmp_path / "empty.txt", ["", " "]))
    with pytest.raises(reps.RepresentationError, match="does not exist"):
        reps.read_phrases(str(tmp_path / "missing.txt"))


def test_tsne_keeps_clusters_apart_and_is_reproducible():
    rng = np.random.default_rng(0)
    vectors = np.concatenate([rng.normal(0, 0.1, (10, 16)), rng.normal(3, 0.1, (10, 16))])
    assert reps.tsne_perplexity(20) < 20 and reps.tsne_perplexity(1000) == 30.0
    xy = reps.tsne_2d(vectors)
    assert xy.shape == (20, 2) and np.all(np.isfinite(xy))
    np.testing.assert_array_equal(xy, reps.tsne_2d(vectors))
    distances = np.linalg.norm(xy[:, None] - xy[None], axis=-1) + np.eye(20) * 1e9
    nearest = distances.argmin(axis=1)
    assert np.all((nearest < 10) == (np.arange(20) < 10))             # each point's neighbour is in its cluster
    with pytest.raises(reps.RepresentationError, match="at least 3"):
        reps.tsne_2d(vectors[:2])


def test_map_labels_are_spread_and_capped():
    points = np.array([[0, 0], [0, 0.001], [1, 1], [0.5, 0.5], [0.9, 1.0]])
    assert plots.spread_labels(points) == [0, 2, 3, 4]                 # point 1 sits on point 0's label
    assert plots.spread_labels(points, max_labels=2) == [0, 2]
    png = plots.representation_map_png(points, list("abcde"), "words", groups=["1 word"] * 3 + ["2 words"] * 2)
    assert png_shape(png) == (600, 600)


def test_cli_writes_maps_and_projector_files(trained_model_dir, tmp_path):
    out, tb = tmp_path / "maps", tmp_path / "tb"
    done = run_cli("-m", "nmt_tf.visualize", "--representations", f"--model_dir={trained_model_dir[0]}",
                   "--most_frequent=8", f"--out={out}", f"--logdir={tb}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(os.listdir(out)) == ["phrases.png", "phrases.tsv", "phrases_metadata.tsv", "projector_config.pbtxt",
                                       "words.png", "words.tsv", "words_metadata.tsv"]
    assert len(open(out / "phrases.tsv").read().splitlines()) == 16                      # 8 words + 8 n-grams
    assert len(open(out / "phrases_metadata.tsv").read().splitlines()) == 17
    assert png_shape((out / "phrases.png").read_bytes())[0] >= 600
    assert f"tensorboard --logdir {out}" in done.stdout
    assert "phrases: 16 vectors of width 32 (RNNSearch phrase mean annotation" in done.stdout
    assert {"representations/words", "representations/phrases"} <= set(read_events(str(tb)))


@pytest.mark.parametrize("lines,message", [(None, "does not exist (--phrases)."),
                                           (["", "  "], "holds no words or phrases (--phrases): give one per line.")])
def test_cli_refuses_a_missing_or_empty_phrase_list(trained_model_dir, tmp_path, lines, message):
    path = tmp_path / "phrases.txt"
    if lines is not None:
        write_lines(path, lines)
    done = run_cli("-m", "nmt_tf.visualize", "--representations", f"--model_dir={trained_model_dir[0]}",
                   f"--phrases={path}", f"--out={tmp_path / 'maps'}")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [f"error: {path} {message}"]
    assert not (tmp_path / "maps").exists()


def test_cli_representation_flags_need_representations_and_a_model_dir(tmp_path):
    done = run_cli("-m", "nmt_tf.visualize", f"--model_dir={tmp_path}", "--text=x", "--phrases=p.txt")
    assert done.returncode == 1 and "--phrases goes with --representations" in done.stderr
    done = run_cli("-m", "nmt_tf.visualize", f"--saved_model={tmp_path}", "--representations")
    assert done.returncode == 1 and "--representations needs --model_dir" in done.stderr
