r"""Two training setups side by side in the same minutes: prints one JSON object.

  python benchmarks/train_ab.py --a=HEAD~1 --b=. --flagfile=benchmarks/reference.flags
  python benchmarks/train_ab.py --a=. --b=. --b_env=TF_ENABLE_ONEDNN_OPTS=0 --flagfile=...
  python benchmarks/train_ab.py --a=. --b=. --b_flags=--mixed_precision=mixed_bfloat16 --flagfile=...

This machine's speed drifts by 10-15 % within minutes (BUILD_NOTES.md,
"Training throughput"), more than most changes to a training step are
worth, so two `train_throughput.py` runs one after the other cannot tell
them apart. Here two worker processes, A and B, each build the model,
optimizer and pipeline as `nmt_tf.train` does (benchmarks/training_setup.py)
and keep the same --round_steps batches (the first ones of the pipeline,
cached). Then they take turns: in each of --rounds rounds both train on
those batches with `model.fit`, one after the other, in the order A B, then
B A, and so on, while the other one waits idle. A round's rate is target
tokens / wall seconds from the end of its first update to the end of its
last; the ratio B / A is taken per round (the two ran within a minute of
each other) and reported as the median over the rounds.

A side (--a, --b) is the code to run: a directory holding an nmt_tf tree
(`.` for this one), or a git revision of this repository, which is
extracted into a temporary directory (its nmt_tf/ and benchmarks/). Both
workers run in the current directory, so the flags' relative paths mean
the same for both, with this Python. --a_env / --b_env set environment
variables for one side (e.g. TF_ENABLE_ONEDNN_OPTS=0 for Eigen's kernels);
--a_flags / --b_flags add nmt_tf flags for one side. All other flags go to
both. A side's tree must have benchmarks/training_setup.py (commit 004b43b
and later) and the nmt_tf flags given.

Reports, per side: the tree, its git commit ("+changes" for uncommitted
edits), env, flags, CPU kernels, dtype policy, each round's tokens/s, their
median and peak memory; and the per-round ratios B / A and their median.
Also updates/s per round and the median of their ratios B / A
(updates_ratio_b_to_a): when the sides tokenize differently (e.g. another
--src_vocab_size), their first batches hold different numbers of tokens,
and an equal training time in updates follows this ratio, not the tokens'.
A worker's log (TensorFlow's messages) goes to a temporary file whose last
lines are shown if it fails.
"""

from __future__ import annotations

import datetime
import gc
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A worker imports nmt_tf and training_setup from its side's tree, not from
# the tree this script lives in (sys.path's first entries win over the
# editable install).
TREE = os.environ.get("NMT_TF_AB_TREE") or REPO
sys.path[:0] = [TREE, os.path.join(TREE, "benchmarks")]

from absl import app
from absl import flags as absl_flags

from nmt_tf import flags as nmt_flags  # noqa: F401  (defines the nmt_tf flags both sides take)

absl_flags.DEFINE_string("a", None, "Side A: an nmt_tf tree's directory (`.`) or a git revision of this repository.")
absl_flags.DEFINE_string("b", None, "Side B: as --a.")
absl_flags.DEFINE_string("a_env", "", "Environment variables for side A only: VAR=value[,VAR=value...].")
absl_flags.DEFINE_string("b_env", "", "Environment variables for side B only: VAR=value[,VAR=value...].")
absl_flags.DEFINE_string("a_flags", "", "nmt_tf flags for side A only, as on a command line (quoted).")
absl_flags.DEFINE_string("b_flags", "", "nmt_tf flags for side B only, as on a command line (quoted).")
absl_flags.DEFINE_integer("rounds", 6, "Timed rounds; each side trains once per round, the order alternating.",
                          lower_bound=1)
absl_flags.DEFINE_integer("round_steps", 20, "Updates per round: the pipeline's first batches, the same every "
                          "round (the first update of a round is not timed).", lower_bound=2)
