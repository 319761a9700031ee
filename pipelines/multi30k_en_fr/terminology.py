r"""Required terms on Multi30k: how often a glossary's terms reach the output, with and without constraints.

  python pipelines/multi30k_en_fr/terminology.py [--preset=multi30k_en_fr | --saved_model=DIR | --model_dir=DIR]
      [--set=test_2016_flickr] [--out=pipelines/multi30k_en_fr/terminology/test_2016_flickr.json]
      [--glossary_file=FILE --noreference_filter --ignore_case] [--placement_weights=0.5,1,2]

The protocol of Dinu et al. (2019, "Training Neural Machine Translation to
Apply Terminology Constraints"), with a glossary nobody chose by hand:

1. The glossary is learnt from the training corpus only: nmt_tf.unk_dictionary's
   IBM Model 1 word translations (both directions), kept where the English
   word is a lowercase alphabetic word of 5+ letters outside the 100 most
   frequent training words and the French word is alphabetic with 3+
   letters (pipelines/multi30k_en_fr/terminology/glossary.en-fr.tsv, made
   once and committed).
2. A test sentence takes an entry as a required term where the English
   word occurs in it as a whole word and the French word occurs in its
   reference as a whole word (the term is right for that sentence); the
   sentences with at least one such term form the test subset.
3. The subset is translated twice with the same model and beam: freely
   (serving_default) and with its terms required (translate_constrained).
   Reported: the share of terms present in the output (whole word,
   case-sensitive), the share of sentences whose terms were all met, and
   BLEU on the subset (sacreBLEU, with its signature; lowercased
   Moses-tokenized, as the Multi30k papers publish) for both.

Nothing here is tuned: the glossary rule was fixed before any output was
seen, and the model and search settings are the export's.

Placement (issue 93): a third run gives each term with its source term
("source|||target", as nmt_tf.translate --glossary does), so that the search
writes it where its source term is translated. For every term in an output
the report counts
- `aligned`: the term's first token attends most, summed over each source
  word's pieces, to a word of its source term (the model's own alignment);
- `after_end`: the term comes after a sentence-final . ! or ? of the output
  (appended after the sentence);
- `last_word_unaligned`: the term is the output's last word, its source
  term is not the source's last word, and it is not aligned (appended
  before the final full stop).
A term counts as present when its words are found among the output's
words (pieces joined), whole words as above.
`--glossary_file=pipelines/multi30k_en_fr/terminology/unlikely.en-fr.tsv
--noreference_filter --ignore_case` runs unlikely terms (snow ->
poudreuse, dog -> toutou, ...) on every sentence that has their source
word, whatever the reference says: its BLEU is not a quality figure.
`--model_dir` (with --checkpoint and --beam_size) and
`--placement_weights=w1,w2,...` run the third run at several weights in
process, without an export, to choose the weight on val.
"""

from __future__ import annotations

import collections
import gzip
import json
import os
import re
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from absl import app
from absl import flags as absl_flags

from nmt_tf import flags as nmt_flags  # noqa: F401  (--preset, --saved_model, --lines_per_batch)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(REPO, "data", "multi30k")
HERE = os.path.join(REPO, "pipelines", "multi30k_en_fr", "terminology")
GLOSSARY = os.path.join(HERE, "glossary.en-fr.tsv")

# --preset (default here: multi30k_en_fr), --saved_model and --lines_per_batch are nmt_tf's own flags.
absl_flags.DEFINE_string("set", "test_2016_flickr", "The Multi30k set (data/multi30k/<set>.en.gz / .fr.gz).")
absl_flags.DEFINE_string("out", None, "The JSON report (default: terminology/<set>.json beside this script).")
absl_flags.DEFINE_string("glossary_file", GLOSSARY, "The glossary (source<TAB>target lines).")
absl_flags.DEFINE_bool("reference_filter", True, "Keep a term only where its target word is in the reference.")
absl_flags.DEFINE_bool("ignore_case", False, "Match the glossary's source terms in any case.")
absl_flags.DEFINE_list("placement_weights", None, "With --model_dir: the sourced run at each of these "
                       "--term_placement weights (default: the export's or the flag's one weight).")
