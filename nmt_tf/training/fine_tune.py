"""Fine-tuning: a new training run that starts from a trained model's weights.

`python -m nmt_tf.train --init_from=SOURCE --train_src=... --train_tgt=...
--model_dir=NEW` (SOURCE: a model directory, or a preset's name or folder,
whose model directory the preset's build holds):

- the model and vocabulary flags (`nmt_tf.flags.FROZEN_FLAGS` but the
  optimizer) come from SOURCE's stored configuration (config.json); one
  given on the command line with another value is an error naming it. Data, training and search flags
  come from the command line (or its flagfile) as usual;
- SOURCE's vocabularies (and SentencePiece models and word lists) are
  copied into NEW and kept: a word the source vocabulary lacks becomes
  pieces (SentencePiece, WordPiece) or [UNK] (words), and the log counts
  them in the new corpus (`describe_coverage`);
- the weights are SOURCE's (--init_checkpoint: averaged if SOURCE has an
  averaged checkpoint, else its best; or last, or a path); the optimizer,
  its step and the learning-rate schedule start afresh;
- --freeze=embeddings,encoder keeps those parts fixed (`freeze`): with
  --tied_embeddings=all "embeddings" is also the output layer's matrix.

A resumed fine-tuning run (its NEW has config.json) continues from its own
checkpoints; --init_from is then not read again.
"""

from __future__ import annotations

import os
import shutil
from typing import NamedTuple

from nmt_tf import config as nmt_config
from nmt_tf import presets
from nmt_tf.config import TrainingConfig
from nmt_tf.core import model_dir as layout
from nmt_tf.core.files import corpus_files, read_lines
from nmt_tf.data.tokenizers import tokenizer_class

FREEZABLE = ("embeddings", "encoder")


class FineTuneError(ValueError):
    """A source that cannot be fine-tuned as asked, in one sentence."""


class Source(NamedTuple):
    model_dir: str      # the model directory the weights, vocabularies and flags come from
    config: dict        # its stored flags
    checkpoint: str     # the checkpoint path of the weights


def source(init_from: str, init_checkpoint: str = "", log=print) -> Source:
    """The model directory, flags and checkpoint that --init_from names."""
    from nmt_tf.core import checkpoints

    if os.path.isfile(nmt_config.path(init_from)):
        model_dir = init_from
    else:
        try:
            saved_model = presets.build(init_from, log=log)
        except presets.PresetError as e:
            raise FineTuneError(f"--init_from={init_from} is neither a model directory (no "
                                f"{layout.CONFIG_JSON} or {layout.FLAGS_JSON} in it) nor a preset: {e}") from None
        model_dir = os.path.join(os.path.dirname(os.path.dirname(saved_model)), "model")
    choice = init_checkpoint or (checkpoints.AVERAGED if os.path.isdir(checkpoints.averaged_dir(model_dir))
                                 else checkpoints.BEST)
    try:
        path = checkpoints.resolve(model_dir, choice)
    except FileNotFoundError as e:
        raise FineTuneError(f"--init_from={init_from}: {e}") from None
    if init_checkpoint:       # a path given: checked now, not half-way into building the run (issue 95)
        damage = checkpoints.damage(path)
        if damage is not None:
            raise FineTuneError(f"--init_checkpoint={init_checkpoint} cannot be read ({damage}): give a checkpoint "
                                "prefix such as RUN/best/ckpt-1200 (its .index file without the suffix), or best, "
                                "last or averaged")
    try:
        return Source(model_dir, nmt_config.load(model_dir), path)
    except nmt_config.ConfigError as e:
        raise FineTuneError(f"--init_from={init_from}: {e}") from None


def merge(config: TrainingConfig, source: TrainingConfig, explicit: set[str], init_from: str) -> TrainingConfig:
    """`config` with the source's model and vocabulary settings; a conflicting
    one given on the command line is a FineTuneError."""
    taken = [name for name in nmt_config.FROZEN if name != "optimizer"]
    given, stored = config.as_dict(), source.as_dict()
    conflicts = [f"--{name}={given[name]!r} (the source has {stored[name]!r})"
                 for name in taken if name in explicit and given[name] != stored[name]]
    if conflicts:
        raise FineTuneError(f"--init_from={init_from} fixes the model and its vocabularies, but "
                            f"{', '.join(conflicts)}: leave these flags out, or train from scratch.")
    return config.replace(**{name: stored[name] for name in taken})


