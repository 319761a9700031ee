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
batch translation on such CPUs, slower one-sentence serving (README.md).
--shortlist_size=C searches at least C candidate tokens per request (more
when its sentences' translations need them) instead of the whole target
vocabulary (nmt_tf.shortlist; its lexical table is stored in
the SavedModel).

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

score (forced decoding, for rescoring and phrase scoring):
  inputs   source, target      [batch] string
  outputs  log_prob            [batch] float, log p(target | source), [EOS] included
           log_prob_per_token  [batch] float, log_prob / target_length
           target_length       [batch] int32, target tokens with [EOS]
           token_log_probs     [batch, T] float, per target token (0 pads)
           truncated           [batch] bool, either side cut to --max_input_length tokens
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil

from absl import app
from absl import flags as absl_flags

from nmt_tf import flags as nmt_flags
from nmt_tf.files import WriteFailed
from nmt_tf.lexicon import for_search
from nmt_tf.translator import EXPORT_METADATA, Translator, UnkReplacement, restore_ensemble

absl_flags.DEFINE_string("export_dir", None, "Base directory of the versioned SavedModels (what TF Serving's --model_base_path points at).")
absl_flags.DEFINE_integer("version", 0, "Version number to write (0: one more than the highest existing).", lower_bound=0)
absl_flags.DEFINE_boolean(
    "freeze_step_weights", True,
    "Store the matrices of a search step (the output layer in column blocks, fused and sliced decoder "
    "matrices) and the encoder GRUs' split recurrent matrices as variables of their own instead of building "
    "them from the model's weights on every request: one-sentence requests answer about a fifth faster, and "
    "the export takes about 60% more bytes (BUILD_NOTES.md, 'Serving latency').")
absl_flags.DEFINE_boolean(
    "freeze_token_products", True,
    "With --freeze_step_weights: also store, for every target word y, the two products a search step takes "
    "of its embedding (the decoder GRU's input term W E y + b, layer-normalised with --layer_norm, and the "
    "readout's V_o E y + b_o), so that a step looks the previous words' terms up instead of multiplying: "
    "batched beam search about 6% and one-sentence requests about 3-5% faster, for target vocabulary x "
    "(3 x hidden_size + 2 x maxout_size - embedding_size) more values (the default Multi30k model: 151 "
    "instead of 82 MB; BUILD_NOTES.md, 'Decoding speed').")

WARMUP_SENTENCES = ["A man is walking his dog in the park.", "Two children are playing.", ""]


def next_version(export_dir: str) -> int:
    versions = [int(d) for d in os.listdir(export_dir) if re.fullmatch(r"\d+", d)] if os.path.isdir(export_dir) else []
    return max(versions, default=0) + 1


def write_warmup(saved_model_dir: str, sentences=WARMUP_SENTENCES) -> str:
    """assets.extra/tf_serving_warmup_requests: one PredictionLog for serving_default."""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    extra = os.path.join(saved_model_dir, "assets.extra")
    os.makedirs(extra, exist_ok=True)
    path = os.path.join(extra, "tf_serving_warmup_requests")
    request = predict_pb2.PredictRequest()
    request.model_spec.signature_name = "serving_default"
    request.inputs["text"].CopyFrom(tf.make_tensor_proto(sentences, dtype=tf.string))
    log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
    with tf.io.TFRecordWriter(path) as writer:
        writer.write(log.SerializeToString())
    return path


TOOL_FLAGS = nmt_flags.tool_flags(__name__, ("model_dir", "ensemble", "max_input_length", "mixed_precision",
                                             *nmt_flags.SEARCH_FLAGS, *nmt_flags.WEIGHTS_FLAGS))


def write_metadata(saved_model_dir: str, model_dirs: list[str], config, options, max_input_length: int,
                   weights: str, unk_replacement=None, precision: str = "float32") -> None:
    """assets.extra/nmt_tf.json (languages, tokenizer, search settings, precision, which
    weights) and the training word shortlists (of the first model), for
    nmt_tf.evaluate / visualize on the export."""
    from nmt_tf import data

    model_dir = model_dirs[0]
    extra = os.path.join(saved_model_dir, "assets.extra")
    os.makedirs(extra, exist_ok=True)
    meta = {"src_lang": config.src_lang, "tgt_lang": config.tgt_lang, "tokenizer": config.tokenizer,
            "model": config.model, "search": dataclasses.asdict(options), "max_input_length": max_input_length,
            "checkpoint": weights, "precision": precision, "model_dirs": [os.path.abspath(d) for d in model_dirs],
            "replace_unk": unk_replacement is not None,
            "unk_dictionary": unk_replacement.dictionary if unk_replacement is not None else None}
    with open(os.path.join(extra, EXPORT_METADATA), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2)
    for path in data.word_shortlist_paths(model_dir):
        if os.path.exists(path):
            shutil.copy(path, os.path.join(extra, os.path.basename(path)))


def remove_stale_temporaries(export_dir: str, log=print) -> list[str]:
    """Removes the `.tmp-<version>-<pid>` folders of exports whose process is
    gone (killed before its rename); an export still running keeps its own.
    Returns the removed paths."""
    removed = []
    for name in sorted(os.listdir(export_dir)):
        match = re.fullmatch(r"\.tmp-\d+-(\d+)", name)
        if not match or _process_alive(int(match.group(1))):
            continue
        path = os.path.join(export_dir, name)
        shutil.rmtree(path, ignore_errors=True)
        log(f"Removed {path}, left by an export that did not finish.")
        removed.append(path)
    return removed


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:      # someone else's process
        return True
    return True


def export(model_dir, export_dir: str, options, version: int = 0, weights="best",
           max_input_length: int = 100, log=print, freeze_step_weights: bool = True,
           unk_replacement=None, precision: str = "float32", freeze_token_products: bool = True) -> str:
    """Writes export_dir/<version>/ atomically; returns its path.

    `model_dir`: a model directory, or a list of several (an ensemble).
    `weights`: a `nmt_tf.checkpoints.WeightsChoice` or a --checkpoint value.
    `unk_replacement`: a `nmt_tf.translator.UnkReplacement`, or None.
    `freeze_step_weights`, `freeze_token_products`: see
    `Seq2SeqModel.freeze_step_weights` (its `token_products`; only with
    `freeze_step_weights`).
    `precision`: the Keras dtype policy the SavedModel computes in
    ("mixed_bfloat16": bfloat16 arithmetic, and its frozen step matrices
    stored in bfloat16)."""
    import tensorflow as tf

    model_dirs = [model_dir] if isinstance(model_dir, str) else list(model_dir)
    version = version or next_version(export_dir)
    final = os.path.join(export_dir, str(version))
    if os.path.exists(final):     # before the (slow) restore
        raise FileExistsError(f"{final} already exists; choose another --version")
    os.makedirs(export_dir, exist_ok=True)
    remove_stale_temporaries(export_dir, log)
    model, src_tok, tgt_tok, config, checkpoint_path = restore_ensemble(model_dirs, weights, log=log,
                                                                        precision=precision)
    tmp = os.path.join(export_dir, f".tmp-{version}-{os.getpid()}")
    shortlist = for_search(model_dirs[0], model, options)
    # A shortlist's search gathers its output columns itself: the whole layer's blocks are not stored.
    step_weights = (model.freeze_step_weights(freeze_token_products, output_layer=shortlist is None)
                    if freeze_step_weights else [])
    module = Translator(model, src_tok, tgt_tok, options, max_input_length, unk_replacement, shortlist).module()
    module.step_weights = step_weights
    try:
        tf.saved_model.save(module, tmp, signatures={
            "serving_default": module.translate.get_concrete_function(),
            "translate": module.translate.get_concrete_function(),
            "score": module.score.get_concrete_function()})
        write_warmup(tmp)
        write_metadata(tmp, model_dirs, config, options, max_input_length, checkpoint_path, unk_replacement,
                       precision)
        os.rename(tmp, final)
    except (tf.errors.OpError, OSError) as e:      # a full disk: no version appears, none is damaged
        shutil.rmtree(tmp, ignore_errors=True)
        raise WriteFailed(final, e, kept="no new version was made; the existing versions are unchanged") from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"Exported {final} (beam {options.beam_size}, n-best {options.n_best}"
        f"{f', shortlist of {options.shortlist_size}' if shortlist is not None else ''}"
        f"{'' if precision == 'float32' else f', {precision}'}"
        f"{f', an ensemble of {len(model_dirs)} models' if len(model_dirs) > 1 else ''}).\n"
        f"  saved_model_cli show --dir {final} --all\n"
        f"  python -m nmt_tf.translate --saved_model={final} < input.txt")
    return final


