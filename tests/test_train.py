"""Training jobs: outputs, TensorBoard, resuming, budgets, errors, the CLI."""

import glob
import json
import os
import shutil
import signal
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from conftest import (
    REPO,
    assert_same_checkpoint_weights,
    checkpoint_weights,
    run_cli,
    smoke_train_args,
    start_cli,
    wait_until,
)
from nmt_tf import config as nmt_config
from nmt_tf import flags
from nmt_tf.config import TrainingConfig
from nmt_tf.training import job as training

QUIET = dict(log=lambda *a: None)


def test_training_writes_every_output(trained_model_dir):
    model_dir, summary = trained_model_dir
    for name in ("config.json", "flags.txt", "model_config.json", "vocab.src.txt", "vocab.tgt.txt",
                 "corpus_stats.json", "train_summary.json"):
        assert os.path.exists(os.path.join(model_dir, name)), name
    stored = json.load(open(os.path.join(model_dir, "train_summary.json")))
    assert stored["steps"] == summary["steps"] == 10           # 2 epochs x 5 batches of 8
    assert stored["completed_epochs"] == 2 and stored["status"] == "max_epochs"
    for side in ("train", "dev"):
        assert stored[side]["nll_per_token"] > 0 and stored[side]["nll_per_sentence"] > stored[side]["nll_per_token"]
    assert stored["target_tokens_per_sec"] > 0 and stored["train_seconds"] > 0
    assert stored["corpus"]["train"]["pairs"] == 40
    assert tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints")).endswith("ckpt-10")
    assert tf.train.latest_checkpoint(os.path.join(model_dir, "best"))
    assert nmt_config.load(model_dir).hidden_size == 16


