r"""Averages the weights of several checkpoints of a model directory into one.

Usage:
  python -m nmt_tf.average --model_dir=runs/m30k --average_checkpoints=4 [--average_from=best|last]

Writes <model_dir>/averaged/averaged-<step> (step: the newest of the
averaged checkpoints) and averaged/sources.json (which checkpoints, their dev
scores); later tools use it with --checkpoint=averaged, e.g.

  python -m nmt_tf.export --model_dir=runs/m30k --checkpoint=averaged --export_dir=exports/nmt

--average_from=best takes the best checkpoints by the dev metric (best/,
as many as training kept with --keep_best_checkpoints); last takes the newest
regular ones (checkpoints/, --keep_checkpoints). Only the model's weights are
averaged, not the optimizer's state: the result translates, it does not
resume training. (export, evaluate and visualize can also average on the
fly with the same flags.)
"""

from __future__ import annotations

import json
import os

from absl import app
from absl import flags as absl_flags

from nmt_tf import flags as nmt_flags
from nmt_tf.files import write_atomically
from nmt_tf.restore import restore_model

TOOL_FLAGS = nmt_flags.tool_flags(__name__, ("model_dir", "average_checkpoints", "average_from"))


def average(model_dir: str, count: int, source: str = "best", log=print) -> str:
    """Writes the mean of `count` checkpoints of `source` (best or last) to
    `<model_dir>/averaged/`; returns the checkpoint path."""
    import tensorflow as tf

    from nmt_tf import checkpoints

    if count < 2:
        raise ValueError("--average_checkpoints must be at least 2 to average anything.")
    restored = restore_model(model_dir, checkpoints.WeightsChoice(average=count, average_from=source), log=log)
    paths = checkpoints.checkpoint_paths(model_dir, source, count)
    step = max(int(os.path.basename(p).rsplit("-", 1)[-1]) for p in paths)
    out_dir = checkpoints.averaged_dir(model_dir)
    os.makedirs(out_dir, exist_ok=True)
    for old in tf.io.gfile.glob(os.path.join(out_dir, "averaged-*")):      # one averaged model at a time
        tf.io.gfile.remove(old)
    path = tf.train.Checkpoint(model=restored.model).write(os.path.join(out_dir, f"averaged-{step}"))
    checkpoints.write_state(out_dir, [os.path.basename(path)])
    scores = {r["path"]: r["score"] for r in checkpoints.read_ranking(checkpoints.best_dir(model_dir))}
    write_atomically(os.path.join(out_dir, "sources.json"), json.dumps(
        {"from": source, "checkpoints": [{"path": os.path.abspath(p), "dev_score": scores.get(os.path.basename(p))}
                                         for p in paths]}, indent=1))
    log(f"Wrote {path}, the mean of {len(paths)} {source} checkpoints.\n"
        f"  Use it with --checkpoint=averaged, e.g. python -m nmt_tf.export --model_dir={model_dir} "
        "--checkpoint=averaged --export_dir=EXPORT_DIR")
    return path


def main(argv):
    nmt_flags.start_cli(argv, accepts=TOOL_FLAGS)
    FLAGS = absl_flags.FLAGS
    if not FLAGS.model_dir:
        return nmt_flags.user_error("--model_dir is required.")
    try:
        average(FLAGS.model_dir, FLAGS.average_checkpoints, FLAGS.average_from)
    except (OSError, ValueError) as e:      # FileNotFoundError, WriteFailed (a full disk), ...
        return nmt_flags.user_error(e)
    return 0


if __name__ == "__main__":
    app.run(main)
