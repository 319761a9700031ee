"""Training under tf.distribute (--distribution): MirroredStrategy over two
logical CPU devices, and MultiWorkerMirroredStrategy with two worker
processes on 127.0.0.1, each against a single-process run of the same job."""

import glob
import json
import math
import os
import signal
import socket
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from conftest import (
    assert_same_checkpoint_weights,
    checkpoint_weights,
    run_cli,
    smoke_train_args,
    start_cli,
    wait_until,
)
from nmt_tf import config as nmt_config
from nmt_tf.training import distribution

# One device and N replicas sum the same numbers in another order (and the
# replicas' shares are padded to their own longest sentence): float32
# round-off, over 10 updates.
WEIGHTS_ATOL = 5e-5
LOSS_RTOL = 1e-5
# SGD, whose update scales with the gradient (Adam's hardly does), with clipping:
# a gradient summed twice over the replicas, or normalised by one replica's
# tokens, or clipped with one replica's norm, trains other weights.
JOB = ("--batch_size=8", "--max_epochs=2", "--checkpoint_every_steps=5", "--seed=5", "--nodev_bleu",
       "--optimizer=sgd", "--learning_rate=1.0", "--clip_norm=2", "--log_every_steps=1")


def free_ports(n):
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def tf_config(ports, index):
    return json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                       "task": {"type": "worker", "index": index}})


def start_workers(corpus, model_dir, *flags):
    """Two worker processes of one multi-worker job; returns their Popens."""
    ports = free_ports(2)
    return [start_cli(*smoke_train_args(corpus, model_dir, *flags, "--distribution=multi_worker"),
                      env={"TF_CONFIG": tf_config(ports, i)}, stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, text=True)
            for i in range(2)]


def finish(procs, timeout=240):
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=timeout)
        out.append((p.returncode, stdout, stderr))
    return out


def summary(model_dir, worker=None):
    base = os.path.join(model_dir, "workers", worker) if worker else model_dir
    with open(os.path.join(base, "train_summary.json")) as f:
        return json.load(f)


def loss_curve(model_dir) -> dict:
    """{step: training loss} as TensorBoard has it (logs/train)."""
    from tensorflow.core.util import event_pb2

    curve = {}
    for path in glob.glob(os.path.join(model_dir, "logs", "train", "events*")):
        for record in tf.data.TFRecordDataset(path):
            event = event_pb2.Event.FromString(record.numpy())
            for value in event.summary.value:
                if value.tag == "loss":
                    curve[event.step] = float(tf.make_ndarray(value.tensor))
    return curve


def assert_same_weights(a_path, b_path, atol=WEIGHTS_ATOL):
    """The model weights of two checkpoints agree; returns the second's."""
    return assert_same_checkpoint_weights(a_path, b_path, rtol=0, atol=atol)


def assert_same_training(a_dir, b_dir, step, atol=WEIGHTS_ATOL, loss_rtol=LOSS_RTOL):
    assert_same_weights(*(os.path.join(d, "checkpoints", f"ckpt-{step}") for d in (a_dir, b_dir)), atol=atol)
    sa, sb = summary(a_dir), summary(b_dir)
    assert sa["steps"] == sb["steps"] == step
    curve_a, curve_b = loss_curve(a_dir), loss_curve(b_dir)      # the loss of every update
    assert sorted(curve_a) == sorted(curve_b) == list(range(1, step + 1))
    np.testing.assert_allclose([curve_b[s] for s in sorted(curve_b)], [curve_a[s] for s in sorted(curve_a)],
                               rtol=loss_rtol)
    for part in ("train", "dev"):
        np.testing.assert_allclose(sa[part]["nll_per_token"], sb[part]["nll_per_token"], rtol=loss_rtol)


MIRRORED = ("--distribution=mirrored", "--cpu_devices=2")
# The runs compared with `one_device` also keep the weights' moving averages,
# which are updated on every replica as the weights are, and which best/ holds.
AVERAGED = ("--ema_decay=0.5",)


@pytest.fixture(scope="module")
def one_device(tiny_corpus, tmp_path_factory):
    """The job on one device, in a process of its own like the others."""
    model_dir = str(tmp_path_factory.mktemp("dist") / "one_device")
    done = run_cli(*smoke_train_args(tiny_corpus, model_dir, *JOB, *AVERAGED))
    assert done.returncode == 0, done.stderr
    return model_dir


