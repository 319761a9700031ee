r"""Where a training step's (or a beam-search step's) time goes: prints one JSON object.

  python benchmarks/profile_step.py --flagfile=benchmarks/reference.flags                 # training
  python benchmarks/profile_step.py --flagfile=benchmarks/reference.flags --mode=search   # beam search
  python benchmarks/profile_step.py --mode=search --model_dir=runs/m30k --beam_size=10    # a trained model

Training: builds the model, optimizer and tf.data pipeline exactly as
benchmarks/train_throughput.py does (the code path of `nmt_tf.train`), runs
--untimed_steps updates, then records --profile_steps updates with
TensorFlow's profiler (tf.profiler.experimental, the trace TensorBoard's
Profile tab shows; --logdir keeps it for TensorBoard). Search: beam search
(`nmt_tf.inference.search.beam_search`, the exported signature's search, with the step
matrices and token products frozen as an export freezes them unless
--noas_exported) of --search_sentences test-2016 sentences in one batch,
traced the same way.

The trace's op events are summed by kind and by where they run. Op times are
the time each TensorFlow op took on the thread that ran it, so ops running at
once on the two cores add up to more than the wall time; the report gives
both. Kinds:

  matmul        MatMul, BatchMatMul and the fused (matmul + bias) kernels
  attention     other ops under the alignment model's name scope (tanh of
                keys + query, scores, softmax), gradients included
  elementwise   the rest of the model's arithmetic: GRU gates, maxout, masks,
                splits and concats, casts, gradient sums (AddN)
  loss          the softmax cross-entropy (nmt_tf.models.training_step.token_losses)
  optimizer     the weight update, gradient norm and clipping
  loop control  the while loops' own ops: TensorList reads / writes, loop
                counters and conditions
  input         ops of the tf.data pipeline (they overlap the step: the
                pipeline prefetches), and the step's wait for its next batch

and places: the encoder's and the decoder's time loops, forward and backward
(gradient), and everything outside the loops.
"""

from __future__ import annotations

import collections
import glob
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app
from absl import flags as absl_flags
from training_setup import compiled_model_and_data

from nmt_tf import flags as nmt_flags
from nmt_tf.core.hardware import choose_training_kernels, training_kernels, vector_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
absl_flags.DEFINE_enum("mode", "train", ["train", "search"], "Profile training updates or a beam search.")
absl_flags.DEFINE_integer("untimed_steps", 30, "Updates (or searches) before the trace starts.")
absl_flags.DEFINE_integer("profile_steps", 10, "Updates (or searches) traced.")
absl_flags.DEFINE_integer("search_sentences", 64, "--mode=search: sentences per batch (test 2016, file order).")
absl_flags.DEFINE_string("source", os.path.join(REPO, "data/multi30k/test_2016_flickr.en.gz"),
                         "--mode=search: sentences to translate.")
absl_flags.DEFINE_boolean("as_exported", True, "--mode=search: freeze the step matrices and the token products "
                          "first, as nmt_tf.export does by default (--noas_exported: the in-process search of "
                          "nmt_tf.evaluate --model_dir).")
absl_flags.DEFINE_string("logdir", None, "Keep the trace here (TensorBoard --logdir) instead of a temporary folder.")

MATMUL = ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "_MklMatMul", "_MklBatchMatMulV2",
          "_MklNativeFusedMatMul", "_FusedMatMul", "_MklFusedMatMul", "Einsum")
LOOP = ("TensorListPushBack", "TensorListPopBack", "TensorListGetItem", "TensorListSetItem",
        "TensorListFromTensor", "TensorListStack", "TensorListReserve", "TensorListLength",
        "TensorListElementShape", "TensorArrayV3", "TensorArrayWriteV3", "TensorArrayReadV3",
        "TensorArrayGatherV3", "TensorArrayScatterV3", "Enter", "Exit", "Merge", "Switch",
        "NextIteration", "LoopCond", "Less", "LogicalAnd", "While", "StatelessWhile")