def read_scalars(log_dir):
    """{tag: [(step, value)]} of the scalar summaries in the event files (images and text are skipped)."""
    out = {}
    for path in glob.glob(os.path.join(log_dir, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for v in event.summary.value:
                value = tf.make_ndarray(v.tensor)
                if value.ndim == 0 and value.dtype.kind == "f":
                    out.setdefault(v.tag, []).append((event.step, float(value)))
    return out


def test_tensorboard_event_files_hold_the_scalars(trained_model_dir):
    """Catches a missing `tensorboard` package: tf.summary then writes empty event files."""
    model_dir, summary = trained_model_dir
    train_scalars = read_scalars(os.path.join(model_dir, "logs", "train"))
    for tag in ("loss", "perplexity", "learning_rate", "tokens_per_sec", "grad_norm"):
        assert len(train_scalars.get(tag, [])) == 10, (tag, sorted(train_scalars))
    np.testing.assert_allclose([v for _, v in train_scalars["learning_rate"]], 0.01, rtol=1e-6)
    dev = read_scalars(os.path.join(model_dir, "logs", "dev"))
    assert [s for s, _ in dev["loss"]] == [5, 10]
    assert dev["loss"][-1][1] == pytest.approx(summary["dev"]["nll_per_token"], rel=1e-5)


# Every kind of dropout the recipes use, with the decoder of rnnsearch.flags.
DROPOUT = dict(dropout=0.3, annotation_dropout=0.3, recurrent_dropout=0.2, decoder="cgru")


def test_interrupted_run_resumes_to_the_same_weights(tiny_config, tmp_path):
    """8 updates in one go == 4 updates, stop, resume for 4 more (mid-epoch),
    with dropout: the checkpoint holds the dropout layers' random states, so
    the resumed run draws the masks the uninterrupted one drew."""
    straight = tiny_config(model_dir=str(tmp_path / "a"), max_steps=8, max_epochs=5, seed=11, **DROPOUT)
    training.train(straight, **QUIET)
    split = straight.replace(model_dir=str(tmp_path / "b"), max_steps=4)
    first = training.train(split, **QUIET)
    assert first["status"] == "max_steps" and first["steps"] == 4
    resumed = training.train(split.replace(max_steps=8), **QUIET)
    assert resumed["steps"] == 8 and resumed["epochs"] == pytest.approx(1.6)
    assert_same_checkpoint_weights(*(str(tmp_path / run / "checkpoints" / "ckpt-8") for run in "ab"))
    states = [name for name, _ in tf.train.list_variables(str(tmp_path / "b" / "checkpoints" / "ckpt-8"))
              if name.startswith("dropout_random_states/")]
    assert len(states) == 5     # embeddings, readout, annotations; the encoder's and the decoder's GRUs


def test_a_resume_from_a_checkpoint_without_dropout_states_says_its_masks_differ(tiny_config, tmp_path):
    """Checkpoints written before nmt_tf kept dropout's random state (or by a
    run without dropout) resume with the states as a new run has them, and
    the log says that the masks differ from an uninterrupted run's."""
    config = tiny_config(model_dir=str(tmp_path / "m"), max_steps=4, max_epochs=5, decoder="cgru")
    training.train(config, **QUIET)
    lines = []
    resumed = training.train(config.replace(max_steps=6, **DROPOUT), log=lines.append)   # dropout turned on
    assert resumed["steps"] == 6
    said = [line for line in lines if "random state" in line]
    assert len(said) == 1 and "of 0 dropout layers, not of this model's 5" in said[0], lines


def test_early_dropout_epochs_train_without_dropout_then_with_it_and_resume_in_the_right_phase(
        tiny_config, tmp_path):
    """--early_dropout_epochs=1 --early_dropout_scale=0: the first epoch (5
    updates) trains without dropout (runs with other rates train it alike),
    the second with the full rates (the log says both); a run stopped in the
    second epoch resumes to the uninterrupted run's weights."""
    lines = []
    late = tiny_config(model_dir=str(tmp_path / "late"), max_epochs=2, seed=11, early_dropout_epochs=1,
                       keep_checkpoints=10, **DROPOUT)
    training.train(late, log=lines.append)
    assert [line for line in lines if "dropout rate" in line] == [
        "Epoch 1: every dropout rate x0 (--early_dropout_scale), the full rates from epoch 2 on "
        "(--early_dropout_epochs=1).", "Epoch 2: the full dropout rates from here on."], lines
    # Other rates, the same layers (so the same initial weights): the same first epoch.
    other_rates = late.replace(model_dir=str(tmp_path / "other"), max_epochs=1, dropout=0.6, annotation_dropout=0.1,
                               recurrent_dropout=0.5)
    training.train(other_rates, **QUIET)
    assert_same_checkpoint_weights(*(str(tmp_path / run / "checkpoints" / "ckpt-5") for run in ("late", "other")))
    # Stopped in the second epoch, the resumed run traces its training with the full rates
    # from the start: the same weights only if the uninterrupted run retraced at the switch.
    split = late.replace(model_dir=str(tmp_path / "split"), max_steps=7)
    assert training.train(split, **QUIET)["steps"] == 7
    assert training.train(split.replace(max_steps=0), **QUIET)["steps"] == 10
    assert_same_checkpoint_weights(*(str(tmp_path / run / "checkpoints" / "ckpt-10") for run in ("late", "split")))


def test_early_dropout_epochs_need_a_dropout_rate(tiny_config, tmp_path):
    with pytest.raises(training.TrainingError, match="--early_dropout_epochs=2 scales the dropout rates"):
        training.train(tiny_config(model_dir=str(tmp_path / "m"), early_dropout_epochs=2), **QUIET)


def test_an_interrupted_and_resumed_run_evaluates_when_an_uninterrupted_one_does(
        tiny_config, tmp_path, monkeypatch):
    """A signal stops with a checkpoint but no dev evaluation: the resumed run evaluates
    at the epoch ends only, so the plateau's patience and best/ see what an
    uninterrupted run sees (the stop used to add an evaluation)."""
    from nmt_tf.training import callbacks as cb

    original = cb.Budget.on_train_batch_end

    def signal_at_update_3(self, batch, logs=None):
        if self.status.step == 3 and self.received_signal is None:
            self._interrupted, self.received_signal = True, "SIGTERM"   # what the handler sets
        original(self, batch, logs)
    monkeypatch.setattr(cb.Budget, "on_train_batch_end", signal_at_update_3)
    config = tiny_config(model_dir=str(tmp_path / "m"), max_epochs=2)
    first = training.train(config, **QUIET)
    assert first["status"] == "interrupted" and 3 <= first["steps"] < 5 and first["dev"] is None
    assert tf.train.latest_checkpoint(str(tmp_path / "m" / "checkpoints")).endswith(f"ckpt-{first['steps']}")
    monkeypatch.setattr(cb.Budget, "on_train_batch_end", original)
    resumed = training.train(config, **QUIET)
    assert resumed["status"] == "max_epochs" and resumed["steps"] == 10
    dev = read_scalars(str(tmp_path / "m" / "logs" / "dev"))
    assert [s for s, _ in dev["loss"]] == [5, 10]


def test_sigterm_saves_a_checkpoint_and_exits_with_128_plus_the_signal(tiny_corpus, tmp_path):
    """A scheduler's SIGTERM: the run stops after the update, checkpoints, says
    'interrupted' and exits 143, not 0 (it did not finish)."""
    model_dir = str(tmp_path / "terminated")
    proc = start_cli(*smoke_train_args(tiny_corpus, model_dir, "--batch_size=4", "--max_epochs=400",
                                       "--checkpoint_every_steps=2", "--nodev_bleu"),
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ckpt_dir = os.path.join(model_dir, "checkpoints")
    wait_until(lambda: tf.train.latest_checkpoint(ckpt_dir), 120, interval=0.2)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM == 143, output[-3000:]
    assert "Received SIGTERM" in output and "Training stopped (interrupted)" in output
    summary = json.load(open(os.path.join(model_dir, "train_summary.json")))
    assert summary["status"] == "interrupted" and summary["signal"] == "SIGTERM"
    assert summary["checkpoint"].endswith(f"ckpt-{summary['steps']}")


def test_death_between_the_last_batch_and_the_epoch_end_checkpoint_resumes_exactly(
        tiny_config, tmp_path, monkeypatch):
    """The checkpoint of an epoch's last batch comes before the epoch-end one (same
    step); a run that dies between them finishes that epoch on resume with no extra
    update. (CI once saw the SIGKILL test land here: 31 updates instead of 30.)"""
    from nmt_tf.training import callbacks as cb

    class Died(Exception):
        pass

    original = cb.DevAndCheckpoints.on_epoch_end

    def dies_at_the_second_epoch_end(self, epoch, logs=None):
        if epoch == 1:
            raise Died
        return original(self, epoch, logs)

    config = tiny_config(model_dir=str(tmp_path / "m"), max_epochs=3, checkpoint_every_steps=5)
    monkeypatch.setattr(cb.DevAndCheckpoints, "on_epoch_end", dies_at_the_second_epoch_end)
    with pytest.raises(Died):
        training.train(config, **QUIET)
    monkeypatch.undo()
    assert tf.train.latest_checkpoint(str(tmp_path / "m" / "checkpoints")).endswith("ckpt-10")
    summary = training.train(config, **QUIET)                 # 5 batches of 8 per epoch
    assert summary["steps"] == 15 and summary["completed_epochs"] == 3


def test_epochs_of_data_dependent_length_take_no_phantom_update(tiny_config, tmp_path):
    """Token batches: Keras learns an epoch's end from get_next() failing, and its
    optimizer counted an update there anyway unless the update depends on the batch."""
    model_dir = tmp_path / "tokens"
    summary = training.train(tiny_config(model_dir=str(model_dir), batch_type="tokens", batch_size=60,
                                      max_epochs=2, log_every_steps=1), **QUIET)
    logged = [step for step, _ in read_scalars(str(model_dir / "logs" / "train"))["loss"]]
    assert summary["completed_epochs"] == 2 and summary["steps"] > 10
    assert sorted(logged) == list(range(1, summary["steps"] + 1))


def test_train_gives_back_the_callers_signal_handlers_and_dtype_policy(tiny_config, tmp_path):
    """Ctrl-C must work again in the Python session that called train(); and
    --mixed_precision (default auto) sets Keras' global policy for the run
    only: models built after train() returns are float32 again. The custom
    gradients its graphs registered are released (they would keep every
    run's graphs alive), also when it fails."""
    import keras

    from nmt_tf.core import custom_gradients
    from nmt_tf.data.pipeline import CorpusError

    def process_state():
        return signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM), custom_gradients.registered()

    before = process_state()
    assert TrainingConfig().mixed_precision == "auto"
    lines = []
    training.train(tiny_config(model_dir=str(tmp_path / "m"), max_steps=1, mixed_precision="auto"),
                log=lines.append)
    assert any(line.startswith("--mixed_precision=auto: ") for line in lines), lines
    assert keras.mixed_precision.dtype_policy().name == "float32"
    assert process_state() == before
    with pytest.raises(CorpusError):                # also when it fails after choosing (every pair too long)
        training.train(tiny_config(model_dir=str(tmp_path / "n"), max_len=2, mixed_precision="mixed_bfloat16"),
                    **QUIET)
    assert keras.mixed_precision.dtype_policy().name == "float32" and process_state() == before


def _trained_weights(model_dir, checkpoint):
    """The trainable weights of a model directory's checkpoint (best, last or a path), in model order."""
    from nmt_tf.inference.restore import restore_model

    model = restore_model(model_dir, checkpoint, log=lambda *a: None).model
    return [np.array(v) for v in model.trainable_variables]


def test_with_ema_decay_dev_and_best_hold_the_averaged_weights_and_a_resume_the_trained_ones(
        tiny_config, tmp_path):
    model_dir = str(tmp_path / "ema")
    # (with dev BLEU: the greedy search of dev also runs on the averages)
    averaging = tiny_config(model_dir=model_dir, ema_decay=0.5, checkpoint_every_steps=5, dev_bleu=True)
    lines = []
    summary = training.train(averaging, log=lines.append)
    assert summary["steps"] == 5
    assert any(line.startswith("Moving average of the weights: decay min(0.5, ") for line in lines)
    last_path = os.path.join(model_dir, "checkpoints", "ckpt-5")
    last, best = _trained_weights(model_dir, last_path), _trained_weights(model_dir, "best")
    assert len(last) == len(best) > 10
    reader = tf.train.load_checkpoint(last_path)
    stored = [reader.get_tensor(k) for k in reader.get_variable_to_shape_map() if k != "_CHECKPOINTABLE_OBJECT_GRAPH"]
    for trained, averaged in zip(last, best):
        assert not np.array_equal(trained, averaged)
        # best/ holds the averages that checkpoints/ keeps beside the trained weights
        assert any(v.shape == averaged.shape and np.array_equal(v, averaged) for v in stored)

    # A resume from best/ (the regular checkpoints lost) trains on from the trained weights.
    os.rename(os.path.join(model_dir, "checkpoints"), str(tmp_path / "lost"))
    lines = []
    training.train(averaging, log=lines.append)
    assert any("best-5 (model and optimizer): step 5" in line for line in lines), lines
    for trained, again in zip(last, _trained_weights(model_dir, last_path)):
        np.testing.assert_array_equal(again, trained)


def test_a_resume_cannot_turn_ema_decay_on_or_off_but_may_change_it(tiny_config, trained_model_dir, tmp_path):
    plain, averaging = str(tmp_path / "plain"), str(tmp_path / "averaging")
    shutil.copytree(trained_model_dir[0], plain)        # trained without --ema_decay
    training.train(tiny_config(model_dir=averaging, max_steps=3, ema_decay=0.9), **QUIET)
    for model_dir, decay in ((plain, 0.9), (averaging, 0.0)):
        with pytest.raises(training.TrainingError, match="a resume cannot turn the weights' moving average on or off"):
            training.train(tiny_config(model_dir=model_dir, max_steps=5, ema_decay=decay), **QUIET)
    assert training.train(tiny_config(model_dir=averaging, max_steps=5, ema_decay=0.5), **QUIET)["steps"] == 5


def test_ema_decay_needs_a_dev_set_and_a_decay_below_one(tiny_config, tmp_path):
    with pytest.raises(training.TrainingError, match="--ema_decay=1.0 would never move"):
        training.train(tiny_config(model_dir=str(tmp_path / "a"), ema_decay=1.0), **QUIET)
    with pytest.raises(training.TrainingError, match="--ema_decay keeps the averaged weights .* needs a dev set"):
        training.train(tiny_config(model_dir=str(tmp_path / "b"), ema_decay=0.9, dev_src=None, dev_tgt=None),
                       **QUIET)


def test_resume_rejects_a_different_model(tiny_config, trained_model_dir, tmp_path):
    config = tiny_config(model_dir=str(tmp_path / "m"))
    shutil.copytree(trained_model_dir[0], config.model_dir)         # hidden_size 16
    with pytest.raises(training.TrainingError, match=r"--hidden_size \(was 16, now 32\)"):
        training.train(config.replace(hidden_size=32), explicit={"hidden_size"}, **QUIET)


def test_a_start_that_fails_on_its_data_leaves_nothing_a_retry_would_trip_over(tiny_config, tiny_corpus, tmp_path):
    """Unusable data: no model directory is left behind (or, if the user made it, only
    what was there); the corrected retry, with other sizes, is accepted. Resuming with
    other data says so."""
    from nmt_tf.data.pipeline import CorpusError

    short = tmp_path / "short.en"
    short.write_text("one\ntwo\n")
    model_dir = tmp_path / "m"
    with pytest.raises(CorpusError, match="lines"):                          # unequal files
        training.train(tiny_config(model_dir=str(model_dir), train_src=str(short)), **QUIET)
    assert not model_dir.exists()
    with pytest.raises(CorpusError, match="No usable sentence pair"):         # every pair too long
        training.train(tiny_config(model_dir=str(model_dir), max_len=2), **QUIET)
    assert not model_dir.exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("kept")
    with pytest.raises(CorpusError, match="No usable sentence pair"):
        training.train(tiny_config(model_dir=str(mine), max_len=2), **QUIET)
    assert os.listdir(mine) == ["notes.txt"]
    summary = training.train(tiny_config(model_dir=str(mine), hidden_size=12, max_steps=1), **QUIET)
    assert summary["steps"] == 1 and nmt_config.load(str(mine)).hidden_size == 12
    lines = []
    other = tmp_path / "other.en.gz"
    other.write_bytes(open(tiny_corpus["train_src"], "rb").read())
    training.train(tiny_config(model_dir=str(mine), hidden_size=12, max_steps=2, train_src=str(other)),
                explicit={"train_src", "max_steps"}, log=lines.append)
    assert any(line.startswith(f"warning: --train_src is now {other} but this run started with "
                               f"{tiny_corpus['train_src']}") for line in lines), lines


def test_resume_takes_unspecified_flags_from_the_model_dir(tiny_config, tmp_path):
    model_dir = str(tmp_path / "m")
    training.train(tiny_config(model_dir=model_dir, max_steps=2, batch_size=4), **QUIET)
    summary = training.train(TrainingConfig(model_dir=model_dir, max_steps=4),
                          explicit={"model_dir", "max_steps"}, **QUIET)
    assert summary["steps"] == 4
    assert nmt_config.load(model_dir).batch_size == 4


def test_the_epochs_of_a_run_share_one_traced_encoder(tiny_config, tmp_path, monkeypatch):
    from nmt_tf.data import pipeline as data

    built = []

    class CountedEncoder(data.PairEncoder):
        def __init__(self, *args, **kw):
            built.append(args)
            super().__init__(*args, **kw)

    monkeypatch.setattr(data, "PairEncoder", CountedEncoder)
    summary = training.train(tiny_config(model_dir=str(tmp_path / "m"), max_epochs=3, dev_src=None, dev_tgt=None),
                             **QUIET)
    assert summary["steps"] == 15 and len(built) == 1    # 3 epochs of 5 batches


def test_budget_max_steps_and_early_stopping(tiny_config, tmp_path):
    summary = training.train(tiny_config(model_dir=str(tmp_path / "a"), max_steps=3), **QUIET)
    assert summary["status"] == "max_steps" and summary["steps"] == 3
    # A learning rate of 0 never improves the dev loss: patience 2 stops after 3 evaluations.
    summary = training.train(tiny_config(model_dir=str(tmp_path / "b"), learning_rate=0.0, max_epochs=50,
                                      eval_every_steps=2, patience=2), **QUIET)
    assert summary["status"] == "early_stopping" and summary["steps"] == 6
    assert summary["best_dev"]["step"] == 2


def test_a_step_budget_the_epochs_cut_short_is_said(tiny_config, tmp_path):
    """--max_steps beyond what --max_epochs allows: the log says which ends the run."""
    said = []
    summary = training.train(tiny_config(model_dir=str(tmp_path / "a"), max_steps=40, max_epochs=1),
                             log=said.append)
    assert summary["status"] == "max_epochs" and summary["steps"] == 5
    assert "Note: --max_epochs=1 ends this run after 5 updates, before --max_steps=40; raise --max_epochs" in \
        "\n".join(map(str, said))


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tiny_config, tmp_path):
    model_dir = str(tmp_path / "nan")
    config = tiny_config(model_dir=model_dir, optimizer="sgd", learning_rate=1e30, clip_norm=0.0,
                         max_epochs=20, checkpoint_every_steps=1)
    with pytest.raises(training.NaNLossError, match="NaN or infinite at step") as e:
        training.train(config, **QUIET)
    latest = tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))
    assert latest and latest in str(e.value)
    for value in checkpoint_weights(latest).values():
        assert np.all(np.isfinite(value))


