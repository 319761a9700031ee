"""The best checkpoints kept by dev score, checkpoint averaging, and ensembles of model directories."""

import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from conftest import checkpoint_weights, run_cli
from nmt_tf.config import ExportConfig
from nmt_tf.core import checkpoints
from nmt_tf.exporting import saved_model as exporter
from nmt_tf.inference import saved_models
from nmt_tf.inference.restore import restore_ensemble, restore_model


def test_best_checkpoints_keep_the_n_best_by_score(tmp_path):
    value = tf.Variable(0.0)
    ckpt = tf.train.Checkpoint(value=value)
    for higher_is_better, scores, kept in ((True, [1.0, 3.0, 2.0, 5.0, 0.5, 4.0], [5.0, 4.0, 3.0]),
                                           (False, [4.0, 2.0, 3.0, 1.0, 5.0], [1.0, 2.0, 3.0])):
        directory = str(tmp_path / f"best_{higher_is_better}")
        best = checkpoints.BestCheckpoints(ckpt, directory, keep=3, higher_is_better=higher_is_better)
        for step, score in enumerate(scores, 1):
            value.assign(score)
            best.save(step, score)
        ranking = checkpoints.read_ranking(directory)
        assert [r["score"] for r in ranking] == kept
        prefixes = sorted(f.split(".")[0] for f in os.listdir(directory) if f.endswith(".index"))
        assert prefixes == sorted(r["path"] for r in ranking)          # the others were deleted
        latest = tf.train.latest_checkpoint(directory)                 # what --checkpoint=best reads
        assert os.path.basename(latest) == ranking[0]["path"]
        assert float(tf.train.load_checkpoint(latest).get_tensor("value/.ATTRIBUTES/VARIABLE_VALUE")) == kept[0]
        # A resumed run continues the same ranking from disk.
        again = checkpoints.BestCheckpoints(ckpt, directory, keep=3, higher_is_better=higher_is_better)
        assert not again.would_keep(kept[-1] - 10.0 if higher_is_better else kept[-1] + 10.0)


