"""Keras callbacks that run a training job, one job each (`TrainingCallbacks`
puts them together): TrainLog (tokens, time, TensorBoard, the log lines and
the NaN guard), LearningRateControl (the schedule and the plateau's decay),
DevAndCheckpoints (dev loss and BLEU, the best checkpoints, early stopping,
checkpoints and epoch ends) and Budget (--max_steps, --max_hours, signals);
TrainingProgbar is the terminal's progress bar.

All mutable training state that must survive a restart lives in
`TrainingState` (tf.Variables saved in the same checkpoint as the weights and
the optimizer), so a checkpoint is always self-consistent.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
import time

import keras
import numpy as np
import tensorflow as tf

from nmt_tf.config import learning_rate
from nmt_tf.core import checkpoints
from nmt_tf.data import pipeline as data
from nmt_tf.evaluation import metrics, plots
from nmt_tf.inference.line_batches import translate_lines
from nmt_tf.inference.translation_graph import TranslationGraph, compiled_translate
from nmt_tf.training import optimizers, schedules


class TrainingState(tf.Module):
    """Counters of a training job, checkpointed with the weights."""

    def __init__(self):
        super().__init__(name="training_state")
        i64 = lambda v: tf.Variable(v, dtype=tf.int64, trainable=False)
        f64 = lambda v: tf.Variable(v, dtype=tf.float64, trainable=False)
        self.epoch = i64(0)                  # epochs completed
        self.epoch_batches = i64(0)          # batches done in the current epoch
        self.train_seconds = f64(0.0)        # summed over resumed runs
        self.target_tokens = i64(0)          # target tokens trained on, summed
        self.best_dev = f64(math.inf)         # best dev NLL per token
        self.best_bleu = f64(-math.inf)       # best dev BLEU
        self.best_step = i64(-1)              # step of the best by --early_stopping_metric
        self.bad_evals = i64(0)              # evaluations since the best one
        self.last_eval_step = i64(-1)


class StopVotes:
    """A multi-worker job's way to stop every worker after the same update.

    A signal or --max_hours reaches each worker at its own moment; a worker
    that stopped alone would leave the others waiting in the next all-reduce.
    So a worker only votes (its signal's number, or 1 for the time budget),
    every update of `Seq2SeqModel.train_step` gathers the votes of all
    workers and takes their maximum, and every worker stops after the update
    in which it sees a vote. Plain (not mirrored) variables: each worker has
    its own."""

    def __init__(self):
        self.signal = tf.Variable(0.0, trainable=False, name="stop_vote_signal")
        self.hours = tf.Variable(0.0, trainable=False, name="stop_vote_hours")


class DevEvaluator:
    """Negative log-likelihood of a dev set, with one traced function.

    The dev batches are kept in memory from the first evaluation on (a few MB
    for a dev set of thousands of sentences), so later evaluations neither
    read nor tokenize the files again.
    """

    def __init__(self, model, dataset):
        self.dataset = dataset.cache()
        spec = tf.TensorSpec([None, None], tf.int32)
        self._batch = tf.function(
            lambda x, y: model.batch_nll(x, y, training=False), autograph=False,
            input_signature=[{"source_ids": spec, "target_ids": spec}, spec])

    def __call__(self) -> dict:
        nll = tokens = sentences = 0.0
        for x, y in self.dataset:
            n, t, s = self._batch(x, y)
            nll, tokens, sentences = nll + float(n), tokens + float(t), sentences + float(s)
        per_token = nll / max(tokens, 1.0)
        return {"nll_per_token": per_token, "nll_per_sentence": nll / max(sentences, 1.0),
                "perplexity": math.exp(min(per_token, 700.0)), "tokens": int(tokens),
                "sentences": int(sentences)}


class DevBleu:
    """Translates dev sentences with the model being trained and scores BLEU.

    Uses the same translate function as the exported SavedModel (greedy or a
    small beam), on the first `sentences` non-empty dev pairs, read once.
    Also returns the first `attention_examples` heatmaps as PNG bytes.
    """

    def __init__(self, model, source_tokenizer, target_tokenizer, src_path, tgt_path, options,
                 sentences: int = 0, attention_examples: int = 4, batch_size: int = 64):
        pairs = []
        for s, t in data.parallel_lines(src_path, tgt_path).as_numpy_iterator():
            if s.strip() and t.strip():
                pairs.append((s, t.decode("utf-8", errors="replace").strip()))
                if sentences and len(pairs) == sentences:
                    break
        self.sources = [s for s, _ in pairs]
        self.references = [t for _, t in pairs]
        self.lang = target_tokenizer.lang
        self.tokenized_references = metrics.moses_lc_tokenize(self.references, self.lang)
        self.attention_examples = attention_examples
        self.batch_size = batch_size
        translator = TranslationGraph(model, source_tokenizer, target_tokenizer, options, max_input_length=250)
        self.translate = compiled_translate(translator)

    def __call__(self) -> dict:
        out = translate_lines(self.translate, self.sources, self.batch_size)
        scores = metrics.corpus_scores(out["translation"], self.references, self.lang, self.tokenized_references)
        images = [plots.attention_png(out["source_tokens"][i], out["target_tokens"][i], out["alignment"][i],
                                      title=out["translation"][i][:80])
                  for i in range(min(self.attention_examples, len(self.sources)))]
        return {"bleu": scores["bleu"], "bleu_lc": scores["bleu_lc"], "chrf": scores["chrf"],
                "bleu_lc_moses": scores["bleu_lc_moses"],
                "bleu_signature": scores["bleu_signature"], "sentences": len(self.sources),
                "examples": list(zip(out["translation"][:3], self.references[:3])), "images": images}


class TrainingProgbar(keras.callbacks.ProgbarLogger):
    """Keras' progress bar, showing only the numbers a user reads."""

    SHOWN = ("loss", "perplexity", "tok/s")

    def _shown(self, logs):
        return {k: logs[k] for k in self.SHOWN if logs and k in logs}

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, self._shown(logs))

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, self._shown(logs))


