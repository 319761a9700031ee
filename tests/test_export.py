"""The exported SavedModel: versions, signatures, stock-TF-Serving compatibility, bad input."""

import gzip
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import REPO, UNICODE_SEPARATORS, padded, run_cli, smoke_train_args
from nmt_tf import config as nmt_config
from nmt_tf.config import ExportConfig
from nmt_tf.core import custom_gradients
from nmt_tf.data.text import with_eos
from nmt_tf.exporting import saved_model as exporter
from nmt_tf.inference import search
from nmt_tf.inference.restore import restore_model
from nmt_tf.inference.saved_models import METADATA_FORMAT, read_metadata
from nmt_tf.training import job as training

OPTIONS = search.SearchOptions(beam_size=3, n_best=2)


@pytest.fixture(scope="session")
def signatures(exported):
    loaded = tf.saved_model.load(exported[2])
    return loaded.signatures


@pytest.fixture(scope="session")
def wordpiece_export(tiny_config, tmp_path_factory):
    d = tmp_path_factory.mktemp("wordpiece")
    model_dir = str(d / "model")
    training.train(tiny_config(model_dir=model_dir, tokenizer="wordpiece", max_steps=2), log=lambda *a: None)
    return exporter.export(model_dir, str(d / "export"), ExportConfig(OPTIONS), log=lambda *a: None)


@pytest.fixture(scope="session")
def sentencepiece_export(tiny_config, tmp_path_factory):
    """(model directory, export) of a tiny --tokenizer=sentencepiece model (joint, unigram,
    one embedding matrix for both sides and the output layer, as the shipped model),
    trained with subword sampling (--sentencepiece_alpha), which the export must not keep."""
    d = tmp_path_factory.mktemp("sentencepiece")
    model_dir = str(d / "model")
    training.train(tiny_config(model_dir=model_dir, tokenizer="sentencepiece", joint_vocabulary=True,
                            src_vocab_size=150, tgt_vocab_size=150, sentencepiece_alpha=0.1, max_steps=2,
                            tied_embeddings="all", maxout_size=16),
                log=lambda *a: None)
    # Long enough for every Multi30k val sentence in tiny pieces (none cut).
    return model_dir, exporter.export(model_dir, str(d / "export"), ExportConfig(OPTIONS, max_input_length=400),
                                      log=lambda *a: None)


@pytest.fixture(scope="session")
def sentencepiece_signatures(sentencepiece_export):
    return tf.saved_model.load(sentencepiece_export[1]).signatures


def test_sentencepiece_tokens_are_the_same_in_tf_data_and_in_the_export(sentencepiece_export,
                                                                        sentencepiece_signatures):
    """Multi30k val through the training pipeline and through the exported
    graph: the same pieces (the best segmentation, though the model was
    trained on sampled ones); the SentencePiece model files are assets."""
    from nmt_tf.data import pipeline as data

    model_dir, path = sentencepiece_export
    assert sorted(os.listdir(os.path.join(path, "assets"))) == [
        "sentencepiece.src.model", "sentencepiece.tgt.model", "vocab.src.txt", "vocab.tgt.txt"]
    assert nmt_config.load(model_dir).sentencepiece_alpha == 0.1
    src_tok, tgt_tok = data.load_tokenizers(nmt_config.load(model_dir), model_dir)
    src, tgt = (os.path.join(REPO, "data", "multi30k", f"val.{lang}.gz") for lang in ("en", "fr"))
    pipeline = data.make_dataset(src, tgt, src_tok, tgt_tok, max_len=1000, batch_size=1, pool_size=1)
    source_ids = [x["source_ids"][0].numpy().tolist() for x, _ in pipeline]
    with open(src, "rb") as f:
        import gzip

        lines = gzip.decompress(f.read()).decode("utf-8").splitlines()
    assert len(source_ids) == len(lines) == 1014
    out = sentencepiece_signatures["serving_default"](text=tf.constant(lines))
    vocab = {piece: i for i, piece in enumerate(src_tok.vocabulary)}
    exported = [[vocab.get(t.decode(), 1) for t in row if t] for row in out["source_tokens"].numpy()]
    assert not out["truncated"].numpy().any() and exported == source_ids
    assert sum(len(r) for r in exported) > 1.2 * sum(len(l.split()) + 1 for l in lines)   # pieces, not words


def test_the_host_tokenizer_gives_the_exports_pieces_without_tensorflow(sentencepiece_export,
                                                                     sentencepiece_signatures):
    """nmt_tf.inference.host_text cleans and cuts a line as the exported graph does, with
    SentencePiece's own library on the export's model file: the same pieces for
    Multi30k val and for lines of control characters, Unicode spaces and
    invalid UTF-8; the server's work limit counts them (serving.SearchCost)."""
    from nmt_tf.inference import host_text
    from nmt_tf.serving import versions as serving

    path = sentencepiece_export[1]
    with gzip.open(os.path.join(REPO, "data", "multi30k", "val.en.gz"), "rb") as f:
        lines = f.read().splitlines()
    lines += [b"  two\xc2\xa0dogs\xe2\x80\xa8run\x07  fast ", b"caf\xe9 au lait", b"zero\xe2\x80\x8bwidth", b"\xef\xbb\xbfA dog",
              b"tab\tand\r\nnew line", b"", b"   ", "日本語のテキスト 🙂".encode()]
    out = sentencepiece_signatures["serving_default"](text=tf.constant(lines))
    graph = [[t.decode() for t in row if t][:-1] for row in out["source_tokens"].numpy()]     # [EOS] left out
    pieces = host_text.SentencePieceSource(os.path.join(path, "assets", "sentencepiece.src.model"))
    assert [pieces.pieces(line) for line in lines] == graph
    cost = serving.SearchCost.of(path)
    assert isinstance(cost.counter, host_text.SentencePieceSource)
    assert [cost.counter.count(line, 400) for line in lines] == [len(row) for row in graph]
    assert cost.counter.count(b"word " * 10000, 7) == 7


def test_versions_are_numbered_and_written_atomically(exported, tmp_path):
    model_dir, base, path = exported
    assert path == os.path.join(base, "1")
    for name in ("saved_model.pb", "variables", "assets/vocab.src.txt", "assets/vocab.tgt.txt",
                 "assets.extra/tf_serving_warmup_requests"):
        assert os.path.exists(os.path.join(path, name)), name
    copy = str(tmp_path / "nmt")
    shutil.copytree(base, copy)
    # A killed export's temporary folder (its process gone) is removed; a running one's is kept.
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale, running = f".tmp-5-{int(gone.stdout)}", f".tmp-6-{os.getpid()}"
    for name in (stale, running):
        os.makedirs(os.path.join(copy, name, "variables"))
    registered = custom_gradients.registered()
    second = exporter.export(model_dir, copy, ExportConfig(OPTIONS), log=lambda *a: None)
    assert second == os.path.join(copy, "2")
    assert custom_gradients.registered() == registered       # its traced graphs can go (nmt_tf.core.custom_gradients)
    assert sorted(os.listdir(copy)) == [running, "1", "2"]   # no temporary folder of its own left behind
    with pytest.raises(FileExistsError):      # refused before the model is loaded
        exporter.export(str(tmp_path / "no-such-model"), copy, ExportConfig(OPTIONS), version=2, log=lambda *a: None)
    with pytest.raises(FileNotFoundError):    # a model that cannot be loaded: no empty --export_dir is left
        exporter.export(str(tmp_path / "no-such-model"), str(tmp_path / "new-exports"), ExportConfig(OPTIONS),
                        log=lambda *a: None)
    assert not os.path.exists(tmp_path / "new-exports")


