r"""Input pipeline benchmark: the training tf.data pipeline alone, reading the
text (tokenizing in every epoch) or prepared TFRecord shards
(--prepared_shards); prints one JSON object.

  python benchmarks/input_pipeline.py --flagfile=benchmarks/reference.flags [--shards=8] [--runs=5]
  python benchmarks/input_pipeline.py --flagfile=benchmarks/reference.flags --generate_pairs=10000000 \
      --runs=1 --workdir=/tmp/big     # memory while streaming a generated corpus

Each run iterates one shuffled epoch of `nmt_tf.data.pipeline.make_dataset` exactly as
training builds it (pools sorted by length, batches, shuffling) and counts
pairs and target tokens ([EOS] included, padding excluded, as
benchmarks/train_throughput.py counts them, so the two rates compare).
Reports the median over --runs of pairs/s and target tokens/s for each source,
the time to prepare the shards, and the resident memory sampled every 0.5 s
while each source streams (min / max after the first 10 % of the epoch:
flat memory means max - min stays small as the epoch goes on).

--generate_pairs=N first writes a corpus of N pairs drawn at random (seeded)
from the corpus of the flags, plain text, into --workdir, and uses it.
"""

from __future__ import annotations

import json
import os
import platform
import random
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app
from absl import flags as absl_flags

from nmt_tf import flags as nmt_flags
from nmt_tf.core.hardware import vector_flags

absl_flags.DEFINE_integer("shards", 8, "Prepared shards.")
absl_flags.DEFINE_integer("runs", 5, "Epochs timed per source (the median is reported).")
absl_flags.DEFINE_integer("generate_pairs", 0, "Write a corpus of this many pairs drawn from the flags' corpus "
                          "into --workdir first, and use it (0: use the flags' corpus).")
absl_flags.DEFINE_list("sources", ["text", "prepared"], "Pipelines to time: text, prepared (the shards are "
                       "made in any case).")
absl_flags.DEFINE_string("workdir", None, "Where vocabularies, shards and a generated corpus go (default: a "
                         "temporary directory, removed at the end).")


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class RssSampler:
    """Resident memory every 0.5 s while a block runs: (time fraction, MB) pairs."""

    def __init__(self):
        self.samples, self._stop = [], threading.Event()

    def __enter__(self):
        self._start = time.perf_counter()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(0.5):
            self.samples.append((time.perf_counter() - self._start, rss_mb()))

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        total = time.perf_counter() - self._start
        late = [mb for t, mb in self.samples if t >= 0.1 * total] or [rss_mb()]
        self.summary = {"rss_mb_min": round(min(late), 1), "rss_mb_max": round(max(late), 1),
                        "rss_samples": len(self.samples)}


def generate(src: str, tgt: str, pairs: int, workdir: str) -> tuple[str, str]:
    from nmt_tf.core.files import input_lines

    source = [line.decode("utf-8", "replace") for line in input_lines(src, "train_src")]
    target = [line.decode("utf-8", "replace") for line in input_lines(tgt, "train_tgt")]
    rng = random.Random(1)
    out = os.path.join(workdir, "generated.src"), os.path.join(workdir, "generated.tgt")
    with open(out[0], "w", encoding="utf-8") as fs, open(out[1], "w", encoding="utf-8") as ft:
        for _ in range(pairs):
            i = rng.randrange(len(source))
            fs.write(source[i] + "\n")
            ft.write(target[i] + "\n")
    return out


def epoch(make, label: str) -> dict:
    pairs = tokens = 0
    with RssSampler() as rss:
        started = time.perf_counter()
        for _, labels in make():
            pairs += int(labels.shape[0])
            tokens += int((labels.numpy() > 0).sum())
        seconds = time.perf_counter() - started
    return {"source": label, "pairs": pairs, "seconds": seconds, "pairs_per_sec": pairs / seconds,
            "target_tokens_per_sec": tokens / seconds, **rss.summary}


def main(argv):
    import tensorflow as tf

    from nmt_tf.data import pipeline as data

    FLAGS = absl_flags.FLAGS
    config = nmt_flags.config_from_flags()
    tmp = None
    workdir = FLAGS.workdir
    if workdir is None:
        tmp = tempfile.TemporaryDirectory()
        workdir = tmp.name
    os.makedirs(workdir, exist_ok=True)
    # Vocabularies of the flags' corpus (a generated corpus draws its lines from it).
    os.makedirs(os.path.join(workdir, "vocab"), exist_ok=True)
    src_tok, tgt_tok, _ = data.build_vocabularies(config, os.path.join(workdir, "vocab"), log=lambda *a: None)
    generated_seconds = None
    if FLAGS.generate_pairs:
        started = time.perf_counter()
        src, tgt = generate(config.train_src, config.train_tgt, FLAGS.generate_pairs, workdir)
        generated_seconds = round(time.perf_counter() - started, 1)
        config = config.replace(train_src=src, train_tgt=tgt)
    prepared = os.path.join(workdir, "prepared")
    started = time.perf_counter()
    with RssSampler() as rss:
        manifest = data.write_prepared_shards(config.train_src, config.train_tgt, src_tok, tgt_tok, prepared,
                                              max_len=config.max_len, shards=FLAGS.shards, log=lambda *a: None)
    prepare = {"seconds": round(time.perf_counter() - started, 1), "pairs": manifest["pairs"],
               "pairs_per_sec": round(manifest["pairs"] / (time.perf_counter() - started), 1), **rss.summary}

    def make(source, run):
        return data.make_dataset(config.train_src, config.train_tgt, src_tok, tgt_tok, max_len=config.max_len,
                                 batch_size=config.batch_size, batch_type=config.batch_type,
                                 pool_size=config.pool_size, shuffle=True, shuffle_buffer=config.shuffle_buffer,
                                 seed=config.seed, epoch=run, prepared=prepared if source == "prepared" else None)

    results = {}
    for source in FLAGS.sources:
        runs = [epoch(lambda: make(source, r), source) for r in range(FLAGS.runs)]
        results[source] = {
            "pairs_per_sec": round(statistics.median(r["pairs_per_sec"] for r in runs), 1),
            "target_tokens_per_sec": round(statistics.median(r["target_tokens_per_sec"] for r in runs), 1),
            "runs_pairs_per_sec": [round(r["pairs_per_sec"], 1) for r in runs],
            "pairs": runs[0]["pairs"],
            "rss_mb_min": min(r["rss_mb_min"] for r in runs), "rss_mb_max": max(r["rss_mb_max"] for r in runs),
        }
    result = {
        "corpus": [config.train_src, config.train_tgt], "generated_pairs": FLAGS.generate_pairs or None,
        "generate_seconds": generated_seconds, "tokenizer": config.tokenizer, "shards": FLAGS.shards,
        "batch_size": config.batch_size, "batch_type": config.batch_type,
        "shuffle_buffer": config.shuffle_buffer, "prepare": prepare, **results,
        "prepared_over_text": (round(results["prepared"]["pairs_per_sec"] / results["text"]["pairs_per_sec"], 2)
                               if len(results) == 2 else None),
        "tensorflow": tf.__version__, "cpu_count": os.cpu_count(),
        "machine": platform.processor() or platform.machine(), "cpu_flags": vector_flags(),
    }
    print(json.dumps(result))
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    app.run(main)
