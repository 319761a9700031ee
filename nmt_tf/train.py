r"""Trains a translation model with Keras `model.fit`.

Usage:
  python -m nmt_tf.train --flagfile=pipelines/multi30k_en_fr/rnnsearch.flags [--flag=value ...]
  python -m nmt_tf.train --model_dir=DIR          # resume with the flags stored in DIR
  python -m nmt_tf.train --flagfile=F --dry_run   # model summary and parameter count only
  python -m nmt_tf.train --init_from=multi30k_en_fr --train_src=S --train_tgt=T --model_dir=NEW   # fine-tune

Flags after --flagfile override the file. Rerunning with an existing
--model_dir resumes from its last checkpoint with the same vocabularies and
flags (flags not given on the command line are taken from DIR/config.json;
flags that define the model cannot change). A run killed at any moment loses
at most --checkpoint_every_steps updates; SIGINT / SIGTERM stop after the
current update and save a checkpoint.

Exit codes: 0 training finished (max_epochs, max_steps, max_hours or early
stopping); 1 a user error (one line on stderr); 3 the loss became NaN; 4 the
model directory has checkpoints but none can be read whole (a damaged
checkpoint is otherwise moved to DIR/damaged/ and the run resumes from the
newest intact one, or from the best intact one of best/); 5 a file could not
be written (a full disk; the message names it, and the previous checkpoint is
intact); 6 --distribution=multi_worker: another worker of the job stopped
(start every worker again with the same command to resume);
130 / 143 stopped by SIGINT / SIGTERM after saving a checkpoint (128 + the
signal's number; rerun the same command to resume).

Outputs in --model_dir:
  config.json, flags.txt    resolved settings (flags.txt is a flagfile; a run
                            from before config.json has flags.json)
  model_config.json         the model's Keras config (sizes, vocabularies)
  vocab.src.txt, vocab.tgt.txt
  corpus_stats.json         what validation found (counts of skipped lines)
  checkpoints/              the last --keep_checkpoints checkpoints
  best/                     the --keep_best_checkpoints weights with the best dev scores (scores.json)
  damaged/                  checkpoints a resume could not read whole, moved aside
  logs/train, logs/dev      TensorBoard
  train_summary.json        steps, epochs, time, train / dev NLL, tokens/s, weights' SHA-256
  prepared/                 --prepared_shards: the training corpus tokenized into TFRecord shards
  workers/worker_<i>/       --distribution=multi_worker: what the other workers write

--init_from starts a new run from a trained model's weights and
vocabularies (fine-tuning; nmt_tf/training/fine_tune.py), --freeze keeps parts fixed.

--distribution=mirrored / multi_worker trains under tf.distribute
(nmt_tf/training/distribution.py); --batch_size stays the global batch.

This tool parses the flags and calls nmt_tf/training/job.py, which trains from
Python without flags.
"""

from __future__ import annotations

import re
import signal

from absl import app

from nmt_tf import flags as nmt_flags
from nmt_tf.config import ConfigError
from nmt_tf.core.files import WriteFailed
from nmt_tf.core.hardware import choose_training_kernels
from nmt_tf.training import distribution, fine_tune
from nmt_tf.training.job import NaNLossError, TrainingError, dry_run, train

EXIT_NAN = 3
EXIT_NO_INTACT_CHECKPOINT = 4
EXIT_WRITE_FAILED = 5
EXIT_WORKER_LOST = 6
TOOL_FLAGS = nmt_flags.tool_flags(__name__, nmt_flags.TRAINING_FLAGS)


def interrupted_exit_code(signal_name: str) -> int:
    """Exit code of a run stopped by SIGINT / SIGTERM (after its checkpoint):
    128 + the signal's number, as a shell reports a process the signal ended
    (130, 143), so that a scheduler sees that training did not finish."""
    return 128 + signal.Signals[signal_name].value


def main(argv):
    nmt_flags.start_cli(argv, accepts=TOOL_FLAGS)
    choose_training_kernels()   # before TensorFlow's import: it reads the choice then
    from nmt_tf.core.checkpoints import NoIntactCheckpointError
    from nmt_tf.data.pipeline import CorpusError  # imports TensorFlow: after start_cli

    try:
        config = nmt_flags.config_from_flags()
    except ConfigError as e:
        return nmt_flags.user_error(e)
    try:
        if config.dry_run:
            if config.init_from:       # the model fine-tuning would build: the source's
                try:
                    config = fine_tune.merge(config, fine_tune.source(config.init_from, config.init_checkpoint).config,
                                             nmt_flags.explicitly_set(), config.init_from)
                except (fine_tune.FineTuneError, ConfigError) as e:
                    raise TrainingError(str(e)) from None
            dry_run(config)
            return 0
        summary = train(config, explicit=nmt_flags.explicitly_set())
    except NaNLossError as e:
        return nmt_flags.user_error(e, EXIT_NAN)
    except NoIntactCheckpointError as e:
        return nmt_flags.user_error(e, EXIT_NO_INTACT_CHECKPOINT)
    except WriteFailed as e:
        return nmt_flags.user_error(f"{e}. {e.remedy} and rerun the same command to resume.", EXIT_WRITE_FAILED)
    except (TrainingError, CorpusError, FileNotFoundError) as e:
        return nmt_flags.user_error(e)
    except Exception as e:
        if config.distribution != "multi_worker" or not distribution.lost_worker(e):
            raise
        reason = re.sub(r"\{\{[^}]*\}\}\s*", "", str(e)).strip().splitlines()
        return nmt_flags.user_error(
            f"the multi-worker job lost a worker, so this one stopped too ({type(e).__name__}: "
            f"{' '.join(line.strip() for line in reason[:2])}). Start every worker again with the same "
            "command: training resumes from the last checkpoint in --model_dir.", EXIT_WORKER_LOST)
    if summary["status"] == "interrupted":
        return interrupted_exit_code(summary["signal"])
    return 0


if __name__ == "__main__":
    app.run(main)
