"""Training on several devices or machines with `tf.distribute` (--distribution).

    none          TensorFlow's default strategy: one device.
    mirrored      tf.distribute.MirroredStrategy: one process, one replica per
                  GPU (per logical CPU device with --cpu_devices=N on a machine
                  without GPUs; that is for trying distribution out, it is not
                  faster than one CPU device).
    multi_worker  tf.distribute.MultiWorkerMirroredStrategy: one process per
                  machine (worker), the cluster described by the TF_CONFIG
                  environment variable, one replica per GPU of each worker (or
                  its CPU); gradients are summed by collective all-reduce.

`--batch_size` is the global batch: `model.fit` cuts every batch of the input
pipeline into one share per replica (tf.data's rebatching), and each worker
takes its replicas' shares of every batch, so an update sees the same pairs
whatever the number of replicas. With sentence batches and several workers,
each worker instead reads its own part of the data (its prepared shards, or
every N-th line of the text) and makes per-replica batches of it
(nmt_tf.train), so no worker trains on all the data. `Seq2SeqModel.train_step` sums the replicas'
gradients and clips that sum, so the update is the one a single device makes.

Every worker runs the same program and makes the same decisions (dev scores,
early stopping, checkpoints), because they hold the same weights. Only the
chief (task "chief", or worker 0 when the cluster has no chief) writes the
model directory; the others write to `<model_dir>/workers/<task>_<id>/`
(TensorFlow's multi-worker guides do the same: some writes, such as a
checkpoint, need every worker), and read the chief's flags, vocabularies and
checkpoints, so the model directory must be storage all workers see (a
shared file system).
"""

from __future__ import annotations

import dataclasses
import json
import os

CHOICES = ("none", "mirrored", "multi_worker")


class DistributionError(ValueError):
    """A distribution setting that cannot work, in one sentence."""


@dataclasses.dataclass(frozen=True)
class Worker:
    """This process's place in the job."""

    task_type: str | None = None     # "chief" / "worker" under multi_worker
    task_id: int = 0
    is_chief: bool = True
    workers: int = 1                 # processes in the job

    @property
    def name(self) -> str:
        return f"{self.task_type}_{self.task_id}" if self.task_type else "local"


