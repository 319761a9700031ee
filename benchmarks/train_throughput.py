r"""Training throughput benchmark: prints one JSON object.

  python benchmarks/train_throughput.py --flagfile=benchmarks/reference.flags [--flag=value ...]
  python benchmarks/train_throughput.py --flagfile=benchmarks/reference.flags --mixed_precision=auto

(The reference configuration trains in float32, --mixed_precision=none;
nmt_tf.train's default, auto, is bfloat16 on a CPU with bfloat16
instructions.)

Trains with exactly the code path of `python -m nmt_tf.train` (the same
tf.data pipeline, model, optimizer and `model.fit`) on the corpus of the
flags, and times windows of --window_steps updates after --untimed_steps
updates of warm-up (tracing, first allocations). Reports:

  target_tokens_per_sec   median over the windows of (target tokens, [EOS]
                          included, padding excluded) / (wall seconds)
  windows                 each window's tokens/s
  peak_rss_mb             peak resident memory of the process
  seconds_per_step        median over the windows
  cpu_kernels             oneDNN or Eigen, chosen as nmt_tf.train chooses
                          (nmt_tf.core.hardware.choose_training_kernels;
                          TF_ENABLE_ONEDNN_OPTS=0 or 1 decides instead)

Nothing is written outside a temporary directory (vocabularies).
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app
from absl import flags as absl_flags
from training_setup import compiled_model_and_data

from nmt_tf import flags as nmt_flags
from nmt_tf.core.hardware import choose_training_kernels, training_kernels, vector_flags

absl_flags.DEFINE_integer("untimed_steps", 20, "Updates before timing starts (tracing, first allocations; not the learning-rate --warmup_steps).")
absl_flags.DEFINE_integer("window_steps", 30, "Updates per timed window.")
absl_flags.DEFINE_integer("windows", 5, "Number of timed windows.")


def main(argv):
    choose_training_kernels()   # as nmt_tf.train does, before TensorFlow's import
    import keras
    import tensorflow as tf

    from nmt_tf.core import precision

    FLAGS = absl_flags.FLAGS
    config = nmt_flags.config_from_flags()
    keras.utils.set_random_seed(config.seed)
    policy = precision.set_globally(config.mixed_precision)
    ds, model = compiled_model_and_data(config)

    marks = []   # (time after the update, target tokens of the update)

    class Timer(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            marks.append((time.perf_counter(), float(logs["batch_tokens"])))

    total = FLAGS.untimed_steps + FLAGS.windows * FLAGS.window_steps
    model.fit(ds.repeat(), steps_per_epoch=total, epochs=1, verbose=0, callbacks=[Timer()],
              shuffle=False)
    rates, step_times = [], []
    for w in range(FLAGS.windows):
        start = FLAGS.untimed_steps + w * FLAGS.window_steps - 1
        window = marks[start:start + FLAGS.window_steps + 1]
        seconds = window[-1][0] - window[0][0]
        tokens = sum(t for _, t in window[1:])
        rates.append(tokens / seconds)
        step_times.append(seconds / FLAGS.window_steps)
    result = {
        "target_tokens_per_sec": round(statistics.median(rates), 1),
        "windows": [round(r, 1) for r in rates],
        "seconds_per_step": round(statistics.median(step_times), 4),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "untimed_steps": FLAGS.untimed_steps, "window_steps": FLAGS.window_steps,
        "mixed_precision": config.mixed_precision, "dtype_policy": policy, "jit_compile": config.jit_compile,
        "batch_size": config.batch_size, "batch_type": config.batch_type,
        "sizes": {k: getattr(config, k) for k in ("embedding_size", "hidden_size", "attention_size",
                                          "maxout_size", "src_vocab_size", "tgt_vocab_size")},
        "parameters": model.count_params(),
        "tensorflow": tf.__version__, "keras": keras.__version__,
        "cpu_count": os.cpu_count(), "machine": platform.processor() or platform.machine(),
        "cpu_flags": vector_flags(), "cpu_kernels": training_kernels(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    app.run(main)