def assert_same_averages(a_dir, b_dir):
    """best/ of the two runs: the same evaluation chose it, and it holds the
    same moving averages, not the weights trained up to that update."""
    best = [tf.train.latest_checkpoint(os.path.join(d, "best")) for d in (a_dir, b_dir)]
    assert os.path.basename(best[0]) == os.path.basename(best[1])
    b = assert_same_weights(*best)
    step = os.path.basename(best[1]).split("-")[1]
    trained = checkpoint_weights(os.path.join(b_dir, "checkpoints", f"ckpt-{step}"))
    assert any(k in trained and not np.allclose(b[k], trained[k]) for k in b)


def test_a_mirrored_run_stopped_and_resumed_trains_and_averages_what_one_device_does(
        tiny_corpus, one_device, tmp_path):
    """Over two CPU devices, stopped after update 5 and resumed: the same 10
    updates, losses, dev losses and moving averages as one device's run."""
    model_dir = str(tmp_path / "mirrored_resumed")
    first = run_cli(*smoke_train_args(tiny_corpus, model_dir, *JOB, *AVERAGED, *MIRRORED, "--max_steps=5"))
    assert first.returncode == 0 and summary(model_dir)["steps"] == 5, first.stderr
    # (--max_steps=0: a resume takes the flags not given from config.json)
    done = run_cli(*smoke_train_args(tiny_corpus, model_dir, *JOB, *AVERAGED, *MIRRORED, "--max_steps=0"))
    assert done.returncode == 0, done.stderr
    assert f"Restored {os.path.join(model_dir, 'checkpoints', 'ckpt-5')}" in done.stdout
    for run in (first, done):
        assert "Distribution: MirroredStrategy, 2 replica(s)." in run.stdout
    assert summary(model_dir)["distribution"]["replicas"] == 2
    assert_same_training(one_device, model_dir, step=10)       # 40 pairs, global batch 8, 2 epochs
    assert_same_averages(one_device, model_dir)


def test_mirrored_with_float16_loss_scaling_trains_what_one_device_trains(tiny_corpus, tmp_path):
    """The GPU setting (mixed_float16: Keras' LossScaleOptimizer around ours), run on CPUs."""
    dirs = [str(tmp_path / "one"), str(tmp_path / "mirrored")]
    for model_dir, extra in zip(dirs, ((), MIRRORED)):
        done = run_cli(*smoke_train_args(tiny_corpus, model_dir, *JOB, "--mixed_precision=mixed_float16", *extra))
        assert done.returncode == 0, done.stderr
    # float16 keeps 11 significant bits: the replicas' other sums round differently
    # (measured: up to 1.4e-4 on a few weights). A loss scale or a sum applied twice
    # would double the SGD updates (the output bias moves by 0.3 in 5 of them, the
    # readout bias by 8e-3) and the losses.
    assert_same_training(*dirs, step=10, atol=1e-3, loss_rtol=1e-3)


def test_two_workers_on_localhost_hold_one_model_and_train_what_one_process_trains(
        tiny_corpus, one_device, tmp_path):
    """--worker_input=global_batches: each worker builds every global batch and
    trains on its share, so the updates are the single process's."""
    model_dir = str(tmp_path / "two_workers")
    (rc0, out0, err0), (rc1, out1, err1) = finish(start_workers(tiny_corpus, model_dir, *JOB, *AVERAGED,
                                                                "--worker_input=global_batches"))
    assert rc0 == 0 and rc1 == 0, err0[-3000:] + err1[-3000:]
    assert "2 replica(s) on 2 workers; this is worker_0 (chief)" in out0
    assert "this is worker_1;" in out1
    chief, other = summary(model_dir), summary(model_dir, "worker_1")
    assert chief["weights_sha256"] == other["weights_sha256"]            # bit for bit
    assert chief["distribution"]["chief"] and not other["distribution"]["chief"]
    # Only the chief writes the model directory; the other worker's copies of
    # the checkpoints are gone, and it wrote no vocabulary or flags.
    assert sorted(os.listdir(os.path.join(model_dir, "workers", "worker_1"))) == [
        "corpus_stats.dev.json", "corpus_stats.json", "logs", "train_summary.json"]
    assert_same_training(one_device, model_dir, step=10)
    assert_same_averages(one_device, model_dir)


