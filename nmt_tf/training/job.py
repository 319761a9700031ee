r"""Training a translation model with Keras `model.fit`: the library behind
`python -m nmt_tf.train`, usable from Python without command-line flags:

    from nmt_tf.config import TrainingConfig
    from nmt_tf.training.job import train
    summary = train(TrainingConfig(train_src="a.en", train_tgt="a.fr", model_dir="runs/a"))

`train` runs (or resumes) a job in stages, each a function below: resolve
the configuration, start (devices, the model directory), read the corpus,
build the model, restore, the controller (evaluation, checkpoints, the
schedule), fit, finish. A rerun with an existing model directory resumes
from its last checkpoint with the same vocabularies and settings (settings
not given are taken from its config.json; those that define the model
cannot change). A run killed at any moment loses at most
--checkpoint_every_steps updates; SIGINT / SIGTERM stop after the current
update and save a checkpoint.

What a run writes into the model directory: `python -m nmt_tf.train --help`
(nmt_tf/train.py), and nmt_tf/core/model_dir.py for the names.

--init_from starts a new run from a trained model's weights and
vocabularies (fine-tuning; nmt_tf/training/fine_tune.py), --freeze keeps parts fixed.

--distribution=mirrored / multi_worker trains under tf.distribute
(nmt_tf/training/distribution.py); --batch_size stays the global batch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import shutil
import time
import warnings
from typing import TYPE_CHECKING, Callable

from nmt_tf import config as nmt_config
from nmt_tf import models
from nmt_tf.config import ConfigError, TrainingConfig
from nmt_tf.core import custom_gradients, precision
from nmt_tf.core import model_dir as layout
from nmt_tf.core.files import write_atomically
from nmt_tf.core.hardware import step_products_choice, training_kernels, transposed_step_products
from nmt_tf.core.precision import dtype_policy
from nmt_tf.training import distribution, fine_tune, schedules

if TYPE_CHECKING:           # the run's parts, named in _Run's fields (modules that load TensorFlow)
    import keras
    import tensorflow as tf

    from nmt_tf.core.checkpoints import BestCheckpoints
    from nmt_tf.data.pipeline import CorpusStats
    from nmt_tf.data.text import Tokenizer
    from nmt_tf.models.base import Seq2SeqModel
    from nmt_tf.training import callbacks


def log_line(message: str) -> None:
    """Progress output, flushed at once (stdout is block-buffered when redirected)."""
    print(message, flush=True)


class TrainingError(RuntimeError):
    """A user-caused problem that stops training, in one sentence."""


class NaNLossError(TrainingError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


def check_config(config) -> None:
    """Flag combinations that cannot work, as one TrainingError before anything runs
    (those that span the configuration's parts; each part checks its own
    settings when it is made, nmt_tf.config)."""
    if config.joint_vocabulary:
        if config.tokenizer != "sentencepiece":
            raise TrainingError("--joint_vocabulary needs --tokenizer=sentencepiece.")
        if config.src_vocab_size != config.tgt_vocab_size:
            raise TrainingError(f"--joint_vocabulary learns one vocabulary: --src_vocab_size "
                                f"({config.src_vocab_size}) and --tgt_vocab_size ({config.tgt_vocab_size}) "
                                "must be equal.")
    if config.sentencepiece_alpha:
        if config.tokenizer != "sentencepiece":
            raise TrainingError("--sentencepiece_alpha samples SentencePiece segmentations: it needs "
                                "--tokenizer=sentencepiece.")
        if config.prepared_shards:
            raise TrainingError("--sentencepiece_alpha cuts the training text anew every epoch: it cannot be "
                                "used with --prepared_shards, which tokenizes it once.")
        if config.sentencepiece_nbest_size in (0, 1):
            raise TrainingError(f"--sentencepiece_nbest_size={config.sentencepiece_nbest_size} leaves nothing "
                                "to sample from: use -1 (all segmentations) or at least 2.")
    if config.worker_input == "own_data" and config.batch_type != "sentences":
        raise TrainingError("--worker_input=own_data needs --batch_type=sentences (the workers' steps per epoch "
                            "are counted in sentence batches).")
    if config.tied_embeddings == "all" and not config.joint_vocabulary:
        raise TrainingError("--tied_embeddings=all shares one embedding matrix between source and target "
                            "words: it needs --joint_vocabulary (with --tokenizer=sentencepiece).")
    if config.ema_decay >= 1.0:
        raise TrainingError(f"--ema_decay={config.ema_decay} would never move the average from the first "
                            "weights: use a decay below 1 (e.g. 0.9999), or 0 for none.")
    if config.ema_decay and not config.dev_src:
        raise TrainingError("--ema_decay keeps the averaged weights in best/ at dev evaluations: it needs a dev "
                            "set (--dev_src and --dev_tgt).")
    if config.early_dropout_epochs and not models.has_dropout(config):
        raise TrainingError(f"--early_dropout_epochs={config.early_dropout_epochs} scales the dropout rates, and "
                            f"every one is 0 ({', '.join('--' + name for name in models.DROPOUT_RATES)}).")
    try:
        schedules.check(config.lr_schedule, config.warmup_steps, config.max_steps, config.max_hours,
                        config.decay_factor, multi_worker=config.distribution == "multi_worker",
                        decay_fraction=config.lr_decay_fraction)
    except schedules.ScheduleError as e:
        raise TrainingError(str(e)) from None
    try:
        fine_tune.check_freeze(config.freeze)
    except ValueError as e:
        raise TrainingError(str(e)) from None


def build_model(config, source_vocab_size: int, target_vocab_size: int):
    """The model of `config`'s architecture (nmt_tf.models.build_model of
    `config.model_config()`), with its ValueErrors as one-line TrainingErrors;
    its time loops multiply as this machine does fastest
    (`transposed_step_products`, said in the log by `step_products_choice`)."""
    check_config(config)
    try:
        return models.build_model(config.model_config(), source_vocab_size, target_vocab_size,
                                  transposed_products=transposed_step_products())
    except ValueError as e:
        raise TrainingError(str(e)) from None


def make_optimizer(config):
    """The optimizer of --optimizer: Adam and Adadelta with fused updates,
    RMSprop and SGD as Keras has them; all four from nmt_tf.training.optimizers, which
    take the train step's gradient norm and replica sums, with
    --weight_decay decay the weight matrices, and with --ema_decay keep the
    weights' moving averages."""
    from nmt_tf.training.optimizers import SGD, FusedAdadelta, FusedAdam, RMSprop

    common = {"learning_rate": nmt_config.learning_rate(config), "global_clipnorm": config.clip_norm or None}
    if config.weight_decay:
        common.update(weight_decay=config.weight_decay)
    if config.ema_decay:
        common.update(use_ema=True, ema_momentum=config.ema_decay)
    if config.optimizer == "adadelta":
        return FusedAdadelta(rho=config.adadelta_rho, epsilon=config.adadelta_epsilon, **common)
    if config.optimizer == "adam":
        return FusedAdam(**common)
    if config.optimizer == "rmsprop":
        return RMSprop(**common)
    return SGD(**common)