# Updates of a run left out of its seconds per update: the first ones trace and compile the step.
_UNTIMED_STEPS = 5


class RunStatus:
    """What the callbacks of one run share: the model, why the run stops (the
    first reason given), and the update whose loss was not finite."""

    def __init__(self):
        self.model = None
        self.stop_reason: str | None = None
        self.nan_step: int | None = None

    def stop(self, reason: str) -> None:
        self.stop_reason = self.stop_reason or reason
        if self.model is not None:
            self.model.stop_training = True

    @property
    def step(self) -> int:
        return int(self.model.optimizer.iterations.numpy())


class TrainLog(keras.callbacks.Callback):
    """Logging: every update, its tokens and time (tokens/s, the state's
    counters) and the NaN guard (a loss that is not finite stops the run);
    every --log_every_steps the TensorBoard scalars under logs/train (and a
    log line when stdout is not a terminal); the epoch's loss when it ends."""

    def __init__(self, config, state: TrainingState, status: RunStatus, batches_per_epoch: int | None,
                 writer, log=print, print_lines: bool = False):
        super().__init__()
        self.config, self.state, self.status = config, state, status
        self.batches_per_epoch, self.writer, self.log, self.print_lines = batches_per_epoch, writer, log, print_lines
        self.run_tokens = 0
        self.run_seconds = 0.0
        self.run_steps = 0
        self._timed = {"steps": 0, "seconds": 0.0}   # this run's updates after the first few, for seconds_per_step
        self._reset_interval()
        self._reset_epoch()

    def _reset_interval(self):
        self._iv = {"nll": 0.0, "tokens": 0.0, "seconds": 0.0, "grad_norm": 0.0, "steps": 0}

    def _reset_epoch(self):
        self._ep = {"nll": 0.0, "tokens": 0.0, "sentences": 0.0}

    @property
    def seconds_per_step(self) -> float | None:
        """This run's mean time per update, leaving out its first updates (which
        trace and compile the step); None until measured."""
        return self._timed["seconds"] / self._timed["steps"] if self._timed["steps"] else None

    def epoch_train_nll(self) -> dict | None:
        """NLL of the updates of the current (or last finished) epoch in this run."""
        if not self._ep["tokens"]:
            return None
        per_token = self._ep["nll"] / self._ep["tokens"]
        return {"nll_per_token": per_token, "nll_per_sentence": self._ep["nll"] / self._ep["sentences"],
                "perplexity": math.exp(min(per_token, 700.0))}

    def on_epoch_begin(self, epoch, logs=None):
        if int(self.state.epoch_batches.numpy()) == 0:
            self._reset_epoch()

    def on_train_batch_begin(self, batch, logs=None):
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        seconds = time.perf_counter() - self._t0
        loss = float(logs["batch_loss"])
        step = self.status.step
        if not np.isfinite(loss):
            self.status.nan_step = step
            self.status.stop("nan")
            return
        tokens, sentences = float(logs["batch_tokens"]), float(logs["batch_sentences"])
        self.state.epoch_batches.assign_add(1)
        self.state.train_seconds.assign_add(seconds)
        self.state.target_tokens.assign_add(int(tokens))
        self.run_tokens += tokens
        self.run_seconds += seconds
        self.run_steps += 1
        if self.run_steps > _UNTIMED_STEPS:
            self._timed["steps"] += 1
            self._timed["seconds"] += seconds
        for acc, values in ((self._iv, {"nll": loss * tokens, "tokens": tokens, "seconds": seconds,
                                        "grad_norm": float(logs["grad_norm"]), "steps": 1}),
                            (self._ep, {"nll": loss * tokens, "tokens": tokens, "sentences": sentences})):
            for k, v in values.items():
                acc[k] += v
        logs["tok/s"] = self._iv["tokens"] / max(self._iv["seconds"], 1e-9)
        if step % self.config.log_every_steps == 0:
            self._write_train_scalars(step)

    def write_epoch_loss(self, step: int) -> None:
        """The finished epoch's loss (called by the callback that ends the epoch)."""
        train = self.epoch_train_nll()
        if train:
            with self.writer.as_default(step=step):
                tf.summary.scalar("epoch_loss", train["nll_per_token"])

    def _write_train_scalars(self, step):
        iv = self._iv
        if not iv["tokens"]:
            return
        loss = iv["nll"] / iv["tokens"]
        tok_s = iv["tokens"] / max(iv["seconds"], 1e-9)
        epoch = float(self.state.epoch.numpy()) + (
            self.state.epoch_batches.numpy() / self.batches_per_epoch if self.batches_per_epoch else 0.0)
        lr = float(keras.ops.convert_to_numpy(self.status.model.optimizer.learning_rate))
        with self.writer.as_default(step=step):
            tf.summary.scalar("loss", loss, description="NLL per target token")
            tf.summary.scalar("perplexity", math.exp(min(loss, 700.0)))
            tf.summary.scalar("learning_rate", lr)
            tf.summary.scalar("tokens_per_sec", tok_s, description="target tokens per second")
            tf.summary.scalar("grad_norm", iv["grad_norm"] / iv["steps"],
                              description="global gradient norm before clipping")
            tf.summary.scalar("epoch", epoch)
        if self.print_lines:
            self.log(f"step {step:,} | epoch {epoch:.2f} | loss {loss:.3f} | "
                     f"ppl {math.exp(min(loss, 700.0)):.2f} | {tok_s:,.0f} tok/s")
        self._reset_interval()


