"""Writes a trained model as a versioned SavedModel for TensorFlow Serving.

The library half of nmt_tf.export (whose docstring lists the signatures and
their outputs): `export()` restores the weights, builds the signature graph
(nmt_tf.inference.translation_graph.TranslationGraph), saves it atomically as
<export_dir>/<version>/, and writes the warm-up requests and nmt_tf.json
into its assets.extra/. nmt_tf.presets builds its SavedModels with it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil

from nmt_tf.config import DecodingConfig, ExportConfig
from nmt_tf.core import custom_gradients
from nmt_tf.core.files import WriteFailed, sha256
from nmt_tf.data.lexicon import for_search
from nmt_tf.inference import confidence
from nmt_tf.inference.restore import restore_ensemble
from nmt_tf.inference.saved_models import EXPORT_METADATA, METADATA_FORMAT
from nmt_tf.inference.translation_graph import TranslationGraph, UnkReplacement

WARMUP_SENTENCES = ["A man is walking his dog in the park.", "Two children are playing.", ""]


def next_version(export_dir: str) -> int:
    versions = [int(d) for d in os.listdir(export_dir) if re.fullmatch(r"\d+", d)] if os.path.isdir(export_dir) else []
    return max(versions, default=0) + 1


def write_warmup(saved_model_dir: str, sentences=WARMUP_SENTENCES) -> str:
    """assets.extra/tf_serving_warmup_requests: one PredictionLog for serving_default."""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    extra = os.path.join(saved_model_dir, "assets.extra")
    os.makedirs(extra, exist_ok=True)
    path = os.path.join(extra, "tf_serving_warmup_requests")
    request = predict_pb2.PredictRequest()
    request.model_spec.signature_name = "serving_default"
    request.inputs["text"].CopyFrom(tf.make_tensor_proto(sentences, dtype=tf.string))
    log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
    with tf.io.TFRecordWriter(path) as writer:
        writer.write(log.SerializeToString())
    return path


def metadata(trained, decoding: DecodingConfig, checkpoint: str) -> dict:
    """What a model translates with: languages, tokenizer, architecture (of its
    training configuration `trained`: its --model name and a description for
    people), search settings, input limit, precision
    (of `decoding`) and which weights (`checkpoint`, the path restored):
    nmt_tf.json's core."""
    return {"src_lang": trained.src_lang, "tgt_lang": trained.tgt_lang, "tokenizer": trained.tokenizer,
            "model": trained.model, "architecture": trained.model_config().describe(),
            "search": dataclasses.asdict(decoding.search),
            "max_input_length": decoding.max_input_length, "checkpoint": checkpoint, "precision": decoding.precision}


def write_metadata(saved_model_dir: str, model_dirs: list[str], trained, decoding: DecodingConfig,
                   checkpoint: str) -> None:
    """assets.extra/nmt_tf.json (`metadata`, the model directories and [UNK]
    replacement) and the training word shortlists (of the first model), for
    nmt_tf.evaluate / visualize on the export. The model directories and the
    checkpoint are recorded relative to the version directory."""
    from nmt_tf.data import pipeline as data

    model_dir = model_dirs[0]
    extra = os.path.join(saved_model_dir, "assets.extra")
    os.makedirs(extra, exist_ok=True)
    # Paths relative to the version directory: a build folder or a checkout can move (or be another machine's).
    relative = lambda path: os.path.relpath(os.path.abspath(path), os.path.abspath(saved_model_dir))
    meta = {"format_version": METADATA_FORMAT,
            **metadata(trained, decoding, relative(checkpoint) if os.path.isabs(checkpoint) else checkpoint),
            "model_dirs": [relative(d) for d in model_dirs], "replace_unk": decoding.replace_unk,
            "max_beam_size": max(getattr(decoding, "max_beam_size", 0), decoding.search.beam_size),
            "unk_dictionary": decoding.unk_dictionary if decoding.replace_unk else None,
            "asset_sha256": asset_digests(saved_model_dir)}
    with open(os.path.join(extra, EXPORT_METADATA), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2)
    for path in data.word_shortlist_paths(model_dir):
        if os.path.exists(path):
            shutil.copy(path, os.path.join(extra, os.path.basename(path)))


def asset_digests(saved_model_dir: str) -> dict:
    """{file under assets/: SHA-256}: what the graph was saved with (vocabularies,
    SentencePiece models). A server checks them before it serves a version
    (nmt_tf.serving.versions.check_assets)."""
    assets = os.path.join(saved_model_dir, "assets")
    digests = {}
    for root, _, names in os.walk(assets):
        for name in sorted(names):
            path = os.path.join(root, name)
            digests[os.path.relpath(path, assets)] = sha256(path)
    return digests


def remove_stale_temporaries(export_dir: str, log=print) -> list[str]:
    """Removes the `.tmp-<version>-<pid>` folders of exports whose process is
    gone (killed before its rename); an export still running keeps its own.
    Returns the removed paths."""
    removed = []
    for name in sorted(os.listdir(export_dir)):
        match = re.fullmatch(r"\.tmp-\d+-(\d+)", name)
        if not match or _process_alive(int(match.group(1))):
            continue
        path = os.path.join(export_dir, name)
        shutil.rmtree(path, ignore_errors=True)
        log(f"Removed {path}, left by an export that did not finish.")
        removed.append(path)
    return removed


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:      # someone else's process
        return True
    return True