def test_translate_signature_outputs(signatures):
    out = signatures["serving_default"](text=tf.constant(["A man in a blue shirt.", "Two dogs run."]))
    assert out["translation"].shape == (2,) and out["translation"].dtype == tf.string
    assert out["score"].shape == (2,) and out["log_prob"].shape == (2,)
    assert out["nbest_translations"].shape == (2, 2) and out["nbest_scores"].shape == (2, 2)
    src, tgt, align = out["source_tokens"].numpy(), out["target_tokens"].numpy(), out["alignment"].numpy()
    assert list(src[0][:8]) == [b"A", b"man", b"in", b"a", b"blue", b"shirt", b".", b"[EOS]"]
    assert align.shape == (2, tgt.shape[1], src.shape[1])
    for i in range(2):
        n_tgt, n_src = int((tgt[i] != b"").sum()), int((src[i] != b"").sum())
        assert tgt[i][n_tgt - 1] == b"[EOS]"
        np.testing.assert_allclose(align[i, :n_tgt, :n_src].sum(-1), 1.0, rtol=1e-5)
        assert np.all(align[i, n_tgt:] == 0)
    scores = out["nbest_scores"].numpy()
    assert np.all(scores[:, 0] >= scores[:, 1])
    assert out["score"].numpy()[0] == pytest.approx(scores[0, 0])


def test_translation_equals_the_python_search(exported, signatures):
    model, src_tok, tgt_tok = restore_model(exported[0], log=lambda *a: None)[:3]
    text = tf.constant(["A man in a blue shirt."])
    ids = src_tok.encode(text).to_tensor()
    ids = tf.concat([ids, tf.fill([1, 1], 3)], axis=1)
    out = search.search(model, ids, OPTIONS)
    want = tgt_tok.decode(out["tokens"][:, 0])
    got = signatures["serving_default"](text=text)
    assert got["translation"].numpy()[0] == want.numpy()[0]
    assert got["score"].numpy()[0] == pytest.approx(float(out["scores"][0, 0]), rel=1e-5)


def test_translate_with_options_searches_with_the_requests_settings(exported, signatures):
    """translate_with_options: left out, a setting is the export's (the
    outputs of translate, exactly); given, the search is the Python search
    at that beam, n-best and length alpha; out of range, one error naming
    the setting and its bound (issue 91)."""
    import dataclasses

    from nmt_tf.inference.translation_graph import failed_check_text

    text = tf.constant(["A man in a blue shirt.", "Two dogs run.", ""])
    with_options = signatures["translate_with_options"]
    from tensorflow.python.saved_model import loader_impl

    signature_def = loader_impl.parse_saved_model(exported[2]).meta_graphs[0].signature_def["translate_with_options"]
    assert {alias: tf.make_ndarray(value).item() for alias, value in signature_def.defaults.items()} == {
        "beam_size": 3, "n_best": 0, "length_alpha": 1.0}          # TF Serving and nmt_tf.serve fill these in
    defaults = with_options(text=text, **{alias: tf.constant(tf.make_ndarray(value))
                                          for alias, value in signature_def.defaults.items()})
    plain = signatures["translate"](text=text)
    assert set(defaults) == set(plain)
    for alias in plain:
        np.testing.assert_array_equal(defaults[alias].numpy(), plain[alias].numpy())
    model, src_tok, tgt_tok = restore_model(exported[0], log=lambda *a: None)[:3]
    ids = tf.concat([src_tok.encode(text[:2]).to_tensor(), tf.fill([2, 1], 3)], axis=1)
    for beam, asked, alpha in ((1, 0, 1.0), (2, 2, 0.0), (3, 3, 0.6), (3, 0, 1.0)):
        n_best = asked or min(OPTIONS.n_best, beam)        # 0: the export's, at most the beam
        options = dataclasses.replace(OPTIONS, beam_size=beam, n_best=n_best, length_alpha=alpha)
        want = search.search(model, ids, options)
        got = with_options(text=text[:2], beam_size=tf.constant(beam), n_best=tf.constant(asked),
                           length_alpha=tf.constant(alpha))
        assert got["nbest_translations"].shape == (2, n_best)
        for rank in range(n_best):
            assert list(got["nbest_translations"].numpy()[:, rank]) == list(
                tgt_tok.decode(want["tokens"][:, rank]).numpy())
        np.testing.assert_allclose(got["nbest_scores"].numpy(), want["scores"].numpy(), rtol=1e-5)
    for settings, message in (((4, 1, 1.0), "beam_size must be at most 3, the widest beam of this export"),
                              ((0, 1, 1.0), "beam_size must be at least 1"),
                              ((2, 3, 1.0), "n_best must be at most beam_size"),
                              ((2, -1, 1.0), "n_best must be at least 1 (or 0: the n-best of the export"),
                              ((2, 1, -1.0), "length_alpha must be at least 0"),
                              ((2, 1, 11.0), "length_alpha must be at most 10")):
        beam, n_best, alpha = settings
        with pytest.raises(tf.errors.InvalidArgumentError) as error:
            with_options(text=text, beam_size=tf.constant(beam), n_best=tf.constant(n_best),
                         length_alpha=tf.constant(alpha))
        assert failed_check_text(error.value.message).startswith(message), error.value.message


PREFIXES = ["Un homme", "", "Deux  chiens Zyxwvq ", "Un homme, en 3 mots"]


@pytest.mark.parametrize("which", ["word", "sentencepiece"])
def test_translate_constrained_starts_with_the_target_prefix_byte_for_byte(which, request):
    """Every n-best translation starts with its prefix as given (without
    trailing whitespace; double spaces and words outside the vocabulary
    kept); no prefix gives serving_default's outputs exactly."""
    loaded = request.getfixturevalue("signatures" if which == "word" else "sentencepiece_signatures")
    text = tf.constant(["A man in a blue shirt.", "Two dogs run.", "Two dogs play in the snow.", "A man."])
    none = tf.constant([""] * 4)
    out = loaded["translate_constrained"](text=text, target_prefix=tf.constant(PREFIXES), required_terms=none)
    for i, prefix in enumerate(PREFIXES):
        for translation in out["nbest_translations"].numpy()[i]:
            assert translation.decode().startswith(prefix.rstrip()), (prefix, translation)
    plain = loaded["serving_default"](text=text)
    free = loaded["translate_constrained"](text=text, target_prefix=none, required_terms=none)
    for key in plain:
        np.testing.assert_array_equal(plain[key].numpy(), free[key].numpy())
    assert out["translation"].numpy()[1] == plain["translation"].numpy()[1]
    with pytest.raises(tf.errors.InvalidArgumentError, match="same number of sentences"):
        loaded["translate_constrained"](text=text, target_prefix=tf.constant(["Un"]), required_terms=none)
    if which == "word":
        # Issue 95: a prefix over max_input_length tokens (20 in this export) is cut there and says so
        # (truncated was false); the translation starts with the prefix as cut, not the user's whole text.
        long_prefix = " ".join(["Un"] * 24 + ["chien"])
        cut = loaded["translate_constrained"](text=text[:1], target_prefix=tf.constant([long_prefix]),
                                              required_terms=none[:1])
        assert cut["truncated"].numpy()[0] and not plain["truncated"].numpy()[0]
        kept = cut["translation"].numpy()[0].decode()
        assert kept.startswith(" ".join(["Un"] * 20)) and not kept.startswith(long_prefix), kept