def split_cpu(devices: int) -> None:
    """Makes TensorFlow see `devices` logical CPU devices (before it starts)."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * devices)
    except RuntimeError:
        current = len(tf.config.list_logical_devices("CPU"))
        if current != devices:
            raise DistributionError(
                f"--cpu_devices={devices} must be set before TensorFlow starts; this process already "
                f"runs with {current} CPU device(s). Run nmt_tf.train in a new process.") from None


def _tf_config() -> dict:
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        raise DistributionError("--distribution=multi_worker needs the TF_CONFIG environment variable "
                                "(the cluster and this worker's task; docs/training.md, 'Training on "
                                "several devices or machines').")
    try:
        tf_config = json.loads(raw)
        cluster, task = tf_config["cluster"], tf_config["task"]
        task_type, task_id = task["type"], int(task["index"])
        addresses = cluster[task_type]
        if not 0 <= task_id < len(addresses):
            raise KeyError("index")
    except (ValueError, KeyError, TypeError) as e:
        raise DistributionError(
            f"TF_CONFIG is not a cluster description ({type(e).__name__}: {e}); expected "
            '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": i}}.') from None
    if task_type not in ("chief", "worker"):
        raise DistributionError(f"TF_CONFIG task type {task_type!r}: multi_worker training has only "
                                "'chief' and 'worker' tasks.")
    return tf_config


def make_strategy(distribution: str, cpu_devices: int = 0, collective_timeout: float = 0.0,
                  heartbeat_timeout: float = 30.0):
    """The `tf.distribute.Strategy` of --distribution and this process's
    `Worker`. Call it before anything else touches TensorFlow: a multi-worker
    strategy and the logical CPU devices configure the runtime as it starts.

    collective_timeout: seconds an all-reduce may wait for the other workers
      (0: no limit) under multi_worker; a worker that died is also found by
      TensorFlow's coordination service, which stops the others.
    heartbeat_timeout: seconds that service waits for a worker's heartbeat
      (`configure_coordination`).
    """
    import tensorflow as tf

    if distribution not in CHOICES:
        raise DistributionError(f"--distribution={distribution}: expected one of {', '.join(CHOICES)}.")
    if cpu_devices and distribution != "mirrored":
        raise DistributionError("--cpu_devices splits the CPU into replicas of --distribution=mirrored; "
                                f"it does nothing with --distribution={distribution}.")
    if distribution == "none":
        return tf.distribute.get_strategy(), Worker()
    if distribution == "mirrored":
        if cpu_devices:
            split_cpu(cpu_devices)
        gpus = tf.config.list_logical_devices("GPU")
        devices = [d.name for d in gpus] if gpus else [d.name for d in tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(devices), Worker()
    tf_config = _tf_config()
    configure_coordination(tf_config["cluster"], heartbeat_timeout)
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=collective_timeout or None)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    task_type, task_id = tf_config["task"]["type"], int(tf_config["task"]["index"])
    has_chief = bool(tf_config["cluster"].get("chief"))
    is_chief = task_type == "chief" or (task_type == "worker" and task_id == 0 and not has_chief)
    workers = sum(len(v) for k, v in tf_config["cluster"].items() if k in ("chief", "worker"))
    return strategy, Worker(task_type, task_id, is_chief, workers)


def configure_coordination(cluster: dict, heartbeat_timeout: float) -> None:
    """Configures TensorFlow's coordination service as MultiWorkerMirroredStrategy
    does (the same leader, the chief and worker jobs), but with a heartbeat
    timeout of `heartbeat_timeout` seconds instead of TensorFlow's 10; the
    strategy keeps a service configured before it is made. On a busy 2-core
    machine a sound two-worker job was once stopped after 10 s as one that had
    lost a worker: the leader answers heartbeats on the process's inter-op
    threads, here 2 (BUILD_NOTES.md, "Training under tf.distribute"). No public
    API sets the timeout; this uses TensorFlow's private one, as the strategy
    itself does."""
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.eager import context

    jobs = [coordination_config_pb2.CoordinatedJob(name=job, num_tasks=len(cluster[job]))
            for job in ("chief", "worker") if job in cluster]
    context.context().configure_coordination_service(
        service_type="standalone", service_leader=multi_worker_util.coordination_leader(cluster),
        coordinated_jobs=jobs, heartbeat_timeout_in_ms=round(heartbeat_timeout * 1000))


def coordination_heartbeat_timeout() -> float:
    """Seconds of heartbeat timeout in the configuration this process's
    TensorFlow runtime starts with (0: no coordination service configured)."""
    from tensorflow.python.eager import context

    return context.context().config.experimental.coordination_config.heartbeat_timeout_in_ms / 1000


def barrier(strategy) -> None:
    """Returns when every worker of a multi-worker strategy has called it (an
    all-reduce of one number); at once otherwise."""
    import tensorflow as tf

    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return
    def one():
        return tf.constant(1.0)

    def all_reduce_one():
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(one), axis=None)

    # Traced: a multi-worker strategy run eagerly warns of its overhead.
    tf.function(all_reduce_one, autograph=False)()


def describe(strategy, worker: Worker) -> str:
    """One log line: the strategy, its replicas and this worker."""
    name = type(strategy).__name__
    if worker.task_type is None:
        return f"Distribution: {name}, {strategy.num_replicas_in_sync} replica(s)."
    return (f"Distribution: {name}, {strategy.num_replicas_in_sync} replica(s) on {worker.workers} workers; "
            f"this is {worker.name}{' (chief)' if worker.is_chief else ''}; a worker without a heartbeat "
            f"for {coordination_heartbeat_timeout():g} s stops the job.")


def lost_worker(error: BaseException) -> bool:
    """Whether `error` is how a multi-worker job learns that another worker
    stopped: its collective ops are aborted (the coordination service found
    the worker's heartbeats missing, or its connection closed) or time out
    (--collective_timeout)."""
    import tensorflow as tf

    return isinstance(error, (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
                              tf.errors.AbortedError, tf.errors.CancelledError))
