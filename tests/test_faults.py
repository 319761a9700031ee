"""Fault injection: a full disk (ENOSPC) at each kind of write. Every case checks
the outcome: one error naming the file, and the previous state still usable."""

import errno
import json
import os
import shutil

import pytest
import tensorflow as tf

from conftest import REPO, run_cli, smoke_train_args, start_cli, wait_until
from nmt_tf import train
from nmt_tf.config import DecodingConfig, ExportConfig
from nmt_tf.core import checkpoints, files
from nmt_tf.exporting import saved_model as exporter
from nmt_tf.inference import saved_models, search
from nmt_tf.training import job as training

QUIET = dict(log=lambda *a: None)
NO_SPACE = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_while_writing_a_small_file_leaves_the_previous_one(tmp_path, monkeypatch):
    path = tmp_path / "train_summary.json"
    files.write_atomically(str(path), "old")

    def full(fd):
        raise NO_SPACE
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(files.WriteFailed) as failed:
        files.write_atomically(str(path), "new")
    assert str(failed.value) == (f"could not write {path}: No space left on device "
                                 "(the previous train_summary.json is unchanged)")
    assert failed.value.errno == errno.ENOSPC
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["train_summary.json"]     # no .tmp left


def test_a_full_disk_while_saving_a_checkpoint_stops_training_with_the_previous_one_intact(
        tiny_config, tmp_path, monkeypatch):
    config = tiny_config(model_dir=str(tmp_path / "m"), max_steps=6, checkpoint_every_steps=2, max_epochs=5)
    real_save = tf.train.CheckpointManager.save

    def save(self, checkpoint_number=None, **kw):
        if checkpoint_number == 4:          # the disk fills up during the second save
            tf.io.gfile.makedirs(os.path.join(self.directory, "ckpt-4_temp"))
            open(os.path.join(self.directory, "ckpt-4.index"), "wb").write(b"\0" * 10)
            raise tf.errors.ResourceExhaustedError(None, None, "ckpt-4_temp/part-00000: No space left on device")
        return real_save(self, checkpoint_number=checkpoint_number, **kw)
    monkeypatch.setattr(tf.train.CheckpointManager, "save", save)
    prefix = os.path.join(config.model_dir, "checkpoints", "ckpt-4")
    with pytest.raises(files.WriteFailed, match=rf"could not write {prefix}: .*No space left on device "
                                                 r"\(the previous checkpoint .*ckpt-2 is intact\)"):
        training.train(config, **QUIET)
    left = sorted(os.listdir(os.path.join(config.model_dir, "checkpoints")))
    assert not [name for name in left if name.startswith("ckpt-4")], left      # no partial checkpoint
    monkeypatch.setattr(tf.train.CheckpointManager, "save", real_save)
    lines = []
    summary = training.train(config, log=lines.append)                           # space again: it resumes
    assert any(line.startswith(f"Restored {os.path.join(config.model_dir, 'checkpoints', 'ckpt-2')}: step 2")
               for line in lines), lines
    assert summary["steps"] == 6


def test_the_training_cli_reports_a_full_disk_with_exit_code_5(tiny_corpus, tmp_path):
    """ENOSPC injected at the OS call (os.replace of train_summary.json) in a real process."""
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(
        "import errno, os\n"
        "_replace = os.replace\n"
        "def replace(src, dst, *a, **kw):\n"
        "    if str(dst).endswith('train_summary.json'):\n"
        "        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))\n"
        "    return _replace(src, dst, *a, **kw)\n"
        "os.replace = replace\n")
    model_dir = str(tmp_path / "m")
    result = run_cli(*smoke_train_args(tiny_corpus, model_dir, "--max_steps=2", "--nodev_bleu"),
                     env={"PYTHONPATH": f"{inject}{os.pathsep}{REPO}"})
    summary = os.path.join(model_dir, "train_summary.json")
    assert result.returncode == train.EXIT_WRITE_FAILED == 5, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"error: could not write {summary}: No space left on device (nothing was written)" in result.stderr
    assert "Traceback" not in result.stderr and not os.path.exists(summary + ".tmp")
    assert tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints")).endswith("ckpt-2")


