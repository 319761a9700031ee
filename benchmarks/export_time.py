r"""Export time of one model directory, by one or two nmt_tf trees side by side: prints one JSON object.

  python benchmarks/export_time.py --model_dir=runs/multi30k_en_fr_rnnsearch --a=HEAD~1 --b=.
  python benchmarks/export_time.py --model_dir=runs/multi30k_en_fr_rnnsearch --a=. --runs=5

Every run is a fresh process that restores the model and exports it with
beam --beam_size into a temporary directory, as `python -m nmt_tf.export`
does: a second export in one process would find TensorFlow's tracing caches
warm, which a user's export never does. A run's time is from the call of
`nmt_tf.exporting.saved_model.export` (what `python -m nmt_tf.export` calls) to its
return: restoring, tracing and writing the SavedModel, not importing
TensorFlow. With two sides the runs alternate,
A B, then B A, and so on, so that the machine's drift falls on both alike.

A side (--a, --b) is a directory holding an nmt_tf tree (`.` for this one)
or a git revision of this repository (extracted into a temporary directory,
as benchmarks/train_ab.py does) with nmt_tf/exporting/saved_model.py (86b36de and
later). Reports per side: the tree, its commit,
every run's seconds and their median; with two sides, each round's ratio
A / B (how many times faster B exported) and their median.
"""

from __future__ import annotations

import datetime
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TREE = os.environ.get("NMT_TF_EXPORT_TREE") or REPO       # a worker imports its side's nmt_tf
sys.path[:0] = [TREE]

from absl import app
from absl import flags as absl_flags

absl_flags.DEFINE_string("model_dir", None, "The model directory to export (its best checkpoint).")
absl_flags.DEFINE_string("a", ".", "Side A: an nmt_tf tree's directory (`.`) or a git revision of this repository.")
absl_flags.DEFINE_string("b", None, "Side B, as --a (none: side A alone).")
absl_flags.DEFINE_integer("runs", 3, "Exports per side (fresh processes), alternating with the other side's.",
                          lower_bound=1)
absl_flags.DEFINE_integer("beam_size", 10, "The exported search's beam.", lower_bound=1)
absl_flags.DEFINE_integer("max_input_length", 100, "The exported graph's longest input, in tokens.", lower_bound=1)
absl_flags.DEFINE_boolean("export_worker", False, "Internal: export once in this process and print the seconds.")
FLAGS = absl_flags.FLAGS
MESSAGE = "EXPORT "


def worker() -> None:
    importlib.import_module("tensorflow")      # before the clock starts
    from nmt_tf.exporting import saved_model as exporter
    from nmt_tf.inference import search

    options = search.SearchOptions(beam_size=FLAGS.beam_size, n_best=1)
    try:
        from nmt_tf.config import ExportConfig
        how = (ExportConfig(options, max_input_length=FLAGS.max_input_length),), {}
    except ImportError:         # a tree from before ExportConfig: the search options and a keyword
        how = (options,), {"max_input_length": FLAGS.max_input_length}
    with tempfile.TemporaryDirectory(prefix="export_time_") as out:
        start = time.perf_counter()
        exporter.export(FLAGS.model_dir, os.path.join(out, "nmt"), *how[0], log=lambda *a: None, **how[1])
        seconds = time.perf_counter() - start
    print(MESSAGE + json.dumps({"seconds": seconds}), flush=True)


def run_once(tree: str) -> float:
    """One export in a fresh process with `tree`'s nmt_tf; its seconds."""
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--export_worker", f"--model_dir={FLAGS.model_dir}",
         f"--beam_size={FLAGS.beam_size}", f"--max_input_length={FLAGS.max_input_length}"],
        capture_output=True, text=True, env={**os.environ, "NMT_TF_EXPORT_TREE": tree, "TF_CPP_MIN_LOG_LEVEL": "2"})
    for line in done.stdout.splitlines():
        if line.startswith(MESSAGE):
            return json.loads(line[len(MESSAGE):])["seconds"]
    raise SystemExit(f"the export with the tree {tree} failed (exit code {done.returncode}); the end of its "
                     f"output:\n{done.stderr[-3000:]}")


def parent() -> None:
    from trees import resolve_tree

    from nmt_tf.core.hardware import vector_flags

    if not FLAGS.model_dir or not os.path.isdir(FLAGS.model_dir):
        raise app.UsageError(f"--model_dir={FLAGS.model_dir}: give an existing model directory")
    started = datetime.datetime.now().isoformat(timespec="seconds")
    names = ("a", "b") if FLAGS.b else ("a",)
    with tempfile.TemporaryDirectory(prefix="export_time_") as scratch:
        sides = {}
        for name in names:
            tree, commit = resolve_tree(FLAGS[name].value, scratch, name)
            sides[name] = {"tree": FLAGS[name].value, "commit": commit, "path": tree, "runs": []}
        for r in range(FLAGS.runs):
            for name in (names if r % 2 == 0 else names[::-1]):
                sides[name]["runs"].append(round(run_once(sides[name]["path"]), 2))
    result = {}
    for name, side in sides.items():
        side.pop("path")
        side["median_seconds"] = round(statistics.median(side["runs"]), 2)
        result[name] = side
    if FLAGS.b:
        ratios = [a / b for a, b in zip(sides["a"]["runs"], sides["b"]["runs"])]
        result["ratios_a_over_b"] = [round(x, 3) for x in ratios]
        result["median_ratio_a_over_b"] = round(statistics.median(ratios), 3)
    result.update({"model_dir": os.path.abspath(FLAGS.model_dir), "beam_size": FLAGS.beam_size,
                   "max_input_length": FLAGS.max_input_length, "runs": FLAGS.runs, "started": started,
                   "finished": datetime.datetime.now().isoformat(timespec="seconds"),
                   "cpu_count": os.cpu_count(), "cpu_flags": vector_flags(),
                   "tf_enable_onednn_opts": os.environ.get("TF_ENABLE_ONEDNN_OPTS")})
    print(json.dumps(result))


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    worker() if FLAGS.export_worker else parent()


if __name__ == "__main__":
    app.run(main)