@pytest.mark.parametrize("source", ["prepared shards", "text lines"])
def test_workers_read_their_own_data(tiny_corpus, tmp_path, source):
    """In sentence batches each worker reads only its part of the data: with
    --prepared_shards, 3 shards of ~13 pairs for 2 workers are 2 shards for
    one and 1 for the other; from text, every other line of the corpus
    (--max_len=12 leaves each worker a different number of pairs). An epoch
    is the steps the smaller share can make in per-replica batches of 2 from
    pools of 6."""
    model_dir = str(tmp_path / "own_data")
    job = ("--batch_size=4", "--pool_size=6", "--max_epochs=2", "--seed=5", "--nodev_bleu")
    if source == "prepared shards":
        job += ("--prepared_shards=3",)
    else:
        job += ("--max_len=12",)
    (rc0, out0, err0), (rc1, out1, err1) = finish(start_workers(tiny_corpus, model_dir, *job))
    assert rc0 == 0 and rc1 == 0, err0[-3000:] + err1[-3000:]
    if source == "prepared shards":
        manifest = json.load(open(os.path.join(model_dir, "prepared", "manifest.json")))
        assert sum(manifest["shard_pairs"]) == 40 and min(manifest["shard_pairs"]) > 0
        per_worker = [sum(manifest["shard_pairs"][0::2]), manifest["shard_pairs"][1]]
        assert "workers reads its own shards of" in out0
    else:
        stats = json.load(open(os.path.join(model_dir, "corpus_stats.json")))["stats"]
        per_worker = stats["pipeline_pairs"]
        assert sum(per_worker) == stats["pairs"] < 40 and per_worker[0] != per_worker[1]
        assert "workers reads its own lines of" in out0
    def batches(pairs, batch):      # pools of 6 pairs, each cut into batches
        return sum(math.ceil(len(pool) / batch) for pool in np.array_split(np.arange(pairs), range(6, pairs, 6)))

    everything = batches(sum(per_worker), 4)    # every worker reading everything: global batches of 4
    steps = min(batches(n, 2) for n in per_worker)
    assert f"an epoch is the {steps} steps all of them can make" in out0
    assert summary(model_dir)["steps"] == 2 * steps != 2 * everything
    assert summary(model_dir)["weights_sha256"] == summary(model_dir, "worker_1")["weights_sha256"]


def two_workers_past_step_10(corpus, model_dir, *flags):
    """Two workers of a long job, once the chief has checkpointed step 10:
    (their Popens, the checkpoint folder)."""
    job = ("--batch_size=4", "--max_epochs=40", "--checkpoint_every_steps=5", "--seed=5", "--nodev_bleu", *flags)
    procs = start_workers(corpus, model_dir, *job)
    ckpt_dir = os.path.join(model_dir, "checkpoints")
    # The wait ends at the checkpoint; its bound only matters on a machine too
    # busy for the job (seen: 180 s were not enough beside a training run).
    wait = 600

    def chief_step():
        latest = tf.train.latest_checkpoint(ckpt_dir)
        return int(latest.rsplit("-", 1)[1]) if latest else 0

    wait_until(lambda: procs[0].poll() is not None or chief_step() >= 10, wait, interval=0.2)
    step = chief_step()
    if step < 10:
        ended = f"the chief exited with {procs[0].returncode}" if procs[0].poll() is not None else f"{wait} s passed"
        for p in procs:
            p.kill()
        (_, out0, err0), _ = finish(procs)
        pytest.fail(f"{ended} before the chief checkpointed step 10 (last: step {step}):\n{out0[-1500:]}{err0[-1500:]}")
    return procs, ckpt_dir


def test_a_killed_worker_stops_the_job_with_a_clear_error_and_a_rerun_resumes(tiny_corpus, tmp_path):
    model_dir = str(tmp_path / "killed")
    # TensorFlow's own 10 s heartbeat timeout here, for a quick end; the rerun has the default 30 s.
    procs, ckpt_dir = two_workers_past_step_10(tiny_corpus, model_dir, "--heartbeat_timeout=10")
    procs[1].send_signal(signal.SIGKILL)
    (rc0, out0, err0), _ = finish(procs)
    assert rc0 == 6, err0[-3000:]
    assert "a worker without a heartbeat for 10 s stops the job" in out0
    assert "error: the multi-worker job lost a worker" in err0
    assert "Start every worker again with the same command" in err0
    assert "Traceback" not in err0
    last = int(tf.train.latest_checkpoint(ckpt_dir).rsplit("-", 1)[1])
    # The same two commands, with a nearer end, resume from the chief's last checkpoint.
    job = ("--batch_size=4", "--max_epochs=4", "--checkpoint_every_steps=5", "--seed=5", "--nodev_bleu")
    (rc0, out0, err0), (rc1, out1, err1) = finish(start_workers(tiny_corpus, model_dir, *job))
    assert rc0 == 0 and rc1 == 0, err0[-3000:] + err1[-3000:]
    assert "a worker without a heartbeat for 30 s stops the job" in out1
    restored = f"Restored {os.path.join(ckpt_dir, f'ckpt-{last}')}"
    assert restored in out0 and restored in out1
    assert summary(model_dir)["steps"] == 40                   # 10 batches of 4 per epoch
    assert summary(model_dir)["weights_sha256"] == summary(model_dir, "worker_1")["weights_sha256"]


