"""Translation quality: sacreBLEU scores and the papers' analyses.

All scores are sacreBLEU's on detokenized output against raw references
(default 13a tokenization): BLEU cased and lowercased, with their signature
strings, and chrF. The analyses reproduce the papers' figures:

* BLEU by source sentence length (paper 000 Fig. 2): bins of 10 source words
  (1-10, 11-20, ..., 51-60, 61+), words as the Moses-like word splitter
  counts them.
* BLEU by number of unknown words (paper 002 Fig. 4c): for k = 0..10, BLEU
  of the sentences with at most k words outside the training shortlists,
  counted in the source and the reference together.
* The "no UNK" subset of paper 000 Table 1: pairs whose source and reference
  contain no unknown word.

An empty bin has BLEU None.
"""

from __future__ import annotations

import sacrebleu

LENGTH_BINS = ((1, 10), (11, 20), (21, 30), (31, 40), (41, 50), (51, 60), (61, None))
MAX_UNKNOWN = 10


def bin_label(low: int, high: int | None) -> str:
    return f"{low}+" if high is None else f"{low}-{high}"


def corpus_scores(hypotheses: list[str], references: list[str]) -> dict:
    """BLEU (cased and lowercased) with signatures, and chrF."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    out = {"sentences": len(hypotheses)}
    if not hypotheses:
        return {**out, "bleu": None, "bleu_lc": None, "chrf": None}
    for key, lowercase in (("bleu", False), ("bleu_lc", True)):
        metric = sacrebleu.metrics.BLEU(lowercase=lowercase)
        score = metric.corpus_score(hypotheses, [references])
        out[key] = score.score
        out[f"{key}_signature"] = str(metric.get_signature())
        out[f"{key}_details"] = {"precisions": [round(p, 2) for p in score.precisions], "bp": round(score.bp, 4),
                                 "hyp_len": score.sys_len, "ref_len": score.ref_len}
    chrf = sacrebleu.metrics.CHRF()
    out["chrf"] = chrf.corpus_score(hypotheses, [references]).score
    out["chrf_signature"] = str(chrf.get_signature())
    return out


def _subset_bleu(indices, hypotheses, references) -> dict:
    if not indices:
        return {"sentences": 0, "bleu": None, "bleu_lc": None}
    hyps = [hypotheses[i] for i in indices]
    refs = [references[i] for i in indices]
    return {"sentences": len(indices),
            "bleu": sacrebleu.metrics.BLEU().corpus_score(hyps, [refs]).score,
            "bleu_lc": sacrebleu.metrics.BLEU(lowercase=True).corpus_score(hyps, [refs]).score}


def bleu_by_length(source_lengths: list[int], hypotheses: list[str], references: list[str]) -> list[dict]:
    """BLEU of the sentences in each source-length bin (paper 000 Fig. 2)."""
    out = []
    for low, high in LENGTH_BINS:
        members = [i for i, n in enumerate(source_lengths) if n >= low and (high is None or n <= high)]
        out.append({"bin": bin_label(low, high), **_subset_bleu(members, hypotheses, references)})
    return out


def bleu_by_unknown(unknown_counts: list[int], hypotheses: list[str], references: list[str],
                    max_unknown: int = MAX_UNKNOWN) -> list[dict]:
    """BLEU of the sentences with at most k unknown words, k = 0..max_unknown (paper 002 Fig. 4c)."""
    return [{"max_unknown": k,
             **_subset_bleu([i for i, n in enumerate(unknown_counts) if n <= k], hypotheses, references)}
            for k in range(max_unknown + 1)]


def count_unknown(words: list[list[str]], known: set[str]) -> list[int]:
    """Number of words of each sentence that are not in `known`."""
    return [sum(w not in known for w in sentence) for sentence in words]
