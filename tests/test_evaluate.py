"""Evaluation (sacreBLEU, the papers' analyses), plots, and attention images in TensorBoard."""

import glob
import json
import os

import numpy as np
import pytest
import sacrebleu
import tensorflow as tf

from conftest import run_cli, write_lines
from nmt_tf import evaluate
from nmt_tf.config import DecodingConfig
from nmt_tf.evaluation import metrics, plots
from nmt_tf.evaluation import quality as evaluation
from nmt_tf.inference import search

HYPS = ["Un homme marche dans la rue.", "Deux chiens jouent.", "une femme lit un livre", "Le chat dort."]
REFS = ["Un homme marche dans la rue.", "Deux chiens courent.", "Une femme lit un livre.", "Un chat dort."]


def png_shape(png: bytes):
    return tuple(tf.image.decode_png(png).shape[:2])


@pytest.mark.parametrize("parallel_batches", [1, 3])
def test_translate_lines_batches_by_length_and_returns_input_order(parallel_batches):
    """nmt_tf.inference.line_batches.translate_lines: batches of similar length, several
    at once, results in the order of the lines; an error stops it."""
    from nmt_tf.inference.line_batches import translate_lines

    sent = []

    def reverse_words(batch):             # a translate function's outputs, padded with b""
        sent.append(list(batch))
        if b"fail" in batch:
            raise RuntimeError("this batch failed")
        words = [line.split() for line in batch]
        width = max(len(w) for w in words) + 1
        pad = lambda ws: ws + [b""] * (width - len(ws))
        return {"translation": np.array([b" ".join(w[::-1]) for w in words], object),
                "source_tokens": np.array([pad(w) for w in words], object),
                "target_tokens": np.array([pad(w[::-1]) for w in words], object)}

    lines = ["a b c", "d", "e f g h", "i j", "k", "l m n o p", "q r"]
    out = translate_lines(reverse_words, lines, batch_size=2, keys=("translation", "target_tokens"),
                          parallel_batches=parallel_batches)
    assert out["translation"] == [" ".join(line.split()[::-1]) for line in lines]
    assert out["target_tokens"] == [line.split()[::-1] for line in lines]
    by_length = sorted((line.encode() for line in lines), key=lambda line: len(line.split()))
    expected = [by_length[i:i + 2] for i in range(0, len(lines), 2)]
    assert (sent if parallel_batches == 1 else sorted(sent)) == (expected if parallel_batches == 1
                                                                 else sorted(expected))
    with pytest.raises(RuntimeError, match="this batch failed"):
        translate_lines(reverse_words, lines + ["fail"], batch_size=2, keys=("translation",),
                        parallel_batches=parallel_batches)


