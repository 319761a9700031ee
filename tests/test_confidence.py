"""The calibrated confidence (nmt_tf.inference.confidence): one definition in
NumPy and in TF ops, a fit that matches scikit-learn's, files that are
checked, and an export that carries it."""

import io
import json
import math
import shutil

import numpy as np
import pytest

from nmt_tf.inference import confidence, translation
from nmt_tf.inference.client import SignatureClient

FREQUENT = ("▁a", "▁dog", "▁runs", ".")


def calibrator(**changes):
    fields = dict(mean=(-1.0, 2.0, 0.3, 0.5, 0.0, 0.1), std=(0.5, 1.5, 0.2, 0.2, 0.3, 0.1),
                  coefficients=(0.9, 0.4, -0.3, -0.3, 0.2, -0.1), intercept=2.5, frequent_source_tokens=FREQUENT,
                  rare_below=5, acceptable="chrF2 >= 50", fitted_on="a test")
    fields.update(changes)
    return confidence.Calibrator(**fields)


def outputs(rng, batch=5, target=7, source=6, n_best=3):
    """A translate signature's outputs as NumPy arrays, with padding, an
    empty source, a dead n-best slot and an unseen token."""
    tokens = np.array([["▁a", "▁dog", "▁runs", "▁zzz", ".", "[EOS]"],
                       ["▁a", "[EOS]", "", "", "", ""],
                       ["[EOS]", "", "", "", "", ""],               # an empty source
                       ["▁dog", "▁qq", "▁qq", "[EOS]", "", ""],
                       ["▁a", "▁a", "▁a", "▁a", "▁a", "[EOS]"]], dtype=object)[:batch, :source]
    lengths = [7, 2, 1, 4, 5][:batch]
    best = np.zeros([batch, target], np.int64)
    for i, n in enumerate(lengths):
        best[i, :n] = rng.integers(4, 50, n)
    alignment = rng.random([batch, target, source]).astype(np.float32)
    alignment *= (tokens != "")[:, None, :]
    alignment /= alignment.sum(2, keepdims=True)
    alignment *= (best != 0)[:, :, None]
    scores = np.sort(rng.normal(-3, 1, [batch, n_best]).astype(np.float32), axis=1)[:, ::-1].copy()
    scores[1, 1:] = -1e9                                            # no second hypothesis
    return {"log_prob": rng.normal(-4, 2, batch).astype(np.float32),
            "target_tokens": np.where(best != 0, "t", "").astype(object), "best_ids": best,
            "source_tokens": np.array([[t.encode() for t in row] for row in tokens], dtype=object),
            "alignment": alignment, "nbest_scores": scores}


def test_the_signals_follow_their_definition():
    out = outputs(np.random.default_rng(0))
    x = confidence.signals_of_outputs(out, FREQUENT)
    assert x.shape == (5, len(confidence.FEATURES))
    first = dict(zip(confidence.FEATURES, x[0]))
    assert first["lp_mean"] == pytest.approx(out["log_prob"][0] / 7)
    assert first["len_ratio"] == pytest.approx(math.log(7 / 6))
    assert first["rare_source"] == pytest.approx(1 / 5)              # ▁zzz of five tokens before [EOS]
    assert first["nbest_margin"] == pytest.approx(out["nbest_scores"][0, 0] - out["nbest_scores"][0, 1])
    coverage = out["alignment"][0].sum(0)[:5]
    assert first["coverage_dev"] == pytest.approx(np.abs(coverage - 1).mean(), rel=1e-5)
    assert x[1][confidence.FEATURES.index("nbest_margin")] == confidence.NO_SECOND
    assert x[3][confidence.FEATURES.index("rare_source")] == pytest.approx(2 / 3)


def test_the_graph_computes_what_numpy_computes():
    import tensorflow as tf

    out = outputs(np.random.default_rng(1))
    c = calibrator()
    graph = confidence.GraphConfidence(c)
    in_graph = graph(tf.constant(out["log_prob"]), tf.constant(out["best_ids"]),
                     tf.constant(out["source_tokens"].astype(bytes)), tf.constant(out["alignment"]),
                     tf.constant(out["nbest_scores"]), 0).numpy()
    expected = confidence.confidence_of_outputs(out, c)
    np.testing.assert_allclose(in_graph, expected, rtol=1e-5, atol=1e-6)
    assert expected[2] == 1.0 and np.all((expected > 0) & (expected <= 1))


