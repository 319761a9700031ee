"""Server-side batching of nmt_tf.serve, as TF Serving's `--enable_batching`.

Concurrent Predict requests for the same model version, signature and
outputs are joined into one call of the signature (their inputs concatenated
along the batch axis), and the call's outputs are split back by rows: a
batched beam search over 32 sentences costs far less than 32 searches of one
sentence. The parameters are TF Serving's `BatchingParameters` (a text proto
read from `--batching_parameters_file`), with its meanings and defaults:

  max_batch_size        sentences in one call (1000); a request with more is
                        refused, as TF Serving refuses a task larger than it
  batch_timeout_micros  how long the oldest request of an open batch waits
                        for others to join when a batch thread is free (0)
  max_enqueued_batches  batches waiting per queue (10); a request that would
                        open one more gets UNAVAILABLE at once
  num_batch_threads     calls running at once (one per CPU core)
  allowed_batch_sizes   if given, a batch is padded up to the next of these
                        sizes with copies of its first sentence, whose outputs
                        are dropped (the last must equal max_batch_size)
  pad_variable_length_inputs, thread_pool_name
                        accepted for TF Serving's files; nmt_tf's inputs are
                        [batch] string vectors, which need no padding

Outputs with a length axis (source_tokens, target_tokens, alignment,
token_log_probs) come back padded to the longest sentence of the merged
batch ("" and 0), as TF Serving pads them; clients already skip that padding,
which a request of several sentences has anyway. If a merged call fails, each
of its requests runs again alone, so a request that makes the signature fail
fails only itself. A request waits at most `timeout` seconds (its gRPC
deadline, or a bound) and then gets DEADLINE_EXCEEDED; a batch not yet
started leaves it out.

No client takes more than its share: one client address holds at most 3/4
of the sentences the queues can hold (max_enqueued_batches x
max_batch_size; at least one full batch) queued or running; one more of its requests is refused at
once (RESOURCE_EXHAUSTED), so a client that floods the server leaves room
in the queues for the others.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import threading
import time

import numpy as np

from nmt_tf.serving import config_protos as protos

# Longest a request waits for its merged batch (nmt_tf.serving.versions: when its client set no shorter deadline).
MAX_BATCH_WAIT_SECONDS = 300
# Most batch threads a server runs (each runs the model).
MAX_BATCH_THREADS = 256

# TF Serving's BatchingParameters (tensorflow_serving/servables/tensorflow/session_bundle_config.proto),
# which the tensorflow-serving-api package does not ship: its fields, numbers and types.
_FIELDS = (("max_batch_size", 1, "Int64Value"), ("batch_timeout_micros", 2, "Int64Value"),
           ("max_enqueued_batches", 3, "Int64Value"), ("num_batch_threads", 4, "Int64Value"),
           ("thread_pool_name", 5, "StringValue"), ("allowed_batch_sizes", 6, "repeated int64"),
           ("pad_variable_length_inputs", 7, "bool"))


class BatchingError(ValueError):
    """A batching parameters file that cannot be used."""


class QueueFull(Exception):
    """The request would open a batch beyond max_enqueued_batches."""


class TooLarge(Exception):
    """The request holds more sentences than max_batch_size."""


class OverShare(Exception):
    """A client holds its share of the queues already."""


class WaitedTooLong(Exception):
    """The request's batch did not finish within its timeout."""


