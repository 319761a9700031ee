r"""nmt_tf beside JoeyNMT 2.3 in the same minutes: prints one JSON object.

  python benchmarks/versus_joeynmt.py --joeynmt=../shared/bench/joeynmt                      # training
  python benchmarks/versus_joeynmt.py --joeynmt=../shared/bench/joeynmt --measure=decoding \
      --saved_model=exports/nmt/1

This machine's speed drifts by 10-15 % within minutes (BUILD_NOTES.md,
"Training throughput"), so a speed ratio to JoeyNMT means something only
when both sides ran in the same minutes. Each of --rounds rounds runs
JoeyNMT and then nmt_tf's configurations, or, in every second round, nmt_tf
first, so that a drift in one direction does not favour one side. The
ratio nmt_tf / JoeyNMT is taken per round and reported with its median.

--joeynmt is the folder of the JoeyNMT peer harness (run.sh, joey_seeded.py,
bench_util.py; the team keeps it in ../shared/bench/joeynmt, outside this
repository), whose Python --joeynmt_python must have torch and joeynmt 2.3.0
(run.sh's PY; its default when not given).

--measure=training: JoeyNMT's `run.sh speed --joeynmt_updates` (the target
tokens per second of its "SPEED" line; an RNNsearch-like GRU model of the
reference configuration's size, batches of 80 sentences) against
`benchmarks/train_throughput.py --flagfile=--nmt_tf_flagfile --windows=--windows`,
once per --mixed_precision value (none: float32, the reference
configuration's; auto: nmt_tf.train's default, bfloat16 on CPUs with
bfloat16 instructions).

--measure=decoding: JoeyNMT's beam-10 decoding of Multi30k test 2016 in
batches of 80 with the model its `run.sh full` trained (the harness's work
folder, --joeynmt_work, must hold configs/test.yaml: run `run.sh full` once
first; sentences / its "Generation took" seconds, which leave out loading)
against `benchmarks/decode_speed.py --saved_model_beam=--saved_model
--batch_sizes=80 --sort_by_length` once per --parallel_batches value (1: one
batch at a time, as JoeyNMT decodes; 2: as nmt_tf.translate does by default).
The two models are not the same network, only models of the same size and
task, so the ratio compares the toolkits, not the weights.

--nmt_tf_args passes more flags to nmt_tf's benchmark (e.g.
"--window_steps=10 --untimed_steps=5"). Reports: the date, the CPU's vector
flags, the commit, each round's start, order, rates and ratios, and the
medians. A side that fails stops the run with its command and the last
lines of its output.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from absl import app
from absl import flags as absl_flags

from nmt_tf.core.hardware import vector_flags

absl_flags.DEFINE_string("joeynmt", None, "Folder of the JoeyNMT peer harness (run.sh, joey_seeded.py); "
                         "the team's is ../shared/bench/joeynmt.")
absl_flags.DEFINE_string("joeynmt_python", None, "Python with torch and joeynmt 2.3.0 (run.sh's PY; default: "
                         "run.sh's own default).")
absl_flags.DEFINE_string("joeynmt_work", "/tmp/joey_m30k", "The harness's work folder (run.sh's WORK).")
absl_flags.DEFINE_enum("measure", "training", ["training", "decoding"], "What to compare.")
absl_flags.DEFINE_integer("rounds", 3, "Rounds, each running both sides.", lower_bound=1)
absl_flags.DEFINE_integer("joeynmt_updates", 150, "--measure=training: JoeyNMT updates per round (run.sh "
                          "speed's argument; its first logging interval is left out as warm-up).", lower_bound=1)
absl_flags.DEFINE_string("nmt_tf_flagfile", "benchmarks/reference.flags", "--measure=training: nmt_tf's "
                         "configuration (train_throughput.py's --flagfile; a relative path not found here is "
                         "taken from the repository's root).")
absl_flags.DEFINE_list("mixed_precision", ["none", "auto"], "--measure=training: nmt_tf's precisions, each "
                       "timed every round.")
absl_flags.DEFINE_integer("windows", 3, "--measure=training: train_throughput.py's timed windows.", lower_bound=1)
absl_flags.DEFINE_string("saved_model", None, "--measure=decoding: nmt_tf's beam-10 SavedModel version directory "
                         "(python -m nmt_tf.export).")
absl_flags.DEFINE_list("parallel_batches", ["1", "2"], "--measure=decoding: nmt_tf's batches in flight, each "
                       "timed every round.")
absl_flags.DEFINE_integer("decode_runs", 3, "--measure=decoding: decode_speed.py's runs per round (median).",
                          lower_bound=1)
absl_flags.DEFINE_string("nmt_tf_args", "", "More flags for nmt_tf's benchmark script, as one shell-quoted string.")

PEER = "joeynmt"


class SideFailed(RuntimeError):
    pass


def side_by_side(rounds: int, peer, ours: dict, log=lambda message: None) -> dict:
    """Runs `peer()` and every `ours[name]()` (each returns a rate) once per
    round, the peer first in rounds 1, 3, ... and last in rounds 2, 4, ...;
    returns the rounds (start, order, rates, ratios to the peer's rate of
    the same round) and the medians of the rates and of the ratios."""
    measures = {PEER: peer, **ours}
    rows = []
    for r in range(rounds):
        order = [PEER, *ours] if r % 2 == 0 else [*ours, PEER]
        row = {"started": datetime.datetime.now().strftime("%H:%M:%S"), "order": order, "rates": {}}
        for name in order:
            row["rates"][name] = round(measures[name](), 2)
            log(f"round {r + 1}: {name} {row['rates'][name]:,.1f}")
        row["ratios"] = {name: round(row["rates"][name] / row["rates"][PEER], 3) for name in ours}
        rows.append(row)
    return {"rounds": rows,
            "median_rates": {name: round(statistics.median(row["rates"][name] for row in rows), 1)
                             for name in measures},
            "median_ratios": {name: round(statistics.median(row["ratios"][name] for row in rows), 2)
                              for name in ours}}


def run(command: list, what: str, env: dict | None = None, cwd: str | None = None):
    """The finished command (its stdout and stderr); SideFailed naming `what`
    and the command, with the last lines of its output, if it fails."""
    done = subprocess.run(command, capture_output=True, text=True, cwd=cwd, env={**os.environ, **(env or {})})
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-25:])
        raise SideFailed(f"{what} failed (exit {done.returncode}): {shlex.join(command)}\n{tail}")
    return done


def last_json(stdout: str, what: str) -> dict:
    """The result line of one of nmt_tf's benchmarks (its standard output's
    last JSON line; TensorFlow's messages go to standard error)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise SideFailed(f"{what} printed no JSON result")