TERMS = ["chien", "", "homme\tsnow ||| neige", " chemise bleue \t\t"]      # a term with its source words (issue 93)


@pytest.mark.parametrize("which", ["word", "sentencepiece"])
def test_translate_constrained_translations_hold_every_required_term(which, request):
    """Tab-separated terms, blanks ignored, one or two words each, with or
    without a prefix and with or without their source words: every n-best
    translation contains each term."""
    from nmt_tf.inference.glossary import target_of

    loaded = request.getfixturevalue("signatures" if which == "word" else "sentencepiece_signatures")
    text = tf.constant(["A man in a blue shirt.", "Two dogs run.", "Two dogs play in the snow.", "A man."])
    out = loaded["translate_constrained"](text=text, target_prefix=tf.constant(["", "", "Deux", ""]),
                                          required_terms=tf.constant(TERMS))
    found = out["nbest_scores"].numpy() > -1e8
    assert out["terms_met"].numpy().all() and (out["nbest_terms_met"].numpy() == found).all()
    for i, terms in enumerate(TERMS):
        for translation, score in zip(out["nbest_translations"].numpy()[i], out["nbest_scores"].numpy()[i]):
            if score > -1e8:
                assert all(target_of(term) in translation.decode() for term in terms.split("\t")), translation
                assert "|||" not in translation.decode() and "snow" not in translation.decode()
    assert out["terms_spellable"].numpy().all()   # the word model writes its unknown "neige" as the term's text
    with pytest.raises(tf.errors.InvalidArgumentError, match="more than 16 required terms"):
        loaded["translate_constrained"](text=text[:1], target_prefix=tf.constant([""]),
                                        required_terms=tf.constant(["\t".join(["chien"] * 17)]))
    # Issue 95: terms the target vocabulary cannot spell ([UNK] tokens, a control character) are left out
    # of the search, with terms_met false: "日本語", "🙂🙂" and "ЖжЖ" were all "met" by one repeated [UNK].
    # (A word model writes one unknown word as the term's own text; a second one in the sentence is refused.)
    foreign = loaded["translate_constrained"](
        text=tf.constant(["A man.", "A man."]), target_prefix=tf.constant(["", ""]),
        required_terms=tf.constant(["日本語\t🙂🙂\tЖжЖ", "chi\x07en"]))
    assert not foreign["terms_met"].numpy().any() and not foreign["terms_spellable"].numpy().any()
    assert not foreign["nbest_terms_met"].numpy().any()
    translations = [t.decode() for t in foreign["translation"].numpy()]
    assert translations[0].count("日本語") <= 1 and "🙂" not in translations[0] and "Ж" not in translations[0]


def test_mixed_bfloat16_export_computes_in_bfloat16_and_equals_the_python_search_in_it(exported, tmp_path):
    """--mixed_precision for an export: the frozen step matrices are bfloat16,
    the metadata says so, and the signature translates as the in-process search
    of the model restored in the same policy; restoring leaves Keras' global
    policy as it was and, by default, builds float32 whatever the global policy."""
    import keras

    model_dir = exported[0]
    path = exporter.export(model_dir, str(tmp_path / "bf16"),
                           ExportConfig(OPTIONS, precision="mixed_bfloat16", max_input_length=20), log=lambda *a: None)
    assert read_metadata(path)["precision"] == "mixed_bfloat16"
    loaded = tf.saved_model.load(path)
    frozen = [v for v in loaded.step_weights if v.dtype != tf.float32]
    assert frozen and all(v.dtype == tf.bfloat16 for v in frozen)
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    try:
        assert restore_model(model_dir, log=lambda *a: None).model.compute_dtype == "float32"
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    model, src_tok, tgt_tok = restore_model(model_dir, log=lambda *a: None, precision="mixed_bfloat16")[:3]
    assert model.compute_dtype == "bfloat16" and keras.mixed_precision.dtype_policy().name == "float32"
    text = tf.constant(["A man in a blue shirt.", "Two dogs run ."])
    ids = with_eos(src_tok.encode(text)).to_tensor()
    want = tgt_tok.decode(search.search(model, ids, OPTIONS)["tokens"][:, 0])
    got = loaded.signatures["serving_default"](text=text)
    assert got["translation"].numpy().tolist() == want.numpy().tolist()


def test_a_cgru_model_exports_and_its_signatures_equal_the_python_search_and_forced_decoding(tiny_config, tmp_path):
    """--decoder=cgru with a deep transition (and layer_norm, so that every
    weight they add is frozen): the frozen step matrices and token products
    hold the transition GRUs', and both signatures give what the restored
    model gives in Python."""
    model_dir = str(tmp_path / "model")
    training.train(tiny_config(model_dir=model_dir, decoder="cgru", decoder_transition_depth=3, layer_norm=True,
                               max_steps=3), log=lambda *a: None)
    loaded = tf.saved_model.load(exporter.export(model_dir, str(tmp_path / "export"),
                                                 ExportConfig(OPTIONS, max_input_length=20), log=lambda *a: None))
    model, src_tok, tgt_tok = restore_model(model_dir, log=lambda *a: None)[:3]
    assert model.decoder.transition.built and model.decoder.gru_3.built
    text = tf.constant(["A man in a blue shirt.", "Two dogs run ."])
    ids = with_eos(src_tok.encode(text)).to_tensor()
    want = search.search(model, ids, OPTIONS)
    got = loaded.signatures["serving_default"](text=text)
    assert got["translation"].numpy().tolist() == tgt_tok.decode(want["tokens"][:, 0]).numpy().tolist()
    np.testing.assert_allclose(got["score"].numpy(), want["scores"][:, 0].numpy(), rtol=1e-5)
    target = tf.constant(["Un homme en bleu.", "Deux chiens courent."])
    tgt = tgt_tok.encode(target).to_list()
    x = {"source_ids": ids.numpy(), "target_ids": padded([[2] + t for t in tgt])}
    want_log_prob = tf.reduce_sum(model.target_log_probs(x, padded([t + [3] for t in tgt])), axis=-1)
    np.testing.assert_allclose(loaded.signatures["score"](source=text, target=target)["log_prob"].numpy(),
                               want_log_prob.numpy(), rtol=1e-5)


def test_score_signature_is_forced_decoding(exported, signatures):
    model, src_tok, tgt_tok = restore_model(exported[0], log=lambda *a: None)[:3]
    out = signatures["score"](source=tf.constant(["A man.", "Two dogs run ."]),
                              target=tf.constant(["Un homme.", "Deux chiens courent."]))
    tgt = tgt_tok.encode(tf.constant(["Un homme."])).to_list()[0]
    src = src_tok.encode(tf.constant(["A man."])).to_list()[0] + [3]
    x = {"source_ids": np.array([src], "int32"), "target_ids": np.array([[2] + tgt], "int32")}
    want = float(tf.reduce_sum(model.target_log_probs(x, np.array([tgt + [3]], "int32"))))
    assert out["log_prob"].numpy()[0] == pytest.approx(want, rel=1e-5)
    assert out["target_length"].numpy().tolist() == [len(tgt) + 1, 5]
    np.testing.assert_allclose(out["log_prob_per_token"].numpy(),
                               out["log_prob"].numpy() / out["target_length"].numpy(), rtol=1e-6)
    np.testing.assert_allclose(out["token_log_probs"].numpy().sum(1), out["log_prob"].numpy(), rtol=1e-5)


