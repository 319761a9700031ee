r"""Required terms on Multi30k: how often a glossary's terms reach the output, with and without constraints.

  python pipelines/multi30k_en_fr/terminology.py [--preset=multi30k_en_fr | --saved_model=DIR]
      [--set=test_2016_flickr] [--out=pipelines/multi30k_en_fr/terminology/test_2016_flickr.json]

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
"""

from __future__ import annotations

import collections
import gzip
import json
import os
import re
import sys
import time

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


def main(argv):
    import nmt_tf
    from nmt_tf.core.hardware import vector_flags
    from nmt_tf.evaluation.metrics import corpus_scores
    from nmt_tf.inference.glossary import Glossary

    if not os.path.exists(GLOSSARY):
        print(f"Learning the glossary into {GLOSSARY} ...", file=sys.stderr)
        make_glossary(GLOSSARY)
    glossary = Glossary(GLOSSARY)
    FLAGS = absl_flags.FLAGS
    sources, references = read(f"{FLAGS.set}.en.gz"), read(f"{FLAGS.set}.fr.gz")
    chosen = []
    for source, reference in zip(sources, references):
        terms = [t for t in glossary.terms(source) if whole_word(t, reference)]
        if terms:
            chosen.append((source, reference, terms))
    translator = (nmt_tf.Translator.from_saved_model(FLAGS.saved_model) if FLAGS.saved_model
                  else nmt_tf.Translator.from_preset(FLAGS.preset or "multi30k_en_fr"))
    texts = [s for s, _, _ in chosen]
    refs = [r for _, r, _ in chosen]
    report = {"set": FLAGS.set, "model": translator.description, "glossary": os.path.relpath(GLOSSARY, REPO),
              "glossary_entries": len(glossary), "sentences": len(sources), "subset_sentences": len(chosen),
              "terms": sum(len(t) for _, _, t in chosen), "cpu_flags": vector_flags(), "runs": {}}
    for name, kwargs in (("free", {}), ("required_terms", {"required_terms": [t for _, _, t in chosen]})):
        start = time.monotonic()
        results = translator.translate(texts, n_best=1, batch_size=FLAGS.lines_per_batch, **kwargs)
        seconds = time.monotonic() - start
        hypotheses = [r.text for r in results]
        present = [whole_word(term, h) for h, (_, _, terms) in zip(hypotheses, chosen) for term in terms]
        scores = corpus_scores(hypotheses, refs, "fr")
        report["runs"][name] = {
            "term_presence": sum(present) / max(1, len(present)),
            "sentences_all_terms": sum(all(whole_word(t, h) for t in terms)
                                       for h, (_, _, terms) in zip(hypotheses, chosen)) / max(1, len(chosen)),
            "terms_met_output": (None if results[0].terms_met is None
                                 else sum(r.terms_met for r in results) / len(results)),
            "seconds": round(seconds, 1),
            **{k: scores[k] for k in ("bleu", "bleu_signature", "bleu_lc_moses", "bleu_lc_moses_signature")},
            "examples": [{"source": s, "terms": t, "translation": h}
                         for (s, _, t), h in list(zip(chosen, hypotheses))[:5]],
        }
        print(name, {k: v for k, v in report["runs"][name].items() if k != "examples"}, file=sys.stderr)
    out = FLAGS.out or os.path.join(HERE, f"{FLAGS.set}.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, ensure_ascii=False)
    print(out)
    return 0


if __name__ == "__main__":
    app.run(main)