class LearningRateControl(keras.callbacks.Callback):
    """The schedule: before every update, the learning rate of --lr_schedule
    (nmt_tf.training.schedules: the warm-up, and the decay to the end of the
    budget of a budgeted schedule, which needs `train_log`'s seconds per
    update); and --decay_factor after every --decay_patience dev
    evaluations without improvement (`after_bad_evaluation`)."""

    def __init__(self, config, state: TrainingState, status: RunStatus, train_log: TrainLog, log=print):
        super().__init__()
        self.config, self.state, self.status, self.train_log, self.log = config, state, status, train_log, log
        self.schedule = schedules.LearningRateSchedule(     # workers of one job must agree: steps only there
            config.lr_schedule, learning_rate(config), config.warmup_steps, config.max_steps,
            0.0 if config.distribution == "multi_worker" else config.max_hours, config.final_lr_fraction,
            config.lr_decay_fraction)

    def on_train_batch_begin(self, batch, logs=None):
        rate = self.schedule.rate(self.status.step, float(self.state.train_seconds.numpy()),
                                  self.train_log.seconds_per_step)
        if rate is not None:
            self.status.model.optimizer.learning_rate.assign(rate)

    def after_bad_evaluation(self):
        """--decay_factor after every --decay_patience evaluations without improvement."""
        bad = int(self.state.bad_evals.numpy())
        if self.config.decay_factor < 1.0 and bad % self.config.decay_patience == 0:
            optimizer = self.status.model.optimizer
            old = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
            optimizer.learning_rate.assign(old * self.config.decay_factor)
            self.log(f"  learning rate {old:.3g} -> {old * self.config.decay_factor:.3g}")


