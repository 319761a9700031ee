"""The shipped model of record (nmt_tf/presets/multi30k_en_fr) still translates
as its model card says: a change to tokenization, search, export or the
preset's loading that costs BLEU or moves the model's probabilities fails here.
The figures are the preset's checks.json, measured when the preset was made."""

import os
import re

import pytest

from conftest import read_multi30k
from nmt_tf import presets
from nmt_tf.evaluation import metrics

PRESET = "multi30k_en_fr"
BLEU_TOLERANCE = presets.CHECK_BLEU_TOLERANCE
LOG_PROB_TOLERANCE = presets.CHECK_LOG_PROB_TOLERANCE


@pytest.fixture(scope="module")
def translator():
    import nmt_tf

    return nmt_tf.Translator.from_preset(PRESET)


@pytest.fixture(scope="module")
def checks():
    return presets.read_checks(PRESET)


def test_bleu_of_the_shipped_model_is_not_below_its_model_card(translator, checks):
    bleu = checks["bleu"]
    sources = read_multi30k(bleu["source"], bleu["lines"])
    references = read_multi30k(bleu["reference"], bleu["lines"])
    hypotheses = [t.text for t in translator.translate(sources)]
    measured, _ = metrics.moses_lc_bleu(hypotheses, references, "fr")
    assert measured >= bleu["bleu_lc_moses"] - BLEU_TOLERANCE, (
        f"{bleu['source']} ({bleu['lines']} lines): lc Moses-tok BLEU {measured:.2f}, the model card says "
        f"{bleu['bleu_lc_moses']:.2f}")


def test_the_score_signature_gives_the_stored_log_probabilities(translator, checks):
    pairs = checks["score"]
    scored = translator.score([p["source"] for p in pairs], [p["target"] for p in pairs])
    for pair, score in zip(pairs, scored):
        assert score.target_length == pair["target_length"], pair
        assert score.log_prob == pytest.approx(pair["log_prob"], abs=LOG_PROB_TOLERANCE), pair


def test_the_model_card_gives_every_file_with_its_sha256_and_the_preset_fits_in_git():
    folder = presets.preset_dir(PRESET)
    card = open(os.path.join(folder, presets.MODEL_CARD), encoding="utf-8").read()
    listed = re.findall(r"`([0-9a-f]{64})`\s*\|\s*`([^`]+)`", card)        # (digest, file); joint files share one
    files = sorted(n for n in os.listdir(folder) if n != presets.MODEL_CARD)
    assert sorted(name for _, name in listed) == files
    for digest, name in listed:
        assert presets.sha256(os.path.join(folder, name)) == digest, name
    presets.verify(folder)
    assert sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder)) <= 25 * 2**20


def test_the_shipped_confidence_tells_captions_from_everyday_text(translator):
    """The preset's calibrator (confidence.json, fitted on val): a caption of
    the training kind is trusted, a business message is not; the LiteRT
    runtime computes the same confidence from its own outputs."""
    sentences = ["Two men are playing soccer on a field.", "Please send me the invoice by Friday.", ""]
    graph = [t.confidence for t in translator.translate(sentences)]
    assert graph[0] > 0.8 and graph[1] < 0.5 and graph[2] == 1.0, graph
    import nmt_tf

    litert = [t.confidence for t in nmt_tf.Translator.from_preset(PRESET, runtime="litert").translate(sentences)]
    assert litert == pytest.approx(graph, abs=0.05)