def dry_run(config, log=log_line) -> int:
    """Builds the model from the flags alone and prints its summary; returns
    its size. The dtype policy is the run's for the build only, as in `train`
    (a caller's later models keep the caller's)."""
    with dtype_policy(precision.chosen(config.mixed_precision)):
        model = build_model(config, config.src_vocab_size, config.tgt_vocab_size)
    model.summary(print_fn=lambda line, *a, **k: log(line))
    log("Parameters by part of the model:")
    for name, count in model.parameter_groups().items():
        log(f"  {name:<32} {count:>14,}")
    total = model.count_params()
    log(f"Total parameters: {total:,} ({total / 1e6:.2f} million)")
    return total


def _check_resume(config, model_dir, explicit, log):
    """Merges stored flags into `config` for a resumed run; rejects model changes."""
    stored = nmt_config.load(model_dir).as_dict()
    merged = config.as_dict()
    for name, value in stored.items():
        if name not in explicit and name in merged:
            merged[name] = value
    changed = [f"--{n} (was {stored[n]!r}, now {merged[n]!r})"
               for n in nmt_config.FROZEN if merged[n] != stored[n]]
    if changed:
        raise TrainingError(
            f"{model_dir} holds a model trained with other settings: {', '.join(changed)}. "
            "Use a new --model_dir, or the stored values.")
    if bool(merged["ema_decay"]) != bool(stored["ema_decay"]):
        # the optimizer's checkpointed variables are a list, the averages first: they would not line up
        raise TrainingError(
            f"{model_dir} was trained with --ema_decay={stored['ema_decay']:g}: a resume cannot turn the "
            "weights' moving average on or off (another decay above 0 is fine). Start a new run from its "
            f"weights instead: --init_from={model_dir} --model_dir=NEW_DIR.")
    log(f"Resuming in {model_dir} (flags not given now are taken from {nmt_config.path(model_dir)}).")
    for name in ("train_src", "train_tgt", "dev_src", "dev_tgt"):
        if merged[name] != stored[name]:
            log(f"warning: --{name} is now {merged[name]} but this run started with {stored[name]}; "
                "training goes on with the new file and the vocabularies built from the first one.")
    return TrainingConfig(**merged)