def test_bad_inputs_get_proper_results(signatures):
    translate = signatures["serving_default"]
    long_input = " ".join(["word"] * 1000)
    out = translate(text=tf.constant([b"", b"   \t ", long_input.encode(), b"caf\xe9 \xff\xfe ok", b"Hello ."]))
    translations = out["translation"].numpy()
    assert translations[0] == b"" and translations[1] == b""
    assert out["score"].numpy()[0] == 0.0
    assert out["truncated"].numpy().tolist() == [False, False, True, False, False]
    assert int((out["source_tokens"].numpy()[2] != b"").sum()) == 21        # 20 tokens + [EOS]
    assert "\ufffd" in b" ".join(out["source_tokens"].numpy()[3]).decode("utf-8")
    # Lines of Unicode separators only (U+00A0, U+3000, U+2028, ... each, and all at once) are empty too.
    separators = translate(text=tf.constant(UNICODE_SEPARATORS + ["".join(UNICODE_SEPARATORS)]))
    assert set(separators["translation"].numpy().tolist()) == {b""}
    assert set(separators["score"].numpy().tolist()) == {0.0}
    empty = translate(text=tf.constant([], tf.string))
    assert empty["translation"].shape == (0,) and empty["alignment"].shape[0] == 0
    scored = signatures["score"](source=tf.constant([], tf.string), target=tf.constant([], tf.string))
    assert scored["log_prob"].shape == (0,)