def test_averaging_identical_checkpoints_changes_nothing_and_averaging_n_gives_the_mean(trained_model_dir):
    model_dir, _ = trained_model_dir
    last = checkpoints.checkpoint_paths(model_dir, "last", 3)
    assert len(last) == 3 and last[0] == tf.train.latest_checkpoint(checkpoints.checkpoints_dir(model_dir))
    # A relative --model_dir (runs/m, as users type it) names the same files.
    relative = checkpoints.checkpoint_paths(os.path.relpath(model_dir), "last", 3)
    assert [os.path.abspath(p) for p in relative] == last and all(os.path.exists(p + ".index") for p in relative)
    one = restore_model(model_dir, last[0], log=lambda *a: None).model
    same = restore_model(model_dir, "best", log=lambda *a: None).model
    checkpoints.average_into(same, [last[0]] * 3)
    for a, b in zip(one.variables, same.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    averaged = restore_model(model_dir, checkpoints.WeightsChoice(average=3, average_from="last"),
                             log=lambda *a: None)
    assert "mean of 3 last checkpoints" in averaged.checkpoint
    stored = [checkpoint_weights(p) for p in last]
    mean = lambda key: np.mean([s[f"model/{key}/.ATTRIBUTES/VARIABLE_VALUE"].astype(np.float64) for s in stored], 0)
    np.testing.assert_allclose(averaged.model.output_weights()[0].numpy(), mean("output_projection/_kernel"),
                               rtol=1e-6)
    np.testing.assert_allclose(averaged.model.target_embedding.embeddings.numpy(),
                               mean("target_embedding/_embeddings"), rtol=1e-6)


def test_average_cli_writes_a_checkpoint_that_export_uses(trained_model_dir, tmp_path):
    model_dir = str(tmp_path / "model")                        # averaged/ is written into the model directory
    shutil.copytree(trained_model_dir[0], model_dir)
    result = run_cli("-m", "nmt_tf.average", f"--model_dir={model_dir}", "--average_checkpoints=2",
                     "--average_from=last")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "the mean of 2 last checkpoints" in result.stdout
    averaged = restore_model(model_dir, "averaged", log=lambda *a: None)
    on_the_fly = restore_model(model_dir, checkpoints.WeightsChoice(average=2, average_from="last"),
                               log=lambda *a: None)
    for a, b in zip(averaged.model.variables, on_the_fly.model.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert run_cli("-m", "nmt_tf.average", f"--model_dir={model_dir}").returncode == 1     # 1: nothing to average


def test_an_exported_ensemble_of_a_model_with_itself_translates_like_the_model(exported, tmp_path):
    model_dir, _, single = exported
    options = saved_models.read_metadata(single)["search"]
    from nmt_tf.inference.search import SearchOptions

    path = exporter.export([model_dir, model_dir], str(tmp_path / "ens"),
                           ExportConfig(SearchOptions(**options), max_input_length=20), log=lambda *a: None)
    meta = saved_models.read_metadata(path)
    assert meta["model_dirs"] == [os.path.relpath(os.path.abspath(model_dir), path)] * 2      # relative to the version
    assert os.path.samefile(os.path.join(path, meta["model_dirs"][0]), model_dir)
    lines = tf.constant(["Un homme marche.", "A dog runs on the beach.", ""])
    want = tf.saved_model.load(single).signatures["serving_default"](text=lines)
    got = tf.saved_model.load(path).signatures["serving_default"](text=lines)
    np.testing.assert_array_equal(got["translation"].numpy(), want["translation"].numpy())
    np.testing.assert_allclose(got["score"].numpy(), want["score"].numpy(), rtol=1e-4, atol=1e-5)


def test_ensemble_members_must_share_vocabularies(trained_model_dir, tmp_path, tiny_config):
    from nmt_tf.training import job as training

    model_dir, _ = trained_model_dir
    other = str(tmp_path / "other")
    training.train(tiny_config(model_dir=other, tgt_vocab_size=60, max_steps=1), log=lambda *a: None)
    with pytest.raises(ValueError, match="vocabular"):
        restore_ensemble([model_dir, other], log=lambda *a: None)


def _cut(prefix, n_bytes=100):
    """A checkpoint whose data file lost its last bytes (a full disk, a copy cut short)."""
    (data,) = [p for p in tf.io.gfile.glob(prefix + ".data-*")]
    raw = open(data, "rb").read()
    open(data, "wb").write(raw[:-n_bytes])


def _regular(model_dir):
    pattern = os.path.join(model_dir, "checkpoints", "ckpt-*.index")
    return sorted((p[:-len(".index")] for p in tf.io.gfile.glob(pattern)), key=lambda p: int(p.rsplit("-", 1)[1]))


def test_a_damaged_checkpoint_is_moved_aside_and_the_run_resumes_from_the_newest_intact_one(tiny_config, tmp_path):
    from nmt_tf.training import job as training

    model_dir = str(tmp_path / "m")
    config = tiny_config(model_dir=model_dir, max_steps=6, max_epochs=5, checkpoint_every_steps=2,
                         keep_checkpoints=3, keep_best_checkpoints=2, eval_every_steps=2)
    training.train(config, log=lambda *a: None)
    older, newest = _regular(model_dir)[-2:]
    assert checkpoints.damage(newest) is None
    _cut(newest)
    assert checkpoints.damage(newest) is not None
    lines = []
    summary = training.train(config.replace(max_steps=8), log=lines.append)
    assert any(line.startswith(f"warning: checkpoint {newest} is damaged (") for line in lines), lines
    assert f"Falling back to {older}, the newest intact checkpoint." in lines
    assert any(line.startswith(f"Restored {older}: step {int(older.rsplit('-', 1)[1])}") for line in lines)
    assert summary["steps"] == 8
    kept_aside = sorted(os.listdir(os.path.join(model_dir, "damaged")))
    assert kept_aside and all(name.startswith(f"checkpoints-{os.path.basename(newest)}.") for name in kept_aside)

    # Every regular checkpoint damaged: the best intact one of best/ (weights only), from step 0.
    for prefix in _regular(model_dir):
        _cut(prefix)
    best = os.path.join(model_dir, "best", checkpoints.read_ranking(os.path.join(model_dir, "best"))[0]["path"])
    best_step = int(best.rsplit("-", 1)[1])
    lines = []
    summary = training.train(config.replace(max_steps=best_step + 2), log=lines.append)
    assert f"Falling back to {best}, the best intact checkpoint of best/." in lines, lines
    assert any(line.startswith(f"Restored {best} (model and optimizer): step {best_step},") for line in lines)
    assert summary["steps"] == best_step + 2, "\n".join(lines)

    # Nothing intact at all: one error (exit code 4) naming the files, which are kept.
    for prefix in _regular(model_dir) + [os.path.join(model_dir, "best", r["path"])
                                         for r in checkpoints.read_ranking(os.path.join(model_dir, "best"))]:
        _cut(prefix)
    result = run_cli("-m", "nmt_tf.train", f"--model_dir={model_dir}")
    assert result.returncode == 4, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"error: {model_dir} holds no intact checkpoint" in result.stderr and "Traceback" not in result.stderr
    assert len(os.listdir(os.path.join(model_dir, "damaged"))) > len(kept_aside)


def test_damaged_copies_of_one_name_are_all_kept_and_unfinished_saves_removed(tmp_path):
    """damaged/ never overwrites an earlier copy; the `_temp` folders of a save
    killed half-way are removed when the run resumes (nothing else is)."""
    model_dir = str(tmp_path / "m")
    regular = os.path.join(model_dir, "checkpoints")
    os.makedirs(regular)
    for generation in (1, 2, 3):
        for suffix in (".index", ".data-00000-of-00001"):
            open(os.path.join(regular, "ckpt-6" + suffix), "w").write(f"copy {generation}")
        checkpoints._move_aside(os.path.join(regular, "ckpt-6"), model_dir)
    aside = sorted(os.listdir(os.path.join(model_dir, "damaged")))
    assert aside == sorted(f"checkpoints-ckpt-6{tag}{suffix}" for tag in ("", "~2", "~3")
                           for suffix in (".index", ".data-00000-of-00001"))
    assert {open(os.path.join(model_dir, "damaged", name)).read() for name in aside} == {"copy 1", "copy 2", "copy 3"}

    os.makedirs(os.path.join(regular, "ckpt-8_temp", "part-00000-of-00001"))
    os.makedirs(os.path.join(model_dir, "best", "best-4_temp"))
    open(os.path.join(regular, "ckpt-6.index"), "w").write("kept")
    said = []
    removed = checkpoints.remove_unfinished_saves(model_dir, log=said.append)
    assert sorted(os.path.basename(p) for p in removed) == ["best-4_temp", "ckpt-8_temp"]
    assert os.listdir(regular) == ["ckpt-6.index"] and os.listdir(os.path.join(model_dir, "best")) == []
    assert said[0].startswith("Removed ") and "a checkpoint save that did not finish" in said[0]


def test_after_a_fallback_the_checkpoints_beyond_keep_are_pruned_again(tmp_path):
    """A fallback rewrites the state file; the manager of the resumed run must
    still date (and so prune) the older checkpoints: without timestamps it kept
    all six, with --keep_checkpoints=3."""
    model_dir = str(tmp_path / "m")
    directory = checkpoints.checkpoints_dir(model_dir)
    checkpoint = tf.train.Checkpoint(v=tf.Variable(1.0))
    saver = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=None)
    for step in range(1, 8):
        saver.save(checkpoint_number=step)
    with open(os.path.join(directory, "ckpt-7.index"), "r+b") as f:    # the newest one damaged
        f.truncate(10)
    path, kind = checkpoints.newest_intact(model_dir, log=lambda *a: None)
    assert (os.path.basename(path), kind) == ("ckpt-6", "last")
    manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=3)   # the resumed run's
    assert manager.latest_checkpoint == path
    manager.save(checkpoint_number=8)
    kept = sorted(n[:-len(".index")] for n in os.listdir(directory) if n.endswith(".index"))
    assert kept == ["ckpt-5", "ckpt-6", "ckpt-8"]