def _prepare_data(config, model_dir: str, log, write_dir: str | None = None, pipelines: int = 1):
    """Checks the corpora, writes config.json and the vocabularies, counts the
    corpora; returns (source tokenizer, target tokenizer, training stats, dev
    stats or None). Raises CorpusError / FileNotFoundError on unusable data.

    write_dir: a worker other than the chief (nmt_tf.training.distribution) loads the
    vocabularies the chief wrote in model_dir (after the chief checked the
    corpora and wrote the flags) and keeps its corpus counts here.
    pipelines: > 1: the training pairs of each of that many workers that read
    every pipelines-th line are counted too (stats.pipeline_pairs).
    """
    from nmt_tf.data import pipeline as data

    chief = write_dir in (None, model_dir)
    write_dir = model_dir if chief else write_dir
    has_dev = bool(config.dev_src or config.dev_tgt)
    if chief:
        # Corpus checks before anything expensive.
        data.check_parallel(config.train_src, config.train_tgt, "train_src", "train_tgt")
        if has_dev:
            data.check_parallel(config.dev_src, config.dev_tgt, "dev_src", "dev_tgt")
    os.makedirs(write_dir, exist_ok=True)
    if chief:
        nmt_config.save(config, model_dir)
    src_tok, tgt_tok, known = data.build_vocabularies(config, model_dir, log=log)
    stats = data.corpus_stats(config.train_src, config.train_tgt, src_tok, tgt_tok, config.max_len,
                              cache_path=layout.path(write_dir, layout.CORPUS_STATS), known=known,
                              pipelines=pipelines)
    log(stats.describe("Training"))
    if stats.pairs == 0:
        raise data.CorpusError(data.no_pairs_message(stats))
    dev_stats = None
    if has_dev:
        dev_stats = data.corpus_stats(config.dev_src, config.dev_tgt, src_tok, tgt_tok, config.max_len,
                                      cache_path=layout.path(write_dir, layout.DEV_CORPUS_STATS))
        log(dev_stats.describe("Dev"))
        if dev_stats.pairs == 0:
            raise data.CorpusError(data.no_pairs_message(dev_stats))
    return src_tok, tgt_tok, stats, dev_stats


def _prepare_shards(config, src_tok, tgt_tok, prepared: str, stats, log) -> None:
    """--prepared_shards: the training corpus tokenized into TFRecord shards,
    made unless `prepared` already holds them for this corpus, these
    vocabularies and --max_len."""
    from nmt_tf.data import pipeline as data

    key = data.prepared_key(config.train_src, config.train_tgt, src_tok, tgt_tok, config.max_len)
    manifest = data.read_prepared_manifest(prepared)
    if (manifest is not None and all(manifest.get(k) == v for k, v in key.items())
            and len(manifest["shards"]) == config.prepared_shards):
        log(f"Training from the {manifest['pairs']:,} pairs prepared in {prepared}.")
        return
    if manifest is not None:
        log(f"{prepared} was prepared from another corpus, other vocabularies, another --max_len or "
            "another number of shards: preparing again.")
    log(f"Tokenizing {config.train_src} | {config.train_tgt} into {config.prepared_shards} shards ...")
    manifest = data.write_prepared_shards(config.train_src, config.train_tgt, src_tok, tgt_tok, prepared,
                                          max_len=config.max_len, shards=config.prepared_shards,
                                          lines=stats.lines, log=log)
    if manifest["pairs"] != stats.pairs:
        raise TrainingError(f"{prepared} holds {manifest['pairs']:,} pairs but the corpus statistics count "
                            f"{stats.pairs:,}: the corpus changed while it was read.")


def _remove_new_files(model_dir: str, before: set[str] | None) -> None:
    """Undoes a start that failed before training: removes what it wrote in
    model_dir (the directory too if it made it); files that were there stay."""
    if before is None:
        shutil.rmtree(model_dir, ignore_errors=True)
        return
    if not os.path.isdir(model_dir):
        return
    for name in set(os.listdir(model_dir)) - before:
        path = os.path.join(model_dir, name)
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.remove(path)


def train(config, explicit: set[str] | None = None, log=log_line) -> dict:
    """Runs (or resumes) a training job; returns the training summary.

    Args:
      config: a `nmt_tf.config.TrainingConfig`.
      explicit: names of the settings the user gave; on resume, the others
        are taken from the run's stored configuration (`nmt_tf.config.load`).
        None means all of them.
      log: where progress lines go.

    Training sets Keras' global dtype policy from --mixed_precision (auto,
    the default, is bfloat16 on CPUs with bfloat16 instructions) for the
    run only (`nmt_tf.core.precision.dtype_policy`, entered in `run_scope`): the
    caller's policy is back in place when this returns or raises, so models
    built afterwards in the same process are not bfloat16 by accident.
    Its traced graphs are let go of when it ends (`nmt_tf.core.custom_gradients`),
    so runs one after another in a process do not pile them up.
    """
    with contextlib.ExitStack() as run_scope:
        run_scope.enter_context(custom_gradients.released())
        return _train(config, explicit, log, run_scope)