def test_flags_after_the_flagfile_override_it():
    smoke = os.path.join(REPO, "pipelines", "smoke.flags")
    try:
        flags.FLAGS(["train", f"--flagfile={smoke}", "--batch_size=7"])
        assert flags.config_from_flags().batch_size == 7
        assert flags.config_from_flags().hidden_size == 16
        assert "batch_size" in flags.explicitly_set()
        flags.FLAGS.unparse_flags()
        flags.FLAGS(["train", "--batch_size=7", f"--flagfile={smoke}"])
        assert flags.config_from_flags().batch_size == 32
    finally:
        flags.FLAGS.unparse_flags()


def test_cli_errors_are_one_clear_line(tmp_path):
    unknown = run_cli("-m", "nmt_tf.train", "--no_such_flag=1")
    assert unknown.returncode != 0 and "no_such_flag" in unknown.stderr
    a = tmp_path / "a.en"
    a.write_text("x\ny\n")
    b = tmp_path / "b.fr"
    b.write_text("x\n")
    unequal = run_cli("-m", "nmt_tf.train", f"--train_src={a}", f"--train_tgt={b}",
                      f"--model_dir={tmp_path / 'm'}")
    assert unequal.returncode == 1
    assert unequal.stderr.strip().splitlines()[-1] == (
        f"error: The corpus is not parallel: {a} (--train_src) has 2 lines but {b} (--train_tgt) has 1 lines.")
    assert "Traceback" not in unequal.stderr
    missing = run_cli("-m", "nmt_tf.train", "--train_src=/nonexistent.en", f"--train_tgt={b}",
                      f"--model_dir={tmp_path / 'm'}")
    assert missing.returncode == 1
    assert "error: /nonexistent.en does not exist (--train_src)." in missing.stderr


