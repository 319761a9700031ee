"""A trained model directory back as a model: `restore_model` builds the
model its configuration describes, reads the chosen weights (best, last,
averaged, or a checkpoint path) and loads its tokenizers;
`restore_ensemble` restores several as one `nmt_tf.models.Ensemble`;
`write_averaged` writes the mean of several checkpoints as one (what
nmt_tf.average does).
"""

from __future__ import annotations

import json
import os
from typing import Any, NamedTuple

from nmt_tf import config as nmt_config
from nmt_tf.core.files import write_atomically
from nmt_tf.core.precision import dtype_policy
from nmt_tf.models import build_model


class RestoredModel(NamedTuple):
    model: Any
    source_tokenizer: Any
    target_tokenizer: Any
    config: Any
    checkpoint: str        # the checkpoint path the weights came from


def restore_model(model_dir: str, weights="best", log=print, precision: str = "float32") -> RestoredModel:
    """The trained model of `model_dir` with the chosen weights, and its tokenizers.

    `weights`: a `nmt_tf.core.checkpoints.WeightsChoice`, or just the checkpoint
    (best, last, averaged or a path). With averaging, RestoredModel.checkpoint
    says which checkpoints were averaged. `precision`: the Keras dtype policy
    the model computes in (float32 whatever it was trained in, unless asked:
    nmt_tf.flags.search_precision)."""
    from nmt_tf.core import checkpoints
    from nmt_tf.data import pipeline as data

    if isinstance(weights, str):
        weights = checkpoints.WeightsChoice(checkpoint=weights)
    config = nmt_config.load(model_dir)
    source_tokenizer, target_tokenizer = data.load_tokenizers(config, model_dir)
    with dtype_policy(precision):
        model = build_model(config.model_config(), source_tokenizer.vocab_size, target_tokenizer.vocab_size)
    if weights.average > 1:
        paths = checkpoints.checkpoint_paths(model_dir, weights.average_from, weights.average)
        if len(paths) < weights.average:
            log(f"Only {len(paths)} {weights.average_from} checkpoints in {model_dir}, not {weights.average}: "
                "averaging those.")
        checkpoints.average_into(model, paths)
        path = (f"mean of {len(paths)} {weights.average_from} checkpoints "
                f"({', '.join(os.path.basename(p) for p in paths)})")
    else:
        path = checkpoints.resolve(model_dir, weights.checkpoint)
        checkpoints.read_weights(model, path)
    log(f"Loaded {path}")
    return RestoredModel(model, source_tokenizer, target_tokenizer, config, path)


def restore_ensemble(model_dirs: list[str], weights="best", log=print, precision: str = "float32") -> RestoredModel:
    """Several trained models as one `nmt_tf.models.Ensemble` (a single model
    directory gives that model itself). They must share tokenizer, languages
    and vocabularies (the source is tokenized once and the log-probabilities
    of the same target tokens are averaged); the first one's tokenizers and
    flags are returned."""
    from nmt_tf.data import pipeline as data
    from nmt_tf.models.ensemble import Ensemble

    restored = [restore_model(d, weights, log=log, precision=precision) for d in model_dirs]
    if len(restored) == 1:
        return restored[0]
    first = restored[0]
    for model_dir, member in zip(model_dirs[1:], restored[1:]):
        for key in ("tokenizer", "src_lang", "tgt_lang"):
            if getattr(member.config, key) != getattr(first.config, key):
                raise ValueError(f"{model_dir} has --{key}={getattr(member.config, key)}, {model_dirs[0]} has "
                                 f"{getattr(first.config, key)}: ensemble members must share it")
        pairs = ((first.source_tokenizer, member.source_tokenizer), (first.target_tokenizer, member.target_tokenizer))
        for side, path, (a, b) in zip(("source", "target"), data.vocabulary_paths(model_dir), pairs):
            if a.vocabulary != b.vocabulary:
                raise ValueError(f"{path} differs from the {side} vocabulary of {model_dirs[0]}: ensemble "
                                 "members must share their vocabularies")
    return RestoredModel(Ensemble([r.model for r in restored]), first.source_tokenizer, first.target_tokenizer,
                         first.config, "; ".join(f"{d}: {r.checkpoint}" for d, r in zip(model_dirs, restored)))


def write_averaged(model_dir: str, count: int, source: str = "best", log=print) -> str:
    """Writes the mean of `count` checkpoints of `source` (best or last) to
    `<model_dir>/averaged/` (with averaged/sources.json: which checkpoints,
    their dev scores), where --checkpoint=averaged finds it; returns the
    checkpoint path. What nmt_tf.average writes."""
    import tensorflow as tf

    from nmt_tf.core import checkpoints

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
