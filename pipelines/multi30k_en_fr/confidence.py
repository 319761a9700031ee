r"""Issue 93: a calibrated confidence for the shipped preset, fitted on val.

  python pipelines/multi30k_en_fr/confidence.py      # writes the preset's confidence.json, confidence/measured.json

Translates val, test 2016 and test 2017 with the shipped preset (its
SavedModel: its served beam, n-best 5, alignments), computes per sentence the six
signals of nmt_tf.inference.confidence (which an export computes in its
graph: mean token log-probability, n-best margin, attention coverage and
entropy, length ratio, share of source pieces seen fewer than 5 times in
training), and three more that need a second pass or the host:

  lp_min         the best translation's least likely token (the score signature)
  nbest_agree    mean sentence chrF of the other n-best hypotheses against the best (0-1)
  unknown_words  share of the source's words outside the training word list (words.src.txt)

"Acceptable" was fixed before any result was seen: sentence chrF (sacreBLEU,
chrF2) of at least ACCEPTABLE_CHRF against the reference. Two logistic
regressions of the standardised signals are fitted on val only: the shipped
calibrator (the six in-graph signals), written as the preset's
confidence.json, and the nine-signal one of the first measurement, kept for
comparison. The baseline is the raw model score (lp_mean), mapped to a
probability by isotonic regression on val. On each test set: expected
calibration error (10 equal-width bins), Spearman's rho with sentence chrF,
and AUROC for flagging the worst 20 % by chrF. Nothing is chosen on the test
sets: they are only reported.

Out of domain: confidence/out_of_domain.en holds 202 everyday English
sentences written for this (messages, instructions, numbers, prices,
times, names, addresses; no reference translations: they are a class of
their own, not judged acceptable or not). Their translations by the preset
are written to confidence/out_of_domain.fr, and the AUROC of separating
them from the test 2016 captions is reported for the calibrators, the raw
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
EXTRA = ("lp_min", "nbest_agree", "unknown_words")
WORD = re.compile(r"\w+|[^\w\s]")


def read(name: str, lang: str) -> list[str]:
    with gzip.open(os.path.join(DATA, f"{name}.{lang}.gz"), "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def signals(signatures, sources: list[str], frequent, known_words, batch: int = 64) -> list[dict]:
    """The signals of each source's translation (module docstring), with the
    translation and the export's own confidence output when it has one."""
    import sacrebleu
    import tensorflow as tf

    from nmt_tf.inference import confidence

    rows = []
    for start in range(0, len(sources), batch):
        chunk = sources[start:start + batch]
        out = {k: v.numpy() for k, v in signatures["serving_default"](text=tf.constant(chunk)).items()}
        in_graph = confidence.signals_of_outputs(out, frequent)
        best = [t.decode() for t in out["translation"]]
        scored = signatures["score"](source=tf.constant(chunk), target=tf.constant(best))
        token_log_probs, target_length = scored["token_log_probs"].numpy(), scored["target_length"].numpy()
        for i, source in enumerate(chunk):
            others = [h.decode() for h, score in zip(out["nbest_translations"][i][1:], out["nbest_scores"][i][1:])
                      if score > confidence.DEAD]
            agree = (sum(sacrebleu.sentence_chrf(h, [best[i]]).score for h in others) / (100 * len(others))
                     if others else 1.0)
            words = WORD.findall(source)
            n = int(target_length[i])
            rows.append({
                "translation": best[i],
                **dict(zip(confidence.FEATURES, in_graph[i].tolist())),
                "lp_min": float(token_log_probs[i][:n].min()) if n else 0.0,
                "nbest_agree": agree,
                "unknown_words": sum(w not in known_words for w in words) / len(words) if words else 0.0,
                **({"exported": float(out["confidence"][i])} if "confidence" in out else {}),
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
    from scipy.stats import spearmanr
    from sklearn.isotonic import IsotonicRegression
    from sklearn.metrics import roc_auc_score

    from nmt_tf import presets
    from nmt_tf.core.files import sha256
    from nmt_tf.core.hardware import vector_flags
    from nmt_tf.inference import confidence
    from nmt_tf.inference.host_text import SentencePieceSource
    from nmt_tf.inference.saved_models import load_saved_model

    start = time.monotonic()
    folder = presets.preset_dir("multi30k_en_fr")
    saved_model = presets.build(folder, log=lambda *a: print(*a, file=sys.stderr))
    signatures = load_saved_model(saved_model).signatures
    pieces = SentencePieceSource(os.path.join(folder, "sentencepiece.src.model"))
    piece_counts = collections.Counter(p for line in read("train", "en") for p in pieces.pieces(line))
    frequent = {p for p, n in piece_counts.items() if n >= RARE_COUNT}
    with open(os.path.join(folder, "words.src.txt"), encoding="utf-8") as f:
        known_words = {line.rstrip("\n") for line in f}
    chrf = sacrebleu.metrics.CHRF()        # chrF2, as sacrebleu.sentence_chrf; its signature goes in the report
    measured = {}
    with open(os.path.join(OUT, "out_of_domain.en"), encoding="utf-8") as f:
        out_of_domain = signals(signatures, [line.rstrip("\n") for line in f], frequent, known_words)
    with open(os.path.join(OUT, "out_of_domain.fr"), "w", encoding="utf-8") as f:
        f.writelines(row["translation"] + "\n" for row in out_of_domain)
    for key, name in SETS.items():
        sources, references = read(name, "en"), read(name, "fr")
        rows = signals(signatures, sources, frequent, known_words)
        for row, reference in zip(rows, references):
            row["chrf"] = chrf.sentence_score(row["translation"], [reference]).score
        measured[key] = rows
        print(f"{key}: {len(rows)} sentences", file=sys.stderr)

    nine = confidence.FEATURES + EXTRA

    def matrix(rows, features):
        return np.array([[row[f] for f in features] for row in rows])

    val = measured["val"]
    y_val = np.array([row["chrf"] >= ACCEPTABLE_CHRF for row in val])
    acceptable = f"sentence chrF2 (sacreBLEU) >= {ACCEPTABLE_CHRF:g} against the reference"
    beam = presets.read_manifest(folder)["export"]["beam_size"]
    shipped = confidence.fit(matrix(val, confidence.FEATURES), y_val, frequent, RARE_COUNT, acceptable,
                             f"Multi30k val 2016 (1,014 sentences), the preset's SavedModel at beam {beam}")
    shipped.save(os.path.join(folder, "confidence.json"))
    manifest = presets.read_manifest(folder)
    manifest["files"]["confidence.json"] = sha256(os.path.join(folder, "confidence.json"))
    with open(os.path.join(folder, presets.MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, ensure_ascii=False)
        f.write("\n")
    mean9, std9, w9 = confidence.logistic_regression(matrix(val, nine), y_val)
    calibrators = {
        "shipped (six in-graph signals)": lambda rows: shipped.probability(matrix(rows, confidence.FEATURES)),
        "nine signals": lambda rows: 1 / (1 + np.exp(-(((matrix(rows, nine) - mean9) / std9) @ w9[:-1] + w9[-1]))),
    }
    baseline = IsotonicRegression(out_of_bounds="clip", y_min=0, y_max=1).fit(
        [row["lp_mean"] for row in val], y_val)
    report = {"acceptable": acceptable, "chrf_signature": str(chrf.get_signature()),
              "fitted_on": "val", "cpu_flags": " ".join(vector_flags()),
              "shipped_calibrator": "nmt_tf/presets/multi30k_en_fr/confidence.json",
              "nine_signal_calibrator": {"features": list(nine), "mean": mean9.tolist(), "std": std9.tolist(),
                                         "coefficients": w9[:-1].tolist(), "intercept": float(w9[-1])},
              "sets": {}}
    for key, rows in measured.items():
        chrf_scores = np.array([row["chrf"] for row in rows])
        labels = chrf_scores >= ACCEPTABLE_CHRF
        worst = chrf_scores <= np.percentile(chrf_scores, 20)
        raw = np.array([row["lp_mean"] for row in rows])
        entry = {"sentences": len(rows), "acceptable_share": round(float(labels.mean()), 4)}
        for label, predict in calibrators.items():
            ours = predict(rows)
            entry[label] = {"ece": round(ece(ours, labels), 4),
                            "spearman_chrf": round(float(spearmanr(ours, chrf_scores)[0]), 4),
                            "auroc_worst_20pct": round(float(roc_auc_score(worst, -ours)), 4)}
        entry["raw_score"] = {"ece": round(ece(baseline.predict(raw), labels), 4),
                              "spearman_chrf": round(float(spearmanr(raw, chrf_scores)[0]), 4),
                              "auroc_worst_20pct": round(float(roc_auc_score(worst, -raw)), 4)}
        entry["each_signal_spearman_chrf"] = {f: round(float(spearmanr([row[f] for row in rows], chrf_scores)[0]), 4)
                                              for f in nine}
        report["sets"][key] = entry
    captions = measured["test_2016"]
    mixed = captions + out_of_domain
    is_foreign = np.array([0] * len(captions) + [1] * len(out_of_domain))
    report["out_of_domain"] = {"sentences": len(out_of_domain), "against": "test_2016 captions",
                               "auroc_raw_score": round(float(roc_auc_score(is_foreign,
                                                                            [-row["lp_mean"] for row in mixed])), 4),
                               "auroc_each_signal": {f: round(float(roc_auc_score(is_foreign,
                                                                                  [row[f] for row in mixed])), 4)
                                                     for f in nine}}
    for label, predict in calibrators.items():
        conf = predict(mixed)
        report["out_of_domain"][label] = {
            "auroc": round(float(roc_auc_score(is_foreign, -conf)), 4),
            "mean_confidence": {"captions": round(float(conf[:len(captions)].mean()), 4),
                                "out_of_domain": round(float(conf[len(captions):].mean()), 4)},
            "share_below_0.5": {"captions": round(float((conf[:len(captions)] < 0.5).mean()), 4),
                                "out_of_domain": round(float((conf[len(captions):] < 0.5).mean()), 4)}}
    report["seconds"] = round(time.monotonic() - start, 1)
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "measured.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    print(json.dumps({k: v for k, v in report.items() if k != "nine_signal_calibrator"}, indent=1))


if __name__ == "__main__":
    main()
