r"""Scores sentence pairs with a model: phrase tables, n-best lists, parallel text.

Usage:
  python -m nmt_tf.score --saved_model=E --phrase_table=phrase-table.gz --output=scored.gz
  python -m nmt_tf.score --saved_model=E --nbest=nbest.txt --source=test.en --output=nbest.rescored.txt
  python -m nmt_tf.score --saved_model=E --source=test.en --target=test.fr --output=scores.tsv
  python -m nmt_tf.score --saved_model=E --tsv=pairs.tsv --output=scores.tsv
  python -m nmt_tf.score --server=localhost:8500 --model_name=nmt ...      # through TF Serving
  python -m nmt_tf.score --preset=multi30k_en_fr --source=test.en --target=test.fr
  python -m nmt_tf.score --preset=multi30k_en_fr --runtime=litert ...       # its LiteRT model, no TensorFlow

Every pair goes through the SavedModel's `score` signature (forced decoding:
log p(target | source), [EOS] included), locally (--saved_model, or
--preset, built on first use) or on a TF Serving-compatible server
(--server); with --runtime=litert, a LiteRT model (--litert_model, or
--preset's) scores on the host with its step signatures, without
TensorFlow (the same scores to about 1e-3): --sort_window pairs (1,000) at a time,
in batches of --lines_per_batch pairs of similar length, --parallel_batches
(2) at once.
Inputs stream (plain or gzip, chosen by content); the output is gzipped when
its name ends in .gz. Line order is always kept.

--phrase_table: a Moses phrase table, `src ||| tgt ||| scores [||| ...]`.
  The model's score of (src, tgt) is appended to the scores field (paper 004
  §3.1: "add a new score for each phrase pair to the existing phrase table");
  every other field is kept. --phrase_score=logprob (default) appends
  log p(tgt | src); Moses' standard phrase-table loader takes the logarithm of
  every score, so with it use --phrase_score=prob (p = exp(log p)).
--nbest: a Moses n-best list, `id ||| hypothesis ||| features ||| total`,
  with --source holding the source sentences (id 0 is the first line). The
  feature `<--feature_name>= <log p(hypothesis | source)>` is appended to
  the features field; the total is kept (tune the new weight, e.g. with MERT).
--source/--target or --tsv: writes `source<TAB>target<TAB>log_prob<TAB>
  log_prob_per_token<TAB>target_length` per pair.

Moses-escaped text (&apos; &quot; &amp; &lt; &gt; &#91; &#93; &#124;) is
unescaped before scoring (--moses_unescape). Malformed lines (too few
fields, a bad n-best id) are copied to the output unchanged and reported on
stderr with their line numbers; --strict makes them an error instead.
"""

from __future__ import annotations

import sys

from absl import app
from absl import flags as absl_flags

from nmt_tf import flags as nmt_flags  # also defines --saved_model, --server, --model_name, ...
from nmt_tf import presets
from nmt_tf.inference.client import ClientError, SignatureClient
from nmt_tf.inference.litert_runtime import LiteRTClient
from nmt_tf.inference.scoring import ScoreError, input_kind, pair_scorer, score_files

absl_flags.DEFINE_string("phrase_table", None, "A Moses phrase table to extend with the model's score.")
absl_flags.DEFINE_string("nbest", None, "A Moses n-best list to add the model's score to (needs --source).")
absl_flags.DEFINE_string("source", None, "Source sentences: of the n-best list, or of the pairs (with --target).")
absl_flags.DEFINE_string("target", None, "Target sentences, line-aligned with --source.")
absl_flags.DEFINE_string("tsv", None, "Pairs as source<TAB>target lines.")
absl_flags.DEFINE_enum("phrase_score", "logprob", ["logprob", "prob"],
                       "Score appended to phrase tables: log p(tgt | src), or p for Moses' loader (which takes logs).")
absl_flags.DEFINE_string("feature_name", "NMT", "Name of the n-best feature.")
absl_flags.DEFINE_boolean("moses_unescape", True, "Undo Moses' escaping of special characters before scoring.")
absl_flags.DEFINE_boolean("strict", False, "Stop at the first malformed line instead of copying it through.")
TOOL_FLAGS = nmt_flags.tool_flags(__name__, ("saved_model", "preset", "server", "model_name", "timeout", "output",
                                             "lines_per_batch", "sort_window", "parallel_batches", "runtime",
                                             "litert_model", "litert_weights", "litert_threads"))


def _scorer():
    """(sources, targets) -> the score signature's outputs, for the model the flags name."""
    FLAGS = absl_flags.FLAGS
    log = lambda *a: print(*a, file=sys.stderr)      # noqa: E731
    if FLAGS.runtime == "litert":
        if FLAGS.saved_model or FLAGS.server or bool(FLAGS.litert_model) == bool(FLAGS.preset):
            raise ScoreError("--runtime=litert scores with a LiteRT model: give exactly one of --litert_model and "
                             "--preset")
        folder = FLAGS.litert_model or presets.litert_model(FLAGS.preset, FLAGS.litert_weights, log=log)
        client = LiteRTClient(folder, num_threads=FLAGS.litert_threads, interpreters=FLAGS.parallel_batches)
        return client.score
    if sum(bool(x) for x in (FLAGS.saved_model, FLAGS.preset, FLAGS.server)) != 1:
        raise ScoreError("give exactly one of --saved_model, --preset and --server.")
    client = SignatureClient("score", saved_model=presets.saved_model_for(FLAGS.saved_model, FLAGS.preset, log=log),
                             server=FLAGS.server, model_name=FLAGS.model_name, timeout=FLAGS.timeout)
    return pair_scorer(client)


def main(argv):
    nmt_flags.start_cli(argv, accepts=TOOL_FLAGS)
    FLAGS = absl_flags.FLAGS
    try:
        input_kind(FLAGS.phrase_table, FLAGS.nbest, FLAGS.source, FLAGS.target, FLAGS.tsv)   # before the model loads
        scored = score_files(_scorer(), phrase_table=FLAGS.phrase_table, nbest=FLAGS.nbest,
                             source=FLAGS.source, target=FLAGS.target, tsv=FLAGS.tsv, output=FLAGS.output,
                             batch_size=FLAGS.lines_per_batch, moses_unescape=FLAGS.moses_unescape,
                             sort_window=FLAGS.sort_window, parallel_batches=FLAGS.parallel_batches,
                             phrase_score=FLAGS.phrase_score, feature_name=FLAGS.feature_name, strict=FLAGS.strict)
        print(f"scored {scored:,} pairs", file=sys.stderr)
    except (ScoreError, ClientError, FileNotFoundError, ValueError, presets.PresetError) as e:   # LiteRTModelError
        return nmt_flags.user_error(e)
    return 0


if __name__ == "__main__":
    app.run(main)
