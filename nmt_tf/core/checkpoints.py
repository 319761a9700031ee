"""The checkpoints of a model directory: where they are, the best ones, averaging.

    <model_dir>/checkpoints/   the last --keep_checkpoints checkpoints of training
                               (weights, optimizer, training state): ckpt-<step>
    <model_dir>/best/          the --keep_best_checkpoints weights with the best
                               dev scores: best-<step>, ranked in best/scores.json
    <model_dir>/averaged/      written by nmt_tf.average: averaged-<step>
    <model_dir>/damaged/       checkpoints that could not be read whole, moved
                               aside by a resume (`newest_intact`), never deleted

Checkpoint averaging (Junczys-Dowmunt et al. 2016; Vaswani et al. 2017) takes
the element-wise mean of every model weight over N checkpoints of one run,
which usually translates a little better than any one of them: the last N
regular checkpoints, or the N best by the dev metric. Only model weights are
averaged (no optimizer state), so the result is for translation, not for
resuming training.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import numpy as np
import tensorflow as tf

from nmt_tf.core.files import WriteFailed, write_atomically
from nmt_tf.core.model_dir import AVERAGED, BEST, CHECKPOINTS, DAMAGED

SCORES = "scores.json"


@dataclasses.dataclass(frozen=True)
class WeightsChoice:
    """Which weights of a model directory to use: `checkpoint` (best, last,
    averaged or a path), or with `average` > 1 the mean of the `average` best
    or last checkpoints (`average_from`)."""

    checkpoint: str = BEST
    average: int = 1
    average_from: str = BEST

    def __post_init__(self):
        if self.average < 1:
            raise ValueError(f"average must be >= 1, got {self.average}")
        if self.average_from not in (BEST, "last"):
            raise ValueError(f"average_from must be 'best' or 'last', got {self.average_from!r}")


def checkpoints_dir(model_dir: str) -> str:
    return os.path.join(model_dir, CHECKPOINTS)


def best_dir(model_dir: str) -> str:
    return os.path.join(model_dir, BEST)


def averaged_dir(model_dir: str) -> str:
    return os.path.join(model_dir, AVERAGED)


def _remove_checkpoint(prefix: str) -> None:
    """The files of checkpoint `prefix`, and TensorFlow's `<prefix>_temp*`
    folder that a failed save may have left."""
    for path in tf.io.gfile.glob(prefix + ".*") + tf.io.gfile.glob(prefix + "_temp*"):
        try:
            if tf.io.gfile.isdir(path):
                tf.io.gfile.rmtree(path)
            else:
                tf.io.gfile.remove(path)
        except tf.errors.OpError:
            pass


def save_checkpoint(manager: tf.train.CheckpointManager, step: int, name: str = "ckpt") -> str:
    """`manager.save(checkpoint_number=step)`; when that fails (a full disk:
    ResourceExhausted / ENOSPC) its partial files are removed and WriteFailed
    names the checkpoint. The state file is only rewritten after a whole save,
    so the previous checkpoints stay usable."""
    prefix = os.path.join(manager.directory, f"{name}-{step}")
    try:
        return manager.save(checkpoint_number=step)
    except (tf.errors.OpError, OSError) as e:
        _remove_checkpoint(prefix)
        raise WriteFailed(prefix, e, kept=f"the previous checkpoint {manager.latest_checkpoint or '(none)'} "
                                          "is intact") from e


class BestCheckpoints:
    """Keeps the `keep` checkpoints of `checkpoint` with the highest dev scores
    in `directory`, ranked in `scores.json` ([{"path", "step", "score"}], best
    first; paths relative to `directory`). TensorFlow's `checkpoint` state file
    names the best one, so `tf.train.latest_checkpoint(directory)` is the best
    checkpoint, as it was when only one was kept.

    Args:
      checkpoint: a `tf.train.Checkpoint` of the model.
      directory: `best_dir(model_dir)`.
      keep: how many to keep.
      higher_is_better: False for a loss.
    """

    def __init__(self, checkpoint: tf.train.Checkpoint, directory: str, keep: int = 1,
                 higher_is_better: bool = True):
        self.checkpoint = checkpoint
        self.directory = directory
        self.keep = keep
        self.sign = 1.0 if higher_is_better else -1.0
        self.ranking = read_ranking(directory)

    def would_keep(self, score: float) -> bool:
        return len(self.ranking) < self.keep or self.sign * score > self.sign * self.ranking[-1]["score"]

    def save(self, step: int, score: float) -> bool:
        """Saves the model as best-<step> if `score` is among the `keep` best;
        drops the checkpoint that falls out. Returns whether it was kept."""
        if not self.would_keep(score):
            return False
        tf.io.gfile.makedirs(self.directory)
        name = f"best-{step}"
        prefix = os.path.join(self.directory, name)
        try:
            self.checkpoint.write(prefix)
        except (tf.errors.OpError, OSError) as e:
            _remove_checkpoint(prefix)
            raise WriteFailed(prefix, e, kept="best/ keeps its previous checkpoints") from e
        ranking = [r for r in self.ranking if r["path"] != name] + [{"path": name, "step": step, "score": score}]
        ranking.sort(key=lambda r: (-self.sign * r["score"], -r["step"]))
        for dropped in ranking[self.keep:]:
            _remove_checkpoint(os.path.join(self.directory, dropped["path"]))
        self.ranking = ranking[:self.keep]
        write_atomically(os.path.join(self.directory, SCORES), json.dumps(self.ranking, indent=1))
        write_state(self.directory, [r["path"] for r in self.ranking])
        return True


def write_state(directory: str, names: list[str]) -> None:
    """TensorFlow's `checkpoint` state file of `directory`, naming `names[0]`
    as the checkpoint to use (what tf.train.latest_checkpoint returns) and
    listing all `names` (checkpoint prefixes inside `directory`)."""
    listed = list(reversed(names))              # the chosen one last
    # Timestamps (each file's, made increasing): a tf.train.CheckpointManager
    # opened on the directory prunes only the checkpoints its state file dates,
    # so without them a resumed run after a fallback kept every older
    # checkpoint beyond --keep_checkpoints.
    stamps, last = [], 0.0
    for name in listed:
        try:
            stamp = os.path.getmtime(os.path.join(directory, name + ".index"))
        except OSError:
            stamp = time.time()
        last = max(stamp, last + 1e-3)
        stamps.append(last)
    lines = [f'model_checkpoint_path: "{names[0]}"']
    lines += [f'all_model_checkpoint_paths: "{name}"' for name in listed]
    lines += [f"all_model_checkpoint_timestamps: {stamp:.6f}" for stamp in stamps]
    write_atomically(os.path.join(directory, "checkpoint"), "\n".join(lines) + "\n")


def read_ranking(directory: str) -> list[dict]:
    """The ranking of `BestCheckpoints` in `directory`, best first. A best/
    written before rankings existed holds one checkpoint: it alone, unscored."""
    path = os.path.join(directory, SCORES)
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    latest = tf.train.latest_checkpoint(directory) if os.path.isdir(directory) else None
    if latest is None:
        return []
    name = os.path.basename(latest)
    return [{"path": name, "step": int(name.rsplit("-", 1)[-1]), "score": None}]


def checkpoint_paths(model_dir: str, source: str, count: int) -> list[str]:
    """Up to `count` checkpoint paths of `model_dir`: source "last" (the newest
    regular checkpoints, newest first) or "best" (by dev score, best first).
    Raises FileNotFoundError when there is none."""
    if source == "last":
        # get_checkpoint_state joins relative names to the directory itself
        # (joining again broke a relative --model_dir: runs/m/checkpoints/runs/m/...).
        state = tf.train.get_checkpoint_state(checkpoints_dir(model_dir))
        paths = list(reversed(state.all_model_checkpoint_paths)) if state else []
    elif source == "best":
        paths = [os.path.join(best_dir(model_dir), r["path"]) for r in read_ranking(best_dir(model_dir))]
    else:
        raise ValueError(f"checkpoints come from 'last' or 'best', not {source!r}")
    if not paths:
        raise FileNotFoundError(f"no {source} checkpoint in {model_dir} (train first)")
    return paths[:count]


def resolve(model_dir: str, checkpoint: str) -> str:
    """The checkpoint path that --checkpoint names: best (falls back to last),
    last, averaged, or a path."""
    if checkpoint not in (BEST, "last", AVERAGED):
        return checkpoint
    if checkpoint == AVERAGED:
        path = tf.train.latest_checkpoint(averaged_dir(model_dir))
        if path is None:
            raise FileNotFoundError(f"no averaged checkpoint in {model_dir} (run nmt_tf.average first)")
        return path
    path = tf.train.latest_checkpoint(best_dir(model_dir)) if checkpoint == BEST else None
    path = path or tf.train.latest_checkpoint(checkpoints_dir(model_dir))
    if path is None:
        raise FileNotFoundError(f"no checkpoint in {model_dir} (train first)")
    return path


class NoIntactCheckpointError(RuntimeError):
    """A model directory holds checkpoints, but none can be read whole."""


def damage(path: str) -> str | None:
    """What is wrong with checkpoint `path` (a prefix), or None when its index
    and every tensor it lists can be read (a file cut short, a bad sector or
    a half-written copy fail here, not half-way through a restore)."""
    try:
        reader = tf.train.load_checkpoint(path)
        for key in reader.get_variable_to_shape_map():
            reader.get_tensor(key)
    except Exception as e:      # tf.errors.OpError, IndexError ("Read less bytes than requested"), ...
        return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else 'unreadable'}"
    return None


def _step_of(prefix: str) -> int:
    try:
        return int(prefix.rsplit("-", 1)[-1])
    except ValueError:
        return -1


def _move_aside(prefix: str, model_dir: str) -> str:
    """Moves the files of checkpoint `prefix` into <model_dir>/damaged/<dir>-<name>.*
    (<dir>-<name>~2.*, ~3, ... when an earlier damaged copy has that name: none
    is ever overwritten); returns that prefix."""
    target_dir = os.path.join(model_dir, DAMAGED)
    tf.io.gfile.makedirs(target_dir)
    base = os.path.join(target_dir, f"{os.path.basename(os.path.dirname(prefix))}-{os.path.basename(prefix)}")
    target, copy = base, 1
    while tf.io.gfile.glob(target + ".*"):
        copy += 1
        target = f"{base}~{copy}"
    for path in tf.io.gfile.glob(prefix + ".*"):
        tf.io.gfile.rename(path, target + path[len(prefix):], overwrite=False)
    return target


def remove_unfinished_saves(model_dir: str, log=print) -> list[str]:
    """Removes the `<name>-<step>_temp*` folders that TensorFlow writes a
    checkpoint into before renaming it, left in checkpoints/ and best/ by a
    run killed while saving (kill -9, power loss); returns their paths. Only
    for the run that is about to write there (the chief): it is the only
    writer, so no save is in progress."""
    removed = []
    for directory in (checkpoints_dir(model_dir), best_dir(model_dir)):
        for path in sorted(tf.io.gfile.glob(os.path.join(directory, "*_temp*"))):
            if tf.io.gfile.isdir(path):
                tf.io.gfile.rmtree(path)
                log(f"Removed {path}, left by a checkpoint save that did not finish.")
                removed.append(path)
    return removed


def newest_intact(model_dir: str, log=print) -> tuple[str | None, str | None]:
    """The checkpoint a resumed run restores: the newest regular checkpoint
    that reads whole (`damage`), else the best intact one of best/ (the
    model with its optimizer, which Keras tracks as `model.optimizer`, but
    not the training counters). Damaged ones are reported, moved to <model_dir>/damaged/
    and dropped from their directory's state file (and best/'s ranking).

    Returns (path, "last" or "best"), or (None, None) when the directory has
    no checkpoint at all. Raises NoIntactCheckpointError when it has some but
    none is intact."""
    regular_dir, best = checkpoints_dir(model_dir), best_dir(model_dir)
    # Listed from the files, not the state file, which may be the damaged part.
    regular = sorted((p[:-len(".index")] for p in tf.io.gfile.glob(os.path.join(regular_dir, "ckpt-*.index"))),
                     key=_step_of, reverse=True)
    ranking = read_ranking(best) if os.path.isdir(best) else []
    damaged = []

    def check(path):
        problem = damage(path)
        if problem is None:
            return True
        moved = _move_aside(path, model_dir)
        log(f"warning: checkpoint {path} is damaged ({problem}); its files were moved to {moved}.*")
        damaged.append(path)
        return False

    for i, path in enumerate(regular):
        if check(path):
            if i:
                write_state(regular_dir, [os.path.basename(p) for p in regular[i:]])
                log(f"Falling back to {path}, the newest intact checkpoint.")
            return path, "last"
    state_file = os.path.join(regular_dir, "checkpoint")
    if regular and tf.io.gfile.exists(state_file):      # it names only damaged checkpoints now
        tf.io.gfile.remove(state_file)
    for i, entry in enumerate(ranking):
        path = os.path.join(best, entry["path"])
        if check(path):
            if i:
                kept = ranking[i:]
                write_atomically(os.path.join(best, SCORES), json.dumps(kept, indent=1))
                write_state(best, [r["path"] for r in kept])
            log(f"Falling back to {path}, the best intact checkpoint of best/.")
            return path, "best"
    if damaged:
        raise NoIntactCheckpointError(
            f"{model_dir} holds no intact checkpoint: {', '.join(damaged)} could not be read (moved to "
            f"{os.path.join(model_dir, DAMAGED)}). Start again in a new --model_dir, or copy an intact "
            f"checkpoint back.")
    return None, None


class DamagedCheckpointError(OSError):
    """A checkpoint's files cannot be read whole."""


