"""RNNencdec and the grConv encoder: equations, masking, learning, search and export."""

import keras
import numpy as np
import pytest
import reference as ref
import tensorflow as tf

from conftest import memorization_batch, memorize, padded
from nmt_tf.config import ConfigError, ExportConfig, TrainingConfig
from nmt_tf.exporting import saved_model as exporter
from nmt_tf.inference import search
from nmt_tf.inference.restore import restore_model
from nmt_tf.layers import GatedRecursiveConvolution
from nmt_tf.models.rnnencdec import RNNEncDec
from nmt_tf.training import job as training

RNG = np.random.default_rng(5)


def grconv_layer(d=4, m=3, scale=0.7):
    layer = GatedRecursiveConvolution(d)
    layer.build((None, None, m))
    for w in layer.weights:
        w.assign(RNG.normal(0, scale, size=w.shape).astype("float32"))
    return layer


def numpy_weights(layer):
    return [w.numpy().astype("float64") for w in (layer.input_kernel, layer.input_bias, layer.left_kernel,
                                                  layer.right_kernel, layer.bias, layer.left_gate_kernel,
                                                  layer.right_gate_kernel, layer.gate_bias)]


def test_grconv_levels_match_the_numpy_reference():
    layer = grconv_layer()
    xs = RNG.normal(size=(5, 3)).astype("float32")
    root, gates = layer(xs[None], np.ones((1, 5), bool), return_gates=True)
    want_root, want_levels = ref.grconv(xs.astype("float64"), *numpy_weights(layer))
    np.testing.assert_allclose(root.numpy()[0], want_root, rtol=1e-4, atol=1e-5)
    assert gates.shape == (4, 1, 4, 3)
    for t, level in enumerate(want_levels):            # level t+1 has 4 - t nodes
        np.testing.assert_allclose(gates.numpy()[t, 0, :len(level)], level, rtol=1e-4, atol=1e-6)
        assert np.all(gates.numpy()[t, 0, len(level):] == 0)


def test_grconv_mixed_length_batch_equals_each_sentence_alone():
    layer = grconv_layer()
    lengths = [5, 2, 1, 3]
    batch = np.full((4, 5, 3), 9.0, "float32")             # padding filled with garbage
    mask = np.zeros((4, 5), bool)
    sentences = []
    for i, n in enumerate(lengths):
        sentences.append(RNG.normal(size=(n, 3)).astype("float32"))
        batch[i, :n] = sentences[-1]
        mask[i, :n] = True
    roots, gates = (t.numpy() for t in layer(batch, mask, return_gates=True))
    for i, xs in enumerate(sentences):
        want_root, want_levels = ref.grconv(xs.astype("float64"), *numpy_weights(layer))
        np.testing.assert_allclose(roots[i], want_root, rtol=1e-4, atol=1e-5)
        for t in range(4):
            real = want_levels[t] if t < len(want_levels) else np.zeros((0, 3))
            np.testing.assert_allclose(gates[t, i, :len(real)], real, rtol=1e-4, atol=1e-6)
            assert np.all(gates[t, i, len(real):] == 0), (i, t)   # nodes over padding stay empty


