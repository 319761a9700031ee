r"""Exports a trained model as a versioned SavedModel for TensorFlow Serving.

Usage:
  python -m nmt_tf.export --model_dir=runs/m30k --export_dir=exports/nmt [--version=N]
      [--checkpoint=best|last|PATH] [--beam_size=10 --n_best=1 ...]

Writes EXPORT_DIR/<version>/ (the next free integer unless --version is
given) atomically: the SavedModel is written to a hidden temporary folder
beside it and renamed into place, so TF Serving never sees half a version.

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

import os
import re
import shutil
import sys

from absl import app
from absl import flags as absl_flags

from nmt_tf import flags as nmt_flags

absl_flags.DEFINE_string("export_dir", None, "Base directory of the versioned SavedModels (what TF Serving's --model_base_path points at).")
absl_flags.DEFINE_integer("version", 0, "Version number to write (0: one more than the highest existing).", lower_bound=0)
absl_flags.DEFINE_string("checkpoint", "best", "Weights to export: best (lowest dev loss; falls back to last), last, or a checkpoint path.")
absl_flags.DEFINE_integer("max_input_length", 100, "Longer inputs are cut to this many tokens (output 'truncated' says so), which bounds the work a request can cause.", lower_bound=1)

WARMUP_SENTENCES = ["A man is walking his dog in the park.", "Two children are playing.", ""]


class Translator:
    """Builds the serving functions around a model and its tokenizers.

    `module()` returns the tf.Module that is saved: it holds the model's
    weights, the tokenizers' tables (vocabularies as assets) and the two
    tf.functions.
    """

    def __init__(self, model, source_tokenizer, target_tokenizer, options, max_input_length: int):
        import tensorflow as tf

        self.tf = tf
        self.model = model
        self.source_tokenizer = source_tokenizer
        self.target_tokenizer = target_tokenizer
        self.options = options
        self.max_input_length = max_input_length

    def _ids(self, tokenizer, text, add_bos=False):
        """Raw text -> (ids [B, L] with [EOS] (and [BOS]), display tokens, truncated, empty)."""
        from nmt_tf.text import BOS_ID, EOS, EOS_ID

        tf = self.tf
        tokens = tokenizer.tokenize(text)
        lengths = tokens.row_lengths()
        tokens = tokens[:, :self.max_input_length]
        ids = tokenizer.lookup(tokens)
        rows = tf.shape(text)[:1]
        eos = tf.fill(tf.concat([rows, [1]], 0), EOS_ID)
        with_eos = tf.concat([ids, eos], axis=1)
        shifted = tf.concat([tf.fill(tf.concat([rows, [1]], 0), BOS_ID), ids], axis=1) if add_bos else None
        display = tf.concat([tokens, tf.fill(tf.concat([rows, [1]], 0), EOS)], axis=1).to_tensor("")
        return with_eos, shifted, display, lengths > self.max_input_length, tf.equal(lengths, 0)

    def _dense(self, ragged):
        """Ragged ids -> [B, L] padded with 0, L >= 1 (an empty batch still has one column)."""
        from nmt_tf.text import PAD_ID

        dense = ragged.to_tensor(PAD_ID)
        return self.tf.pad(dense, [[0, 0], [0, self.tf.maximum(0, 1 - self.tf.shape(dense)[1])]])

    def translate(self, text):
        from nmt_tf.search import search
        from nmt_tf.text import PAD_ID

        tf = self.tf
        source, _, source_tokens, truncated, empty = self._ids(self.source_tokenizer, text)
        source = self._dense(source)
        out = search(self.model, source, self.options)
        batch, n = tf.shape(out["tokens"])[0], tf.shape(out["tokens"])[1]
        flat = tf.reshape(out["tokens"], [batch * n, -1])
        texts = tf.reshape(self.target_tokenizer.decode(flat), [batch, n])
        keep = ~empty
        texts = tf.where(keep[:, None], texts, "")
        scores = tf.where(keep[:, None], out["scores"], 0.0)
        best = out["tokens"][:, 0]
        target_tokens = tf.where((best != PAD_ID) & keep[:, None],
                                 self.target_tokenizer.id_to_token(best), "")
        alignment = out["alignments"][:, 0] * tf.cast(keep, tf.float32)[:, None, None]
        return {
            "translation": texts[:, 0], "score": scores[:, 0],
            "log_prob": tf.where(keep, out["log_probs"][:, 0], 0.0),
            "source_tokens": source_tokens, "target_tokens": target_tokens,
            "alignment": alignment, "truncated": truncated,
            "nbest_translations": texts, "nbest_scores": scores,
        }

    def score(self, source, target):
        from nmt_tf.text import PAD_ID

        tf = self.tf
        source_ids, _, _, src_truncated, _ = self._ids(self.source_tokenizer, source)
        labels, target_in, _, tgt_truncated, _ = self._ids(self.target_tokenizer, target, add_bos=True)
        x = {"source_ids": self._dense(source_ids), "target_ids": self._dense(target_in)}
        labels = self._dense(labels)
        token_log_probs = self.model.target_log_probs(x, labels)
        length = tf.reduce_sum(tf.cast(labels != PAD_ID, tf.int32), axis=1)
        log_prob = tf.reduce_sum(token_log_probs, axis=1)
        return {"log_prob": log_prob,
                "log_prob_per_token": log_prob / tf.cast(tf.maximum(length, 1), tf.float32),
                "target_length": length, "token_log_probs": token_log_probs,
                "truncated": src_truncated | tgt_truncated}

    def module(self):
        tf = self.tf
        module = tf.Module()
        module.model = self.model
        module.source_tokenizer = self.source_tokenizer
        module.target_tokenizer = self.target_tokenizer
        module.translate = tf.function(self.translate, input_signature=[
            tf.TensorSpec([None], tf.string, name="text")])
        module.score = tf.function(self.score, input_signature=[
            tf.TensorSpec([None], tf.string, name="source"), tf.TensorSpec([None], tf.string, name="target")])
        return module


def restore_model(model_dir: str, checkpoint: str = "best", log=print):
    """The trained model of `model_dir` with the chosen weights, and its tokenizers."""
    import tensorflow as tf

    from nmt_tf import data, text, train

    config = nmt_flags.load_config(model_dir)
    src_path, tgt_path = data.vocabulary_paths(model_dir)
    source_tokenizer = text.Tokenizer(src_path, config.tokenizer, config.src_lang, name="source_tokenizer")
    target_tokenizer = text.Tokenizer(tgt_path, config.tokenizer, config.tgt_lang, name="target_tokenizer")
    model = train.build_model(config, source_tokenizer.vocab_size, target_tokenizer.vocab_size)
    if checkpoint in ("best", "last"):
        path = tf.train.latest_checkpoint(os.path.join(model_dir, "best")) if checkpoint == "best" else None
        path = path or tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))
        if path is None:
            raise FileNotFoundError(f"no checkpoint in {model_dir} (train first)")
    else:
        path = checkpoint
    tf.train.Checkpoint(model=model).read(path).expect_partial().assert_existing_objects_matched()
    log(f"Loaded {path}")
    return model, source_tokenizer, target_tokenizer, config


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


def export(model_dir: str, export_dir: str, options, version: int = 0, checkpoint: str = "best",
           max_input_length: int = 100, log=print) -> str:
    """Writes export_dir/<version>/ atomically; returns its path."""
    import tensorflow as tf

    model, src_tok, tgt_tok, _ = restore_model(model_dir, checkpoint, log=log)
    version = version or next_version(export_dir)
    final = os.path.join(export_dir, str(version))
    if os.path.exists(final):
        raise FileExistsError(f"{final} already exists; choose another --version")
    os.makedirs(export_dir, exist_ok=True)
    tmp = os.path.join(export_dir, f".tmp-{version}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    module = Translator(model, src_tok, tgt_tok, options, max_input_length).module()
    try:
        tf.saved_model.save(module, tmp, signatures={
            "serving_default": module.translate.get_concrete_function(),
            "translate": module.translate.get_concrete_function(),
            "score": module.score.get_concrete_function()})
        write_warmup(tmp)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"Exported {final} (beam {options.beam_size}, n-best {options.n_best}).\n"
        f"  saved_model_cli show --dir {final} --all\n"
        f"  python -m nmt_tf.translate --saved_model={final} < input.txt")
    return final


def main(argv):
    from absl import logging

    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    logging.set_verbosity(logging.WARNING)
    FLAGS = absl_flags.FLAGS
    if not FLAGS.model_dir or not FLAGS.export_dir:
        print("error: --model_dir and --export_dir are required.", file=sys.stderr)
        return 1
    try:
        export(FLAGS.model_dir, FLAGS.export_dir, nmt_flags.search_options(), FLAGS.version,
               FLAGS.checkpoint, FLAGS.max_input_length)
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    app.run(main)