def main(argv):
    nmt_flags.start_cli(argv, accepts=TOOL_FLAGS)
    FLAGS = absl_flags.FLAGS
    if not FLAGS.model_dir or not FLAGS.export_dir:
        return nmt_flags.user_error("--model_dir and --export_dir are required.")
    if FLAGS["freeze_token_products"].present and FLAGS.freeze_token_products and not FLAGS.freeze_step_weights:
        return nmt_flags.user_error("--freeze_token_products needs --freeze_step_weights (the products are "
                                    "stored with the frozen step matrices).")
    try:
        export([FLAGS.model_dir, *(FLAGS.ensemble or [])], FLAGS.export_dir, nmt_flags.search_options(),
               FLAGS.version, nmt_flags.weights_choice(), FLAGS.max_input_length,
               freeze_step_weights=FLAGS.freeze_step_weights, unk_replacement=UnkReplacement.from_flags(
                   FLAGS.replace_unk, FLAGS.unk_dictionary), precision=nmt_flags.search_precision(),
               freeze_token_products=FLAGS.freeze_token_products)
    except (OSError, ValueError) as e:      # FileNotFoundError, FileExistsError, WriteFailed (a full disk)
        return nmt_flags.user_error(e)
    return 0


if __name__ == "__main__":
    app.run(main)