class DevAndCheckpoints(keras.callbacks.Callback):
    """Checkpoints and dev evaluation: every --checkpoint_every_steps and at
    epoch ends a checkpoint; every --eval_every_steps (or at epoch ends) the
    dev loss and BLEU, TensorBoard under logs/dev, the best checkpoints,
    the plateau's learning-rate decay and early stopping. It also ends an
    epoch (the state's counters) when its last batch is done."""

    def __init__(self, config, state: TrainingState, status: RunStatus, manager: tf.train.CheckpointManager,
                 best_checkpoints, evaluator: DevEvaluator | None, bleu: DevBleu | None, batches_per_epoch: int | None,
                 train_log: TrainLog, learning_rate: LearningRateControl, writer, log=print):
        super().__init__()
        self.config, self.state, self.status, self.log = config, state, status, log
        self.manager = manager
        self.best_checkpoints = best_checkpoints       # nmt_tf.core.checkpoints.BestCheckpoints or None
        self.evaluator, self.bleu = evaluator, bleu
        self.batches_per_epoch = batches_per_epoch
        self.train_log, self.learning_rate, self.writer = train_log, learning_rate, writer
        self.last_dev = None

    def on_train_batch_end(self, batch, logs=None):
        if self.status.nan_step is not None:
            return
        step = self.status.step
        if self.config.eval_every_steps and step % self.config.eval_every_steps == 0:
            self.evaluate(step)
        if step % self.config.checkpoint_every_steps == 0:
            self.save(step)

    def on_epoch_end(self, epoch, logs=None):
        if self.status.nan_step is not None:
            return
        done = int(self.state.epoch_batches.numpy())
        complete = (done >= self.batches_per_epoch if self.batches_per_epoch
                    else not self.status.model.stop_training)
        if not complete:
            return
        self.state.epoch.assign_add(1)
        self.state.epoch_batches.assign(0)
        step = self.status.step
        self.train_log.write_epoch_loss(step)
        if not self.config.eval_every_steps:
            self.evaluate(step)
        self.save(step)

    def evaluate(self, step):
        """Dev loss (and BLEU), TensorBoard, best checkpoint, learning-rate decay, early stopping;
        with --ema_decay all of it on the weights' moving averages."""
        if self.evaluator is None or int(self.state.last_eval_step.numpy()) == step:
            return
        t0 = time.perf_counter()
        # with --ema_decay, the weights' moving averages are what is evaluated and kept in best/
        with optimizers.averaged_weights(self.status.model.optimizer):
            dev = self.evaluator()
            bleu = self.bleu() if self.bleu is not None else None
            if bleu:
                dev.update({k: bleu[k] for k in ("bleu", "bleu_lc", "chrf", "bleu_lc_moses", "bleu_signature")})
                dev["bleu_sentences"] = bleu["sentences"]
            self.last_dev = {**dev, "step": step}
            self.state.last_eval_step.assign(step)
            by_bleu = self.config.early_stopping_metric == "bleu" and bleu is not None
            improved = (dev["bleu"] > float(self.state.best_bleu.numpy()) if by_bleu
                        else dev["nll_per_token"] < float(self.state.best_dev.numpy()))
            self.state.best_dev.assign(min(dev["nll_per_token"], float(self.state.best_dev.numpy())))
            if bleu:
                self.state.best_bleu.assign(max(dev["bleu"], float(self.state.best_bleu.numpy())))
            if self.best_checkpoints is not None:       # a new best is always kept
                self.best_checkpoints.save(step, dev["bleu"] if by_bleu else dev["nll_per_token"])
        if improved:
            self.state.best_step.assign(step)
            self.state.bad_evals.assign(0)
        else:
            self.state.bad_evals.assign_add(1)
            self.learning_rate.after_bad_evaluation()
        self._write_dev_summaries(step, dev, bleu)
        self.log(self._dev_line(step, dev, bleu, improved, by_bleu) + f" [{time.perf_counter() - t0:.1f}s]")
        if bleu and bleu["examples"]:
            hyp, ref = bleu["examples"][0]
            self.log(f"    hyp: {hyp}\n    ref: {ref}")
        if self.config.patience and int(self.state.bad_evals.numpy()) >= self.config.patience:
            self.log(f"  early stopping: no dev improvement in {self.config.patience} evaluations")
            self.status.stop("early_stopping")

    def _write_dev_summaries(self, step, dev: dict, bleu: dict | None):
        """An evaluation's TensorBoard scalars (and attention images, with BLEU) under logs/dev."""
        with self.writer.as_default(step=step):
            tf.summary.scalar("loss", dev["nll_per_token"], description="dev NLL per target token")
            tf.summary.scalar("perplexity", dev["perplexity"])
            tf.summary.scalar("nll_per_sentence", dev["nll_per_sentence"])
            tf.summary.scalar("best_loss", float(self.state.best_dev.numpy()))
            if bleu:
                tf.summary.scalar("bleu", bleu["bleu"], description=bleu["bleu_signature"])
                tf.summary.scalar("bleu_lc", bleu["bleu_lc"], description="lowercased BLEU")
                tf.summary.scalar("chrf", bleu["chrf"])
                tf.summary.scalar("bleu_lc_moses", bleu["bleu_lc_moses"],
                                  description="lowercased Moses-tokenized BLEU, as the Multi30k papers score")
                tf.summary.scalar("best_bleu", float(self.state.best_bleu.numpy()))
                for i, png in enumerate(bleu["images"]):
                    tf.summary.image(f"attention/example_{i}", plots.png_to_tensor(png), step=step,
                                     description="alignment alpha_ij: source words on the x axis, "
                                                 "generated words on the y axis (black 0, white 1)")
        self.writer.flush()

    def _dev_line(self, step, dev: dict, bleu: dict | None, improved: bool, by_bleu: bool) -> str:
        """An evaluation's log line: the dev NLL, BLEU, and the best so far."""
        best = (f"best {float(self.state.best_bleu.numpy()):.2f} BLEU" if by_bleu
                else f"best {float(self.state.best_dev.numpy()):.4f}") + \
            f" at step {int(self.state.best_step.numpy()):,}"
        return (f"  dev at step {step:,}: NLL/token {dev['nll_per_token']:.4f} (ppl {dev['perplexity']:.2f}), "
                f"NLL/sentence {dev['nll_per_sentence']:.2f}"
                + (f", BLEU {bleu['bleu']:.2f} (lowercased {bleu['bleu_lc']:.2f}, "
                   f"lc Moses-tok {bleu['bleu_lc_moses']:.2f})" if bleu else "")
                + (" (best)" if improved else f" ({best})"))

    def save(self, step):
        if self.status.nan_step is None:
            checkpoints.save_checkpoint(self.manager, step)
            self.train_log.writer.flush()