@dataclasses.dataclass
class _Run:
    """One training run, as `_train`'s stages hand it on: each stage reads what
    the earlier ones set and sets its own part (None until then)."""
    config: TrainingConfig
    log: Callable[[str], None]
    model_dir: str
    resuming: bool
    init: fine_tune.Source | None = None            # --init_from's weights
    # _start: where it runs
    strategy: tf.distribute.Strategy | None = None
    worker: distribution.Worker | None = None
    write_dir: str = ""             # the chief writes model_dir; another worker its own part of it
    # _read_corpus: the data
    src_tok: Tokenizer | None = None
    tgt_tok: Tokenizer | None = None
    stats: CorpusStats | None = None
    dev_stats: CorpusStats | None = None
    prepared: str | None = None     # --prepared_shards: the shards' folder
    own_data: bool = False          # several workers, each reading its own part of the data
    context: tf.distribute.InputContext | None = None      # with own_data: this worker's
    n_batches: int | None = None    # per epoch (None: data-dependent, token batches)
    # _build, _restore, _controller: the model and its training
    model: Seq2SeqModel | None = None
    optimizer: keras.optimizers.Optimizer | None = None
    state: callbacks.TrainingState | None = None
    manager: tf.train.CheckpointManager | None = None      # of checkpoints/
    evaluator: callbacks.DevEvaluator | None = None
    bleu: callbacks.DevBleu | None = None
    best_checkpoints: BestCheckpoints | None = None
    controller: callbacks.TrainingCallbacks | None = None
    print_lines: bool = False
    dropout_factor: float | None = None     # --early_dropout_epochs: the factor the model's rates have now


def _train(config, explicit: set[str] | None, log, run_scope: contextlib.ExitStack) -> dict:
    """The stages of a run, in order (each below says what it does)."""
    run = _resolve_config(config, explicit, log)
    _start(run, run_scope)
    _read_corpus(run)
    _build(run)
    _restore(run)
    _controller(run)
    step, started = _fit(run)
    return _finish(run, step, started)


def _resolve_config(config, explicit, log) -> _Run:
    """The run's flags: a resume's merged with its stored configuration, a fine-tuning
    run's with its source's model flags; checked."""
    if not config.model_dir:
        raise TrainingError("--model_dir is required.")
    model_dir = config.model_dir
    resuming = os.path.exists(nmt_config.path(model_dir))
    explicit = set(nmt_config.NAMES) if explicit is None else explicit
    init = None
    try:
        if resuming:
            config = _check_resume(config, model_dir, explicit, log)
        elif config.init_from:
            init = fine_tune.source(config.init_from, config.init_checkpoint, log=log)
            config = fine_tune.merge(config, init.config, explicit, config.init_from)
    except (fine_tune.FineTuneError, ConfigError) as e:     # ConfigError: the stored settings with the new ones
        raise TrainingError(str(e)) from None
    if init is not None:
        log(f"Fine-tuning {init.model_dir} ({init.checkpoint}): its model and vocabulary flags are kept.")
    check_config(config)
    return _Run(config, log, model_dir, resuming, init)


def _start(run: _Run, run_scope: contextlib.ExitStack) -> None:
    """The distribution strategy (before anything else touches TensorFlow: a
    multi-worker strategy and logical CPU devices configure its runtime as it
    starts), the seed, the kernels and the precision of the run."""
    import keras

    config = run.config
    try:
        run.strategy, run.worker = distribution.make_strategy(config.distribution, config.cpu_devices,
                                                              config.collective_timeout, config.heartbeat_timeout)
    except distribution.DistributionError as e:
        raise TrainingError(str(e)) from None
    distribution.barrier(run.strategy)      # every worker has seen whether this is a resume
    run.write_dir = run.model_dir if run.worker.is_chief else layout.worker_dir(run.model_dir, run.worker.name)
    if config.distribution != "none":
        run.log(distribution.describe(run.strategy, run.worker))
    keras.utils.set_random_seed(config.seed)
    if training_kernels():
        run.log(training_kernels())
    run.log(step_products_choice())
    run_scope.enter_context(dtype_policy(precision.chosen(config.mixed_precision, run.log)))