def read_weights(model, path: str) -> None:
    """Sets the weights of `model` (built) from the checkpoint `path` (a
    training or weights-only one); every model weight must be in it. Raises
    DamagedCheckpointError (naming `path`) when its files cannot be read."""
    try:
        status = tf.train.Checkpoint(model=model).read(path)
    except (tf.errors.OpError, IndexError, ValueError) as e:     # cut short, bad sector, missing data file
        raise DamagedCheckpointError(
            f"checkpoint {path} cannot be read ({damage(path) or type(e).__name__}); choose other weights "
            "(--checkpoint=last or a path), or resume training, which moves damaged checkpoints aside") from e
    status.expect_partial().assert_existing_objects_matched()


# The name under which a training checkpoint holds the model's dropout random
# states (`Seq2SeqModel.dropout_random_states`), a list: <name>/0, <name>/1, ...
DROPOUT_RANDOM_STATES = "dropout_random_states"


def read_dropout_random_states(states: list, path: str) -> int:
    """Sets `states` (a model's dropout random states) from the training
    checkpoint `path` when it holds as many; returns how many it holds (0 for
    a checkpoint written before nmt_tf kept them, 2026-12-02). Otherwise the
    states keep their values, and the masks drawn from there on are not
    those an uninterrupted run would draw."""
    prefix = f"{DROPOUT_RANDOM_STATES}/"
    saved = sum(1 for name, _ in tf.train.list_variables(path) if name.startswith(prefix))
    if saved and saved == len(states):
        tf.train.Checkpoint(**{DROPOUT_RANDOM_STATES: states}).read(path).expect_partial() \
            .assert_existing_objects_matched()
    return saved


def average_into(model, paths: list[str]) -> None:
    """Sets every weight of `model` (built) to its mean over the checkpoints
    `paths` (each must hold all of the model's weights)."""
    if not paths:
        raise ValueError("nothing to average")
    sums = None
    for path in paths:
        read_weights(model, path)
        values = [np.asarray(v.numpy(), np.float64) for v in model.variables]
        sums = values if sums is None else [s + v for s, v in zip(sums, values)]
    for variable, total in zip(model.variables, sums):
        variable.assign((total / len(paths)).astype(variable.dtype))