def _remove_new(tmp: str, export_dir: str | None) -> None:
    """A failed export's temporary folder, and `export_dir` if it made it and it is empty."""
    shutil.rmtree(tmp, ignore_errors=True)
    if export_dir:
        try:
            os.rmdir(export_dir)
        except OSError:        # not empty (another export's version appeared): kept
            pass


def export(model_dir, export_dir: str, config: ExportConfig | None = None, version: int = 0, log=print) -> str:
    """Writes export_dir/<version>/ (the next free version unless `version`)
    atomically; returns its path.

    `model_dir`: a model directory, or a list of several (an ensemble).
    `config`: a `nmt_tf.config.ExportConfig` (default: its defaults): which
    weights, the search, the longest input, [UNK] replacement, the Keras
    dtype policy the SavedModel computes in ("mixed_bfloat16": bfloat16
    arithmetic, and its frozen step matrices stored in bfloat16), and
    whether a search step's matrices are frozen (`freeze_step_weights`,
    `freeze_token_products`: see `Seq2SeqModel.freeze_step_weights`).
    The graphs traced for it are let go of when it returns
    (`nmt_tf.core.custom_gradients`)."""
    with custom_gradients.released():
        return _export(model_dir, export_dir, config, version, log)


def graph_confidence(model_dirs: list, log):
    """The model directory's confidence calibrator as TF ops (a `confidence`
    output), or None: when it has none, or for an ensemble (a calibrator
    fitted on one model's signals does not describe several)."""
    found = confidence.find(model_dirs[0])
    if found is None:
        return None
    if len(model_dirs) > 1:
        log(f"{confidence.path_in(model_dirs[0])} is left out: it was fitted on one model, not this ensemble")
        return None
    return confidence.GraphConfidence(found)


def _export(model_dir, export_dir: str, config: ExportConfig | None, version: int, log) -> str:
    import tensorflow as tf

    config = ExportConfig() if config is None else config
    if not isinstance(config, ExportConfig):
        raise TypeError(f"config: an ExportConfig, not {type(config).__name__} (the search options go in as "
                        "ExportConfig(SearchOptions(...)))")
    options = config.search
    model_dirs = [model_dir] if isinstance(model_dir, str) else list(model_dir)
    version = version or next_version(export_dir)
    final = os.path.join(export_dir, str(version))
    if os.path.exists(final):     # before the (slow) restore
        raise FileExistsError(f"{final} already exists; choose another --version")
    unk_replacement = UnkReplacement.of(config)     # checks the dictionary before the restore, too
    model, src_tok, tgt_tok, trained, checkpoint_path = restore_ensemble(model_dirs, config.weights, log=log,
                                                                         precision=config.precision)
    created = not os.path.isdir(export_dir)         # a failed first export leaves no empty folder behind
    os.makedirs(export_dir, exist_ok=True)
    remove_stale_temporaries(export_dir, log)
    tmp = os.path.join(export_dir, f".tmp-{version}-{os.getpid()}")
    shortlist = for_search(model_dirs[0], model, options)
    # A shortlist's search gathers its output columns itself: the whole layer's blocks are not stored.
    step_weights = (model.freeze_step_weights(config.freeze_token_products, output_layer=shortlist is None)
                    if config.freeze_step_weights else [])
    module = TranslationGraph(model, src_tok, tgt_tok, options, config.max_input_length, unk_replacement,
                              shortlist, graph_confidence(model_dirs, log), config.max_beam_size).module()
    module.step_weights = step_weights
    # The tf.functions, not concrete functions: tf.saved_model.save traces them in its own context,
    # where a function traced before would be traced again (the save's variable policy is part of the
    # tracing key), so each is traced once.
    signatures = {"serving_default": module.translate, "translate": module.translate, "score": module.score,
                  "translate_with_options": module.translate_with_options}
    if shortlist is None:      # forced tokens need the whole output layer, which a shortlist's export leaves out
        signatures["translate_constrained"] = module.translate_constrained
    try:
        tf.saved_model.save(module, tmp, signatures=signatures)
        write_warmup(tmp)
        write_metadata(tmp, model_dirs, trained, config, checkpoint_path)
        os.rename(tmp, final)
    except (tf.errors.OpError, OSError) as e:      # a full disk: no version appears, none is damaged
        _remove_new(tmp, export_dir if created else None)
        raise WriteFailed(final, e, kept="no new version was made; the existing versions are unchanged") from e
    except BaseException:
        _remove_new(tmp, export_dir if created else None)
        raise
    log(f"Exported {final} (beam {options.beam_size}, n-best {options.n_best}"
        f"{f', requests may ask for beams up to {config.max_beam_size}' if config.max_beam_size > options.beam_size else ''}"
        f"{f', shortlist of {options.shortlist_size}, no translate_constrained' if shortlist is not None else ''}"
        f"{'' if config.precision == 'float32' else f', {config.precision}'}"
        f"{f', an ensemble of {len(model_dirs)} models' if len(model_dirs) > 1 else ''}).\n"
        f"  saved_model_cli show --dir {final} --all\n"
        f"  python -m nmt_tf.translate --saved_model={final} < input.txt")
    return final