absl_flags.DEFINE_integer("examples", 5, "Translations kept in the report per run.")


def read(name: str) -> list[str]:
    with gzip.open(os.path.join(DATA, name), "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def make_glossary(path: str) -> int:
    """Step 1 of the module docstring; returns the number of entries."""
    from nmt_tf import unk_dictionary

    src = [line.encode("utf-8") for line in read("train.en.gz")]
    tgt = [line.encode("utf-8") for line in read("train.fr.gz")]
    pairs, _ = unk_dictionary.split_corpus(src, tgt, "en", "fr", 80, 1_000_000)
    frequent = {w for w, _ in collections.Counter(w for s, _ in pairs for w in s).most_common(100)}
    entries = [(s, t) for s, t in unk_dictionary.learn(pairs, log=lambda *a: None)
               if s.isalpha() and s.islower() and len(s) >= 5 and s not in frequent and t.isalpha() and len(t) >= 3]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(f"{s}\t{t}\n" for s, t in entries)
    return len(entries)


def whole_word(word: str, text: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(word)}(?!\w)", text) is not None


PUNCT = ".,;:!?»«\"'()"


def words_of(tokens) -> list[list[int]]:
    """Token indices grouped into words (SentencePiece: a piece with "▁" starts one; else one token a word)."""
    tokens = [t for t in tokens if t not in ("", "[EOS]")]
    pieces = any(t.startswith("▁") for t in tokens)
    groups = []
    for i, token in enumerate(tokens):
        if not groups or not pieces or token.startswith("▁"):
            groups.append([])
        groups[-1].append(i)
    return groups


def word_texts(tokens, groups) -> list[str]:
    return ["".join(tokens[i] for i in g).replace("▁", "") for g in groups]


def find_words(term: str, words: list[str]) -> int | None:
    """The index of the first word where `term` (one or more words) starts, as whole words (punctuation apart)."""
    n = len(term.split())
    for i in range(len(words) - n + 1):
        window = " ".join(words[i:i + n])
        match = re.search(rf"(?<!\w){re.escape(term)}(?!\w)", window)
        if match and match.start() < len(words[i]):
            return i
    return None


def placement(result, source: str, target_term: str) -> dict | None:
    """Where the term is in one translation (None: not in it)."""
    src_tokens, tgt_tokens = list(result.source_tokens), list(result.target_tokens)
    src_groups, tgt_groups = words_of(src_tokens), words_of(tgt_tokens)
    tgt_words, src_words = word_texts(tgt_tokens, tgt_groups), word_texts(src_tokens, src_groups)
    at = find_words(target_term, tgt_words)
    if at is None:
        return None
    row = np.asarray(result.alignment)[tgt_groups[at][0]]
    per_word = [row[g].sum() for g in src_groups]
    where = find_words(source, src_words)
    covered = set() if where is None else set(range(where, where + len(source.split())))
    aligned = bool(per_word) and int(np.argmax(per_word)) in covered
    before = " ".join(tgt_words[:at])
    content = [i for i, w in enumerate(src_words) if w.strip(PUNCT)]
    last_word = at + len(target_term.split()) >= len([w for w in tgt_words if w.strip(PUNCT)])
    return {"aligned": aligned, "after_end": re.search(r"[.!?]", before) is not None,
            "last_word_unaligned": last_word and not aligned and bool(content) and content[-1] not in covered}


def run_report(translator, texts, refs, chosen, kwargs) -> dict:
    from nmt_tf.evaluation.metrics import corpus_scores

    start = time.monotonic()
    results = translator.translate(texts, n_best=1, batch_size=absl_flags.FLAGS.lines_per_batch, **kwargs)
    seconds = time.monotonic() - start
    hypotheses = [r.text for r in results]
    places = [placement(r, source, target) for r, (_, _, terms) in zip(results, chosen) for source, target in terms]
    found = [p for p in places if p is not None]
    scores = corpus_scores(hypotheses, refs, "fr")
    share = lambda key: sum(p[key] for p in found) / max(1, len(found))
    return {
        "term_presence": len(found) / max(1, len(places)),
        "sentences_all_terms": sum(all(whole_word(t, h) for _, t in terms)
                                   for h, (_, _, terms) in zip(hypotheses, chosen)) / max(1, len(chosen)),
        "terms_met_output": (None if results[0].terms_met is None
                             else sum(r.terms_met for r in results) / len(results)),
        "aligned": share("aligned"), "after_end": sum(p["after_end"] for p in found),
        "last_word_unaligned": sum(p["last_word_unaligned"] for p in found),
        "seconds": round(seconds, 1),
        **{k: scores[k] for k in ("bleu", "bleu_signature", "bleu_lc_moses", "bleu_lc_moses_signature")},
        "examples": [{"source": s, "terms": [list(t) for t in terms], "translation": h}
                     for (s, _, terms), h in list(zip(chosen, hypotheses))[:absl_flags.FLAGS.examples]],
    }


def translators(FLAGS):
    """(run name suffix, Translator) pairs: the export's, or one per --placement_weights with --model_dir."""
    import nmt_tf

    if FLAGS.model_dir:
        weights = FLAGS.placement_weights or [str(FLAGS.term_placement)]
        for weight in weights:
            yield float(weight), nmt_tf.Translator.from_model_dir(
                FLAGS.model_dir, checkpoint=FLAGS.checkpoint, log=lambda *a: None, beam_size=FLAGS.beam_size,
                n_best=1, term_placement=float(weight))
    elif FLAGS.saved_model:
        yield None, nmt_tf.Translator.from_saved_model(FLAGS.saved_model)
    else:
        yield None, nmt_tf.Translator.from_preset(FLAGS.preset or "multi30k_en_fr")


def main(argv):
    from nmt_tf.core.hardware import vector_flags
    from nmt_tf.inference.glossary import Glossary

    if not os.path.exists(GLOSSARY):
        print(f"Learning the glossary into {GLOSSARY} ...", file=sys.stderr)
        make_glossary(GLOSSARY)
    FLAGS = absl_flags.FLAGS
    glossary = Glossary(FLAGS.glossary_file, ignore_case=FLAGS.ignore_case)
    sources, references = read(f"{FLAGS.set}.en.gz"), read(f"{FLAGS.set}.fr.gz")
    chosen = []
    for source, reference in zip(sources, references):
        first = {}
        for matched, target in glossary.matches(source):
            if not FLAGS.reference_filter or whole_word(target, reference):
                first.setdefault(target, matched)
        if first:
            chosen.append((source, reference, [(s, t) for t, s in first.items()]))
    texts = [s for s, _, _ in chosen]
    refs = [r for _, r, _ in chosen]
    report = {"set": FLAGS.set, "glossary": os.path.relpath(os.path.abspath(FLAGS.glossary_file), REPO),
              "glossary_entries": len(glossary), "reference_filter": FLAGS.reference_filter,
              "ignore_case": FLAGS.ignore_case, "sentences": len(sources), "subset_sentences": len(chosen),
              "terms": sum(len(t) for _, _, t in chosen), "cpu_flags": vector_flags(), "runs": {}}
    for n, (weight, translator) in enumerate(translators(FLAGS)):
        report.setdefault("model", translator.description)
        runs = {} if n else {"free": {}, "required_terms": {"required_terms": [[t for _, t in terms]
                                                                               for _, _, terms in chosen]}}
        runs["sourced" if weight is None else f"sourced_w{weight:g}"] = {
            "required_terms": [[(s, t) for s, t in terms] for _, _, terms in chosen]}
        for name, kwargs in runs.items():
            report["runs"][name] = run_report(translator, texts, refs, chosen, kwargs)
            print(name, {k: v for k, v in report["runs"][name].items() if k != "examples" and "signature" not in k},
                  file=sys.stderr)
    out = FLAGS.out or os.path.join(HERE, f"{FLAGS.set}.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, ensure_ascii=False)
    print(out)
    return 0


if __name__ == "__main__":
    app.run(main)