class ScriptedDevLoss:
    """Stands in for the dev evaluator: returns the given losses in turn."""

    def __init__(self, losses):
        self.losses = iter(losses)

    def __call__(self):
        loss = next(self.losses)
        return {"nll_per_token": loss, "nll_per_sentence": 10 * loss, "perplexity": float(np.exp(loss)),
                "tokens": 10, "sentences": 1}


def test_learning_rate_halves_on_plateaus_and_patience_stops(tiny_config, tmp_path):
    import keras

    from nmt_tf.models.rnnsearch import RNNSearch
    from nmt_tf.training import callbacks

    model = RNNSearch(10, 10, 4, 4, 4, 2)
    model.build()
    model.compile(optimizer=keras.optimizers.Adam(0.4))
    state = callbacks.TrainingState()
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(state=state), str(tmp_path / "c"), 1)
    losses = [3.0, 2.0, 2.5, 2.1, 2.2, 2.0, 1.9, 2.0, 2.0, 2.0, 2.0, 2.0]
    controller = callbacks.TrainingCallbacks(
        tiny_config(decay_factor=0.5, decay_patience=2, patience=5), state, manager, None,
        ScriptedDevLoss(losses), str(tmp_path / "logs"), 10, log=lambda *a: None)
    controller.set_model(model)
    rates = []
    for step in range(1, len(losses) + 1):
        controller.dev.evaluate(step)
        rates.append(round(float(model.optimizer.learning_rate.numpy()), 6))
    # bad evaluations: -, -, 1, 2*, 3, 4* (2.0 is not better than 2.0), -, 1, 2*, 3, 4*, 5 -> stop
    assert rates == [0.4, 0.4, 0.4, 0.2, 0.2, 0.1, 0.1, 0.1, 0.05, 0.05, 0.025, 0.025]
    assert controller.stop_reason == "early_stopping"
    assert float(state.best_dev.numpy()) == 1.9 and int(state.best_step.numpy()) == 7


