r"""Exports a trained model as a versioned SavedModel for TensorFlow Serving.

Usage:
  python -m nmt_tf.export --model_dir=runs/m30k --export_dir=exports/nmt [--version=N]
      [--checkpoint=best|last|averaged|PATH] [--beam_size=10 --n_best=1 ...]
  python -m nmt_tf.export --model_dir=runs/m30k --average_checkpoints=4 --average_from=best --export_dir=E
  python -m nmt_tf.export --model_dir=runs/a --ensemble=runs/b --ensemble=runs/c --export_dir=E
  python -m nmt_tf.export --model_dir=runs/m30k --mixed_precision=mixed_bfloat16 --export_dir=E

--average_checkpoints exports the mean of the weights of several checkpoints
(of each model); --ensemble exports several models as one: at every beam
step their log-probabilities are averaged inside the graph, so TF Serving
serves the ensemble as one model (nmt_tf.models.ensemble).
--mixed_precision=mixed_bfloat16 (or auto: bfloat16 if this machine's CPU has
bfloat16 instructions) exports a model that computes in bfloat16: faster
batch translation on such CPUs, slower one-sentence serving (docs/translating.md).
--shortlist_size=C searches at least C candidate tokens per request (more
when its sentences' translations need them) instead of the whole target
vocabulary (nmt_tf.shortlist; its lexical table is stored in
the SavedModel).

--format=litert writes a LiteRT model folder instead (nmt_tf.exporting.litert;
docs/litert.md), with --litert_weights=int8 (default), float16 or float32:
  python -m nmt_tf.export --model_dir=runs/m30k --average_checkpoints=5 --format=litert --export_dir=lite

Writes EXPORT_DIR/<version>/ (the next free integer unless --version is
given) atomically: the SavedModel is written to a hidden temporary folder
beside it and renamed into place, so TF Serving never sees half a version.
The temporary folders of exports that were killed before their rename
(`.tmp-<version>-<pid>`, their process gone) are removed by the next export.
An existing --version is refused before the model is loaded.

The SavedModel's signatures run everything in the graph with core
TensorFlow ops (plus tensorflow-text ops for --tokenizer=wordpiece, which the
official tensorflow_model_server links in): clean-up, tokenization,
vocabulary lookup (vocabularies are assets), beam search and detokenization.
No py_function. All outputs are dense and batch-major.

serving_default (= "translate"):
  inputs   text                [batch] string, raw sentences
  outputs  translation         [batch] string, the best hypothesis, detokenized
           score               [batch] float, its log-probability / length penalty
           log_prob            [batch] float, its log-probability
           source_tokens       [batch, S] string, the source tokens the model saw, with "[EOS]"; "" pads
           target_tokens       [batch, T] string, the output tokens with "[EOS]"; "" pads
           alignment           [batch, T, S] float, attention weights alpha (row i: output token i)
           truncated           [batch] bool, True where the source had more than
                               --max_input_length tokens and was cut to that length
           nbest_translations  [batch, N] string, N = --n_best fixed at export, best first
  With --replace_unk the translations have each [UNK] replaced by the most
  attended source word (or its --unk_dictionary translation); target_tokens
  keep [UNK].
           nbest_scores        [batch, N] float (-1e9 where fewer hypotheses finished)
  An empty or whitespace-only input gives an empty translation with score 0.

translate_constrained (serving_default's outputs, steered):
  inputs   text                [batch] string, raw sentences
           target_prefix       [batch] string, what each translation must start with ("": nothing)
           required_terms      [batch] string, target terms each translation must contain,
                               tab-separated ("": none; at most 16)
  outputs  serving_default's, and
           terms_met           [batch] bool, the translation holds every required term
           nbest_terms_met     [batch, N] bool
           terms_spellable     [batch] bool, False where a term cannot be written with the target
                               vocabulary (an [UNK] token, except one unknown word of a word-level
                               model, written as the term's text; or a control character): that
                               term is left out of the search and terms_met is False
  Every hypothesis of sentence i starts with the tokens of target_prefix[i]
  (forced), then the search is free; the translation starts with the prefix
  byte for byte (its trailing whitespace dropped). Every returned hypothesis
  holds each required term (lexically constrained beam search with dynamic
  beam allocation, nmt_tf.inference.constraints), unless they do not fit in the length
  limit: then the best partial one, terms_met False. An empty source still
  gives an empty translation. Searches the whole target vocabulary: an
  export with --shortlist_size has no translate_constrained signature.

translate_with_options (serving_default with the request's search settings):
  inputs   text                [batch] string, raw sentences
           beam_size           int32 scalar, 1 to --max_beam_size (default: --beam_size)
           n_best              int32 scalar, 1 to beam_size (default: --n_best)
           length_alpha        float scalar, 0 to 10 (default: --length_alpha)
  outputs  serving_default's, with N = the request's n_best
  Each setting may be left out of a request (the signature's defaults, which
  TF Serving and nmt_tf.serve fill in). One search is built per beam width up
  to --max_beam_size; a setting out of its range is INVALID_ARGUMENT naming
  it and its bound. With tensorflow_model_server's --enable_batching, which
  batches every input along its first dimension, call serving_default or
  translate instead: a scalar input cannot be batched there (nmt_tf.serve's
  batching joins requests of the same settings).

score (forced decoding, for rescoring and phrase scoring):
  inputs   source, target      [batch] string
  outputs  log_prob            [batch] float, log p(target | source), [EOS] included
           log_prob_per_token  [batch] float, log_prob / target_length
           target_length       [batch] int32, target tokens with [EOS]
           token_log_probs     [batch, T] float, per target token (0 pads)
           truncated           [batch] bool, either side cut to --max_input_length tokens
"""