def test_the_fit_is_scikit_learns_logistic_regression():
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(2)
    x = rng.normal(size=[400, len(confidence.FEATURES)]) * [1, 3, 0.2, 0.3, 1, 0.1] + [-2, 1, 0.4, 0.5, 0, 0.1]
    y = rng.random(400) < 1 / (1 + np.exp(-(x[:, 0] * 2 + 3 - x[:, 2] * 4)))
    fitted = confidence.fit(x, y, ["▁b", "▁a"], 5, "ok", "synthetic")
    z = (x - np.array(fitted.mean)) / np.array(fitted.std)
    reference = LogisticRegression(C=1.0, tol=1e-10, max_iter=10000).fit(z, y)
    np.testing.assert_allclose(fitted.coefficients, reference.coef_[0], atol=1e-4)
    assert fitted.intercept == pytest.approx(reference.intercept_[0], abs=1e-4)
    assert fitted.frequent_source_tokens == ("▁a", "▁b")
    with pytest.raises(confidence.CalibratorError, match="same label"):
        confidence.fit(x, np.ones(400), [], 5, "ok", "synthetic")


def test_a_calibrator_is_saved_and_its_faults_named(tmp_path):
    path = str(tmp_path / "confidence.json")
    calibrator().save(path)
    assert confidence.load(path) == calibrator()
    stored = json.load(open(path, encoding="utf-8"))
    for change, message in [({"features": ["lp_mean"]}, "fitted on the signals"), ({"format": 9}, "format 1"),
                            ({"std": [1, 1, 1, 1, 1, 0]}, "std positive"), ({"mean": [1, 2]}, "6 values"),
                            ({"intercept": "x"}, "not a number")]:
        with open(path, "w", encoding="utf-8") as f:
            json.dump({**stored, **change}, f)
        with pytest.raises(confidence.CalibratorError, match=message) as caught:
            confidence.load(path)
        assert path in str(caught.value)
    open(path, "w").write("{")
    with pytest.raises(confidence.CalibratorError, match="cannot be read"):
        confidence.load(path)


def test_an_export_of_a_model_with_a_calibrator_has_a_confidence_output(trained_model_dir, tmp_path):
    import tensorflow as tf

    from nmt_tf.config import ExportConfig, SearchOptions
    from nmt_tf.exporting import saved_model as exporter
    from nmt_tf.inference.saved_models import load_signature

    model_dir = str(tmp_path / "model")
    shutil.copytree(trained_model_dir[0], model_dir)
    c = calibrator(frequent_source_tokens=("A", "man", "a", "."))
    c.save(confidence.path_in(model_dir))
    path = exporter.export(model_dir, str(tmp_path / "export"),
                           ExportConfig(SearchOptions(beam_size=3, n_best=2), max_input_length=20), log=lambda *a: None)
    translate = load_signature(path)
    out = {k: v.numpy() for k, v in translate(text=tf.constant(["A man is sleeping .", "", "zz qq"])).items()}
    assert out["confidence"].shape == (3,) and out["confidence"][1] == 1.0
    np.testing.assert_allclose(out["confidence"], confidence.confidence_of_outputs(out, c), rtol=1e-4, atol=1e-5)
    assert "confidence" in load_signature(path, "translate_constrained").structured_outputs
    # translate_with_options at the export's settings: the same confidences (its n-best width is known only
    # when the graph runs; the n-best margin was left out of its confidence before)
    with_options = load_signature(path, "translate_with_options")(
        text=tf.constant(["A man is sleeping .", "", "zz qq"]), beam_size=tf.constant(3), n_best=tf.constant(2),
        length_alpha=tf.constant(SearchOptions().length_alpha))
    np.testing.assert_allclose(with_options["confidence"].numpy(), out["confidence"], rtol=1e-5)
    written = io.StringIO()
    translation.translate_lines(SignatureClient(saved_model=path, outputs=translation.needed_outputs(
        1, False, False, with_confidence=True)), [b"A man is sleeping .", b""], written, 2, 1, False, False,
        with_confidence=True)
    records = [json.loads(line) for line in written.getvalue().splitlines()]
    assert [set(r) for r in records] == [{"translation", "confidence"}] * 2
    assert records[0]["confidence"] == pytest.approx(float(out["confidence"][0]), abs=1e-4)
    assert records[1]["confidence"] == 1.0


def test_asking_a_model_without_a_calibrator_for_confidence_names_the_fix():
    class NoConfidence:
        where = "export/1"

        def has_output(self, name):
            return False

    with pytest.raises(translation.TranslationError, match="export/1 has no confidence output.*confidence.json"):
        translation.translate_lines(NoConfidence(), [b"a"], io.StringIO(), 1, 1, False, False, with_confidence=True)