def _read_corpus(run: _Run) -> None:
    """Checks and counts the corpora, writes config.json and the vocabularies (a
    fine-tuning run copies its source's), prepares shards, and decides how
    each worker reads the data and how many batches an epoch has."""
    import tensorflow as tf

    from nmt_tf.data import pipeline as data

    config, log, model_dir, worker = run.config, run.log, run.model_dir, run.worker
    before = set(os.listdir(model_dir)) if os.path.isdir(model_dir) else None
    # Several workers with --worker_input=own_data each read their own part of
    # the data (their prepared shards, or every N-th line of the text) and make
    # their replicas' batches of it; with global_batches every worker reads all
    # of it and keeps its replicas' shares of each batch.
    run.own_data = worker.workers > 1 and (config.worker_input == "own_data" or (
        config.worker_input == "auto" and config.batch_type == "sentences"))
    line_pipelines = worker.workers if run.own_data and not config.prepared_shards else 1
    try:
        if worker.is_chief:
            if run.init is not None:
                fine_tune.copy_vocabularies(run.init.model_dir, model_dir)
            run.src_tok, run.tgt_tok, run.stats, run.dev_stats = _prepare_data(config, model_dir, log,
                                                                               pipelines=line_pipelines)
            if run.init is not None:
                log(fine_tune.describe_coverage(config, run.src_tok, run.tgt_tok, run.init.model_dir))
        distribution.barrier(run.strategy)  # the chief's flags and vocabularies are written
        if not worker.is_chief:
            run.src_tok, run.tgt_tok, run.stats, run.dev_stats = _prepare_data(
                config, model_dir, log, write_dir=run.write_dir, pipelines=line_pipelines)
    except BaseException:
        if not run.resuming and worker.is_chief:   # nothing was trained: a corrected retry must start afresh
            _remove_new_files(model_dir, before)
        raise
    if config.prepared_shards:
        run.prepared = layout.path(model_dir, layout.PREPARED)
        if worker.is_chief:
            _prepare_shards(config, run.src_tok, run.tgt_tok, run.prepared, run.stats, log)
        distribution.barrier(run.strategy)  # the shards are written
    run.n_batches = data.batches_per_epoch(run.stats, config.batch_size, config.batch_type, config.pool_size)
    if not run.own_data:
        return
    if config.prepared_shards and config.prepared_shards < worker.workers:
        raise TrainingError(f"--prepared_shards={config.prepared_shards} is fewer than the "
                            f"{worker.workers} workers: each worker reads its own shards.")
    run.context = tf.distribute.InputContext(num_input_pipelines=worker.workers,
                                             num_replicas_in_sync=run.strategy.num_replicas_in_sync)
    if run.prepared:
        source = f"shards of {run.prepared}"
        pipeline_pairs = data.prepared_pipeline_pairs(data.read_prepared_manifest(run.prepared), worker.workers)
    else:
        source = f"lines of {config.train_src} | {config.train_tgt} (one line in {worker.workers})"
        pipeline_pairs = run.stats.pipeline_pairs
    run.n_batches = data.pipeline_batches_per_epoch(pipeline_pairs, config.batch_size, config.batch_type,
                                                    config.pool_size, run.context)
    if not run.n_batches:
        raise TrainingError(f"The {source} give some of the {worker.workers} workers no batch: the corpus "
                            "is too small for them.")
    log(f"Each of the {worker.workers} workers reads its own {source}; an epoch is the "
        f"{run.n_batches:,} steps all of them can make (a worker's batches beyond that are left out).")


def _build(run: _Run) -> None:
    """The model (a fine-tuning run's with its source's weights, --freeze
    applied) and its optimizer, under the strategy; model_config.json."""
    config, log = run.config, run.log
    vocab_sizes = (run.src_tok.vocab_size, run.tgt_tok.vocab_size)
    with run.strategy.scope():
        run.model = build_model(config, *vocab_sizes)
        if run.init is not None:
            try:
                fine_tune.load_weights(run.model, run.init.checkpoint, lambda: build_model(config, *vocab_sizes))
            except fine_tune.FineTuneError as e:
                raise TrainingError(str(e)) from None
            log(f"Weights from {run.init.checkpoint}; a fresh optimizer and learning-rate schedule.")
        if config.freeze:
            log(f"Frozen (not trained): {', '.join(fine_tune.freeze(run.model, config.freeze))}.")
        run.optimizer = make_optimizer(config)
        run.model.compile(optimizer=run.optimizer, jit_compile=config.jit_compile)
        run.optimizer.build(run.model.trainable_variables)
    if run.worker.is_chief:
        write_atomically(layout.path(run.model_dir, layout.MODEL_CONFIG),
                         json.dumps({"class_name": type(run.model).__name__, "config": run.model.get_config()},
                                    indent=2))