def test_prepared_shards_are_made_once_and_trained_from(tiny_config, tmp_path):
    lines = []
    config = tiny_config(model_dir=str(tmp_path / "m"), prepared_shards=2, max_epochs=1)
    first = training.train(config, log=lines.append)
    assert any(l.startswith("Prepared 40 training pairs in 2 shards") for l in lines), lines
    assert first["steps"] == 5                                  # 40 pairs in batches of 8, as from the text
    lines.clear()
    resumed = training.train(config.replace(max_epochs=2), log=lines.append)
    assert "Training from the 40 pairs prepared in" in "\n".join(lines)
    assert resumed["steps"] == 10
    lines.clear()
    training.train(config.replace(max_epochs=3, prepared_shards=3), log=lines.append)
    assert any("another number of shards: preparing again" in l for l in lines), lines
    assert len(json.load(open(tmp_path / "m" / "prepared" / "manifest.json"))["shards"]) == 3


def test_fine_tuning_starts_from_the_source_weights_and_keeps_its_vocabularies(trained_model_dir, tiny_config,
                                                                              tiny_corpus, tmp_path):
    """--init_from with --freeze=embeddings,encoder, and dropout the source did
    not have: the frozen weights are the source's exactly (so training started
    from them) and the others moved;
    the vocabularies are the source's; the log counts the new corpus' [UNK]s;
    a model flag that contradicts the source is one error."""
    source = trained_model_dir[0]
    tuned = str(tmp_path / "tuned")
    given = {"model_dir", "train_src", "train_tgt", "init_from", "freeze", "max_epochs", "dropout",
             "recurrent_dropout"}
    lines = []
    training.train(tiny_config(model_dir=tuned, train_src=tiny_corpus["dev_src"], train_tgt=tiny_corpus["dev_tgt"],
                            init_from=source, freeze=["embeddings", "encoder"], max_epochs=2, dropout=0.3,
                            recurrent_dropout=0.2),
                explicit=given, log=lines.append)
    log = "\n".join(lines)
    assert f"Fine-tuning {source}" in log and "tokens are [UNK]" in log and "Frozen (not trained)" in log
    for name in ("vocab.src.txt", "vocab.tgt.txt"):
        with open(os.path.join(source, name)) as a, open(os.path.join(tuned, name)) as b:
            assert a.read() == b.read()
    from nmt_tf.inference.restore import restore_model

    weights = lambda directory, which: {v.path: v.numpy() for v in restore_model(
        directory, which, log=lambda *a: None).model.weights}
    before, after = weights(source, "best"), weights(tuned, "last")
    assert sorted(before) == sorted(after)
    frozen = [k for k in before if k.split("/")[1] in ("source_embedding", "target_embedding", "encoder")]
    assert frozen and all(np.array_equal(before[k], after[k]) for k in frozen), frozen
    moved = [k for k in before if k not in frozen and not np.array_equal(before[k], after[k])]
    assert moved
    assert json.load(open(os.path.join(tuned, "train_summary.json")))["steps"] <= 4, log     # a fresh step count
    with pytest.raises(training.TrainingError, match=r"--hidden_size=32 \(the source has 16\)"):
        training.train(tiny_config(model_dir=str(tmp_path / "wrong"), init_from=source, hidden_size=32),
                    explicit=given | {"hidden_size"}, log=lambda *a: None)
    with pytest.raises(training.TrainingError, match="neither a model directory"):
        training.train(tiny_config(model_dir=str(tmp_path / "none"), init_from=str(tmp_path / "nothing")),
                    explicit=given, log=lambda *a: None)
    # Issue 95: a bad --init_checkpoint and a damaged config.json in the source were raw tracebacks.
    with pytest.raises(training.TrainingError, match=r"--init_checkpoint=.*nothing/ckpt-1 cannot be read"):
        training.train(tiny_config(model_dir=str(tmp_path / "bad_ckpt"), init_from=source,
                                   init_checkpoint=str(tmp_path / "nothing" / "ckpt-1")),
                       explicit=given | {"init_checkpoint"}, log=lambda *a: None)
    damaged = tmp_path / "damaged_source"
    shutil.copytree(source, damaged)
    (damaged / "config.json").write_text('{"model": ')
    with pytest.raises(training.TrainingError, match=r"config.json is damaged \(JSONDecodeError"):
        training.train(tiny_config(model_dir=str(tmp_path / "from_damaged"), init_from=str(damaged)),
                       explicit=given, log=lambda *a: None)