def test_sigterm_to_one_worker_stops_every_worker_after_the_same_update(tiny_corpus, tmp_path):
    """The signalled worker votes; both stop after the update that carries the
    vote, checkpoint it, and exit with 128 + SIGTERM."""
    model_dir = str(tmp_path / "sigterm")
    procs, ckpt_dir = two_workers_past_step_10(tiny_corpus, model_dir)
    procs[1].send_signal(signal.SIGTERM)
    (rc0, out0, err0), (rc1, out1, err1) = finish(procs)
    assert rc0 == rc1 == 128 + signal.SIGTERM, err0[-3000:] + err1[-3000:]
    assert "Another worker received SIGTERM: stopping after this update." in out0
    chief, other = summary(model_dir), summary(model_dir, "worker_1")
    assert chief["status"] == other["status"] == "interrupted" and chief["signal"] == "SIGTERM"
    assert chief["steps"] == other["steps"] and chief["weights_sha256"] == other["weights_sha256"]
    # The update's checkpoint, from which a rerun resumes (as after a kill, below).
    assert tf.train.latest_checkpoint(ckpt_dir).endswith(f"ckpt-{chief['steps']}")


def test_the_time_budget_stops_every_worker_after_the_same_update(tiny_corpus, tmp_path):
    """--max_hours runs out at each worker's own moment: a vote, like a signal."""
    model_dir = str(tmp_path / "budget")
    job = ("--batch_size=4", "--max_epochs=200", "--max_hours=0.0005", "--checkpoint_every_steps=50", "--seed=5",
           "--nodev_bleu")
    (rc0, _, err0), (rc1, _, err1) = finish(start_workers(tiny_corpus, model_dir, *job))
    assert rc0 == rc1 == 0, err0[-3000:] + err1[-3000:]
    chief, other = summary(model_dir), summary(model_dir, "worker_1")
    assert chief["status"] == other["status"] == "max_hours"
    assert chief["steps"] == other["steps"] and chief["weights_sha256"] == other["weights_sha256"]


def test_settings_that_cannot_work_are_one_clear_error(tiny_corpus, tmp_path, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(distribution.DistributionError, match="needs the TF_CONFIG environment variable"):
        distribution.make_strategy("multi_worker")
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker"}}')
    with pytest.raises(distribution.DistributionError, match="TF_CONFIG is not a cluster description"):
        distribution.make_strategy("multi_worker")
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"ps": ["127.0.0.1:1"]}, "task": {"type": "ps", "index": 0}}')
    with pytest.raises(distribution.DistributionError, match="only 'chief' and 'worker' tasks"):
        distribution.make_strategy("multi_worker")
    with pytest.raises(distribution.DistributionError, match="--cpu_devices splits the CPU"):
        distribution.make_strategy("none", cpu_devices=2)
    # From the command line: one line and exit code 1.
    done = run_cli(*smoke_train_args(tiny_corpus, str(tmp_path / "m"), "--distribution=multi_worker"),
                   env={"TF_CONFIG": ""})
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("error: --distribution=multi_worker needs the TF_CONFIG")
    assert not os.path.exists(tmp_path / "m")
    done = run_cli(*smoke_train_args(tiny_corpus, str(tmp_path / "m"), "--worker_input=own_data",
                                     "--batch_type=tokens", "--batch_size=100"))
    assert done.returncode == 1 and done.stderr.strip().splitlines()[-1].startswith(
        "error: --worker_input=own_data needs --batch_type=sentences")


def test_the_distribution_flags_describe_where_a_run_runs_and_are_not_stored(tiny_config, tmp_path):

    config = tiny_config(model_dir=str(tmp_path), distribution="mirrored", cpu_devices=2)
    nmt_config.save(config, str(tmp_path))
    stored = json.load(open(nmt_config.path(str(tmp_path))))
    assert not {"distribution", "cpu_devices", "collective_timeout", "heartbeat_timeout", "worker_input"} & set(stored)
