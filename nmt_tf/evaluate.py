r"""Translation quality with the papers' analyses (sacreBLEU).

Usage:
  python -m nmt_tf.evaluate --model_dir=runs/m30k --src=data/multi30k/test_2016_flickr.en.gz \
      --ref=data/multi30k/test_2016_flickr.fr.gz [--out_dir=O] [--beam_size=10]
  python -m nmt_tf.evaluate --model_dir=A --model_dir=B --label=RNNsearch --label=RNNencdec --src=F --ref=G
  python -m nmt_tf.evaluate --saved_model=exports/nmt/1 --src=F --ref=G
  python -m nmt_tf.evaluate --model_dir=A --average_checkpoints=4 --src=F --ref=G    # mean of the 4 best
  python -m nmt_tf.evaluate --model_dir=A --ensemble=B --src=F --ref=G                # A and B as one ensemble

For each model: translates --src with beam search (--beam_size, default 10,
and the other search flags; in float32, or --mixed_precision; a --saved_model
uses the settings fixed at its export), writes the hypotheses, and reports
sacreBLEU on the detokenized output against the raw --ref: BLEU cased and
lowercased with their signature strings, and chrF; and lowercased
Moses-tokenized BLEU, the way the Multi30k / WMT multimodal papers score
(nmt_tf.evaluation.metrics.moses_lc_bleu), as report.json and a table (printed and
report.txt).

The papers' analyses, in the same report and as PNG plots:

* no UNK (paper 000 Table 1): only the pairs whose source and reference
  contain no unknown word, decoded again with [UNK] forbidden
  (hypotheses.no_unk.txt). A word is unknown when it is not among the
  training shortlist of the model's side; for sub-word models the shortlist is
  that of the training words with the same size as the sub-word vocabulary
  (words.src.txt / words.tgt.txt, written at training time). A SavedModel
  cannot change its search: its no-UNK score uses its normal output.
* BLEU by source length (paper 000 Fig. 2): bins of 10 words, 1-10 ... 61+
  (bleu_by_length.png).
* BLEU by number of unknown words (paper 002 Fig. 4c): sentences with at
  most k unknown words in source and reference, k = 0..10
  (bleu_by_unknown.png).
* with UNK: the other pairs, those with an unknown word, scored from the
  normal output (where --replace_unk acts), and the number of [UNK] tokens
  left in the output.

With several models (--model_dir / --saved_model repeated, in that order;
--label names them), each gets a folder under --out_dir and the plots show
them together, labelled. Words are counted by the Moses-like word splitter.
The test files are read into memory (they are test sets); progress with an
ETA goes to stderr on a terminal.

This tool parses the flags and calls nmt_tf/evaluation/quality.py, which evaluates
from Python without flags.
"""

from __future__ import annotations

from absl import app
from absl import flags as absl_flags

from nmt_tf import flags as nmt_flags
from nmt_tf.evaluation.quality import EvaluationError, format_table, run
from nmt_tf.inference.client import ClientError

absl_flags.DEFINE_string("src", None, "Source sentences to translate (plain or gzip).")
absl_flags.DEFINE_string("ref", None, "Reference translations, line-aligned with --src (raw, untokenized).")
absl_flags.DEFINE_string("out_dir", None, "Where hypotheses, report.json, report.txt and the plots go "
                         "(default: <model_dir>/eval/<name of --src>, or eval/<name of --src> for --saved_model).")
absl_flags.DEFINE_multi_string("label", None, "Names of the models in reports and plots, in the order given.")
TOOL_FLAGS = nmt_flags.tool_flags(__name__, ("model_dir", "saved_model", "ensemble", "lines_per_batch",
                                             "max_input_length", "mixed_precision", *nmt_flags.SEARCH_FLAGS,
                                             *nmt_flags.WEIGHTS_FLAGS))


def split_model_args(argv: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """Takes every --model_dir=... and --saved_model=... out of argv (they may repeat), in order."""
    rest, models = [], []
    args = iter(argv)
    for arg in args:
        kind = next((k for k in ("model_dir", "saved_model") if arg == f"--{k}" or arg.startswith(f"--{k}=")), None)
        if kind is None:
            rest.append(arg)
        elif "=" in arg:
            models.append((kind, arg.split("=", 1)[1]))
        else:
            models.append((kind, next(args, "")))
    return rest, models


def main(argv):
    nmt_flags.start_cli(argv, accepts=TOOL_FLAGS)
    FLAGS = absl_flags.FLAGS
    if MODELS and all(kind == "saved_model" for kind, _ in MODELS) and nmt_flags.fixed_at_export_given():
        return nmt_flags.user_error(f"--{', --'.join(nmt_flags.fixed_at_export_given())}: "
                                    f"{nmt_flags.FIXED_AT_EXPORT_REASON}, or evaluate the model directory "
                                    "(--model_dir).")
    try:
        reports = run(MODELS, FLAGS.label, FLAGS.src, FLAGS.ref, FLAGS.out_dir, nmt_flags.decoding_config(),
                      FLAGS.lines_per_batch, ensemble=FLAGS.ensemble)
    except (EvaluationError, ClientError, OSError, ValueError) as e:   # OSError: FileNotFoundError, WriteFailed
        return nmt_flags.user_error(e)
    print(format_table(reports))
    return 0


MODELS: list[tuple[str, str]] = []


def parse_flags(argv):
    """absl parsing, with --model_dir / --saved_model allowed several times."""
    rest, models = split_model_args(argv)
    MODELS.extend(models)
    return app.parse_flags_with_usage(rest)      # an unknown flag: one line and exit code 1, as the other tools


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
