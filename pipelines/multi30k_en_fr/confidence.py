r"""Issue 93, first step: can the model's own signals say when a translation should not be trusted?

  python pipelines/multi30k_en_fr/confidence.py            # writes confidence/measured.json

Translates val, test 2016 and test 2017 with the shipped preset (its
SavedModel: beam 10, n-best 5, alignments; the score signature for each
best translation's token log-probabilities), computes per sentence the
signals below, and measures how well they predict the sentence's quality:

  lp_mean        log p(translation) / its tokens ([EOS] included)
  lp_min         its least likely token's log-probability
  nbest_agree    mean sentence chrF of the other n-best hypotheses against the best (0-1)
  nbest_margin   the best hypothesis' score minus the second's
  coverage_dev   mean |sum of a source token's attention - 1| over the source tokens
  att_entropy    mean entropy of the attention rows / log(source tokens)
  len_ratio      log(translation tokens / source tokens)
  rare_pieces    share of the source's SentencePiece pieces seen fewer than 5 times in training
  unknown_words  share of the source's words outside the training word list (words.src.txt)

"Acceptable" is fixed before looking at any result: sentence chrF (sacreBLEU,
chrF2) of at least ACCEPTABLE_CHRF against the reference. A logistic
regression of the standardised signals is fitted on val only (the
calibrator); the baseline is the raw model score (lp_mean), mapped to a
probability by isotonic regression on val. On each test set: expected
calibration error (10 equal-width bins), Spearman's rho with sentence chrF,
and AUROC for flagging the worst 20 % by chrF; both for the calibrator and
the baseline. Nothing is chosen on the test sets: they are only reported.

Out of domain: confidence/out_of_domain.en holds 202 everyday English
sentences written for this (messages, instructions, numbers, prices,
times, names, addresses; no reference translations: they are a class of
their own, not judged acceptable or not). Their translations by the preset
are written to confidence/out_of_domain.fr, and the AUROC of separating
them from the test 2016 captions is reported for the calibrator, the raw
score and each signal.
"""

from __future__ import annotations

import collections
import gzip
import json
import math
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)

DATA = os.path.join(REPO, "data", "multi30k")
OUT = os.path.join(HERE, "confidence")
SETS = {"val": "val", "test_2016": "test_2016_flickr", "test_2017": "test_2017_flickr"}
ACCEPTABLE_CHRF = 50.0
RARE_COUNT = 5
FEATURES = ("lp_mean", "lp_min", "nbest_agree", "nbest_margin", "coverage_dev", "att_entropy", "len_ratio",
            "rare_pieces", "unknown_words")
WORD = re.compile(r"\w+|[^\w\s]")