def test_scores_equal_sacrebleus_own_api():
    got = metrics.corpus_scores(HYPS, REFS)
    assert got["bleu"] == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS]).score)
    assert got["bleu_lc"] == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS], lowercase=True).score)
    assert got["chrf"] == pytest.approx(sacrebleu.corpus_chrf(HYPS, [REFS]).score)
    assert got["bleu_lc"] > got["bleu"]                 # "une femme" only matches lowercased
    assert got["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert "case:lc" in got["bleu_lc_signature"]



def test_lowercased_moses_tokenized_bleu_is_sacrebleu_on_sacremoses_tokens():
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    hyps = ["L'homme porte un « T-shirt » bleu.", "Deux chiens jouent dans l'herbe !"]
    refs = ["L’homme porte un T-shirt bleu.", "Deux chiens courent dans l'herbe."]
    tokenized = metrics.moses_lc_tokenize(hyps, "fr")
    # Lowercased, quotes normalised and escaped, French elision split off, hyphens kept.
    assert tokenized[0] == "l&apos; homme porte un &quot; t-shirt &quot; bleu ."
    norm, tok = MosesPunctNormalizer(lang="fr"), MosesTokenizer(lang="fr")
    by_hand = lambda lines: [tok.tokenize(norm.normalize(l.lower()), escape=True, return_str=True) for l in lines]
    assert tokenized == by_hand(hyps)
    expected = sacrebleu.metrics.BLEU(tokenize="none", force=True).corpus_score(by_hand(hyps), [by_hand(refs)])
    got = metrics.corpus_scores(hyps, refs, "fr")
    assert got["bleu_lc_moses"] == pytest.approx(expected.score)
    assert got["bleu_lc_moses"] != pytest.approx(got["bleu_lc"])      # a different tokenization, another number
    assert "moses-tok-escape:fr" in got["bleu_lc_moses_signature"] and "tok:none" in got["bleu_lc_moses_signature"]
    assert "bleu_lc_moses" not in metrics.corpus_scores(hyps, refs)     # needs the target language

def test_bleu_by_length_puts_sentences_in_the_right_bins():
    lengths = [5, 10, 11, 25, 61, 100]
    hyps = ["a b c d", "x y z w", "a b c d", "a b c d", "p q r s", "p q r s"]
    refs = ["a b c d", "a b c d", "a b c d", "a b c d", "p q r s", "p q r s"]
    bins = metrics.bleu_by_length(lengths, hyps, refs)
    assert [b["bin"] for b in bins] == ["1-10", "11-20", "21-30", "31-40", "41-50", "51-60", "61+"]
    assert [b["sentences"] for b in bins] == [2, 1, 1, 0, 0, 0, 2]
    assert bins[1]["bleu"] == pytest.approx(100.0) and bins[6]["bleu"] == pytest.approx(100.0)
    assert bins[0]["bleu"] < 100.0 and bins[3]["bleu"] is None


def test_bleu_by_unknown_words_is_cumulative():
    unknown = metrics.count_unknown([["a", "b"], ["a", "zz"], ["q", "zz", "yy"], []], known={"a", "b"})
    assert unknown == [0, 1, 3, 0]
    rows = metrics.bleu_by_unknown(unknown, HYPS, REFS, max_unknown=4)
    assert [r["max_unknown"] for r in rows] == [0, 1, 2, 3, 4]
    assert [r["sentences"] for r in rows] == [2, 3, 3, 4, 4]
    assert rows[3]["bleu"] == pytest.approx(metrics.corpus_scores(HYPS, REFS)["bleu"])


def test_pngs_decode_to_the_expected_sizes():
    src, tgt = ["A", "man", ".", "[EOS]"], ["Un", "homme", ".", "[EOS]", "x", "y", "z"]
    png = plots.attention_png(src, tgt, np.random.default_rng(0).random((7, 4)), title="Un homme .")
    width, height = plots.attention_size(4, 7)
    assert png_shape(png) == (round(height * plots.DPI), round(width * plots.DPI))
    curve = plots.bleu_png({"a": [("1-10", 30.0), ("11-20", None)], "b": [("1-10", 20.0), ("11-20", 25.0)]},
                           "length", "title")
    assert png_shape(curve) == (420, 640)


def read_events(log_dir):
    out = {}
    for path in glob.glob(os.path.join(log_dir, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for v in event.summary.value:
                out.setdefault(v.tag, []).append((event.step, tf.make_ndarray(v.tensor)))
    return out


def test_training_logs_dev_bleu_and_attention_images(trained_model_dir):
    model_dir, summary = trained_model_dir
    events = read_events(os.path.join(model_dir, "logs", "dev"))
    assert [s for s, _ in events["bleu"]] == [5, 10]
    assert summary["dev"]["bleu"] == pytest.approx(float(events["bleu"][-1][1]))
    assert summary["best_dev"]["metric"] == "bleu" and summary["best_dev"]["bleu"] is not None
    for i in range(4):                                   # trained_model_dir's --attention_examples=4
        images = events[f"attention/example_{i}"]
        assert [s for s, _ in images] == [5, 10]
        width, height, png = images[-1][1]               # image summaries hold [width, height, PNG]
        assert png_shape(png) == (int(height), int(width))
        assert int(width) >= 400 and int(height) >= 300


@pytest.fixture(scope="module")
def dev_files(tiny_corpus, tmp_path_factory):
    """The 12 dev pairs and 3 training pairs (these have no unknown words, so the no-UNK subset is not empty)."""
    d = tmp_path_factory.mktemp("eval_set")
    src = [l.rstrip("\n") for l in open(tiny_corpus["dev_src"], encoding="utf-8")]
    ref = [l.rstrip("\n") for l in open(tiny_corpus["dev_tgt"], encoding="utf-8")]
    pairs = tiny_corpus["pairs"][:3]
    return (write_lines(d / "eval.en", src + [s for s, _ in pairs]),
            write_lines(d / "eval.fr", ref + [t for _, t in pairs]))


def test_evaluate_two_models_end_to_end(trained_model_dir, exported, dev_files, tmp_path):
    model_dir, _ = trained_model_dir
    src, ref = dev_files
    out = str(tmp_path / "eval")
    reports = evaluation.run([("model_dir", model_dir), ("saved_model", exported[2])], ["dir", "export"], src, ref,
                           out, DecodingConfig(search.SearchOptions(beam_size=3), max_input_length=20), 4,
                           log=lambda *a: None)
    assert [r["label"] for r in reports] == ["dir", "export"]
    for r in reports:
        assert r["sentences"] == 15 and r["all"]["bleu"] is not None
        assert sum(b["sentences"] for b in r["bleu_by_length"]) == 15
        assert r["bleu_by_unknown"][-1]["sentences"] <= 15
        assert r["no_unk"]["sentences"] == r["bleu_by_unknown"][0]["sentences"] >= 1
        assert r["with_unk"]["sentences"] == 15 - r["no_unk"]["sentences"] >= 1
    assert reports[0]["no_unk"]["decoding"] == "[UNK] forbidden"
    no_unk_hyps = open(os.path.join(out, "dir", "hypotheses.no_unk.txt"), encoding="utf-8").read()
    assert no_unk_hyps.count("\n") == reports[0]["no_unk"]["sentences"] and "[UNK]" not in no_unk_hyps
    for name in ("dir", "export"):
        folder = os.path.join(out, name)
        hyps = open(os.path.join(folder, "hypotheses.txt"), encoding="utf-8").read().splitlines()
        assert len(hyps) == 15
        assert sum(h.count("[UNK]") for h in hyps) == reports[["dir", "export"].index(name)]["unk_in_output"]
        assert json.load(open(os.path.join(folder, "report.json")))["label"] == name
    # beam 3 from the directory and the export (beam 3 too) give the same output
    assert (open(os.path.join(out, "dir", "hypotheses.txt")).read()
            == open(os.path.join(out, "export", "hypotheses.txt")).read())
    for plot in ("bleu_by_length.png", "bleu_by_unknown.png"):
        assert png_shape(open(os.path.join(out, plot), "rb").read()) == (420, 640)
    table = open(os.path.join(out, "report.txt")).read()
    assert "dir" in table and "export" in table and "tok:13a" in table


def test_evaluate_rejects_unequal_files(trained_model_dir, tmp_path):
    src, ref = tmp_path / "s", tmp_path / "r"
    src.write_text("a\nb\n")
    ref.write_text("a\n")
    with pytest.raises(evaluation.EvaluationError, match="has 2 lines but .* has 1 lines"):
        evaluation.run([("model_dir", trained_model_dir[0])], None, str(src), str(ref), None,
                     DecodingConfig(), 4)


def test_repeated_model_flags_are_kept_in_order():
    rest, models = evaluate.split_model_args(["prog", "--model_dir=A", "--src=x", "--saved_model", "B",
                                              "--model_dir=C"])
    assert rest == ["prog", "--src=x"]
    assert models == [("model_dir", "A"), ("saved_model", "B"), ("model_dir", "C")]


def test_visualize_cli_writes_pngs_and_tensorboard_images(exported, tmp_path):
    one = tmp_path / "one.png"
    result = run_cli("-m", "nmt_tf.visualize", f"--saved_model={exported[2]}", "--text=A man runs.",
                     f"--out={one}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert png_shape(one.read_bytes())[0] >= 300
    lines = tmp_path / "in.en"
    lines.write_text("A man runs.\nTwo dogs play in the snow.\n")
    result = run_cli("-m", "nmt_tf.visualize", f"--saved_model={exported[2]}", f"--input={lines}",
                     f"--out={tmp_path / 'maps'}", f"--logdir={tmp_path / 'tb'}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(os.listdir(tmp_path / "maps")) == ["attention_0001.png", "attention_0002.png"]
    assert {"attention/0001", "attention/0002"} <= set(read_events(str(tmp_path / "tb")))