absl_flags.DEFINE_boolean("ab_worker", False, "Internal: run as one side's worker (the parent starts them).")

FLAGS = absl_flags.FLAGS
OWN_FLAGS = ("a", "b", "a_env", "b_env", "a_flags", "b_flags", "ab_worker")
MESSAGE = "AB "    # prefix of the worker's protocol lines on its stdout


def parse_env(text: str) -> dict:
    """"VAR=value,VAR2=value" -> {"VAR": "value", ...}."""
    env = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise app.UsageError(f"an environment setting must be VAR=value, got {item!r}")
        env[name] = value
    return env


def round_rate(marks) -> tuple[float, float]:
    """(target tokens, seconds) of one round from its updates' (end time,
    target tokens): the first update's end starts the clock."""
    seconds = marks[-1][0] - marks[0][0]
    return sum(tokens for _, tokens in marks[1:]), seconds


def summarize(rates_a: list, rates_b: list) -> dict:
    """Per-round ratios B / A and their median (pairs of the same round)."""
    ratios = [b / a for a, b in zip(rates_a, rates_b)]
    return {"ratio_b_to_a": round(statistics.median(ratios), 3), "ratios": [round(r, 3) for r in ratios]}


# ----------------------------------------------------------------- the worker

def send(message: dict) -> None:
    print(MESSAGE + json.dumps(message), flush=True)