def test_a_full_disk_during_export_makes_no_version_and_leaves_the_others(exported, tmp_path, monkeypatch):
    model_dir, base, _ = exported
    copy = str(tmp_path / "nmt")
    shutil.copytree(base, copy)
    before = sorted(os.listdir(copy))
    real_save = tf.saved_model.save

    def save(module, path, **kw):
        os.makedirs(os.path.join(path, "variables"), exist_ok=True)
        open(os.path.join(path, "saved_model.pb"), "wb").write(b"partial")
        raise tf.errors.ResourceExhaustedError(None, None, "variables.data-00000-of-00001: No space left on device")
    monkeypatch.setattr(tf.saved_model, "save", save)
    with pytest.raises(files.WriteFailed, match=rf"could not write {os.path.join(copy, '2')}: .*No space left "
                                                 r"on device \(no new version was made"):
        exporter.export(model_dir, copy, ExportConfig(search.SearchOptions(beam_size=2), max_input_length=20), **QUIET)
    assert sorted(os.listdir(copy)) == before              # nothing half-written for a server to load
    monkeypatch.setattr(tf.saved_model, "save", real_save)
    assert json.load(open(os.path.join(copy, "1", "assets.extra", saved_models.EXPORT_METADATA)))["search"]["beam_size"] == 3


def test_a_full_disk_while_keeping_a_best_checkpoint_keeps_the_previous_best(tmp_path, monkeypatch):
    value = tf.Variable(1.0)
    best = checkpoints.BestCheckpoints(tf.train.Checkpoint(value=value), str(tmp_path), keep=1)
    best.save(1, 10.0)

    def write(self, prefix, **kw):
        open(prefix + ".index", "wb").write(b"\0")
        raise tf.errors.ResourceExhaustedError(None, None, "No space left on device")
    monkeypatch.setattr(tf.train.Checkpoint, "write", write)
    with pytest.raises(files.WriteFailed, match="best/ keeps its previous checkpoints"):
        best.save(2, 20.0)
    assert [r["path"] for r in checkpoints.read_ranking(str(tmp_path))] == ["best-1"]
    assert not [n for n in os.listdir(tmp_path) if n.startswith("best-2")]
    assert os.path.basename(tf.train.latest_checkpoint(str(tmp_path))) == "best-1"


def test_a_full_disk_while_writing_a_vocabulary_leaves_the_previous_one(tmp_path, monkeypatch):
    from nmt_tf.data import text

    path = str(tmp_path / "vocab.src.txt")
    text.write_vocabulary(list(text.SPECIAL_TOKENS) + ["old"], path)

    def rename(*a, **kw):
        raise tf.errors.ResourceExhaustedError(None, None, "No space left on device")
    monkeypatch.setattr(tf.io.gfile, "rename", rename)
    with pytest.raises(files.WriteFailed, match=f"could not write {path}: No space left on device "
                                                 r"\(the previous vocab.src.txt is unchanged\)"):
        text.write_vocabulary(list(text.SPECIAL_TOKENS) + ["new"], path)
    assert text.read_vocabulary(path)[-1] == "old" and os.listdir(tmp_path) == ["vocab.src.txt"]


def _cut_file(path, keep=0.5):
    raw = open(path, "rb").read()
    open(path, "wb").write(raw[:int(len(raw) * keep)])


def test_a_damaged_saved_model_is_one_clear_error_for_translate_and_evaluate(exported, tmp_path):
    from nmt_tf.evaluation import quality as evaluation

    no_variables, cut = str(tmp_path / "no_variables"), str(tmp_path / "cut")
    shutil.copytree(exported[2], no_variables)
    shutil.rmtree(os.path.join(no_variables, "variables"))
    shutil.copytree(exported[2], cut)
    (data,) = [p for p in tf.io.gfile.glob(os.path.join(cut, "variables", "variables.data-*"))]
    _cut_file(data)
    source = tmp_path / "in.en"
    source.write_text("A man .\n")
    result = run_cli("-m", "nmt_tf.translate", f"--saved_model={no_variables}", f"--input={source}")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert f"error: {no_variables} could not be loaded as a SavedModel" in result.stderr
    with pytest.raises(FileNotFoundError, match=f"{cut} could not be loaded as a SavedModel"):
        evaluation.run([("saved_model", cut)], None, str(source), str(source), str(tmp_path / "eval"),
                     DecodingConfig(search.SearchOptions(beam_size=2), max_input_length=20), 8, log=lambda *a: None)


def test_a_damaged_best_checkpoint_is_one_clear_error_for_the_tools(trained_model_dir, tmp_path):
    model_dir = str(tmp_path / "model")
    shutil.copytree(trained_model_dir[0], model_dir)
    best = tf.train.latest_checkpoint(os.path.join(model_dir, "best"))
    (data,) = tf.io.gfile.glob(best + ".data-*")
    _cut_file(data)
    result = run_cli("-m", "nmt_tf.export", f"--model_dir={model_dir}", f"--export_dir={tmp_path / 'e'}")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert f"error: checkpoint {best} cannot be read (IndexError" in result.stderr
    assert not os.path.exists(tmp_path / "e" / "1")