@dataclasses.dataclass(frozen=True)
class BatchingParameters:
    """TF Serving's batching parameters, with its defaults (BasicBatchScheduler::Options)."""

    max_batch_size: int = 1000
    batch_timeout_micros: int = 0
    max_enqueued_batches: int = 10
    num_batch_threads: int = dataclasses.field(default_factory=lambda: os.cpu_count() or 1)
    allowed_batch_sizes: tuple[int, ...] = ()
    pad_variable_length_inputs: bool = False
    thread_pool_name: str = ""

    def __post_init__(self):
        for name in ("max_batch_size", "max_enqueued_batches", "num_batch_threads"):
            if getattr(self, name) < 1:
                raise BatchingError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.batch_timeout_micros < 0:
            raise BatchingError(f"batch_timeout_micros must not be negative, not {self.batch_timeout_micros}")
        # A request waits at most MAX_BATCH_WAIT_SECONDS for its batch (nmt_tf.serving.versions), so a longer timeout
        # could never be reached (int64's largest killed the batch thread with an OverflowError before).
        if self.batch_timeout_micros > MAX_BATCH_WAIT_SECONDS * 1_000_000:
            raise BatchingError(f"batch_timeout_micros must be at most {MAX_BATCH_WAIT_SECONDS * 1_000_000:,} "
                                f"({MAX_BATCH_WAIT_SECONDS} s, the longest a request waits for its batch), not "
                                f"{self.batch_timeout_micros:,}")
        if self.num_batch_threads > MAX_BATCH_THREADS:
            raise BatchingError(f"num_batch_threads must be at most {MAX_BATCH_THREADS} (each is a thread running "
                                f"the model), not {self.num_batch_threads:,}")
        sizes = self.allowed_batch_sizes
        if sizes:
            if any(b <= a for a, b in zip(sizes, sizes[1:])) or sizes[0] < 1:
                raise BatchingError(f"allowed_batch_sizes must be positive and increasing: {list(sizes)}")
            if sizes[-1] != self.max_batch_size:
                raise BatchingError(f"the last of allowed_batch_sizes ({sizes[-1]}) must equal max_batch_size "
                                    f"({self.max_batch_size})")

    def padded_size(self, size: int) -> int:
        """The batch size a merged batch of `size` sentences runs at."""
        return next((s for s in self.allowed_batch_sizes if s >= size), size)

    def describe(self) -> str:
        return (f"at most {self.max_batch_size} sentences per call, {self.batch_timeout_micros} µs timeout, "
                f"{self.max_enqueued_batches} batches queued, {self.num_batch_threads} batch threads"
                + (f", sizes {list(self.allowed_batch_sizes)}" if self.allowed_batch_sizes else ""))


def parse_batching_parameters(text: str, source: str = "batching parameters") -> BatchingParameters:
    """BatchingParameters from TF Serving's text format; a BatchingError names
    `source` and the line of an unknown field or a syntax error."""
    proto = protos.parse_text(protos.message_class("nmt_tf.serving.versions.BatchingParameters", _FIELDS), text, source,
                              BatchingError)
    try:
        return BatchingParameters(**protos.field_values(proto, _FIELDS))
    except BatchingError as e:
        raise BatchingError(f"{source}: {e}") from None


def read_batching_parameters(path: str) -> BatchingParameters:
    return parse_batching_parameters(protos.read_text_file(path, "batching parameters file", BatchingError), path)


# Most request threads a front end keeps for requests waiting in batches.
MAX_REQUEST_THREADS = 512


def request_threads(threads: int, params: BatchingParameters | None) -> int:
    """Requests a front end (gRPC, REST) serves at once: `threads`, and with
    batching at least enough to fill a batch on every batch thread (a waiting
    request holds a thread but no CPU), at most MAX_REQUEST_THREADS."""
    if params is None:
        return threads
    return max(threads, min(params.max_batch_size * params.num_batch_threads, MAX_REQUEST_THREADS))


class _Task:
    __slots__ = ("feeds", "size", "done", "result", "error", "abandoned")

    def __init__(self, feeds: dict, size: int):
        self.feeds, self.size = feeds, size
        self.done = threading.Event()
        self.result = self.error = None
        self.abandoned = False


class _Batch:
    __slots__ = ("call", "tasks", "size", "opened")

    def __init__(self, call, opened: float):
        self.call, self.tasks, self.size, self.opened = call, [], 0, opened


def _split(outputs: dict, tasks: list[_Task], rows: int) -> None:
    """Gives each task its rows of the batch's outputs (an output without the
    batch axis goes to every task whole)."""
    start = 0
    for task in tasks:
        task.result = {name: (value[start:start + task.size]
                              if getattr(value, "ndim", 0) and value.shape[0] == rows else value)
                       for name, value in outputs.items()}
        start += task.size