def joeynmt_env() -> dict:
    env = {"THREADS": str(os.cpu_count())}
    if absl_flags.FLAGS.joeynmt_python:
        env["PY"] = absl_flags.FLAGS.joeynmt_python
    return {**env, "WORK": absl_flags.FLAGS.joeynmt_work}


def joeynmt_training() -> float:
    FLAGS = absl_flags.FLAGS
    command = ["bash", os.path.join(FLAGS.joeynmt, "run.sh"), "speed", str(FLAGS.joeynmt_updates)]
    done = run(command, "JoeyNMT's training", joeynmt_env())
    output = done.stdout + done.stderr
    found = re.search(r"SPEED target_tokens_per_sec=([\d.]+)", output)
    if not found:
        raise SideFailed(f"JoeyNMT's training printed no 'SPEED target_tokens_per_sec=' line: {shlex.join(command)}")
    return float(found.group(1))


def joeynmt_decoding(config: str, sentences: int) -> float:
    FLAGS = absl_flags.FLAGS
    with open(config, encoding="utf-8") as f:
        seed = re.search(r"random_seed:\s*(\d+)", f.read())
    python = FLAGS.joeynmt_python or "/tmp/joey/bin/python"      # run.sh's default PY
    with tempfile.TemporaryDirectory() as tmp:
        command = [python, os.path.join(FLAGS.joeynmt, "joey_seeded.py"), seed.group(1) if seed else "42", "test",
                   config, "-o", os.path.join(tmp, "hyp")]
        threads = str(os.cpu_count())
        done = run(command, "JoeyNMT's decoding", {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
                                                   "PYTHONWARNINGS": "ignore"}, cwd=tmp)
    output = done.stdout + done.stderr      # JoeyNMT logs to either
    found = re.findall(r"Generation took ([\d.]+)\[sec\]", output)
    if not found:
        raise SideFailed(f"JoeyNMT's decoding printed no 'Generation took' line: {shlex.join(command)}")
    return sentences / float(found[-1])