def test_an_export_killed_while_writing_leaves_no_version_a_server_would_load(trained_model_dir, tmp_path):
    import signal
    import subprocess

    from nmt_tf.serving import server as nmt_server

    base = str(tmp_path / "nmt")
    proc = start_cli("-m", "nmt_tf.export", f"--model_dir={trained_model_dir[0]}", f"--export_dir={base}",
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(lambda: tf.io.gfile.glob(os.path.join(base, ".tmp-1-*", "*")), 120, interval=0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    leftovers = [n for n in os.listdir(base) if n.startswith(".tmp-")]
    assert leftovers and nmt_server.ModelRegistry("nmt", base).available_versions() == []
    lines = []          # the next export (here in-process, as nmt_tf.export calls it)
    exporter.export(trained_model_dir[0], base, ExportConfig(), log=lines.append)
    assert f"Removed {os.path.join(base, leftovers[0])}, left by an export that did not finish." in lines, lines
    assert sorted(os.listdir(base)) == ["1"]


def test_sigkill_at_random_moments_loses_at_most_one_checkpoint_interval_and_resumes_exactly(tiny_corpus, tmp_path):
    """Three SIGKILLs at random moments of one training job (a seeded RNG picks
    each moment: in an update, a checkpoint write, a dev evaluation, start-up);
    each rerun of the same command resumes from a checkpoint at most one
    interval (3 updates) behind the last update it had logged, and the job
    ends with the weights of a run that was never interrupted."""
    import random
    import re
    import signal
    import subprocess
    import time

    from conftest import assert_same_checkpoint_weights

    interval, epochs = 3, 6          # 10 batches of 4 per epoch: 60 updates
    flags = ("--batch_size=4", f"--max_epochs={epochs}", f"--checkpoint_every_steps={interval}",
             "--log_every_steps=1")
    model_dir = str(tmp_path / "killed")
    rng = random.Random(20261124)
    resumed_from, last_logged = [], 0
    for cycle in range(3):
        log = tmp_path / f"run{cycle}.log"
        with open(log, "w") as out:
            proc = start_cli(*smoke_train_args(tiny_corpus, model_dir, *flags), stdout=out,
                             stderr=subprocess.STDOUT, text=True)
            wait_until(lambda: " | epoch " in log.read_text(), 120, interval=0.05)  # until an update
            time.sleep(rng.uniform(0.0, 1.5))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
        text = log.read_text()
        restored = re.search(r"Restored \S*ckpt-(\d+)", text)
        if cycle:
            # No "Restored" only if the killed run had not reached its first checkpoint.
            resumed_from.append(int(restored.group(1)) if restored else 0)
            assert resumed_from[-1] >= last_logged - interval, (resumed_from, last_logged, text[-2000:])
        logged = [int(s) for s in re.findall(r"^step (\d+) \|", text, flags=re.M)]
        assert logged, text[-2000:]
        last_logged = max(logged)
        assert last_logged < epochs * 10, "the job finished before it was killed: kill earlier"
    newest = max(int(p[:-len(".index")].rsplit("-", 1)[1])
                 for p in tf.io.gfile.glob(os.path.join(model_dir, "checkpoints", "ckpt-*.index")))
    done = run_cli(*smoke_train_args(tiny_corpus, model_dir, *flags))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "CPU kernels: " in done.stdout                  # the kernel choice is logged (nmt_tf.core.hardware)
    restored = re.search(r"Restored \S*ckpt-(\d+)", done.stdout)
    assert restored and int(restored.group(1)) >= last_logged - interval, done.stdout[-2000:]
    if "is damaged" not in done.stdout:     # unless the last kill cut the newest checkpoint short
        assert int(restored.group(1)) == newest, done.stdout[-2000:]   # the newest one on disk is resumed
    summary = json.load(open(os.path.join(model_dir, "train_summary.json")))
    assert summary["steps"] == epochs * 10 and summary["completed_epochs"] == epochs

    straight_dir = str(tmp_path / "straight")
    assert run_cli(*smoke_train_args(tiny_corpus, straight_dir, *flags)).returncode == 0
    assert_same_checkpoint_weights(*(os.path.join(d, "checkpoints", f"ckpt-{epochs * 10}")
                                     for d in (model_dir, straight_dir)))


@pytest.mark.parametrize("code, remedy", [
    (errno.ENOSPC, "Free some space"), (errno.EROFS, "writable"), (errno.EACCES, "writable"),
    (errno.EIO, "Fix the cause above"),
])
def test_a_failed_write_says_what_to_do_about_its_cause(tmp_path, code, remedy):
    """A read-only model directory is not told to free space (the training CLI prints the remedy)."""
    failed = files.WriteFailed(str(tmp_path / "m" / "flags.json"), OSError(code, os.strerror(code)))
    assert failed.remedy.startswith(remedy) or remedy in failed.remedy
    if remedy == "writable":
        assert f"Make {tmp_path / 'm'} writable" in failed.remedy