def _restore(run: _Run) -> None:
    """The checkpoint manager, and the newest intact checkpoint restored (damaged
    ones moved aside first): the last regular one whole, or a best one's model
    and optimizer with the epoch position from its step."""
    import keras
    import tensorflow as tf

    from nmt_tf.core import checkpoints
    from nmt_tf.training import callbacks as cb
    from nmt_tf.training import optimizers

    model, optimizer, n_batches, log = run.model, run.optimizer, run.n_batches, run.log
    state = run.state = cb.TrainingState()
    dropout_states = model.dropout_random_states()
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, state=state,
                                     **{checkpoints.DROPOUT_RANDOM_STATES: dropout_states})
    # Before the manager reads the state file: damaged checkpoints are moved aside.
    if run.worker.is_chief:
        checkpoints.remove_unfinished_saves(run.model_dir, log=log)
        restore_from, kind = checkpoints.newest_intact(run.model_dir, log=log)    # or NoIntactCheckpointError
    distribution.barrier(run.strategy)     # damaged ones are moved aside: the others read the chief's choice
    if not run.worker.is_chief:
        restore_from, kind = checkpoints.newest_intact(run.model_dir, log=log)
    run.manager = tf.train.CheckpointManager(checkpoint, checkpoints.checkpoints_dir(run.write_dir),
                                             max_to_keep=run.config.keep_checkpoints, checkpoint_name="ckpt")
    if kind == "last":
        # Weights and optimizer must match exactly; training-state counters
        # added by a newer nmt_tf keep their defaults when a checkpoint lacks them.
        tf.train.Checkpoint(model=model, optimizer=optimizer).read(
            restore_from).expect_partial().assert_existing_objects_matched()
        tf.train.Checkpoint(state=state).read(restore_from).expect_partial()
        saved = checkpoints.read_dropout_random_states(dropout_states, restore_from)
        if saved != len(dropout_states):
            log(f"{restore_from} holds the random state of {saved} dropout layers, not of this model's "
                f"{len(dropout_states)}: the dropout masks from here on differ from an uninterrupted run's "
                "(checkpoints written before 2026-12-02 hold none).")
        log(f"Restored {restore_from}: step {int(optimizer.iterations.numpy()):,}, "
            f"epoch {int(state.epoch.numpy()) + 1}, batch {int(state.epoch_batches.numpy()):,}"
            f"{f' of {n_batches:,}' if n_batches else ''}.")
    elif kind == "best":
        # best/ holds the model and, tracked by it, the optimizer (with its step), not the
        # training counters: the epoch position follows from the step (every epoch has
        # n_batches); the time and token counters start again.
        checkpoints.read_weights(model, restore_from)
        # it was saved with the weights' moving averages in the model (--ema_decay): training goes on
        # from the trained weights, as after a regular checkpoint
        optimizers.swap_moving_averages(optimizer)
        step = int(optimizer.iterations.numpy())
        if n_batches:
            state.epoch.assign(step // n_batches)
            state.epoch_batches.assign(step % n_batches)
        log(f"Restored {restore_from} (model and optimizer): step {step:,}, epoch {int(state.epoch.numpy()) + 1}, "
            f"batch {int(state.epoch_batches.numpy()):,}; the training-time and token counters start again "
            "from zero.")
    log(f"Model {run.config.model}: {model.count_params():,} parameters; "
        f"{f'{n_batches:,}' if n_batches else 'a data-dependent number of'} batches per epoch; "
        f"precision {keras.mixed_precision.dtype_policy().name}.")
    config = run.config
    if config.max_steps and n_batches and config.max_epochs * n_batches < config.max_steps:
        log(f"Note: --max_epochs={config.max_epochs} ends this run after {config.max_epochs * n_batches:,} "
            f"updates, before --max_steps={config.max_steps:,}; raise --max_epochs to train that long.")


def _dataset(run: _Run, path_src: str, path_tgt: str, **kw):
    """The batches of a corpus, as the run reads them."""
    import tensorflow as tf

    from nmt_tf.data import pipeline as data

    config = run.config
    ds = data.make_dataset(path_src, path_tgt, run.src_tok, run.tgt_tok, max_len=config.max_len,
                           batch_size=config.batch_size, batch_type=config.batch_type,
                           pool_size=config.pool_size, **kw)
    # Without own_data (global_batches): every worker reads the corpus and keeps its
    # replicas' shares of each global batch (a text corpus is one file a side:
    # it cannot be shared out by files).
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.with_options(options)


def _controller(run: _Run) -> None:
    """What watches the training: dev loss and dev BLEU, the best checkpoints,
    the learning-rate schedule and the budgets (callbacks.TrainingCallbacks)."""
    import tensorflow as tf

    from nmt_tf.core import checkpoints
    from nmt_tf.training import callbacks as cb

    config, log = run.config, run.log
    has_dev = run.dev_stats is not None
    run.evaluator = cb.DevEvaluator(run.model, _dataset(run, config.dev_src, config.dev_tgt)) if has_dev else None
    if has_dev and config.dev_bleu:
        from nmt_tf.inference.search import SearchOptions

        options = SearchOptions(beam_size=config.dev_bleu_beam_size, n_best=1)
        run.bleu = cb.DevBleu(run.model, run.src_tok, run.tgt_tok, config.dev_src, config.dev_tgt, options,
                              sentences=config.dev_bleu_sentences, attention_examples=config.attention_examples)
    elif config.early_stopping_metric == "bleu" and has_dev:
        log("Dev BLEU is off (--nodev_bleu): the best checkpoint and early stopping use the dev loss.")
    run.best_checkpoints = checkpoints.BestCheckpoints(
        tf.train.Checkpoint(model=run.model), checkpoints.best_dir(run.write_dir), config.keep_best_checkpoints,
        higher_is_better=run.bleu is not None and config.early_stopping_metric == "bleu") if has_dev else None
    run.print_lines = not cb.is_terminal()
    controller = run.controller = cb.TrainingCallbacks(
        config, run.state, run.manager, run.best_checkpoints, run.evaluator,
        layout.path(run.write_dir, layout.LOGS), run.n_batches, log=log, print_lines=run.print_lines, bleu=run.bleu)
    controller.set_model(run.model)
    log(f"Learning rate ({config.lr_schedule}): {controller.schedule.describe()}"
        + (f"; x{config.decay_factor:g} after every {config.decay_patience} dev evaluations without improvement"
           if config.decay_factor < 1.0 else "") + ".")
    if config.ema_decay:
        log(f"Moving average of the weights: decay min({config.ema_decay:g}, (1 + t) / (10 + t)) at update t; "
            "dev evaluations and best/ use the averages.")
    if run.worker.workers > 1:
        # Not tracked by the model (a plain object): checkpoints stay as they are.
        run.model.stop_votes = controller.budget.votes = cb.StopVotes()


def _fit(run: _Run) -> tuple[int, float]:
    """The epochs, each one `model.fit` from where the last one stopped, until
    the controller stops them or --max_epochs; then the last evaluation (not
    after a signal) and checkpoint. Returns (the last step, when this run started)."""
    from nmt_tf.core import checkpoints
    from nmt_tf.data import pipeline as data
    from nmt_tf.training import callbacks as cb

    config, state, controller, n_batches = run.config, run.state, run.controller, run.n_batches
    callbacks = list(controller.callbacks)
    if not run.print_lines:
        callbacks.append(cb.TrainingProgbar())
    sampling = (config.sentencepiece_alpha, config.sentencepiece_nbest_size) if config.sentencepiece_alpha else None
    # traced once for all epochs (prepared shards hold ids already)
    encoder = None if run.prepared else data.PairEncoder(run.src_tok, run.tgt_tok, config.max_len, sampling)
    started = time.time()
    start_step = int(run.optimizer.iterations.numpy())
    with controller.budget.signal_handlers():
        controller.budget.check_budgets()
        while not controller.stop_reason and int(state.epoch.numpy()) < config.max_epochs:
            epoch, skip = int(state.epoch.numpy()), int(state.epoch_batches.numpy())
            if n_batches and skip >= n_batches:
                # Stopped between the checkpoint of the epoch's last batch and the
                # epoch-end one: nothing left to train, only the epoch-end work.
                controller.on_epoch_end(epoch)
                continue
            _set_dropout_phase(run, epoch)
            epoch_data = dict(shuffle=True, shuffle_buffer=config.shuffle_buffer, seed=config.seed, epoch=epoch,
                              skip_batches=skip, prepared=run.prepared, sampling=sampling, encoder=encoder)
            if run.own_data:
                local = data.replicas_per_pipeline(run.context)
                epoch_data["skip_batches"] = skip * local
                ds = run.strategy.distribute_datasets_from_function(
                    lambda context, kw=epoch_data, batches=(n_batches - skip) * local: _dataset(
                        run, config.train_src, config.train_tgt, input_context=context, **kw).take(batches))
            else:
                ds = _dataset(run, config.train_src, config.train_tgt, **epoch_data)
            if not run.print_lines:
                run.log(f"Epoch {epoch + 1}/{config.max_epochs}")
            with warnings.catch_warnings():
                # An epoch of data-dependent length (token batches) ends when the
                # data does; Keras warns about that as if it were a mistake.
                warnings.filterwarnings("ignore", message="Your input ran out of data", category=UserWarning)
                run.model.fit(ds, epochs=epoch + 1, initial_epoch=epoch,
                              steps_per_epoch=n_batches - skip if n_batches else None,
                              callbacks=callbacks, verbose=0 if run.print_lines else 1, shuffle=False)
        step = int(run.optimizer.iterations.numpy())
        if controller.nan_step is not None:
            controller.flush()
            last = run.manager.latest_checkpoint or "none"
            raise NaNLossError(
                f"The training loss became NaN or infinite at step {controller.nan_step:,}; training "
                f"stopped. The last good checkpoint is {last}. Lower --learning_rate or --clip_norm, "
                "or use --mixed_precision=none.")
        if step > start_step or not run.manager.latest_checkpoint:
            if controller.stop_reason != "interrupted":
                # A signal asks for a quick stop (a scheduler's grace period may be
                # 30 s), and the resumed run evaluates at the epoch end as an
                # uninterrupted one would: an evaluation here would add one to the
                # plateau's patience and to best/.
                controller.dev.evaluate(step)
            checkpoints.save_checkpoint(run.manager, step)
    controller.flush()
    return step, started


def _set_dropout_phase(run: _Run, epoch: int) -> None:
    """--early_dropout_epochs: before `epoch`'s `fit`, the model's dropout
    rates for that epoch (scaled in the first epochs, full after), the
    training function retraced when they change. Decided by the epoch alone,
    so a resumed run trains each epoch with the rates an uninterrupted one would."""
    config = run.config
    if not config.early_dropout_epochs:
        return
    factor = config.early_dropout_scale if epoch < config.early_dropout_epochs else 1.0
    if factor == run.dropout_factor:
        return
    run.model.scale_dropout(factor)
    run.model.make_train_function(force=True)
    last = config.early_dropout_epochs
    if factor < 1.0:
        epochs = f"Epoch {last}" if epoch + 1 == last else f"Epochs {epoch + 1}-{last}"
        run.log(f"{epochs}: every dropout rate x{factor:g} (--early_dropout_scale), the full rates from epoch "
                f"{last + 1} on (--early_dropout_epochs={last}).")
    elif run.dropout_factor is not None:
        run.log(f"Epoch {epoch + 1}: the full dropout rates from here on.")
    run.dropout_factor = factor


def _finish(run: _Run, step: int, started: float) -> dict:
    """train_summary.json, what the run says at its end, and the summary."""
    from nmt_tf.core import checkpoints

    state, controller, manager, worker, n_batches = run.state, run.controller, run.manager, run.worker, run.n_batches
    status = controller.stop_reason or "max_epochs"
    by_bleu = run.bleu is not None and run.config.early_stopping_metric == "bleu"
    summary = {
        "status": status,
        "signal": controller.budget.received_signal if status == "interrupted" else None,
        "model_dir": os.path.abspath(run.model_dir),
        "distribution": {"strategy": type(run.strategy).__name__, "replicas": run.strategy.num_replicas_in_sync,
                         "workers": worker.workers, "worker": worker.name, "chief": worker.is_chief},
        "steps": step,
        "epochs": int(state.epoch.numpy()) + (int(state.epoch_batches.numpy()) / n_batches if n_batches else 0.0),
        "completed_epochs": int(state.epoch.numpy()),
        "train_seconds": float(state.train_seconds.numpy()),
        "wall_seconds_this_run": time.time() - started,
        "target_tokens": int(state.target_tokens.numpy()),
        "target_tokens_per_sec": int(state.target_tokens.numpy()) / max(float(state.train_seconds.numpy()), 1e-9),
        "target_tokens_per_sec_this_run": controller.train_log.run_tokens / max(controller.train_log.run_seconds,
                                                                                1e-9),
        "parameters": run.model.count_params(),
        "train": controller.train_log.epoch_train_nll(),
        "dev": controller.dev.last_dev,
        "best_dev": ({"metric": "bleu" if by_bleu else "loss",
                      "step": int(state.best_step.numpy()),           # of the best by that metric
                      "bleu": float(state.best_bleu.numpy()) if run.bleu is not None else None,
                      # the lowest dev loss of the run, wherever it was (with metric=bleu, not at `step`)
                      "lowest_nll_per_token": float(state.best_dev.numpy()),
                      "lowest_perplexity": math.exp(min(float(state.best_dev.numpy()), 700.0))}
                     if int(state.best_step.numpy()) >= 0 else None),
        # (another worker's copies are removed below: name the chief's, which are the same)
        "checkpoint": (os.path.join(checkpoints.checkpoints_dir(run.model_dir),
                                    os.path.basename(manager.latest_checkpoint))
                       if manager.latest_checkpoint else None),
        "best_checkpoint": (os.path.join(checkpoints.best_dir(run.model_dir), run.best_checkpoints.ranking[0]["path"])
                            if run.best_checkpoints and run.best_checkpoints.ranking else None),
        "corpus": {"train": _stats_dict(run.stats), "dev": _stats_dict(run.dev_stats) if run.dev_stats else None},
        "weights_sha256": weights_fingerprint(run.model),
    }
    write_atomically(layout.path(run.write_dir, layout.TRAIN_SUMMARY), json.dumps(summary, indent=2))
    if not worker.is_chief:
        # Saved only because a checkpoint needs every worker; a resume reads the chief's.
        for name in (layout.CHECKPOINTS, layout.BEST):
            shutil.rmtree(layout.path(run.write_dir, name), ignore_errors=True)
        return summary
    run.log(f"Training stopped ({status}) at step {step:,}, epoch {summary['epochs']:.2f}, after "
            f"{summary['train_seconds'] / 60:.1f} min of training "
            f"({summary['target_tokens_per_sec']:,.0f} target tokens/s).")
    run.log(f"Outputs in {os.path.abspath(run.model_dir)}:\n"
            f"  checkpoints/ (last: {os.path.basename(manager.latest_checkpoint or '-')}), "
            f"best/ (best dev {summary['best_dev']['metric'] if summary['best_dev'] else '-'}), "
            "vocab.src.txt, vocab.tgt.txt, config.json\n"
            f"  train_summary.json; TensorBoard: tensorboard --logdir {layout.path(run.model_dir, layout.LOGS)}")
    return summary


def weights_fingerprint(model) -> str:
    """SHA-256 of the model's weights (names, shapes and float32 bytes, in
    order): equal for the same weights, so workers can be compared."""
    digest = hashlib.sha256()
    for w in model.weights:
        value = w.numpy()
        digest.update(f"{w.path}:{value.shape}:{value.dtype}".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


def _stats_dict(stats):
    d = dataclasses.asdict(stats)
    d.pop("length_histogram")
    return d