def read(name: str, lang: str) -> list[str]:
    with gzip.open(os.path.join(DATA, f"{name}.{lang}.gz"), "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def signals(signatures, sources: list[str], piece_counts, known_words, pieces, batch: int = 64) -> list[dict]:
    """The signals of each source's translation (module docstring), with the translation."""
    import numpy as np
    import sacrebleu
    import tensorflow as tf

    rows = []
    for start in range(0, len(sources), batch):
        chunk = sources[start:start + batch]
        out = {k: v.numpy() for k, v in signatures["serving_default"](text=tf.constant(chunk)).items()}
        best = [t.decode() for t in out["translation"]]
        scored = signatures["score"](source=tf.constant(chunk), target=tf.constant(best))
        token_log_probs, target_length = scored["token_log_probs"].numpy(), scored["target_length"].numpy()
        for i, source in enumerate(chunk):
            source_tokens = [t for t in out["source_tokens"][i] if t and t != b"[EOS]"]
            target_tokens = [t for t in out["target_tokens"][i] if t]
            s, t = len(source_tokens) + 1, len(target_tokens)
            alpha = out["alignment"][i][:t, :s]
            coverage = alpha.sum(0)[:s - 1] if s > 1 else np.zeros(1)
            entropy = -(alpha * np.log(np.maximum(alpha, 1e-12))).sum(1).mean() / math.log(max(s, 2))
            others = [h.decode() for h, score in zip(out["nbest_translations"][i][1:], out["nbest_scores"][i][1:])
                      if score > -1e8]
            agree = (sum(sacrebleu.sentence_chrf(h, [best[i]]).score for h in others) / (100 * len(others))
                     if others else 1.0)
            scores = out["nbest_scores"][i]
            source_pieces = pieces.pieces(source)
            words = WORD.findall(source)
            n = int(target_length[i])
            rows.append({
                "translation": best[i],
                "lp_mean": float(out["log_prob"][i]) / max(t, 1),
                "lp_min": float(token_log_probs[i][:n].min()) if n else 0.0,
                "nbest_agree": agree,
                "nbest_margin": float(scores[0] - scores[1]) if len(scores) > 1 and scores[1] > -1e8 else 10.0,
                "coverage_dev": float(np.abs(coverage - 1.0).mean()),
                "att_entropy": float(entropy),
                "len_ratio": math.log(max(t, 1) / max(s, 1)),
                "rare_pieces": (sum(piece_counts[p] < RARE_COUNT for p in source_pieces) / len(source_pieces)
                                if source_pieces else 0.0),
                "unknown_words": sum(w not in known_words for w in words) / len(words) if words else 0.0,
            })
    return rows


def ece(probabilities, labels, bins: int = 10) -> float:
    import numpy as np

    probabilities, labels = np.asarray(probabilities), np.asarray(labels, float)
    edges = np.linspace(0, 1, bins + 1)
    total = 0.0
    for low, high in zip(edges[:-1], edges[1:]):
        inside = (probabilities >= low) & ((probabilities < high) if high < 1 else (probabilities <= high))
        if inside.any():
            total += inside.mean() * abs(probabilities[inside].mean() - labels[inside].mean())
    return float(total)


def main():
    import numpy as np
    import sacrebleu
    import tensorflow as tf
    from scipy.stats import spearmanr
    from sklearn.isotonic import IsotonicRegression
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    from nmt_tf import presets
    from nmt_tf.core.hardware import vector_flags
    from nmt_tf.inference.host_text import SentencePieceSource
    from nmt_tf.inference.saved_models import load_saved_model

    start = time.monotonic()
    saved_model = presets.build("multi30k_en_fr", log=lambda *a: print(*a, file=sys.stderr))
    model_dir = os.path.join(os.path.dirname(os.path.dirname(saved_model)), "model")
    signatures = load_saved_model(saved_model).signatures
    pieces = SentencePieceSource(os.path.join(model_dir, "sentencepiece.src.model"))
    piece_counts = collections.Counter(p for line in read("train", "en") for p in pieces.pieces(line))
    with open(os.path.join(model_dir, "words.src.txt"), encoding="utf-8") as f:
        known_words = {line.rstrip("\n") for line in f}
    chrf = sacrebleu.metrics.CHRF()        # chrF2, as sacrebleu.sentence_chrf; its signature goes in the report
    measured = {}
    with open(os.path.join(OUT, "out_of_domain.en"), encoding="utf-8") as f:
        out_of_domain = signals(signatures, [line.rstrip("\n") for line in f], piece_counts, known_words, pieces)
    with open(os.path.join(OUT, "out_of_domain.fr"), "w", encoding="utf-8") as f:
        f.writelines(row["translation"] + "\n" for row in out_of_domain)
    for key, name in SETS.items():
        sources, references = read(name, "en"), read(name, "fr")
        rows = signals(signatures, sources, piece_counts, known_words, pieces)
        for row, reference in zip(rows, references):
            row["chrf"] = chrf.sentence_score(row["translation"], [reference]).score
        measured[key] = rows
        print(f"{key}: {len(rows)} sentences", file=sys.stderr)

    def matrix(rows):
        return np.array([[row[f] for f in FEATURES] for row in rows])

    val = measured["val"]
    x_val = matrix(val)
    mean, std = x_val.mean(0), x_val.std(0) + 1e-9
    y_val = np.array([row["chrf"] >= ACCEPTABLE_CHRF for row in val])
    calibrator = LogisticRegression(C=1.0, max_iter=1000).fit((x_val - mean) / std, y_val)
    baseline = IsotonicRegression(out_of_bounds="clip", y_min=0, y_max=1).fit(
        [row["lp_mean"] for row in val], y_val)
    report = {"acceptable": f"sentence chrF2 (sacreBLEU) >= {ACCEPTABLE_CHRF:g} against the reference",
              "chrf_signature": str(chrf.get_signature()),
              "fitted_on": "val", "cpu_flags": " ".join(vector_flags()),
              "calibrator": {"features": list(FEATURES), "mean": mean.tolist(), "std": std.tolist(),
                             "coefficients": calibrator.coef_[0].tolist(),
                             "intercept": float(calibrator.intercept_[0])},
              "sets": {}}
    for key, rows in measured.items():
        chrf = np.array([row["chrf"] for row in rows])
        labels = chrf >= ACCEPTABLE_CHRF
        worst = chrf <= np.percentile(chrf, 20)
        ours = calibrator.predict_proba((matrix(rows) - mean) / std)[:, 1]
        raw = np.array([row["lp_mean"] for row in rows])
        theirs = baseline.predict(raw)
        report["sets"][key] = {
            "sentences": len(rows), "acceptable_share": round(float(labels.mean()), 4),
            "calibrator": {"ece": round(ece(ours, labels), 4),
                           "spearman_chrf": round(float(spearmanr(ours, chrf)[0]), 4),
                           "auroc_worst_20pct": round(float(roc_auc_score(worst, -ours)), 4)},
            "raw_score": {"ece": round(ece(theirs, labels), 4),
                          "spearman_chrf": round(float(spearmanr(raw, chrf)[0]), 4),
                          "auroc_worst_20pct": round(float(roc_auc_score(worst, -raw)), 4)},
            "each_signal_spearman_chrf": {f: round(float(spearmanr([row[f] for row in rows], chrf)[0]), 4)
                                          for f in FEATURES},
        }
    captions = measured["test_2016"]
    mixed = captions + out_of_domain
    is_foreign = np.array([0] * len(captions) + [1] * len(out_of_domain))
    confidence = calibrator.predict_proba((matrix(mixed) - mean) / std)[:, 1]
    report["out_of_domain"] = {
        "sentences": len(out_of_domain), "against": "test_2016 captions",
        "auroc_calibrator": round(float(roc_auc_score(is_foreign, -confidence)), 4),
        "auroc_raw_score": round(float(roc_auc_score(is_foreign, [-row["lp_mean"] for row in mixed])), 4),
        "auroc_each_signal": {f: round(float(roc_auc_score(is_foreign, [row[f] for row in mixed])), 4)
                              for f in FEATURES},
        "mean_confidence": {"captions": round(float(confidence[:len(captions)].mean()), 4),
                            "out_of_domain": round(float(confidence[len(captions):].mean()), 4)},
        "share_below_0.5": {"captions": round(float((confidence[:len(captions)] < 0.5).mean()), 4),
                            "out_of_domain": round(float((confidence[len(captions):] < 0.5).mean()), 4)},
    }
    report["seconds"] = round(time.monotonic() - start, 1)
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "measured.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    print(json.dumps({k: v for k, v in report.items() if k != "calibrator"}, indent=1))


if __name__ == "__main__":
    main()
