"""Translation quality: sacreBLEU scores and the papers' analyses (docs/SPEC.md §7).

Two kinds of BLEU, always named:

* sacreBLEU on detokenized output against raw references (default 13a
  tokenization): BLEU cased and lowercased, with their signature strings,
  and chrF. Comparable across toolkits whatever their tokenization.
* lowercased Moses-tokenized BLEU (`moses_lc_bleu`), the way the Multi30k /
  WMT multimodal papers score: hypotheses and references lowercased, Moses
  punctuation-normalised and Moses-tokenized with escaping (sacremoses,
  as the Multi30k dataset's own scripts/task1-tokenize.sh does with the Perl
  scripts: lowercase.perl | normalize-punctuation.perl -l L | tokenizer.perl
  -l L), then BLEU on those tokens (sacreBLEU with tokenize="none", i.e.
  multi-bleu.perl's computation). It reads about one point above lowercased
  sacreBLEU on Multi30k French (Moses splits "l'homme" into "l&apos; homme").

The analyses reproduce the papers' figures:

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

import functools

import sacrebleu

LENGTH_BINS = ((1, 10), (11, 20), (21, 30), (31, 40), (41, 50), (51, 60), (61, None))
MAX_UNKNOWN = 10


def bin_label(low: int, high: int | None) -> str:
    return f"{low}+" if high is None else f"{low}-{high}"


@functools.lru_cache(maxsize=None)
def _moses(lang: str):
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    return MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)


def moses_lc_tokenize(lines: list[str], lang: str) -> list[str]:
    """Lowercase, Moses punctuation normalisation, Moses tokenization with
    escaping (`&apos;`, `&quot;` ...), no aggressive hyphen splitting: the
    official Multi30k tokenized text. Returns space-joined tokens per line."""
    normalizer, tokenizer = _moses(lang)
    return [tokenizer.tokenize(normalizer.normalize(line.lower()), escape=True, return_str=True)
            for line in lines]


def moses_lc_bleu(hypotheses: list[str], references: list[str], lang: str,
                  tokenized_references: list[str] | None = None) -> tuple[float, str]:
    """Lowercased Moses-tokenized BLEU (see the module docstring) and its
    signature. `tokenized_references`: `moses_lc_tokenize(references, lang)`
    when the caller keeps it (dev BLEU scores the same references often)."""
    import sacremoses

    refs = tokenized_references if tokenized_references is not None else moses_lc_tokenize(references, lang)
    metric = sacrebleu.metrics.BLEU(tokenize="none", force=True)
    score = metric.corpus_score(moses_lc_tokenize(hypotheses, lang), [refs]).score
    return score, (f"lowercase+moses-normpunct+moses-tok-escape:{lang}|sacremoses:{sacremoses.__version__}|"
                   f"{metric.get_signature()}")


def corpus_scores(hypotheses: list[str], references: list[str], lang: str | None = None,
                  tokenized_references: list[str] | None = None) -> dict:
    """sacreBLEU BLEU (cased and lowercased) with signatures, chrF, and with
    the target language `lang`, lowercased Moses-tokenized BLEU
    ("bleu_lc_moses", see `moses_lc_bleu`)."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    out = {"sentences": len(hypotheses)}
    if not hypotheses:
        return {**out, "bleu": None, "bleu_lc": None, "chrf": None, "bleu_lc_moses": None}
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
    if lang:
        out["bleu_lc_moses"], out["bleu_lc_moses_signature"] = moses_lc_bleu(
            hypotheses, references, lang, tokenized_references)
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