class Batcher:
    """Joins concurrent calls of the same queue key into batches run on
    `num_batch_threads` threads (TF Serving's shared batch scheduler)."""

    def __init__(self, params: BatchingParameters):
        self.params = params
        self._queues: dict = {}                       # key -> deque of _Batch
        self._held: collections.Counter = collections.Counter()     # client -> its sentences queued or running
        # 3/4 of the queues, and at least a full batch
        self.client_share = max(params.max_batch_size, params.max_enqueued_batches * params.max_batch_size * 3 // 4)
        self._cond = threading.Condition()
        self._stopped = False
        self.batches_run = 0                          # merged calls made, for tests and logs
        self._threads = [threading.Thread(target=self._work, daemon=True, name=f"batch-{i}")
                         for i in range(params.num_batch_threads)]
        for thread in self._threads:
            thread.start()

    def run(self, key, call, feeds: dict, size: int, timeout: float, client: str = "") -> dict:
        """Runs `call(feeds)` (a dict of [batch, ...] numpy arrays in, a dict of
        numpy arrays out) merged with other calls of the same `key`; returns
        this call's rows of the outputs, or raises what the call raised,
        TooLarge, QueueFull, OverShare (`client`, its address, holds its
        share; "": a caller in this process, not counted) or WaitedTooLong."""
        if size > self.params.max_batch_size:
            raise TooLarge(f"Task size {size} is larger than maximum input batch size "
                           f"{self.params.max_batch_size}")
        task = _Task(feeds, size)
        with self._cond:
            if self._stopped:
                raise QueueFull("the server is stopping")
            if client and self._held[client] + size > self.client_share:
                raise OverShare(f"this client has {self._held[client]} sentences queued or running, its share of "
                                f"this server's batch queues ({self.client_share}); send more when they are done")
            queue = self._queues.setdefault(key, collections.deque())
            if queue and queue[-1].size + size <= self.params.max_batch_size:
                batch = queue[-1]
            else:
                if len(queue) >= self.params.max_enqueued_batches:
                    raise QueueFull("The batch scheduling queue to which this task was submitted is full")
                batch = _Batch(call, time.monotonic())
                queue.append(batch)
            batch.tasks.append(task)
            batch.size += size
            self._held[client] += size
            self._cond.notify()
        try:
            if not task.done.wait(timeout):
                with self._cond:
                    task.abandoned = True                 # a batch not yet started leaves it out
                if not task.done.is_set():
                    raise WaitedTooLong(f"the request's batch did not finish within {timeout:g} s")
        finally:
            with self._cond:
                self._held[client] -= size
                if self._held[client] <= 0:
                    del self._held[client]
        if task.error is not None:
            raise task.error
        return task.result

    def stop(self):
        """Ends the batch threads; requests still queued fail with QueueFull at once."""
        with self._cond:
            self._stopped = True
            queued = [t for queue in self._queues.values() for batch in queue for t in batch.tasks]
            self._queues.clear()
            self._cond.notify_all()
        for task in queued:
            task.error = QueueFull("the server is stopping")
            task.done.set()

    def _next_batch(self):
        """The ready batch whose oldest request waited longest, and the key of its
        queue; or (None, seconds until an open batch times out, or None)."""
        now, timeout = time.monotonic(), self.params.batch_timeout_micros / 1e6
        best, best_key, wake = None, None, None
        for key, queue in self._queues.items():
            if not queue:
                continue
            head = queue[0]
            ready = len(queue) > 1 or head.size >= self.params.max_batch_size or now - head.opened >= timeout
            if ready:
                if best is None or head.opened < best.opened:
                    best, best_key = head, key
            else:
                due = head.opened + timeout - now
                wake = due if wake is None else min(wake, due)
        if best is not None:
            self._queues[best_key].popleft()
            if not self._queues[best_key]:
                del self._queues[best_key]
        return best, wake

    def _work(self):
        while True:
            with self._cond:
                while True:
                    if self._stopped:
                        return
                    batch, wake = self._next_batch()
                    if batch is not None:
                        break
                    self._cond.wait(timeout=wake)
                tasks = [t for t in batch.tasks if not t.abandoned]
            if tasks:
                self._run(batch.call, tasks)

    def _run(self, call, tasks: list[_Task]) -> None:
        size = sum(t.size for t in tasks)
        padded = self.params.padded_size(size)
        names = list(tasks[0].feeds)
        feeds = {name: np.concatenate([t.feeds[name] for t in tasks]) for name in names}
        if padded > size:
            feeds = {name: np.concatenate([value, np.repeat(value[:1], padded - size, axis=0)])
                     for name, value in feeds.items()}
        try:
            outputs = call(feeds)
        except Exception as e:
            if len(tasks) > 1:                        # find the request that fails: each runs alone
                for task in tasks:
                    self._run(call, [task])
                return
            tasks[0].error = e
            tasks[0].done.set()
            return
        self.batches_run += 1
        _split(outputs, tasks, padded)
        for task in tasks:
            task.done.set()
