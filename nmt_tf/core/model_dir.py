"""The layout of a model directory: what nmt_tf.train writes and every other tool reads.

    config.json               the run's configuration: sections data, model, trainer
                              (nmt_tf.config; a run from before has flags.json, still read)
    flags.txt                 the same as a flagfile, to rerun with
    model_config.json         the model's Keras config
    vocab.{src,tgt}.txt       vocabularies (ids in line order, specials first)
    sentencepiece.{src,tgt}.model   SentencePiece models (--tokenizer=sentencepiece)
    words.{src,tgt}.txt       training word shortlists ("unknown words" of the evaluations)
    corpus_stats.json         what corpus validation found (cached by file identity;
                              corpus_stats.dev.json for the dev set)
    checkpoints/              the last --keep_checkpoints training checkpoints
    best/                     the --keep_best_checkpoints best by dev score (scores.json)
    averaged/                 nmt_tf.average's mean of checkpoints
    damaged/                  checkpoints a resume could not read whole, moved aside
    logs/train, logs/dev      TensorBoard
    train_summary.json        steps, epochs, time, NLL, tokens/s, status
    eval/<source name>/       nmt_tf.evaluate's default output folder
    lexical_shortlist.npz     nmt_tf.shortlist's lexical table (--shortlist_size)
    confidence.json           a confidence calibrator fitted on a dev set
                              (nmt_tf.inference.confidence); an export gets a confidence output
    prepared/                 the training corpus tokenized into TFRecord shards
                              (--prepared_shards), with manifest.json
    workers/<task>_<id>/      what a worker other than the chief writes under
                              --distribution=multi_worker (nmt_tf.training.distribution)

Every path is built here, so the layout is written once; files that may be
cut short by a full disk or a crash are written with
`nmt_tf.core.files.write_atomically`.
"""

from __future__ import annotations

import os

CONFIG_JSON, FLAGS_TXT, MODEL_CONFIG = "config.json", "flags.txt", "model_config.json"
FLAGS_JSON = "flags.json"          # a run's configuration before config.json (still read)
CORPUS_STATS, DEV_CORPUS_STATS, TRAIN_SUMMARY = "corpus_stats.json", "corpus_stats.dev.json", "train_summary.json"
CHECKPOINTS, BEST, AVERAGED, DAMAGED, LOGS, EVAL = "checkpoints", "best", "averaged", "damaged", "logs", "eval"
WORKERS, PREPARED, LEXICAL_TABLE, CONFIDENCE = "workers", "prepared", "lexical_shortlist.npz", "confidence.json"
VOCABULARIES = ("vocab.src.txt", "vocab.tgt.txt")
SENTENCEPIECE_MODELS = ("sentencepiece.src.model", "sentencepiece.tgt.model")
WORD_SHORTLISTS = ("words.src.txt", "words.tgt.txt")


def path(model_dir: str, name: str) -> str:
    """<model_dir>/<name>, for one of the names above."""
    return os.path.join(model_dir, name)


def pair(model_dir: str, names: tuple[str, str]) -> tuple[str, str]:
    """The (source, target) files of VOCABULARIES, SENTENCEPIECE_MODELS or WORD_SHORTLISTS."""
    return path(model_dir, names[0]), path(model_dir, names[1])


# What a preset carries of its run (those that exist), besides the weights.
RUN_FILES = (CONFIG_JSON, FLAGS_JSON, *VOCABULARIES, *SENTENCEPIECE_MODELS, *WORD_SHORTLISTS, CONFIDENCE)


def eval_dir(model_dir: str, source_name: str) -> str:
    """nmt_tf.evaluate's default output folder for the source file named `source_name`."""
    return os.path.join(model_dir, EVAL, source_name)


def worker_dir(model_dir: str, worker_name: str) -> str:
    """Where the worker `worker_name` (not the chief) of a multi-worker run writes."""
    return os.path.join(model_dir, WORKERS, worker_name)