@pytest.mark.parametrize("which", ["word", "wordpiece", "sentencepiece"])
def test_fresh_process_with_only_tensorflow_runs_both_signatures(which, request):
    """Nothing but TensorFlow (and tensorflow-text's op libraries, as TF Serving links them):
    keras, keras_hub and nmt_tf imports are refused."""
    path = {"word": lambda: request.getfixturevalue("exported")[2],
            "wordpiece": lambda: request.getfixturevalue("wordpiece_export"),
            "sentencepiece": lambda: request.getfixturevalue("sentencepiece_export")[1]}[which]()
    result = run_cli(os.path.join(REPO, "tests", "load_with_tensorflow_only.py"), path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "translation ok" in result.stdout and "score ok" in result.stdout
    assert "session ok" in result.stdout          # loaded like tensorflow_model_server loads it
    assert "imported: []" in result.stdout


def _op_types(saved_model_dir):
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(saved_model_dir, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    ops = set()
    for meta_graph in proto.meta_graphs:
        ops |= {node.op for node in meta_graph.graph_def.node}
        for function in meta_graph.graph_def.library.function:
            ops |= {node.op for node in function.node_def}
    functions = {f.signature.name for mg in proto.meta_graphs for f in mg.graph_def.library.function}
    return ops - functions      # calls of library functions are not ops


def _unregistered(ops) -> dict:
    """{"core": the ops a fresh process with only TensorFlow imported does not
    know, "text": those it still does not know after `import tensorflow_text`}."""
    code = ("import sys, tensorflow as tf\n"
            "from tensorflow.python.framework import op_def_registry\n"
            "def unknown(): return ' '.join(o for o in sys.argv[1:] if op_def_registry.get(o) is None)\n"
            "print(unknown())\n"
            "import tensorflow_text\n"
            "print(unknown())\n")
    result = subprocess.run([sys.executable, "-c", code, *sorted(ops)], capture_output=True, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert result.returncode == 0, result.stderr[-2000:]
    core, text = result.stdout.split("\n")[:2]
    return {"core": set(core.split()), "text": set(text.split())}


@pytest.fixture(scope="module")
def unregistered(exported, wordpiece_export, sentencepiece_export):
    """`_unregistered` of the three exports' ops: one fresh process for the three."""
    return _unregistered(set().union(*(_op_types(p) for p in (exported[2], wordpiece_export,
                                                              sentencepiece_export[1]))))


def test_word_model_uses_only_core_tensorflow_ops(exported, unregistered):
    ops = _op_types(exported[2])
    # The graph really holds the in-graph text processing and the search loop.
    assert {"StaticRegexReplace", "RegexReplace"} & ops and {"While", "StatelessWhile"} & ops, ops
    assert ops & unregistered["core"] == set()


def test_wordpiece_model_needs_only_tensorflow_text_ops_that_tf_serving_links(wordpiece_export, unregistered):
    ops = _op_types(wordpiece_export)
    not_core = ops & unregistered["core"]
    assert not_core, "the WordPiece export should use tensorflow-text ops"
    assert ops & unregistered["text"] == set()          # all are tensorflow-text ops
    assert not_core <= {"FastWordpieceTokenizeWithOffsets", "FastWordpieceDetokenize"}, not_core


def test_sentencepiece_model_needs_only_tensorflow_text_ops_that_tf_serving_links(sentencepiece_export,
                                                                                 unregistered):
    ops = _op_types(sentencepiece_export[1])
    not_core = ops & unregistered["core"]
    assert ops & unregistered["text"] == set()
    assert not_core == {"SentencepieceOp", "SentencepieceTokenizeOp"}, not_core


def test_saved_model_cli_shows_everything_and_runs(exported):
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    result = subprocess.run([cli, "show", "--dir", exported[2], "--all"], capture_output=True, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert result.returncode == 0, result.stderr[-2000:]
    for text in ("signature_def['serving_default']", "signature_def['score']", "inputs['text']",
                 "outputs['translation']", "outputs['alignment']", "inputs['source']", "outputs['log_prob']"):
        assert text in result.stdout, text
    # `run` loads through a TF1 session and the saver's restore op, as the model server does.
    result = subprocess.run([cli, "run", "--dir", exported[2], "--tag_set", "serve", "--signature_def",
                             "score", "--input_exprs", 'source=["A man."];target=["Un homme."]'],
                            capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Result for output key log_prob:" in result.stdout


def test_warmup_record_is_a_predict_request_that_runs(exported, signatures):
    from tensorflow_serving.apis import prediction_log_pb2

    path = os.path.join(exported[2], "assets.extra", "tf_serving_warmup_requests")
    records = list(tf.data.TFRecordDataset(path).as_numpy_iterator())
    assert len(records) == 1
    log = prediction_log_pb2.PredictionLog.FromString(records[0])
    request = log.predict_log.request
    assert request.model_spec.signature_name == "serving_default"
    text = tf.make_ndarray(request.inputs["text"])
    out = signatures[request.model_spec.signature_name](text=tf.constant(text))
    assert out["translation"].shape == (len(text),)


def test_export_cli_errors(tmp_path):
    result = run_cli("-m", "nmt_tf.export", f"--model_dir={tmp_path}", f"--export_dir={tmp_path / 'e'}")
    assert result.returncode == 1 and "config.json not found" in result.stderr
    result = run_cli("-m", "nmt_tf.export", f"--model_dir={tmp_path}", f"--export_dir={tmp_path / 'e'}",
                     "--nofreeze_step_weights", "--freeze_token_products")
    assert result.returncode == 1 and "--freeze_token_products needs --freeze_step_weights" in result.stderr


def test_a_flagfile_from_before_the_typed_configuration_trains_exports_and_translates(tiny_corpus, tmp_path):
    """The commands as a user runs them, with pipelines/smoke.flags as it was
    before the configuration became typed dataclasses (43786b2, kept verbatim
    in tests/data/): train, export with search flags and [UNK] replacement,
    translate an n-best list with scores. The change was to how settings are
    held, not to what the commands take or write."""
    import json

    model_dir, export_dir = str(tmp_path / "m"), str(tmp_path / "e")
    args = smoke_train_args(tiny_corpus, model_dir, "--attention_examples=0")
    args[2] = f"--flagfile={os.path.join(REPO, 'tests', 'data', 'smoke_43786b2.flags')}"
    trained = run_cli(*args)
    assert trained.returncode == 0, trained.stdout[-2000:] + trained.stderr[-2000:]
    exported = run_cli("-m", "nmt_tf.export", f"--model_dir={model_dir}", f"--export_dir={export_dir}",
                       "--beam_size=3", "--n_best=2", "--max_input_length=20", "--replace_unk")
    assert exported.returncode == 0, exported.stderr[-2000:]
    meta = read_metadata(os.path.join(export_dir, "1"))
    assert meta["search"]["beam_size"] == 3 and meta["max_input_length"] == 20 and meta["replace_unk"]
    assert meta["precision"] == "float32" and meta["checkpoint"].endswith("best-2")     # 40 pairs: 32 + 8
    assert meta["format_version"] == METADATA_FORMAT and not os.path.isabs(meta["checkpoint"])
    newer = tmp_path / "newer"
    (newer / "assets.extra").mkdir(parents=True)
    (newer / "assets.extra" / "nmt_tf.json").write_text(json.dumps({**meta, "format_version": METADATA_FORMAT + 1}))
    with pytest.raises(ValueError, match="written by a newer nmt_tf .* upgrade nmt_tf"):
        read_metadata(str(newer))
    (tmp_path / "in.en").write_text("A man is walking his dog.\nTwo children are playing.\n")
    done = run_cli("-m", "nmt_tf.translate", f"--saved_model={os.path.join(export_dir, '1')}",
                   f"--input={tmp_path / 'in.en'}", "--n_best=2", "--with_scores")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(lines) == 2 and all(len(line["nbest"]) >= 1 and "score" in line for line in lines)


# --- LiteRT (nmt_tf.exporting.litert, nmt_tf.inference.litert_runtime) ------------------------------------------------------


@pytest.fixture(scope="session")
def litert_export(sentencepiece_export, tmp_path_factory):
    """The tiny SentencePiece model as a float32 LiteRT folder, with the SavedModel's search settings."""
    from nmt_tf.exporting import litert as lite

    model_dir, _ = sentencepiece_export
    return lite.export_litert(model_dir, str(tmp_path_factory.mktemp("litert") / "nmt"),
                              ExportConfig(OPTIONS, max_input_length=400), weights="float32", log=lambda *a: None)


def _litert_agrees(got: dict, want: dict, lines, client=None, score_fn=None, targets=None) -> None:
    """LiteRTClient's outputs against a SavedModel's on `lines`. The numbers
    first, free of search ties: with `client`, `score_fn` and `targets` (the
    lines' references), both runtimes score every pair by forced decoding, and
    the token log-probabilities agree to rounding at every step. Then the search: the
    same n-best translations on >= 2/3 of the lines, and on those the same
    tokens, scores and alignments to rounding. (This model has had two updates,
    with sampled segmentations that differ from run to run: it is nearly
    uniform, and its near ties let XNNPACK's and TensorFlow's rounding part the
    beams on some lines, more on some CPUs: 77 of 103 agreed on one CI machine.
    The shipped model's float32 LiteRT gives the SavedModel's translation on
    every line of test 2016: BUILD_NOTES.md.)"""
    want = {name: value.numpy() for name, value in want.items()}
    if client is not None:
        forced = client.score(source=lines, target=targets)
        reference = {name: value.numpy() for name, value in score_fn(source=tf.constant(lines),
                                                                      target=tf.constant(targets)).items()}
        assert forced["target_length"].mean() > 10
        np.testing.assert_array_equal(forced["target_length"], reference["target_length"])
        steps = forced["token_log_probs"].shape[1]
        np.testing.assert_allclose(forced["token_log_probs"], reference["token_log_probs"][:, :steps], atol=2e-4)
    same = [i for i in range(len(lines)) if list(got["nbest_translations"][i]) == list(want["nbest_translations"][i])]
    assert len(same) >= 2 / 3 * len(lines), len(same)
    np.testing.assert_allclose(got["nbest_scores"][same], want["nbest_scores"][same], atol=2e-4)
    assert (got["truncated"] == want["truncated"]).all()
    for i in same:
        assert list(got["source_tokens"][i]) == list(want["source_tokens"][i])
        steps = got["alignment"].shape[1]
        assert list(got["target_tokens"][i]) == list(want["target_tokens"][i][:steps])
        np.testing.assert_allclose(got["alignment"][i], want["alignment"][i][:steps], atol=2e-4)


def test_the_litert_model_translates_as_the_saved_model(sentencepiece_export, litert_export, sentencepiece_signatures,
                                                        tmp_path):
    """Multi30k val through the SavedModel and through the LiteRT folder (host
    tokenization, encoder and step signatures, the search in NumPy), at the
    export's beam 3 and greedy: the same translations, tokens, scores and
    alignments; empty and odd lines as the SavedModel answers them."""
    from nmt_tf.inference.litert_runtime import LiteRTClient, read_manifest

    manifest = read_manifest(litert_export)
    assert manifest["step_beams"] == [1, 3] and manifest["weights"] == "float32"
    assert manifest["host_embeddings"]["source"] and manifest["host_embeddings"]["target"]
    assert sorted(os.listdir(litert_export)) == ["model.tflite", "nmt_tf_litert.json", "sentencepiece.src.model",
                                                 "sentencepiece.tgt.model", "vocab.src.txt", "vocab.tgt.txt"]
    with gzip.open(os.path.join(REPO, "data", "multi30k", "val.en.gz"), "rb") as f:
        lines = f.read().splitlines()[:100] + [b"", b"   ", b"caf\xe9 \xe2\x80\xa8 au lait"]
    with gzip.open(os.path.join(REPO, "data", "multi30k", "val.fr.gz"), "rb") as f:
        references = f.read().splitlines()[:100] + [b"", b"Un homme.", b"caf\xe9 au lait"]
    client = LiteRTClient(litert_export)
    got = client(text=lines)
    _litert_agrees(got, sentencepiece_signatures["serving_default"](text=tf.constant(lines)), lines,
                   client, sentencepiece_signatures["score"], references)
    assert got["translation"][-3] == got["translation"][-2] == b"" and got["score"][-2] == 0.0
    assert got["nbest_translations"].shape == (len(lines), 2)
    greedy = exporter.export(sentencepiece_export[0], str(tmp_path / "greedy"),
                             ExportConfig(search.SearchOptions(beam_size=1, n_best=1), max_input_length=400),
                             log=lambda *a: None)
    client.options.update(beam_size=1, n_best=1)
    greedy_signatures = tf.saved_model.load(greedy).signatures
    _litert_agrees(client(text=lines), greedy_signatures["serving_default"](text=tf.constant(lines)), lines)
    # A beam of 1 builds translate_constrained too (its search lost the beam's static width before).
    constrained = greedy_signatures["translate_constrained"](text=tf.constant([b"A dog."]),
                                                             target_prefix=tf.constant([b""]),
                                                             required_terms=tf.constant([b"chien"]))
    assert constrained["nbest_translations"].shape == (1, 1)


def test_a_tied_embedding_matrix_is_stored_once_in_a_litert_model(sentencepiece_export, litert_export, tiny_config,
                                                                   tmp_path):
    """With --tied_embeddings=all the file holds E only as the output
    layer's weights: no signature gathers from a table of its own, the host
    reads the rows the manifest names (int8 too: per-row scales). An untied
    model keeps its ids and gather tables (no "host_embeddings")."""
    from ai_edge_litert.interpreter import Interpreter

    from nmt_tf.exporting import litert as lite
    from nmt_tf.inference.litert_runtime import LiteRTClient, LiteRTModel, read_manifest

    model_dir = sentencepiece_export[0]
    interpreter = Interpreter(model_path=os.path.join(litert_export, "model.tflite"))
    signatures = interpreter.get_signature_list()
    assert signatures["encode"]["inputs"] == ["source_embeddings", "source_ids"]
    assert "previous_embeddings" in signatures["step_k3"]["inputs"]
    vocab = read_manifest(litert_export)["vocab_size"]
    model = LiteRTModel(litert_export)
    shapes = {tuple(d["shape"]) for k in signatures
              for d in interpreter.get_tensor_details(interpreter.get_signature_runner(k)._subgraph_index)}
    assert (vocab, 16) not in shapes                      # no gather table of E
    embeddings = restore_model(model_dir, ExportConfig().weights, log=lambda *a: None).model.target_embedding.embeddings
    np.testing.assert_array_equal(model.embeddings(np.arange(vocab)), embeddings.numpy())
    int8 = lite.export_litert(model_dir, str(tmp_path / "int8"), ExportConfig(OPTIONS, max_input_length=400),
                              log=lambda *a: None)
    assert np.abs(LiteRTModel(int8).embeddings(np.arange(vocab)) - embeddings.numpy()).max() < 0.01
    assert LiteRTClient(int8)(text=[b"A dog runs."])["translation"].shape == (1,)
    untied_dir = str(tmp_path / "untied")
    training.train(tiny_config(model_dir=untied_dir, tokenizer="sentencepiece", joint_vocabulary=True,
                               src_vocab_size=150, tgt_vocab_size=150, max_steps=1), log=lambda *a: None)
    untied = lite.export_litert(untied_dir, str(tmp_path / "untied_lite"), ExportConfig(OPTIONS, max_input_length=400),
                                weights="float32", log=lambda *a: None)
    assert "host_embeddings" not in read_manifest(untied)
    assert "previous_ids" in Interpreter(model_path=os.path.join(untied, "model.tflite")).get_signature_list()[
        "step_k1"]["inputs"]
    lines = [b"A dog runs.", b"Two men are sitting on a bench."]
    want = tf.saved_model.load(exporter.export(untied_dir, str(tmp_path / "untied_sm"),
                                               ExportConfig(OPTIONS, max_input_length=400), log=lambda *a: None))
    _litert_agrees(LiteRTClient(untied)(text=lines), want.signatures["serving_default"](text=tf.constant(lines)),
                   lines)


def test_the_device_loop_of_docs_litert_runs_on_an_exported_folder(litert_export, tmp_path):
    """docs/litert.md's greedy loop ("Running the folder on a device"), as
    printed there, on a folder of a tied model: it runs and prints a line."""
    text = open(os.path.join(REPO, "docs", "litert.md"), encoding="utf-8").read()
    start = text.index("```python\nimport json, math") + len("```python\n")
    code = text[start:text.index("```", start)]
    assert 'folder = "lite/1"' in code
    script = tmp_path / "device.py"
    script.write_text(code.replace('folder = "lite/1"', f"folder = {litert_export!r}"), encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(done.stdout.splitlines()) == 1


def test_translating_with_litert_imports_no_tensorflow(litert_export, tmp_path):
    """translate --runtime=litert --litert_model, in a fresh process, writes one
    line per input line and never imports TensorFlow; so does the API's client."""
    source = tmp_path / "in.en"
    source.write_text("A dog runs.\nTwo men sit on a bench.\n\n")
    code = ("import runpy, sys\n"
            f"sys.argv = ['translate', '--runtime=litert', '--litert_model={litert_export}', '--input={source}']\n"
            "try:\n    runpy.run_module('nmt_tf.translate', run_name='__main__')\n"
            "except SystemExit as e:\n    assert not e.code, e.code\n"
            "from nmt_tf.inference.litert_runtime import LiteRTClient\n"
            f"assert LiteRTClient({litert_export!r})(text=[b'A cat.'])['translation'].shape == (1,)\n"
            "print('tensorflow' in sys.modules, file=sys.stderr)\n")
    done = run_cli("-c", code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == "False"
    assert len(done.stdout.splitlines()) == 3 and done.stdout.splitlines()[2] == ""


def test_a_litert_search_is_chosen_per_client_and_checked(litert_export, tmp_path):
    """The host runs a LiteRT model's search: beam, n-best and length
    penalty per client (the API's keywords, translate's flags with
    --runtime=litert), each checked with its bound named; a SavedModel
    still refuses them."""
    import nmt_tf
    from nmt_tf.inference.litert_runtime import LiteRTClient

    lines = [b"A dog runs in the snow.", b"Two men sit on a bench."]
    greedy = LiteRTClient(litert_export)
    greedy.options.update(beam_size=1, n_best=1)
    translator = nmt_tf.Translator.from_litert(litert_export, beam_size=1, n_best=1)
    assert [t.text for t in translator.translate([l.decode() for l in lines])] == [
        t.decode() for t in greedy(text=lines)["translation"]]
    wide = LiteRTClient(litert_export, search={"beam_size": 4, "n_best": 4, "length_alpha": 0.6})
    assert wide(text=lines)["nbest_translations"].shape == (2, 4)           # beam 4: no step_k4, rows of step_k1
    for search, message in (({"beam_size": 0}, "beam_size 0: from 1 to 64"),
                            ({"beam_size": 2, "n_best": 3}, r"n_best 3: from 1 to the beam size \(2\)"),
                            ({"length_penalty": "none"}, "length_penalty 'none': average or gnmt"),
                            ({"max_length": 5}, "max_length: not a search setting")):
        with pytest.raises(ValueError, match=message):
            LiteRTClient(litert_export, search=search)
    source = tmp_path / "in.en"
    source.write_bytes(b"\n".join(lines) + b"\n")
    done = run_cli("-m", "nmt_tf.translate", "--runtime=litert", f"--litert_model={litert_export}",
                   f"--input={source}", "--beam_size=2", "--n_best=2")
    assert done.returncode == 0, done.stderr[-2000:]
    assert [len(json.loads(line)["nbest"]) <= 2 for line in done.stdout.splitlines()] == [True, True]
    refused = run_cli("-m", "nmt_tf.translate", f"--saved_model={litert_export}", "--length_penalty=gnmt")
    assert refused.returncode == 1 and "fixed when the SavedModel was exported" in refused.stderr


def test_a_damaged_litert_folder_is_one_error_naming_the_file(litert_export, tmp_path):
    """A truncated model file, a foreign file in its place, a manifest of
    another format version, or no manifest: one LiteRTModelError naming the file."""
    from nmt_tf.inference.litert_runtime import LiteRTClient, LiteRTModelError

    def damaged(change):
        folder = tmp_path / f"copy{len(os.listdir(tmp_path))}"
        shutil.copytree(litert_export, folder)
        change(folder)
        with pytest.raises(LiteRTModelError) as e:
            LiteRTClient(str(folder))
        return str(e.value)

    def truncate(folder):
        data = (folder / "model.tflite").read_bytes()
        (folder / "model.tflite").write_bytes(data[:len(data) // 3])

    assert "model.tflite: not the file the export wrote" in damaged(truncate)

    def unchecked(change):           # without the manifest's digests, the interpreter's own refusal
        def both(folder):
            manifest = json.loads((folder / "nmt_tf_litert.json").read_text())
            manifest.pop("sha256")
            (folder / "nmt_tf_litert.json").write_text(json.dumps(manifest))
            change(folder)
        return both

    assert "model.tflite: not a usable LiteRT model" in damaged(unchecked(truncate))
    assert "model.tflite: not a usable LiteRT model" in damaged(unchecked(
        lambda f: (f / "model.tflite").write_bytes(b"PK\x03\x04 not a flatbuffer" * 100)))
    assert "vocab.tgt.txt: not the file the export wrote" in damaged(
        lambda f: (f / "vocab.tgt.txt").write_text("[PAD]\n[UNK]\n[BOS]\n[EOS]\n"))

    def other_version(folder):
        manifest = json.loads((folder / "nmt_tf_litert.json").read_text())
        (folder / "nmt_tf_litert.json").write_text(json.dumps({**manifest, "format_version": 99}))

    assert "nmt_tf_litert.json: format version 99; this nmt_tf reads versions 1, 2" in damaged(other_version)
    assert "nmt_tf_litert.json: no such file" in damaged(lambda f: (f / "nmt_tf_litert.json").unlink())
    assert "sentencepiece.src.model: missing" in damaged(lambda f: (f / "sentencepiece.src.model").unlink())


def test_the_api_translates_with_a_litert_folder(litert_export, sentencepiece_signatures):
    """Translator.from_litert: Translation objects as from a SavedModel; pairs
    scored on the host as the SavedModel's score signature scores them."""
    import nmt_tf

    translator = nmt_tf.Translator.from_litert(litert_export)
    result = translator.translate("A dog runs in the snow.")
    assert result.source_tokens[-1] == "[EOS]" and len(result.nbest) == 2
    assert result.alignment.shape == (len(result.target_tokens), len(result.source_tokens))
    assert [r.text for r in translator.translate(["A dog.", ""])][1] == ""
    with gzip.open(os.path.join(REPO, "data", "multi30k", "val.en.gz"), "rt", encoding="utf-8") as f:
        sources = f.read().splitlines()[:20] + ["", "A dog."]
    with gzip.open(os.path.join(REPO, "data", "multi30k", "val.fr.gz"), "rt", encoding="utf-8") as f:
        targets = f.read().splitlines()[:20] + ["Un chien.", ""]
    got = translator.score(sources, targets)
    want = sentencepiece_signatures["score"](source=tf.constant(sources), target=tf.constant(targets))
    np.testing.assert_array_equal([p.target_length for p in got], want["target_length"].numpy())
    np.testing.assert_allclose([p.log_prob for p in got], want["log_prob"].numpy(), rtol=1e-4, atol=1e-3)
    for pair, row in zip(got, want["token_log_probs"].numpy()):
        np.testing.assert_allclose(pair.token_log_probs, row[:pair.target_length], atol=1e-3)
    assert [p.truncated for p in got] == list(want["truncated"].numpy())
    # markup="html": the model reads the plain sentence; its tags come back once each, well-formed
    plain = translator.translate("A dog runs in the snow.")
    tagged = translator.translate(["A <b>dog</b> runs in the <i>snow</i>.<br>", "A <b>dog runs."], markup="html")
    assert tagged[0].source_tokens == plain.source_tokens and tagged[0].markup_warning is None
    assert [tagged[0].text.count(tag) for tag in ("<b>", "</b>", "<i>", "</i>", "<br>")] == [1, 1, 1, 1, 1]
    assert "never closed" in tagged[1].markup_warning
    # protect (on by default): the model reads the masks; each item comes back once, verbatim
    masked = translator.translate("A dog runs at °1° to °2°.", protect="none")
    kept = translator.translate("A dog runs at 7:30 to www.example.org.")
    assert kept.source_tokens == masked.source_tokens
    assert [kept.text.count(item) for item in ("7:30", "www.example.org")] == [1, 1] and "°" not in kept.text
    assert translator.translate("A dog runs at 7:30.", protect="none").source_tokens != masked.source_tokens


def test_nmt_tf_score_runtime_litert_writes_the_score_signatures_log_probs(litert_export, sentencepiece_signatures,
                                                                         tmp_path):
    """nmt_tf.score --runtime=litert scores pairs with a LiteRT folder: the
    SavedModel's score signature's log-probabilities (to 1e-3) and lengths;
    --runtime=litert with --saved_model is one error."""
    sources = ["A dog runs in the snow.", "Two men sit on a bench.", ""]
    targets = ["Un chien court dans la neige.", "Deux hommes sont assis.", "Un chien."]
    (tmp_path / "s").write_text("\n".join(sources) + "\n")
    (tmp_path / "t").write_text("\n".join(targets) + "\n")
    result = run_cli("-m", "nmt_tf.score", "--runtime=litert", f"--litert_model={litert_export}",
                     f"--source={tmp_path / 's'}", f"--target={tmp_path / 't'}", f"--output={tmp_path / 'o'}")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line.split("\t") for line in (tmp_path / "o").read_text().splitlines()]
    want = sentencepiece_signatures["score"](source=tf.constant(sources), target=tf.constant(targets))
    np.testing.assert_allclose([float(r[2]) for r in rows], want["log_prob"].numpy(), atol=1e-3, rtol=1e-4)
    assert [int(r[4]) for r in rows] == list(want["target_length"].numpy())
    wrong = run_cli("-m", "nmt_tf.score", "--runtime=litert", f"--saved_model={litert_export}",
                    f"--source={tmp_path / 's'}", f"--target={tmp_path / 't'}")
    assert wrong.returncode == 1 and "give exactly one of --litert_model and --preset" in wrong.stderr


def test_nmt_tf_serve_runtime_litert_answers_like_the_litert_client_without_tensorflow(litert_export, tmp_path):
    """nmt_tf.serve --runtime=litert, in a fresh process, serves a folder of
    LiteRT versions: Predict over gRPC gives LiteRTClient's outputs, REST and
    the page answer, score gives LiteRTClient.score's, GetModelMetadata shows
    serving_default and score and another signature is FAILED_PRECONDITION,
    the process never loads TensorFlow, and a damaged new version is refused
    while version 1 goes on serving."""
    import socket
    import urllib.request

    import grpc
    from tensorflow_serving.apis import (
        get_model_metadata_pb2,
        get_model_status_pb2,
        model_service_pb2_grpc,
        predict_pb2,
        prediction_service_pb2_grpc,
    )

    from conftest import start_cli, wait_until
    from nmt_tf.inference.litert_runtime import LiteRTClient

    base = tmp_path / "nmt"
    shutil.copytree(litert_export, base / "1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        rest_port = s.getsockname()[1]
    proc = start_cli("-m", "nmt_tf.serve", "--runtime=litert", f"--model_base_path={base}", "--port=0",
                     f"--rest_api_port={rest_port}", "--host=127.0.0.1", "--poll_seconds=0.2",
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        said = []
        for line in proc.stdout:
            said.append(line)
            if line.startswith("Serving model"):
                break
        assert said and said[-1].startswith("Serving model 'nmt' version 1"), "".join(said)[-3000:]
        port = int(said[-1].split(" on port ")[1].split()[0])
        with open(f"/proc/{proc.pid}/maps") as f:
            assert "tensorflow" not in f.read(), "the LiteRT server loaded TensorFlow"
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        lines = [b"A dog runs in the snow.", b"", b"Two men sit on a bench."]
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "nmt"
        request.inputs["text"].CopyFrom(tf.make_tensor_proto(lines))
        reply = stub.Predict(request, timeout=60)
        want = LiteRTClient(litert_export)(text=lines)
        assert sorted(reply.outputs) == sorted(want)
        for alias, value in want.items():
            np.testing.assert_array_equal(tf.make_ndarray(reply.outputs[alias]), value, err_msg=alias)
        assert reply.model_spec.version.value == 1 and reply.model_spec.signature_name == "serving_default"
        scoring = predict_pb2.PredictRequest()
        scoring.model_spec.name, scoring.model_spec.signature_name = "nmt", "score"
        targets = [b"Un chien court dans la neige.", b"", b"Deux hommes."]
        scoring.inputs["source"].CopyFrom(tf.make_tensor_proto(lines))
        scoring.inputs["target"].CopyFrom(tf.make_tensor_proto(targets))
        scored = stub.Predict(scoring, timeout=60)
        want_scores = LiteRTClient(litert_export).score(lines, targets)
        assert sorted(scored.outputs) == sorted(want_scores)
        for alias, value in want_scores.items():
            np.testing.assert_array_equal(tf.make_ndarray(scored.outputs[alias]), value, err_msg=alias)
        request.model_spec.signature_name = "translate_constrained"
        with pytest.raises(grpc.RpcError) as refused:
            stub.Predict(request, timeout=60)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        metadata = stub.GetModelMetadata(get_model_metadata_pb2.GetModelMetadataRequest(
            model_spec={"name": "nmt"}, metadata_field=["signature_def"]), timeout=60)
        signatures = get_model_metadata_pb2.SignatureDefMap()
        metadata.metadata["signature_def"].Unpack(signatures)
        assert sorted(signatures.signature_def) == ["score", "serving_default", "translate_with_options"]
        assert signatures.signature_def["serving_default"].outputs["nbest_translations"].tensor_shape.dim[1].size == 2
        # translate_with_options (issue 91): the host search with the request's settings; left out: the export's
        request.model_spec.signature_name = "translate_with_options"
        request.inputs["beam_size"].CopyFrom(tf.make_tensor_proto(1, dtype=tf.int32))
        greedy = stub.Predict(request, timeout=60)
        want_greedy = LiteRTClient(litert_export, search={"beam_size": 1, "n_best": 1})(text=lines)
        for alias in ("translation", "nbest_translations", "score"):
            np.testing.assert_array_equal(tf.make_ndarray(greedy.outputs[alias]), want_greedy[alias], err_msg=alias)
        del request.inputs["beam_size"]
        defaulted = stub.Predict(request, timeout=60)
        np.testing.assert_array_equal(tf.make_ndarray(defaulted.outputs["nbest_translations"]),
                                      want["nbest_translations"])
        request.inputs["beam_size"].CopyFrom(tf.make_tensor_proto(4, dtype=tf.int32))
        with pytest.raises(grpc.RpcError) as refused:
            stub.Predict(request, timeout=60)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details().startswith("beam_size must be at most 3"), refused.value.details()
        del request.inputs["beam_size"]
        body = json.dumps({"instances": ["A dog runs in the snow."]}).encode()
        rest = json.loads(urllib.request.urlopen(urllib.request.Request(
            f"http://127.0.0.1:{rest_port}/v1/models/nmt:predict", data=body), timeout=60).read())
        assert rest["predictions"][0]["translation"] == want["translation"][0].decode()
        page = urllib.request.urlopen(f"http://127.0.0.1:{rest_port}/", timeout=60).read().decode()
        assert "English" in page and "French" in page and 'data-max-beam-size="3"' in page     # the beam list
        # A damaged version 2 (its model truncated) is refused; version 1 goes on serving.
        shutil.copytree(litert_export, tmp_path / "2")
        with open(tmp_path / "2" / "model.tflite", "r+b") as f:
            f.truncate(1000)
        shutil.move(str(tmp_path / "2"), str(base / "2"))
        models = model_service_pb2_grpc.ModelServiceStub(channel)

        def states():
            status = models.GetModelStatus(get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "nmt"}),
                                           timeout=60)
            return {s.version: (s.state, s.status.error_message) for s in status.model_version_status}

        assert wait_until(lambda: 2 in states(), 30), states()
        assert states()[2][0] == get_model_status_pb2.ModelVersionStatus.END and "model.tflite" in states()[2][1]
        request.model_spec.signature_name = ""
        assert stub.Predict(request, timeout=60).model_spec.version.value == 1
        channel.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_presets_litert_model_is_built_in_a_child_process_then_found_in_the_cache(sentencepiece_export, tmp_path):
    """presets.litert_model (what translate, serve and the API call with
    --runtime=litert and --preset): the first use builds the LiteRT folder
    in a child process (python -m nmt_tf.presets --build_litert) and says
    so; the next use finds it in the cache and builds nothing."""
    from nmt_tf import presets
    from nmt_tf.inference.litert_runtime import LiteRTClient, read_manifest

    folder = str(tmp_path / "tiny_sp")
    presets.create(sentencepiece_export[0], folder, "tiny_sp", weights="last", weights_dtype="float32",
                   export_settings={"beam_size": 3, "n_best": 2, "max_input_length": 40}, log=lambda *a: None)
    cache, said = str(tmp_path / "cache"), []
    built = presets.litert_model(folder, "int8", cache, log=said.append)
    assert read_manifest(built)["weights"] == "int8" and built.endswith(os.path.join("litert-int8", "1"))
    assert any(line.startswith("Built the LiteRT model of preset tiny_sp") for line in said), said
    again = []
    assert presets.litert_model(folder, "int8", cache, log=again.append) == built and again == []
    assert LiteRTClient(built)(text=[b"A dog runs."])["nbest_translations"].shape == (1, 2)
