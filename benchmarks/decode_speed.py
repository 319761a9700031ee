r"""Decoding speed through the exported SavedModel: prints one JSON object.

  python benchmarks/decode_speed.py --model_dir=runs/multi30k_en_fr_rnnsearch
  python benchmarks/decode_speed.py --saved_model_beam=exports/nmt/1 --saved_model_greedy=exports/greedy/1

Translates the Multi30k test 2016 English source (1,000 sentences, in file
order, or sorted by length with --sort_by_length) with beam 10 and with
greedy search, in batches of 1 and of 64 sentences (--batch_sizes), through
the SavedModel's serving_default signature, exactly as nmt_tf.translate
--saved_model does. With --model_dir, both SavedModels
are exported to a temporary directory first. Each configuration runs
--runs times after one warm-up batch; the median run is reported:

  sentences_per_sec, target_tokens_per_sec (output tokens, [EOS] included),
  seconds (median), runs (all runs' sentences/s)

--limit_batch1 bounds the sentences decoded one at a time (default: all).
--parallel_batches=2 translates two batches at once, on two threads, as
nmt_tf.translate does by default.

  python benchmarks/decode_speed.py --compare=old/1,new/1 --batch_sizes=80 --sort_by_length

compares SavedModels, or LiteRT model folders (nmt_tf.export --format=litert;
--litert_threads sets their interpreter's threads), side by side instead:
every batch is translated by each
of them in turn, the order rotating from batch to batch, so that the
machine's drift (large on a shared machine) falls on all of them alike. For
each: sentences_per_sec (median run), runs (every run's), and
differ_from_first (translations that are not the first SavedModel's, in the
first run). `TF_ENABLE_ONEDNN_OPTS=0 ... --intra_op_threads=1` measures
with nmt_tf.serve's settings (Eigen kernels, one thread per op).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app
from absl import flags as absl_flags

from nmt_tf import flags as nmt_flags  # noqa: F401  (search flags)
from nmt_tf.core.files import read_lines

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
absl_flags.DEFINE_string("saved_model_beam", None, "SavedModel exported with --beam_size=10.")
absl_flags.DEFINE_string("saved_model_greedy", None, "SavedModel exported with --beam_size=1.")
absl_flags.DEFINE_string("source", os.path.join(REPO, "data/multi30k/test_2016_flickr.en.gz"), "Sentences to translate.")
absl_flags.DEFINE_integer("runs", 3, "Timed runs per configuration.", lower_bound=1)
absl_flags.DEFINE_integer("limit_batch1", 0, "Sentences decoded at batch 1 (0: all).", lower_bound=0)
absl_flags.DEFINE_list("batch_sizes", ["1", "64"], "Batch sizes to measure.")
absl_flags.DEFINE_list("compare", [], "SavedModels or LiteRT model folders to compare side by side, each batch "
                       "translated by all of them "
                       "in turn (see the module docstring); replaces --saved_model_beam / --saved_model_greedy.")
absl_flags.DEFINE_integer("intra_op_threads", 0, "Threads one TensorFlow op may use (0: TensorFlow's default; "
                          "nmt_tf.serve uses 1).", lower_bound=0)
# --parallel_batches (nmt_tf.flags, nmt_tf.translate's): batches translated at
# once, on as many threads; here one by default, as the earlier rows of
# BUILD_NOTES were measured (not with --compare).
absl_flags.FLAGS.set_default("parallel_batches", 1)
absl_flags.DEFINE_boolean("sort_by_length", False, "Batch the sentences in order of length (as nmt_tf.translate and "
                          "nmt_tf.evaluate do) instead of in file order.")


def measure(signature, lines, batch_size, runs, parallel_batches=1):
    import tensorflow as tf

    from nmt_tf.inference.line_batches import batches_by_length

    signature(text=tf.constant(lines[:batch_size]))          # warm-up (tracing, allocation)

    def tokens_of(batch):
        out = signature(text=tf.constant(batch))
        return int(tf.reduce_sum(tf.cast(out["target_tokens"] != b"", tf.int32)))

    results = []
    for _ in range(runs):
        start = time.perf_counter()
        batched = batches_by_length(tokens_of, lines, batch_size, parallel_batches, by_length=False)
        tokens = sum(count for _, count in batched)
        seconds = time.perf_counter() - start
        results.append((len(lines) / seconds, tokens / seconds, seconds))
    results.sort()
    sent, tok, seconds = results[len(results) // 2]
    return {"sentences": len(lines), "sentences_per_sec": round(sent, 2),
            "target_tokens_per_sec": round(tok, 1), "seconds": round(seconds, 2),
            "runs": [round(r[0], 2) for r in results]}


def translator(path: str):
    """batch of lines -> their translations (bytes), through a SavedModel's
    serving_default signature, or a LiteRT model folder (nmt_tf.inference.litert_runtime,
    one interpreter with --litert_threads threads)."""
    from nmt_tf.inference.litert_runtime import MANIFEST, LiteRTClient

    if os.path.isfile(os.path.join(path, MANIFEST)):
        client = LiteRTClient(path, outputs=["translation"], num_threads=absl_flags.FLAGS.litert_threads)
        return lambda batch: client(text=batch)["translation"].tolist()
    import tensorflow as tf

    from nmt_tf.inference.saved_models import load_signature

    signature = load_signature(path)
    return lambda batch: signature(text=tf.constant(batch))["translation"].numpy().tolist()


def compare(translators, lines, batch_size, runs):
    """Each batch through every translator in turn (rotating order): {index: result}."""
    for translate in translators:
        translate(lines[:batch_size])
    seconds = [[0.0] * runs for _ in translators]
    first_run = [[] for _ in translators]
    for run in range(runs):
        for b, i in enumerate(range(0, len(lines), batch_size)):
            batch = lines[i:i + batch_size]
            for k in [(b + j) % len(translators) for j in range(len(translators))]:
                start = time.perf_counter()
                out = translators[k](batch)
                seconds[k][run] += time.perf_counter() - start
                if run == 0:
                    first_run[k].extend(out)
    results = {}
    for k, times in enumerate(seconds):
        rates = sorted(len(lines) / t for t in times)
        results[k] = {"sentences": len(lines), "sentences_per_sec": round(rates[len(rates) // 2], 2),
                      "runs": [round(len(lines) / t, 2) for t in times],
                      "differ_from_first": sum(a != b for a, b in zip(first_run[0], first_run[k]))}
    return results


def main(argv):
    import dataclasses

    import tensorflow as tf

    from nmt_tf.config import ExportConfig
    from nmt_tf.core.hardware import vector_flags
    from nmt_tf.exporting import saved_model as exporter
    from nmt_tf.inference.saved_models import load_signature

    FLAGS = absl_flags.FLAGS
    if FLAGS.intra_op_threads:
        tf.config.threading.set_intra_op_parallelism_threads(FLAGS.intra_op_threads)
    tmp = None
    paths = {"beam10": FLAGS.saved_model_beam, "greedy": FLAGS.saved_model_greedy}
    if FLAGS.model_dir and not FLAGS.compare:
        tmp = tempfile.mkdtemp()
        base = nmt_flags.search_options()
        for name, beam in (("beam10", 10), ("greedy", 1)):
            options = dataclasses.replace(base, beam_size=beam, n_best=1)
            paths[name] = exporter.export(FLAGS.model_dir, os.path.join(tmp, name), ExportConfig(options),
                                          log=lambda *a: None)
    lines = read_lines(FLAGS.source)
    if FLAGS.sort_by_length:
        lines.sort(key=lambda line: len(line.split()))
    result = {"source": os.path.relpath(FLAGS.source, REPO), "tensorflow": tf.__version__,
              "cpu_count": os.cpu_count(), "cpu_flags": vector_flags(), "order": "length-sorted" if FLAGS.sort_by_length else "file",
              "intra_op_threads": FLAGS.intra_op_threads, "parallel_batches": FLAGS.parallel_batches,
              "onednn": {"0": "off (Eigen kernels)", "1": "on"}.get(os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
                                                                "TensorFlow's default"), "configs": {}}
    subset = lambda batch_size: lines[:FLAGS.limit_batch1] if batch_size == 1 and FLAGS.limit_batch1 else lines
    if FLAGS.compare:
        translators = [translator(path) for path in FLAGS.compare]
        for batch_size in map(int, FLAGS.batch_sizes):
            for k, measured in compare(translators, subset(batch_size), batch_size, FLAGS.runs).items():
                result["configs"][f"{FLAGS.compare[k]}_batch{batch_size}"] = measured
        print(json.dumps(result))
        return
    for name, path in paths.items():
        if not path:
            continue
        signature = load_signature(path)      # registers tensorflow-text's ops (SentencePiece exports)
        for batch_size in map(int, FLAGS.batch_sizes):
            result["configs"][f"{name}_batch{batch_size}"] = measure(signature, subset(batch_size), batch_size,
                                                                     FLAGS.runs, FLAGS.parallel_batches)
    print(json.dumps(result))


if __name__ == "__main__":
    app.run(main)
