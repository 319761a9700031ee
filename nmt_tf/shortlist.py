r"""Learns the lexical table that vocabulary shortlists (--shortlist_size) use.

Usage:
  python -m nmt_tf.shortlist --model_dir=runs/m30k            # writes runs/m30k/lexical_shortlist.npz
  python -m nmt_tf.evaluate --model_dir=runs/m30k --shortlist_size=2000 --src=val.en --ref=val.fr
  python -m nmt_tf.export --model_dir=runs/m30k --shortlist_size=1000 --export_dir=exports/nmt

Reads the model's training corpus (config.json's --train_src / --train_tgt,
or the ones given) with the model's own tokenizers, skips the pairs with an
empty side or more than --max_len tokens, and learns IBM Model 1 (EM,
--shortlist_iterations) over at most --shortlist_pairs of them. It stores
for every source token its --shortlist_keep likeliest target tokens and the
target tokens' counts (nmt_tf.data.lexicon), and reports how many of the dev
set's reference tokens (config.json's --dev_src / --dev_tgt) a shortlist of
each size would hold, sentence by sentence. A search with --shortlist_size=C
then computes its output layer and softmax over at least C candidate tokens
per batch, more when the batch's translations need the room (Jean et al.
2015; docs/translating.md, "Vocabulary shortlists").
"""

from __future__ import annotations

import io
import os
import sys
import time

import numpy as np
from absl import app
from absl import flags as absl_flags

from nmt_tf import config as nmt_config
from nmt_tf import flags as nmt_flags
from nmt_tf.core.files import corpus_files, write_atomically
from nmt_tf.data.lexicon import coverage, encoded_pairs, lexical_table, lexical_table_path

absl_flags.DEFINE_integer("shortlist_keep", 50, "Translations stored per source token, best first (the most "
                          "--shortlist_per_word can use).", lower_bound=1)
absl_flags.DEFINE_integer("shortlist_pairs", 300_000, "Learn from at most this many sentence pairs (the first "
                          "usable ones).", lower_bound=1)
absl_flags.DEFINE_integer("shortlist_iterations", 5, "EM iterations of IBM Model 1.", lower_bound=1)
COVERAGE_SIZES = (200, 500, 1000, 2000, 3000, 5000)
TOOL_FLAGS = nmt_flags.tool_flags(__name__, ("model_dir", "train_src", "train_tgt", "dev_src", "dev_tgt",
                                             "shortlist_per_word"))


def _corpus_path(flag: str, config) -> str:
    """--train_src etc. as given, else the model directory's training flags' value."""
    FLAGS = absl_flags.FLAGS
    path = FLAGS[flag].value if FLAGS[flag].present else getattr(config, flag)
    for part in corpus_files(path):        # several files: comma-separated
        if not os.path.exists(part):
            origin = "" if FLAGS[flag].present else ", from the model directory"
            raise FileNotFoundError(f"{part} does not exist (--{flag}{origin})")
    return path


def main(argv):
    nmt_flags.start_cli(argv, accepts=TOOL_FLAGS)
    FLAGS = absl_flags.FLAGS
    if not FLAGS.model_dir:
        return nmt_flags.user_error("--model_dir is required.")
    log = lambda message: print(message, file=sys.stderr)      # noqa: E731
    try:
        from nmt_tf.data import pipeline as data

        config = nmt_config.load(FLAGS.model_dir)
        source_tokenizer, target_tokenizer = data.load_tokenizers(config, FLAGS.model_dir)
        train_src, train_tgt = _corpus_path("train_src", config), _corpus_path("train_tgt", config)
        started = time.time()
        pairs, skipped = encoded_pairs(train_src, train_tgt, source_tokenizer, target_tokenizer, config.max_len,
                                       FLAGS.shortlist_pairs)
        if not pairs:
            return nmt_flags.user_error(f"no usable sentence pairs in {train_src} and {train_tgt}.")
        log(f"IBM Model 1 on {len(pairs):,} pairs of {train_src} / {train_tgt} ({skipped:,} skipped: an empty "
            f"side or more than {config.max_len} tokens), {FLAGS.shortlist_iterations} iterations")
        table = lexical_table(pairs, source_tokenizer.vocab_size, target_tokenizer.vocab_size,
                              FLAGS.shortlist_keep, FLAGS.shortlist_iterations)
        buffer = io.BytesIO()
        np.savez(buffer, **table)
        path = lexical_table_path(FLAGS.model_dir)
        write_atomically(path, buffer.getvalue())
        log(f"Wrote {path} ({FLAGS.shortlist_keep} translations per source token) in "
            f"{time.time() - started:.0f} s.")
        dev_src, dev_tgt = _corpus_path("dev_src", config), _corpus_path("dev_tgt", config)
        if dev_src and dev_tgt:
            dev, _ = encoded_pairs(dev_src, dev_tgt, source_tokenizer, target_tokenizer, None)
            vocab = target_tokenizer.vocab_size
            sizes = [size for size in COVERAGE_SIZES if size < vocab] or [vocab // 4, vocab // 2]
            per_word = min(FLAGS.shortlist_per_word, FLAGS.shortlist_keep)
            covered = coverage(table, dev, sizes, per_word)
            log(f"Reference tokens of {dev_tgt} inside their sentence's shortlist (--shortlist_per_word="
                f"{per_word}), by --shortlist_size: " + ", ".join(f"{size:,}: {100 * share:.2f} %"
                                                                  for size, share in covered.items()))
    except (OSError, ValueError) as e:      # FileNotFoundError, WriteFailed, unequal corpora
        return nmt_flags.user_error(e)
    return 0


if __name__ == "__main__":
    app.run(main)
