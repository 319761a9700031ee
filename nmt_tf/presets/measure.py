"""What a preset must go on doing, measured: its checks.json.

`measure_checks` translates a test set with the preset's SavedModel (built
as `presets.build` does) and scores fixed sentence pairs with its score
signature; tests/test_model_of_record.py holds the shipped model to what it
wrote (python -m nmt_tf.presets --measure_checks=...). It calls the
signatures through nmt_tf.inference.client, in batches as nmt_tf.api does, and not
through nmt_tf.api, which stands above the presets (it imports them).
"""

from __future__ import annotations

import json
import os

from nmt_tf import presets
from nmt_tf.core.files import InputError, input_lines
from nmt_tf.evaluation import metrics
from nmt_tf.inference.client import SignatureClient
from nmt_tf.inference.line_batches import scored_pairs, translate_lines
from nmt_tf.inference.scoring import pair_scorer


def measure_checks(name: str, bleu_source: str, bleu_reference: str, pairs_source: str, pairs_target: str,
                   pairs: int = 12, cache_dir: str | None = None, log=print) -> dict:
    """Measures what the preset `name` must still do and writes it as its
    checks.json (what tests/test_model_of_record.py holds the shipped model
    to): the lc Moses-tok BLEU of its translations of `bleu_source` against
    `bleu_reference`, through its SavedModel (built as `presets.build`
    does), and the score signature's log-probabilities of the first `pairs`
    lines of `pairs_source` / `pairs_target`. The files are read as a
    tool's input is (nmt_tf.core.files.input_lines), errors naming the
    --measure_checks flag that gives each; checks.json names them by base
    name, as the test reads them from the project's data folder. Returns
    the checks."""
    folder = presets.preset_dir(name)
    manifest = presets.read_manifest(folder)
    texts = {}
    for what, path, flag in (("BLEU source", bleu_source, "bleu_src"),
                             ("BLEU reference", bleu_reference, "bleu_ref"),
                             ("pairs source", pairs_source, "pairs_src"),
                             ("pairs target", pairs_target, "pairs_tgt")):
        try:
            texts[what] = [line.decode("utf-8") for line in input_lines(path, flag)]
        except InputError as e:
            raise presets.PresetError(str(e)) from None
        except UnicodeDecodeError as e:
            raise presets.PresetError(f"{path} (--{flag}) is not UTF-8: {e}") from None
    for a, b in (("BLEU source", "BLEU reference"), ("pairs source", "pairs target")):
        if len(texts[a]) != len(texts[b]):
            raise presets.PresetError(f"the {a} has {len(texts[a]):,} lines but the {b} {len(texts[b]):,}")
    if not 1 <= pairs <= len(texts["pairs source"]):
        raise presets.PresetError(f"pairs={pairs}: the pairs files have {len(texts['pairs source']):,} lines")
    saved_model = presets.build(folder, cache_dir, log=log)
    translate = SignatureClient("serving_default", saved_model=saved_model,
                                outputs=["translation", "source_tokens", "target_tokens"])
    hypotheses = translate_lines(lambda batch: translate(text=batch), texts["BLEU source"],
                                 keys=("translation",))["translation"]
    bleu, signature = metrics.moses_lc_bleu(hypotheses, texts["BLEU reference"], manifest["tgt_lang"])
    sources, targets = texts["pairs source"][:pairs], texts["pairs target"][:pairs]
    scores = _scores(SignatureClient("score", saved_model=saved_model), sources, targets)
    checks = {
        "about": "What this preset must go on doing, measured when it was made (tests/test_model_of_record.py "
                 "holds the shipped model to it): lc Moses-tok BLEU of a test set (a failure more than "
                 f"{presets.CHECK_BLEU_TOLERANCE:g} below) and the score signature's log-probabilities of fixed "
                 f"pairs (the first {pairs} of {os.path.basename(pairs_source)}; a failure more than "
                 f"{presets.CHECK_LOG_PROB_TOLERANCE:g} away).",
        "bleu": {"source": os.path.basename(bleu_source), "reference": os.path.basename(bleu_reference),
                 "lines": len(hypotheses), "bleu_lc_moses": round(bleu, 2), "signature": signature},
        "score": [{"source": s, "target": t, "log_prob": round(log_prob, 4), "target_length": length}
                  for s, t, (log_prob, length) in zip(sources, targets, scores)],
    }
    with open(os.path.join(folder, presets.CHECKS), "w", encoding="utf-8") as f:
        json.dump(checks, f, indent=1, ensure_ascii=False)
    log(f"Wrote {os.path.join(folder, presets.CHECKS)}: lc Moses-tok BLEU {bleu:.2f} on "
        f"{os.path.basename(bleu_source)} ({len(hypotheses):,} lines), log-probabilities of {pairs} pairs")
    return checks


def _scores(score: SignatureClient, sources: list[str], targets: list[str]) -> list:
    """(log p(target | source), target length) of each pair, batched as
    `nmt_tf.api.Translator.score` batches them (line_batches.scored_pairs)."""
    return [(float(result["log_prob"][row]), int(result["target_length"][row]))
            for result, row in scored_pairs(pair_scorer(score), sources, targets)]