def copy_vocabularies(source_dir: str, model_dir: str) -> list[str]:
    """Copies the source's vocabularies, SentencePiece models and word lists
    into `model_dir` (which then builds none); returns the names copied."""
    os.makedirs(model_dir, exist_ok=True)
    copied = []
    for names in (layout.VOCABULARIES, layout.SENTENCEPIECE_MODELS, layout.WORD_SHORTLISTS):
        for name in names:
            if os.path.isfile(layout.path(source_dir, name)):
                shutil.copyfile(layout.path(source_dir, name), layout.path(model_dir, name))
                copied.append(name)
    return copied


def describe_coverage(config, source_tokenizer, target_tokenizer, source_dir: str, batch: int = 1024) -> str:
    """How the kept vocabularies cover the new training corpus: per side the
    [UNK] tokens, and the word types the source's training corpus did not
    have (its word list), which sub-word models spell in pieces."""
    import tensorflow as tf

    from nmt_tf.data.text import UNK_ID, read_vocabulary, words_of_lines

    lines = []
    for side, path, tokenizer, lang, known in (
            ("source", config.train_src, source_tokenizer, config.src_lang, layout.WORD_SHORTLISTS[0]),
            ("target", config.train_tgt, target_tokenizer, config.tgt_lang, layout.WORD_SHORTLISTS[1])):
        text = [line for part in corpus_files(path) for line in read_lines(part)]
        tokens = unknown = 0
        for start in range(0, len(text), batch):
            ids = tokenizer.encode(tf.constant(text[start:start + batch])).flat_values
            tokens += int(tf.size(ids))
            unknown += int(tf.reduce_sum(tf.cast(ids == UNK_ID, tf.int32)))
        line = f"  {side}: {unknown:,} of {tokens:,} tokens are [UNK] ({unknown / max(1, tokens):.2%})"
        word_list = layout.path(source_dir, known)
        if os.path.isfile(word_list):
            seen = set(read_vocabulary(word_list))
            words = [w for sentence in words_of_lines(text, lang) for w in sentence]
            new = [w for w in words if w not in seen]
            line += (f"; {len(set(new)):,} word types ({len(new):,} of {len(words):,} words) are not among the "
                     f"source model's training words" + ("" if tokenizer_class(config.tokenizer).word_level
                                                         else ", spelled in pieces"))
        lines.append(line)
    return "Vocabularies kept from the source model; on the new training corpus:\n" + "\n".join(lines)


def load_weights(model, checkpoint: str, build) -> None:
    """Sets `model`'s weights to those of `checkpoint`, read into a second
    model made by `build()` and copied by variable path: reading the
    checkpoint into `model` itself would also restore, deferred, the
    source's optimizer state (tracked by its model) into the new optimizer
    once it exists. Weights only: the dropout layers' random-number states
    are not weights (a second model's are named after the first's, and the
    new run draws its own)."""
    from nmt_tf.core import checkpoints

    source = build()
    checkpoints.read_weights(source, checkpoint)
    values = {v.path: v for v in source.weights}
    missing = sorted({v.path for v in model.weights} - set(values))
    if missing:
        raise FineTuneError(f"{checkpoint} does not hold {missing[:3]}: the model does not match its source")
    for variable in model.weights:
        variable.assign(values[variable.path])


def check_freeze(parts) -> None:
    unknown = sorted(set(parts) - set(FREEZABLE))
    if unknown:
        raise FineTuneError(f"--freeze={','.join(unknown)}: the parts that can be frozen are "
                            f"{', '.join(FREEZABLE)}")


def freeze(model, parts) -> list[str]:
    """Marks the named parts of `model` not trainable (before compiling);
    returns the layers' names."""
    check_freeze(parts)
    layers = []
    if "embeddings" in parts:
        layers += [model.source_embedding, model.target_embedding]
    if "encoder" in parts:
        layers += getattr(model, "encoders", [model.encoder])     # RNNsearch's layers, or RNNencdec's one
    for layer in layers:
        layer.trainable = False
    return sorted({layer.name for layer in layers})