class Budget(keras.callbacks.Callback):
    """Budget and signals: after every update, --max_steps, --max_hours and
    SIGINT / SIGTERM (`signal_handlers`) stop the run; under a multi-worker
    strategy the time budget and a signal are votes (StopVotes, `votes`)."""

    def __init__(self, config, state: TrainingState, status: RunStatus, log=print):
        super().__init__()
        self.config, self.state, self.status, self.log = config, state, status, log
        self._interrupted = False
        self.received_signal: str | None = None      # name of the signal that stopped the run
        self.votes: StopVotes | None = None           # set under a multi-worker strategy

    @contextlib.contextmanager
    def signal_handlers(self):
        """While inside: SIGINT / SIGTERM stop after the current update, with a checkpoint.

        The previous handlers come back on exit, so Ctrl-C works again in the
        Python session (notebook, tests) that called train(). Outside the main
        thread, where Python cannot install handlers, signals keep their default.
        """
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum, frame):
            if self._interrupted:            # a second signal: stop at once
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
            self._interrupted = True
            self.received_signal = signal.Signals(signum).name
            self.log(f"\nReceived {signal.Signals(signum).name}: stopping after this update "
                     "(signal again to stop at once, without a checkpoint).")
        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, h in previous.items():
                signal.signal(sig, h)

    def on_train_batch_end(self, batch, logs=None):
        if self.status.nan_step is not None:
            return
        if self.votes is not None:
            self._count_votes(logs)
        self.check_budgets(vote=True)

    def check_budgets(self, vote: bool = False):
        """Stops on --max_steps, --max_hours or a signal. With `vote` (after an
        update, under a multi-worker strategy), the time budget and a signal,
        which each worker meets at its own moment, are votes (StopVotes)."""
        out_of_time = self.config.max_hours and self.state.train_seconds.numpy() >= self.config.max_hours * 3600
        if self.config.max_steps and self.status.step >= self.config.max_steps:
            self.status.stop("max_steps")
        elif vote and self.votes is not None:
            if out_of_time:
                self.votes.hours.assign(1.0)
            if self._interrupted:
                self.votes.signal.assign(float(signal.Signals[self.received_signal].value))
        elif out_of_time:
            self.status.stop("max_hours")
        elif self._interrupted:
            self.status.stop("interrupted")

    def _count_votes(self, logs):
        """Stops after this update if a worker voted in it (StopVotes)."""
        signum, hours = int(float(logs.get("stop_signal", 0))), float(logs.get("stop_hours", 0))
        if signum:
            if self.received_signal is None:
                self.log(f"Another worker received {signal.Signals(signum).name}: stopping after this update.")
            self.received_signal = self.received_signal or signal.Signals(signum).name
            self.status.stop("interrupted")
        elif hours:
            self.status.stop("max_hours")