def nmt_tf_training(precision: str) -> float:
    FLAGS = absl_flags.FLAGS
    command = [sys.executable, os.path.join(REPO, "benchmarks", "train_throughput.py"),
               f"--flagfile={FLAGS.nmt_tf_flagfile}", f"--mixed_precision={precision}",
               f"--windows={FLAGS.windows}", *shlex.split(FLAGS.nmt_tf_args)]
    what = f"nmt_tf's training (--mixed_precision={precision})"
    return float(last_json(run(command, what, cwd=REPO).stdout, what)["target_tokens_per_sec"])


def nmt_tf_decoding(parallel: str) -> float:
    FLAGS = absl_flags.FLAGS
    command = [sys.executable, os.path.join(REPO, "benchmarks", "decode_speed.py"),
               f"--saved_model_beam={FLAGS.saved_model}", "--batch_sizes=80", "--sort_by_length",
               f"--runs={FLAGS.decode_runs}", f"--parallel_batches={parallel}", *shlex.split(FLAGS.nmt_tf_args)]
    what = f"nmt_tf's decoding (--parallel_batches={parallel})"
    result = last_json(run(command, what, cwd=REPO).stdout, what)
    return float(result["configs"]["beam10_batch80"]["sentences_per_sec"])


def commit() -> str:
    done = subprocess.run(["git", "describe", "--always", "--dirty=+changes", "--abbrev=7"], cwd=REPO,
                          capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def main(argv):
    FLAGS = absl_flags.FLAGS
    if len(argv) > 1:
        return f"unexpected arguments: {' '.join(argv[1:])}"
    if not FLAGS.joeynmt or not os.path.isfile(os.path.join(FLAGS.joeynmt, "run.sh")):
        return (f"--joeynmt={FLAGS.joeynmt} is not the JoeyNMT harness's folder (no run.sh in it); "
                "the team's is ../shared/bench/joeynmt")
    FLAGS.joeynmt = os.path.abspath(FLAGS.joeynmt)      # the sides run in other folders
    log = lambda message: print(message, file=sys.stderr, flush=True)      # noqa: E731
    result = {"date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "cpu_count": os.cpu_count(),
              "cpu_flags": vector_flags(), "commit": commit(), "measure": FLAGS.measure,
              "joeynmt_harness": FLAGS.joeynmt}
    if FLAGS.measure == "training":
        flagfile = FLAGS.nmt_tf_flagfile
        flagfile = os.path.abspath(flagfile if os.path.exists(flagfile) else os.path.join(REPO, flagfile))
        if not os.path.isfile(flagfile):
            return f"--nmt_tf_flagfile={FLAGS.nmt_tf_flagfile} does not exist"
        FLAGS.nmt_tf_flagfile = flagfile
        peer = joeynmt_training
        ours = {f"nmt_tf --mixed_precision={p}": (lambda p=p: nmt_tf_training(p)) for p in FLAGS.mixed_precision}
        result.update(unit="target tokens/s", joeynmt_updates=FLAGS.joeynmt_updates,
                      nmt_tf_flagfile=os.path.relpath(FLAGS.nmt_tf_flagfile, REPO))
    else:
        config = os.path.join(FLAGS.joeynmt_work, "configs", "test.yaml")
        source = os.path.join(FLAGS.joeynmt_work, "test_2016_flickr.en")
        if not FLAGS.saved_model or not os.path.isfile(os.path.join(FLAGS.saved_model, "saved_model.pb")):
            return (f"--saved_model={FLAGS.saved_model} is not a SavedModel version directory: --measure=decoding "
                    "needs a beam-10 export (python -m nmt_tf.export)")
        FLAGS.saved_model = os.path.abspath(FLAGS.saved_model)
        if not os.path.isfile(config) or not os.path.isfile(source):
            return (f"{config} or {source} does not exist: JoeyNMT's decoding needs the model that the "
                    f"harness's `run.sh full` trains (WORK={FLAGS.joeynmt_work}); run it once first")
        with open(source, encoding="utf-8") as f:
            sentences = sum(1 for _ in f)
        peer = lambda: joeynmt_decoding(config, sentences)      # noqa: E731
        ours = {f"nmt_tf --parallel_batches={p}": (lambda p=p: nmt_tf_decoding(p)) for p in FLAGS.parallel_batches}
        result.update(unit="sentences/s (beam 10, test 2016, batches of 80)",
                      saved_model=FLAGS.saved_model)
    result["nmt_tf_args"] = FLAGS.nmt_tf_args
    started = time.time()
    try:
        result.update(side_by_side(FLAGS.rounds, peer, ours, log))
    except SideFailed as e:
        return str(e)
    result["minutes"] = round((time.time() - started) / 60, 1)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    app.run(main)
