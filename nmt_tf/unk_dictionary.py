r"""Builds the word dictionary that --replace_unk --unk_dictionary uses, from a parallel corpus.

Usage:
  python -m nmt_tf.unk_dictionary --train_src=train.en.gz --train_tgt=train.fr.gz \
      --src_lang=en --tgt_lang=fr --output=unk_dictionary.tsv

[UNK] replacement (Luong et al. 2015; Jean et al. 2015) puts, for each [UNK]
the model generates, the source word it attended to most, or that word's
translation from a dictionary. Copying is right for names and numbers; the
dictionary is for the other case, a source word the model knows whose
translation is too rare for the target shortlist (the published systems
took it from a word aligner). This tool learns one from the training
corpus: IBM Model 1 (Brown et al. 1993; EM, --dictionary_iterations) in both
directions, source->target with a NULL source word and target->source with
a NULL target word, and for each source word the target word w that
maximises p(w | source word) * p(source word | w) among the words it
co-occurs with. The product of the two directions keeps frequent function
words ("le", ".") from becoming the translation of a rare word, which one
direction alone does (a rare word "explains" whatever its sentence has left).

Words are split exactly as the word tokenizer of nmt_tf splits them (the
same TF ops, case kept), so the entries match the source tokens and target
words of a `--tokenizer=word` model. The output is `source<TAB>target`, one
line per source word, most frequent source words first (UTF-8). Pairs with
an empty side or more than --max_len words on either side are skipped and
counted; corpora of unequal length are an error. The whole corpus (up to
--dictionary_max_sentences pairs) is held in memory.
"""

from __future__ import annotations

import sys

from absl import app
from absl import flags as absl_flags

from nmt_tf import flags as nmt_flags
from nmt_tf.core.files import input_lines, write_atomically
from nmt_tf.data.alignment import learn_dictionary, split_corpus

absl_flags.DEFINE_integer("dictionary_iterations", 5, "EM iterations of IBM Model 1 in each direction.",
                          lower_bound=1)
absl_flags.DEFINE_integer("dictionary_max_sentences", 1_000_000,
                          "Learn from at most this many sentence pairs (the first ones).", lower_bound=1)
TOOL_FLAGS = nmt_flags.tool_flags(__name__, ("train_src", "train_tgt", "src_lang", "tgt_lang", "max_len",
                                             "output"))


def main(argv):
    nmt_flags.start_cli(argv, accepts=TOOL_FLAGS)
    FLAGS = absl_flags.FLAGS
    missing = [f"--{name}" for name in ("train_src", "train_tgt", "output") if not FLAGS[name].value]
    if missing:
        return nmt_flags.user_error(f"{' and '.join(missing)} required.")
    log = lambda message: print(message, file=sys.stderr)      # noqa: E731
    try:
        pairs, skipped = split_corpus(
            input_lines(FLAGS.train_src, "train_src"), input_lines(FLAGS.train_tgt, "train_tgt"),
            FLAGS.src_lang, FLAGS.tgt_lang, FLAGS.max_len, FLAGS.dictionary_max_sentences,
            names=(f"{FLAGS.train_src} (--train_src)", f"{FLAGS.train_tgt} (--train_tgt)"))
        if skipped:
            log("Skipped " + ", ".join(f"{n:,} pairs with {why}" for why, n in skipped.items()))
        if not pairs:
            return nmt_flags.user_error(f"no usable sentence pairs in {FLAGS.train_src} and {FLAGS.train_tgt}.")
        entries = learn_dictionary(pairs, FLAGS.dictionary_iterations, log)
        write_atomically(FLAGS.output, "".join(f"{s}\t{t}\n" for s, t in entries))
    except (OSError, ValueError) as e:      # InputError, WriteFailed, ...
        return nmt_flags.user_error(e)
    log(f"Wrote {len(entries):,} entries to {FLAGS.output}; "
        f"{sum(s != t for s, t in entries):,} of them translate the word into another.")
    return 0


if __name__ == "__main__":
    app.run(main)
