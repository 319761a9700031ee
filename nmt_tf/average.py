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

from absl import app
from absl import flags as absl_flags

from nmt_tf import flags as nmt_flags
from nmt_tf.inference.restore import write_averaged

TOOL_FLAGS = nmt_flags.tool_flags(__name__, ("model_dir", "average_checkpoints", "average_from"))


def main(argv):
    nmt_flags.start_cli(argv, accepts=TOOL_FLAGS)
    FLAGS = absl_flags.FLAGS
    if not FLAGS.model_dir:
        return nmt_flags.user_error("--model_dir is required.")
    try:
        write_averaged(FLAGS.model_dir, FLAGS.average_checkpoints, FLAGS.average_from)
    except (OSError, ValueError) as e:      # FileNotFoundError, WriteFailed (a full disk), ...
        return nmt_flags.user_error(e)
    return 0


if __name__ == "__main__":
    app.run(main)