@pytest.mark.parametrize("encoder", ["rnn", "grconv"])
def test_padding_never_changes_rnnencdec_outputs(encoder):
    model = RNNEncDec(12, 11, embedding_size=5, hidden_size=4, maxout_size=3, encoder=encoder, grconv_size=6)
    model.build()
    for w in model.weights:
        w.assign(RNG.normal(0, 0.5, size=w.shape).astype("float32"))
    sources, targets = [[5, 6, 7, 3], [8, 3], [4, 9, 10, 11, 3]], [[2, 5, 6], [2, 7, 8, 9], [2, 4]]
    batch = model({"source_ids": padded(sources), "target_ids": padded(targets)}).numpy()
    for i, (s, t) in enumerate(zip(sources, targets)):
        alone = model({"source_ids": np.array([s], "int32"), "target_ids": np.array([t], "int32")}).numpy()
        np.testing.assert_allclose(batch[i, :len(t)], alone[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("encoder", ["rnn", "grconv"])
def test_rnnencdec_overfits_20_pairs(encoder):
    keras.utils.set_random_seed(2)
    x, y = memorization_batch(RNG, lengths=(3, 7))
    model = RNNEncDec(30, 30, embedding_size=32, hidden_size=64, maxout_size=32, encoder=encoder, grconv_size=64)
    nll_per_token = memorize(model, x, y, updates=400)
    assert nll_per_token < 0.1, nll_per_token
    predicted = np.argmax(model(x).numpy(), axis=-1)
    assert np.mean(predicted[y > 0] == y[y > 0]) > 0.98


def test_paper_sized_rnnencdec_and_grconv_dry_runs():
    """Also: a dry run leaves the caller's dtype policy as it was (it used to
    set --mixed_precision=auto's for good, and every later test of the suite
    ran in bfloat16 on CPUs with bfloat16 instructions)."""
    lines = []
    total = training.dry_run(TrainingConfig(model="rnnencdec", src_vocab_size=30000, tgt_vocab_size=30000),
                          log=lines.append)
    # embeddings 2 x 18.6M, GRU encoder 4.863M, c 1.001M, decoder GRU 7.863M (C: 1000 x 3000),
    # s_0 1.001M, readout 2.621M (C_o: 1000 x 1000), output 15.03M
    assert total == 2 * 18_600_000 + 4_863_000 + 1_001_000 + 7_863_000 + 1_001_000 + 2_621_000 + 15_030_000
    grconv = training.dry_run(TrainingConfig(model="rnnencdec", encoder="grconv", src_vocab_size=30000,
                                                tgt_vocab_size=30000), log=lines.append)
    # grConv: U 620x2000 + 2000, W^l, W^r 2000x2000, b 2000, G^l, G^r 2000x3, 3; c from 2000
    assert grconv - total == (620 * 2000 + 2000 + 2 * 2000 * 2000 + 2000 + 2 * 2000 * 3 + 3 - 4_863_000
                              + 1000 * 1000)
    with pytest.raises(ConfigError, match="grconv goes with --model=rnnencdec"):
        TrainingConfig(encoder="grconv")
    assert keras.mixed_precision.dtype_policy().name == "float32"


@pytest.mark.parametrize("encoder", ["rnn", "grconv"])
def test_rnnencdec_trains_searches_and_exports(encoder, tiny_config, tmp_path):
    model_dir = str(tmp_path / "m")
    training.train(tiny_config(model_dir=model_dir, model="rnnencdec", encoder=encoder, grconv_size=16, max_steps=3),
                log=lambda *a: None)
    path = exporter.export(model_dir, str(tmp_path / "e"), ExportConfig(search.SearchOptions(beam_size=3)),
                           log=lambda *a: None)
    out = tf.saved_model.load(path).signatures["serving_default"](text=tf.constant(["A man.", "Two dogs run."]))
    assert out["translation"].shape == (2,)
    assert np.all(out["alignment"].numpy() == 0.0)          # no attention in RNNencdec
    if encoder == "grconv":      # the learned structure of paper 002 Fig. 6
        from nmt_tf.evaluation import visualization

        (drawn,) = visualization.render_grconv(model_dir, "best", ["A man runs ."], ["one"],
                                               [str(tmp_path / "tree.png")], logdir=str(tmp_path / "tb"))
        assert drawn["tokens"] == ["A", "man", "runs", ".", "[EOS]"]
        assert drawn["gates"].shape == (4, 4, 3)
        np.testing.assert_allclose(drawn["gates"][0].sum(-1), 1.0, rtol=1e-5)       # 4 real nodes at level 1
        assert np.all(drawn["gates"][3, 1:] == 0)                                    # 1 node at the top
        assert tf.image.decode_png((tmp_path / "tree.png").read_bytes()).shape[0] >= 300
    model = restore_model(model_dir, log=lambda *a: None).model
    sources = np.array([[5, 6, 3, 0], [7, 8, 9, 3]], "int32")
    greedy = search.greedy_search(model, sources, search.SearchOptions(beam_size=1))
    beam = search.beam_search(model, sources, search.SearchOptions(beam_size=1))
    np.testing.assert_array_equal(greedy["tokens"].numpy(), beam["tokens"][:, 0].numpy())
    # Frozen as an export freezes it (the previous word's products per word): the same search.
    options = search.SearchOptions(beam_size=3)
    before = search.beam_search(model, sources, options)
    model.freeze_step_weights()
    after = search.beam_search(model, sources, options)
    np.testing.assert_array_equal(before["tokens"].numpy(), after["tokens"].numpy())
    np.testing.assert_allclose(before["scores"].numpy(), after["scores"].numpy(), rtol=1e-5)
