"""Writes a trained model as a LiteRT model folder (nmt_tf.export --format=litert).

The folder (EXPORT_DIR/<version>/, written atomically as the SavedModel's):

    model.tflite          signatures, LiteRT built-in ops only:
                            encode(source_ids [1, S] int32) -> state [1, d],
                              keys, projected_annotations [1, S, .], bias [1, S]
                            step_k<K>(previous_ids [B, K] int32, state [B, K, d],
                                      keys, projected_annotations, bias [B, S, .])
                              -> log_probs [B, K, V], state [B, K, d], alpha [B, K, S]
                              for K = 1 (greedy, a beam's first step) and the beam size
                          (the model's `search_inputs` and `decode_step`, the
                          step's fused matrices folded into constants)

With tied embeddings (--tied_embeddings=target or all) the matrix E is the
output layer's weights, and a gather table of it would be a second copy in
the file (the converter stores the two apart, differently quantised: 2.5 MB
of the 13.1 MiB int8 Multi30k model). So the steps take the previous words'
embeddings instead of their ids (`previous_embeddings` [B, K, m] float32),
and with `all` the encoder takes the source's too (`source_embeddings`
[1, S, m] beside source_ids, which still gives the padding mask): the host
reads those rows from the output layer's weight tensors in the file, which
the manifest's "host_embeddings" names (found at export by their values).
    sentencepiece.src.model, sentencepiece.tgt.model, vocab.src.txt, vocab.tgt.txt
    nmt_tf_litert.json    the manifest: format and its version, the files,
                          languages, the search settings, the input limit,
                          the weights' storage, the model's card fields

Tokenization, search and detokenization run on the host
(nmt_tf.inference.litert_runtime): the pip wheels of LiteRT carry no Flex delegate, so
the in-graph SentencePiece op and the beam search's loop cannot be in the
model. Only SentencePiece models export (the other tokenizers are not
rebuilt on the host); ensembles stay SavedModel-only.

Weights: "float32"; "float16" (stored in half precision, computed in float32);
"int8" (dynamic-range quantisation: int8 weights, float activations).
Needs TensorFlow's converter; running the folder does not.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import numpy as np

from nmt_tf.config import ExportConfig
from nmt_tf.core import custom_gradients
from nmt_tf.core import model_dir as layout
from nmt_tf.core.files import WriteFailed, sha256
from nmt_tf.core.model_dir import SENTENCEPIECE_MODELS
from nmt_tf.exporting.saved_model import metadata, next_version, remove_stale_temporaries
from nmt_tf.inference import confidence
from nmt_tf.inference.litert_runtime import (FORMAT_VERSION, HOST_EMBEDDING_SIGNATURE, MANIFEST, dequantized,
                                            weight_tensors)
from nmt_tf.inference.restore import restore_model
from nmt_tf.inference.translation_graph import tf_variables

WEIGHT_STORAGE = ("int8", "float16", "float32")
MODEL_FILE = "model.tflite"


def export_litert(model_dir, export_dir: str, config: ExportConfig | None = None, weights: str = "int8",
                  version: int = 0, card: dict | None = None, log=print) -> str:
    """Writes export_dir/<version>/ (the next free version unless `version`)
    atomically; returns its path. `config`: the search settings, the input
    limit and which weights of `model_dir` (its precision must be float32);
    `weights`: their storage (WEIGHT_STORAGE); `card`: model-card fields
    for the manifest (a preset's)."""
    config = ExportConfig() if config is None else config
    model_dirs = [model_dir] if isinstance(model_dir, str) else list(model_dir)
    if len(model_dirs) > 1:
        raise ValueError("an ensemble exports as a SavedModel only (--format=savedmodel); a LiteRT export takes "
                         "one model (average its checkpoints with --average_checkpoints)")
    if weights not in WEIGHT_STORAGE:
        raise ValueError(f"LiteRT weights {weights!r}: choose one of {', '.join(WEIGHT_STORAGE)}")
    if config.precision != "float32":
        raise ValueError(f"a LiteRT export computes in float32 (its int8 and float16 weights included); "
                         f"--mixed_precision={config.precision} is for SavedModels")
    if config.search.shortlist_size or config.replace_unk:
        raise ValueError("a LiteRT export has no --shortlist_size and no --replace_unk yet (SavedModel only)")
    version = version or next_version(export_dir)
    final = os.path.join(export_dir, str(version))
    if os.path.exists(final):
        raise FileExistsError(f"{final} already exists; choose another --version")
    with custom_gradients.released():
        restored = restore_model(model_dirs[0], config.weights, log=log)
        trained = restored.config
        if trained.tokenizer != "sentencepiece":
            raise ValueError(f"{model_dirs[0]} uses --tokenizer={trained.tokenizer}; a LiteRT export needs "
                             "--tokenizer=sentencepiece (its pieces are cut on the host by SentencePiece's library)")
        created = not os.path.isdir(export_dir)
        os.makedirs(export_dir, exist_ok=True)
        remove_stale_temporaries(export_dir, log)
        tmp = os.path.join(export_dir, f".tmp-{version}-{os.getpid()}")
        try:
            os.makedirs(tmp)
            beams = sorted({1, config.search.beam_size})
            size, host_embeddings = _convert(restored.model, os.path.join(tmp, MODEL_FILE), weights, beams)
            files = _copy_host_files(model_dirs[0], tmp)
            manifest = {
                "format": "nmt_tf-litert", "format_version": FORMAT_VERSION,
                **metadata(trained, config, restored.checkpoint),
                "weights": weights, "vocab_size": restored.target_tokenizer.vocab_size, "step_beams": beams,
                # the widest beam a served request may ask for (nmt_tf.serve's translate_with_options)
                "max_beam_size": max(config.max_beam_size, config.search.beam_size),
                **({"host_embeddings": host_embeddings} if host_embeddings else {}),
                "files": {"model": MODEL_FILE, **files},
                "card": dict(card or {}),
            }
            manifest["checkpoint"] = os.path.basename(str(manifest["checkpoint"]))
            manifest["sha256"] = {name: sha256(os.path.join(tmp, name)) for name in manifest["files"].values()}
            with open(os.path.join(tmp, MANIFEST), "w", encoding="utf-8") as f:
                json.dump(manifest, f, indent=2)
            os.rename(tmp, final)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            if created:
                shutil.rmtree(export_dir, ignore_errors=True)
            raise WriteFailed(final, e, kept="no new version was made; the existing versions are unchanged") from e
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    log(f"Exported {final} (LiteRT, {weights} weights, {size / 2**20:.1f} MiB; beam {config.search.beam_size}, "
        f"n-best {config.search.n_best}).\n"
        f"  python -m nmt_tf.translate --runtime=litert --litert_model={final} < input.txt")
    return final


def _copy_host_files(model_dir: str, out: str) -> dict:
    """What the runtime reads besides the model: vocabularies, SentencePiece
    models and, when the model directory has one, its confidence calibrator;
    returns {manifest key: file name}."""
    from nmt_tf.data import pipeline as data

    src_vocab, tgt_vocab = data.vocabulary_paths(model_dir)
    files = {}
    for key, path in zip(("source_vocabulary", "target_vocabulary"), (src_vocab, tgt_vocab)):
        shutil.copy(path, os.path.join(out, "vocab." + ("src" if key.startswith("source") else "tgt") + ".txt"))
        files[key] = "vocab." + ("src" if key.startswith("source") else "tgt") + ".txt"
    for key, name in zip(("source_sentencepiece", "target_sentencepiece"), SENTENCEPIECE_MODELS):
        shutil.copy(os.path.join(model_dir, name), os.path.join(out, name))
        files[key] = name
    calibrator = confidence.path_in(model_dir)
    if os.path.exists(calibrator):           # the runtime computes the confidence from its outputs
        confidence.load(calibrator)          # a damaged one fails the export, not the first request
        shutil.copy(calibrator, os.path.join(out, layout.CONFIDENCE))
        files["confidence"] = layout.CONFIDENCE
    return files


def _convert(model, path: str, weights: str, beams: list[int]) -> tuple[int, dict | None]:
    """The encode signature of `model` and a step_k<K> signature for each K
    in `beams`, converted; returns the file's size and, for tied embeddings,
    the manifest's "host_embeddings" (see the module docstring)."""
    import tensorflow as tf

    probe = model.search_inputs(tf.constant([[4, 3]], tf.int32), model.step_weights())
    names = sorted(k for k in probe if k != "state")
    width = model.embedding_size
    host = {"target": model.tied_embeddings != "none", "source": model.tied_embeddings == "all"}
    module = tf.Module()
    module.model_variables = tf_variables(model)

    def encode(source_ids, *source_embeddings):
        return model.search_inputs(source_ids, model.step_weights(), *source_embeddings)

    def step(previous, state, *per_sentence):
        log_probs, new_state, alpha = model.decode_step(previous, state, dict(zip(names, per_sentence)),
                                                        model.step_weights())
        return {"log_probs": log_probs, "state": new_state, "alpha": alpha}

    # The encoder's scan needs a static batch (LiteRT lowers TensorLists only
    # with static element shapes): one sentence per call. A step takes K
    # hypotheses per sentence, K static (decode_step's need): one signature
    # per K in `beams`, the K hypotheses of a sentence attending to its
    # annotations together (never tiled).
    per_sentence_specs = [tf.TensorSpec([None, *probe[k].shape[1:]], probe[k].dtype, name=k) for k in names]
    module.encode = tf.function(encode, autograph=False, input_signature=[
        tf.TensorSpec([1, None], tf.int32, name="source_ids"),
        *([tf.TensorSpec([1, None, width], tf.float32, name="source_embeddings")] if host["source"] else [])])
    signatures = {"encode": module.encode.get_concrete_function()}
    for k in beams:
        previous = (tf.TensorSpec([None, k, width], tf.float32, name="previous_embeddings") if host["target"]
                    else tf.TensorSpec([None, k], tf.int32, name="previous_ids"))
        function = tf.function(step, autograph=False, input_signature=[
            previous, tf.TensorSpec([None, k, probe["state"].shape[-1]], probe["state"].dtype, name="state"),
            *per_sentence_specs])
        setattr(module, f"step_k{k}", function)
        signatures[f"step_k{k}"] = function.get_concrete_function()
    with tempfile.TemporaryDirectory() as saved:
        tf.saved_model.save(module, saved, signatures=signatures)
        converter = tf.lite.TFLiteConverter.from_saved_model(saved, signature_keys=sorted(signatures))
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        if weights != "float32":
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
        if weights == "float16":
            converter.target_spec.supported_types = [tf.float16]
        flatbuffer = converter.convert()
    with open(path, "wb") as f:
        f.write(flatbuffer)
    found = None
    if host["target"]:
        found = {**host, **_output_layer_tensors(path, model.target_embedding.embeddings.numpy())}
    return len(flatbuffer), found


def _output_layer_tensors(path: str, embeddings) -> dict:
    """Where the converted model keeps E (`embeddings` [V, m]) as its output
    layer's weights: {"signature": "step_k1", "blocks": [{"tensor", "name",
    "rows"}, ...]}, one block per column block of the output layer
    (`output_block_bounds`), each the constant tensor of that subgraph whose
    values (dequantised) are those rows of E. A conversion that kept them
    otherwise is an error: the runtime could not look the embeddings up."""
    from nmt_tf.models.search_step import output_block_bounds      # loads TensorFlow

    tensors = weight_tensors(path, HOST_EMBEDDING_SIGNATURE)
    blocks = []
    for a, b in output_block_bounds(embeddings.shape[0]):
        want = embeddings[a:b]
        errors = {index: float(np.abs(dequantized(values, details) - want).max())
                  for index, (details, values) in tensors.items() if tuple(values.shape) == want.shape}
        index = min(errors, key=errors.get) if errors else None
        if index is None or errors[index] > 0.01 * float(np.abs(want).max()) + 1e-6:
            raise ValueError(f"{path}: the converter kept no tensor of the output layer's rows {a}:{b} "
                             "(the host cannot look the tied embeddings up)")
        blocks.append({"tensor": index, "name": tensors[index][0]["name"], "rows": [a, b]})
    return {"signature": HOST_EMBEDDING_SIGNATURE, "blocks": blocks}