class TrainingCallbacks:
    """The callbacks of one training job, each one job, in the order Keras
    calls them (`callbacks`): the learning rate (LearningRateControl),
    logging (TrainLog), checkpoints and dev evaluation
    (DevAndCheckpoints), budget and signals (Budget). nmt_tf.training.job
    asks it what happened (why the run stopped, the last evaluation, this
    run's tokens) and calls the evaluation, a checkpoint or an epoch's end
    between fits."""

    def __init__(self, config, state: TrainingState, manager: tf.train.CheckpointManager, best_checkpoints,
                 evaluator: DevEvaluator | None, log_dir: str, batches_per_epoch: int | None, log=print,
                 print_lines=False, bleu: DevBleu | None = None):
        self.status = RunStatus()
        self.train_writer = tf.summary.create_file_writer(os.path.join(log_dir, "train"))
        self.dev_writer = tf.summary.create_file_writer(os.path.join(log_dir, "dev"))
        self.train_log = TrainLog(config, state, self.status, batches_per_epoch, self.train_writer, log, print_lines)
        self.learning_rate = LearningRateControl(config, state, self.status, self.train_log, log)
        self.dev = DevAndCheckpoints(config, state, self.status, manager, best_checkpoints, evaluator, bleu,
                                     batches_per_epoch, self.train_log, self.learning_rate, self.dev_writer, log)
        self.budget = Budget(config, state, self.status, log)
        # The rate is set before an update's clock starts; after it, its counts come before what reads them.
        self.callbacks = [self.learning_rate, self.train_log, self.dev, self.budget]

    def set_model(self, model) -> None:
        self.status.model = model
        for callback in self.callbacks:
            callback.set_model(model)

    @property
    def stop_reason(self) -> str | None:
        return self.status.stop_reason

    @property
    def nan_step(self) -> int | None:
        return self.status.nan_step

    @property
    def schedule(self):
        return self.learning_rate.schedule

    def on_epoch_end(self, epoch: int) -> None:
        """An epoch whose last batch was done before the run stopped: its end's work."""
        for callback in self.callbacks:
            callback.on_epoch_end(epoch)

    def flush(self):
        self.train_writer.flush()
        self.dev_writer.flush()


def is_terminal() -> bool:
    return sys.stdout.isatty()