def classify(name: str) -> tuple[str, str]:
    """(kind, place) of one op event named "<scope>/<op name>:<op type>"."""
    path, op_type = name.rsplit(":", 1)
    backward = "gradient_tape" in path or "_grad" in path
    if "while" in path and "decoder" in path:
        place = "decoder loop"
    elif "while" in path and "encoder" in path:
        place = "encoder loop"
    elif "while" in path:
        place = "search loop" if FLAGS.mode == "search" else "other loop"
    else:
        place = "outside the loops"
    if FLAGS.mode == "train":
        place = ("backward, " if backward else "forward, ") + place
    if op_type in MATMUL:
        kind = "matmul"
    elif op_type in LOOP or op_type.startswith("TensorList"):
        kind = "loop control"
    elif "/attention" in path or "attention/" in path:
        kind = "attention"
    elif "SoftmaxCrossEntropy" in op_type or "token_losses" in path:
        kind = "loss"
    elif op_type.startswith("ResourceApply") or "adadelta" in path or "adam" in path or "global_norm" in path \
            or op_type == "L2Loss" or "optimizer" in path or "clip" in path:
        kind = "optimizer"
    else:
        kind = "elementwise"
    return kind, place


FLAGS = absl_flags.FLAGS


def read_trace(logdir: str, steps: int) -> dict:
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    files = glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb"))
    if not files:
        raise SystemExit(f"the profiler wrote no trace into {logdir}")
    space = xplane_pb2.XSpace()
    with open(max(files, key=os.path.getmtime), "rb") as f:
        space.ParseFromString(f.read())
    host = next(p for p in space.planes if p.name == "/host:CPU")
    names = host.event_metadata
    kinds, places, types = collections.Counter(), collections.Counter(), collections.Counter()
    counts = collections.Counter()
    input_ms = executor_ms = 0.0
    for line in host.lines:
        pipeline = line.name.startswith("tf_data")
        for event in line.events:
            name = names[event.metadata_id].name
            ms = event.duration_ps / 1e9
            if name.startswith("IteratorGetNextOp::DoCompute"):
                input_ms += ms                                   # the step waiting for its batch
            if name == "ExecutorState::Process" and line.name.startswith("tf_Compute"):
                executor_ms += ms                                # ops and the executor's work around them
            if ":" not in name or name.startswith(("Executor", "Iterator", "Threadpool")):
                continue
            if pipeline:
                input_ms += ms
                continue
            if not line.name.startswith("tf_Compute"):
                continue
            kind, place = classify(name)
            kinds[kind] += ms
            places[place] += ms
            op_type = name.rsplit(":", 1)[1]
            types[op_type] += ms
            counts[op_type] += 1
    total = sum(kinds.values())
    per_step = lambda ms: round(ms / steps, 2)
    share = lambda ms: round(100 * ms / total, 1) if total else 0.0
    kinds["input"] = input_ms
    return {
        "op_ms_per_step": per_step(total),
        # The executor's own time between and around the ops it runs
        # (scheduling, bookkeeping of the graph's edges), not in op_ms.
        "executor_overhead_ms_per_step": per_step(max(0.0, executor_ms - total)),
        "by_kind": {k: {"ms": per_step(v), "percent": share(v)} for k, v in kinds.most_common()},
        "by_place": {k: {"ms": per_step(v), "percent": share(v)} for k, v in places.most_common()},
        "top_op_types": [{"op": k, "ms": per_step(v), "percent": share(v), "per_step": round(counts[k] / steps, 1)}
                         for k, v in types.most_common(15)],
    }