from __future__ import annotations

from absl import app
from absl import flags as absl_flags

from nmt_tf import flags as nmt_flags
from nmt_tf.config import ExportConfig
from nmt_tf.exporting.litert import export_litert
from nmt_tf.exporting.saved_model import export

absl_flags.DEFINE_string("export_dir", None, "Base directory of the versioned SavedModels (what TF Serving's --model_base_path points at).")
absl_flags.DEFINE_integer("version", 0, "Version number to write (0: one more than the highest existing).", lower_bound=0)
absl_flags.DEFINE_enum("format", "savedmodel", ["savedmodel", "litert"],
                       "savedmodel: a SavedModel for TF Serving and nmt_tf.serve (the default). litert: a LiteRT "
                       "model folder (model.tflite with an encoder and a decoder-step signature, the SentencePiece "
                       "models and vocabularies, nmt_tf_litert.json), translated by nmt_tf.translate "
                       "--runtime=litert without TensorFlow and on devices (docs/litert.md); SentencePiece models "
                       "only, one model (no --ensemble), float32 search, no --shortlist_size or --replace_unk; "
                       "--litert_weights chooses the weights' storage.")
nmt_flags.define_settings(ExportConfig, ("freeze_step_weights", "freeze_token_products", "max_beam_size"),
                          module_name=__name__)

TOOL_FLAGS = nmt_flags.tool_flags(__name__, ("model_dir", "ensemble", "max_input_length", "mixed_precision",
                                             "litert_weights", *nmt_flags.SEARCH_FLAGS, *nmt_flags.WEIGHTS_FLAGS))


def main(argv):
    nmt_flags.start_cli(argv, accepts=TOOL_FLAGS)
    FLAGS = absl_flags.FLAGS
    if not FLAGS.model_dir or not FLAGS.export_dir:
        return nmt_flags.user_error("--model_dir and --export_dir are required.")
    try:
        # Not given, the token products follow --freeze_step_weights (they are stored with its matrices).
        products = FLAGS.freeze_token_products if FLAGS["freeze_token_products"].present else FLAGS.freeze_step_weights
        config = nmt_flags.export_config(freeze_token_products=products)
        if FLAGS.format == "litert":
            export_litert([FLAGS.model_dir, *(FLAGS.ensemble or [])], FLAGS.export_dir, config,
                          FLAGS.litert_weights, FLAGS.version)
        else:
            export([FLAGS.model_dir, *(FLAGS.ensemble or [])], FLAGS.export_dir, config, FLAGS.version)
    except (OSError, ValueError) as e:      # ConfigError, FileNotFoundError, FileExistsError, WriteFailed (a full disk)
        return nmt_flags.user_error(e)
    return 0


if __name__ == "__main__":
    app.run(main)