def worker() -> None:
    from nmt_tf.core.hardware import choose_training_kernels, training_kernels

    choose_training_kernels()   # as nmt_tf.train does, before TensorFlow's import
    import keras
    import tensorflow as tf
    from training_setup import compiled_model_and_data

    from nmt_tf.core import precision

    config = nmt_flags.config_from_flags()
    keras.utils.set_random_seed(config.seed)
    policy = precision.set_globally(config.mixed_precision)
    ds, model = compiled_model_and_data(config)
    batches = ds.take(FLAGS.round_steps).cache()
    marks = []

    class Timer(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            marks.append((time.perf_counter(), float(logs["batch_tokens"])))

    def one_round() -> tuple[float, float]:
        marks.clear()
        # Off the clock, as timeit does: the garbage of earlier rounds is
        # collected before a round, and the collector is off during it. With
        # it on, one collection in the third round took 4-15 s in most runs
        # (the round's 20 updates of rnnsearch.flags take about 10); one long
        # `model.fit` in nmt_tf.train showed no stall that long (BUILD_NOTES.md,
        # "The third round's stall").
        gc.collect()
        gc.disable()
        try:
            model.fit(batches, epochs=1, verbose=0, callbacks=[Timer()], shuffle=False)
        finally:
            gc.enable()
        if len(marks) < 2:
            raise SystemExit(f"the pipeline gave {len(marks)} batch(es); a round needs at least 2 "
                             "(a larger training corpus, or a smaller --round_steps)")
        return round_rate(marks)

    one_round()    # traces the step and fills the cache; not timed
    send({"ready": True, "cpu_kernels": training_kernels(), "dtype_policy": policy,
          "steps": len(marks), "tensorflow": tf.__version__, "parameters": model.count_params()})
    for line in sys.stdin:
        command = line.strip()
        if command == "round":
            tokens, seconds = one_round()
            send({"tokens": tokens, "seconds": seconds})
        elif command == "quit":
            send({"peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)})
            return


# ----------------------------------------------------------------- the parent

class Worker:
    """One side's worker process and its protocol."""

    def __init__(self, name: str, tree: str, env: dict, extra_flags: list, args: list, scratch: str):
        self.name, self.tree = name, tree
        self.log_path = os.path.join(scratch, f"worker_{name}.log")
        self.log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--ab_worker", *args, *extra_flags],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
            env={**os.environ, **env, "NMT_TF_AB_TREE": tree})

    def receive(self) -> dict:
        for line in self.process.stdout:
            if line.startswith(MESSAGE):
                return json.loads(line[len(MESSAGE):])
        self.process.wait()
        self.log.flush()
        with open(self.log_path) as f:
            tail = "".join(f.readlines()[-30:])
        raise SystemExit(f"side {self.name}'s worker (tree {self.tree}) exited with code "
                         f"{self.process.returncode}; the end of its log:\n{tail}")

    def ask(self, command: str) -> dict:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.receive()

    def close(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.log.close()


def forwarded_args(argv: list) -> list:
    """The command line's arguments (sys.argv[1:]) minus this script's own
    side flags, in either form: `--a=X` or `--a X`."""
    kept, skip = [], False
    for arg in argv:
        name = arg.lstrip("-").split("=", 1)[0]
        if skip:
            skip = False
        elif arg.startswith("-") and name in OWN_FLAGS + ("noab_worker",):
            skip = "=" not in arg and name != "ab_worker" and name != "noab_worker"
        else:
            kept.append(arg)
    return kept


def parent() -> None:
    from trees import resolve_tree  # the parent's own (a worker's tree may predate it)

    from nmt_tf.core.hardware import vector_flags

    if FLAGS.a is None or FLAGS.b is None:
        raise app.UsageError("--a and --b are required (a directory such as `.`, or a git revision)")
    args = forwarded_args(sys.argv[1:])
    started = datetime.datetime.now().isoformat(timespec="seconds")
    with tempfile.TemporaryDirectory(prefix="train_ab_") as scratch:
        sides = {}
        for name in ("a", "b"):
            tree, commit = resolve_tree(FLAGS[name].value, scratch, name)
            sides[name] = {"tree": tree, "commit": commit, "env": parse_env(FLAGS[f"{name}_env"].value),
                           "flags": shlex.split(FLAGS[f"{name}_flags"].value), "rounds": [],
                           "round_updates_per_sec": []}
        workers = {}
        try:
            for name, side in sides.items():     # one at a time: start-up is heavy, and not timed
                workers[name] = Worker(name, side["tree"], side["env"], side["flags"], args, scratch)
                ready = workers[name].receive()
                side.update({k: ready[k] for k in ("cpu_kernels", "dtype_policy", "tensorflow", "parameters")})
            # A round's clock starts at the end of its first update (`round_rate`).
            timed_updates = FLAGS.round_steps - 1
            for r in range(FLAGS.rounds):
                for name in (("a", "b") if r % 2 == 0 else ("b", "a")):
                    done = workers[name].ask("round")
                    sides[name]["rounds"].append(round(done["tokens"] / done["seconds"], 1))
                    sides[name]["round_updates_per_sec"].append(round(timed_updates / done["seconds"], 3))
            for name, w in workers.items():
                sides[name]["peak_rss_mb"] = w.ask("quit")["peak_rss_mb"]
        finally:
            for w in workers.values():
                w.close()
    for side in sides.values():
        side["target_tokens_per_sec"] = round(statistics.median(side["rounds"]), 1)
        side["updates_per_sec"] = round(statistics.median(side["round_updates_per_sec"]), 3)
    per_update = summarize(sides["a"]["round_updates_per_sec"], sides["b"]["round_updates_per_sec"])
    result = {**summarize(sides["a"]["rounds"], sides["b"]["rounds"]),
              "updates_ratio_b_to_a": per_update["ratio_b_to_a"], "updates_ratios": per_update["ratios"],
              "a": sides["a"], "b": sides["b"],
              "rounds": FLAGS.rounds, "round_steps": FLAGS.round_steps, "order": "a b, b a, a b, ...",
              "common_args": args, "started": started,
              "finished": datetime.datetime.now().isoformat(timespec="seconds"),
              "cpu_count": os.cpu_count(), "cpu_flags": vector_flags()}
    print(json.dumps(result))


def main(argv):
    if FLAGS.ab_worker:
        worker()
    else:
        parent()


if __name__ == "__main__":
    app.run(main)