def profile_training(config, logdir: str) -> dict:
    import keras
    import tensorflow as tf

    ds, model = compiled_model_and_data(config)
    first, last = FLAGS.untimed_steps, FLAGS.untimed_steps + FLAGS.profile_steps - 1
    timing = {}

    class Trace(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == first:
                tf.profiler.experimental.start(logdir)
                timing["start"] = time.perf_counter()
                timing["tokens"] = 0.0

        def on_train_batch_end(self, batch, logs=None):
            if first <= batch <= last:
                timing["tokens"] += float(logs["batch_tokens"])
            if batch == last:
                timing["seconds"] = time.perf_counter() - timing["start"]
                tf.profiler.experimental.stop()

    model.fit(ds.repeat(), steps_per_epoch=last + 1, epochs=1, verbose=0, callbacks=[Trace()], shuffle=False)
    report = read_trace(logdir, FLAGS.profile_steps)
    report["wall_ms_per_step"] = round(1000 * timing["seconds"] / FLAGS.profile_steps, 1)
    report["target_tokens_per_sec_while_tracing"] = round(timing["tokens"] / timing["seconds"], 1)
    return report


def profile_search(config, logdir: str, policy: str) -> dict:
    import tensorflow as tf

    from nmt_tf.core.files import read_lines
    from nmt_tf.data import lexicon
    from nmt_tf.data import pipeline as data
    from nmt_tf.inference import restore, search, translation_graph
    from nmt_tf.training import job as training

    if FLAGS.model_dir:
        restored = restore.restore_model(FLAGS.model_dir, log=lambda *a: None, precision=policy)
        model, src_tok, tgt_tok = restored.model, restored.source_tokenizer, restored.target_tokenizer
        origin = f"trained model {FLAGS.model_dir}"
    else:
        with tempfile.TemporaryDirectory() as tmp:
            src_tok, tgt_tok, _ = data.build_vocabularies(config, tmp, log=lambda *a: None)
        model = training.build_model(config, src_tok.vocab_size, tgt_tok.vocab_size)
        origin = "untrained model (hypotheses run to the length limit)"
    if FLAGS.as_exported:
        model.freeze_step_weights()
    options = nmt_flags.search_options()
    # The exported signature's source ids: tokenized, [EOS] appended, padded.
    prepare = translation_graph.TranslationGraph(model, src_tok, tgt_tok, options, max_input_length=FLAGS.max_input_length)
    lines = tf.constant(read_lines(FLAGS.source)[:FLAGS.search_sentences])
    source_ids = prepare._dense(prepare._ids(src_tok, lines)[0])
    lexical = lexicon.for_search(FLAGS.model_dir, model, options) if FLAGS.model_dir else None
    run = tf.function(lambda ids: search.beam_search(model, ids, options, lexical))
    for _ in range(max(1, FLAGS.untimed_steps // 10)):
        out = run(source_ids)
    tf.profiler.experimental.start(logdir)
    start = time.perf_counter()
    for _ in range(FLAGS.profile_steps):
        out = run(source_ids)
    seconds = time.perf_counter() - start
    tf.profiler.experimental.stop()
    steps = int(tf.shape(out["tokens"])[-1])
    report = read_trace(logdir, FLAGS.profile_steps * steps)
    report["search"] = {"model": origin, "as_exported": FLAGS.as_exported, "sentences": int(lines.shape[0]),
                        "beam_size": options.beam_size, "shortlist_size": options.shortlist_size,
                        "steps_per_search": steps, "wall_ms_per_search": round(1000 * seconds / FLAGS.profile_steps, 1)}
    report["wall_ms_per_step"] = round(1000 * seconds / FLAGS.profile_steps / steps, 2)
    return report


def main(argv):
    if FLAGS.mode == "train":
        choose_training_kernels()   # as nmt_tf.train does, before TensorFlow's import
    import keras
    import tensorflow as tf

    from nmt_tf.core import precision

    config = nmt_flags.config_from_flags()
    keras.utils.set_random_seed(config.seed)
    policy = precision.set_globally(config.mixed_precision)
    logdir = FLAGS.logdir or tempfile.mkdtemp(prefix="profile_step_")
    report = profile_training(config, logdir) if FLAGS.mode == "train" else profile_search(config, logdir, policy)
    report.update({"mode": FLAGS.mode, "profile_steps": FLAGS.profile_steps, "trace": logdir if FLAGS.logdir else None,
                   "mixed_precision": config.mixed_precision, "dtype_policy": policy, "tensorflow": tf.__version__,
                   "cpu_kernels": training_kernels() or os.environ.get("TF_ENABLE_ONEDNN_OPTS", "TensorFlow's default"),
                   "cpu_flags": vector_flags()})
    print(json.dumps(report))


if __name__ == "__main__":
    app.run(main)
