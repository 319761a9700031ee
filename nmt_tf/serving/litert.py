"""A LiteRT model folder served by nmt_tf.serve --runtime=litert, without TensorFlow.

`LiteRTVersion` is a served version (nmt_tf.serving.versions.ServedVersion) of a
folder written by `nmt_tf.export --format=litert`: the registry loads,
replaces and unloads it as it does a SavedModel version, and the gRPC and
REST front ends, the batching and the page call it the same way. It serves
the serving_default, translate_with_options and score signatures, with the SavedModel's inputs,
outputs, dtypes and shapes (their SignatureDefs are declared here, as
GetModelMetadata shows them; score is forced decoding on the host,
LiteRTClient.score); the prefix and constrained signatures are the
SavedModel's alone. Each request in flight takes an interpreter of its own
(nmt_tf.inference.litert_runtime.LiteRTClient), up to one per core.
"""

from __future__ import annotations

import os

import grpc
import numpy as np

from nmt_tf.inference.litert_runtime import CONFIDENCE_OUTPUT, MANIFEST, OUTPUTS, LiteRTClient
from nmt_tf.inference.translation_graph import (
    MAX_LENGTH_ALPHA,
    SEARCH_SETTINGS,
    WITH_OPTIONS_SIGNATURE,
    beam_bound_text,
)
from nmt_tf.serving import api_protos as serving_protos
from nmt_tf.serving.versions import DEFAULT_SIGNATURE, SearchCost, ServedVersion, ServingError, alignment_bound

WARM_UP_LINE = b"A man in a blue shirt is standing on a ladder."


def serving_default_signature(n_best: int, with_confidence: bool = False):
    """The SignatureDef of serving_default, as the SavedModel export has it
    (`with_confidence`: a model with a calibrator, whose export has a
    confidence output)."""
    signature = serving_protos.SignatureDef(method_name="tensorflow/serving/predict")
    _declare(signature.inputs["text"], "text", "DT_STRING", [-1])
    outputs = {**OUTPUTS, **({"confidence": CONFIDENCE_OUTPUT} if with_confidence else {})}
    for alias, (dtype, shape) in outputs.items():
        _declare(signature.outputs[alias], alias, dtype, shape, n_best)
    return signature


_SETTING_DTYPES = {"int32": "DT_INT32", "float32": "DT_FLOAT"}


def with_options_signature(search: dict, with_confidence: bool = False):
    """The SignatureDef of translate_with_options, as the SavedModel export
    has it: serving_default's with the search settings as scalar inputs,
    whose defaults are the export's (n_best 0: the export's, at most the
    beam), and an n-best size the request chooses."""
    signature = serving_default_signature(-1, with_confidence)
    defaults = {"beam_size": int(search["beam_size"]), "n_best": 0, "length_alpha": float(search["length_alpha"])}
    for alias, dtype in SEARCH_SETTINGS.items():
        _declare(signature.inputs[alias], alias, _SETTING_DTYPES[dtype], [])
        serving_protos.from_array(np.array(defaults[alias], dtype), signature.defaults[alias])
    return signature


def request_search(feeds: dict, options: dict, max_beam_size: int) -> dict:
    """The search settings of a translate_with_options request (its scalar
    inputs), checked as the SavedModel's graph checks them: a ServingError
    (INVALID_ARGUMENT) naming the setting and its bound."""
    beam, n_best, alpha = (feeds[name].item() for name in SEARCH_SETTINGS)
    problem = ("beam_size must be at least 1" if beam < 1 else
               beam_bound_text(max_beam_size) if beam > max_beam_size else
               "n_best must be at least 1 (or 0: the n-best of the export, at most beam_size)" if n_best < 0 else
               "n_best must be at most beam_size" if n_best > beam else
               "length_alpha must be at least 0" if not alpha >= 0 else
               f"length_alpha must be at most {MAX_LENGTH_ALPHA:g}" if alpha > MAX_LENGTH_ALPHA else None)
    if problem:
        raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, problem)
    return {"beam_size": int(beam), "n_best": int(n_best) or min(int(options["n_best"]), int(beam)),
            "length_alpha": float(alpha)}


SCORE_OUTPUTS = {"log_prob": ("DT_FLOAT", [-1]), "log_prob_per_token": ("DT_FLOAT", [-1]),
                 "target_length": ("DT_INT32", [-1]), "token_log_probs": ("DT_FLOAT", [-1, -1]),
                 "truncated": ("DT_BOOL", [-1])}


def _declare(info, name: str, dtype: str, shape: list, n_best: int = 0) -> None:
    info.name = name
    info.dtype = getattr(serving_protos.DT, dtype)
    for size in shape:
        info.tensor_shape.dim.add(size=n_best if size == "n" else size)


def score_signature():
    """The SignatureDef of score, as the SavedModel export has it."""
    signature = serving_protos.SignatureDef(method_name="tensorflow/serving/predict")
    for name in ("source", "target"):
        _declare(signature.inputs[name], name, "DT_STRING", [-1])
    for alias, (dtype, shape) in SCORE_OUTPUTS.items():
        _declare(signature.outputs[alias], alias, dtype, shape)
    return signature


class LiteRTVersion(ServedVersion):
    """One LiteRT model folder as a served version. A damaged folder (a file
    whose SHA-256 is not the manifest's, a model LiteRT cannot load) fails
    to load, and the versions already served go on."""

    MARKER = MANIFEST
    KIND = "LiteRT model"

    def __init__(self, path: str, version: int, threads: int = 1):
        super().__init__(path, version)
        self.client = LiteRTClient(path, num_threads=threads, interpreters=max(1, os.cpu_count() or 1))
        model = self.client.model
        manifest, search = model.manifest, model.search
        self.signature_defs = {DEFAULT_SIGNATURE: serving_default_signature(self.client.options["n_best"],
                                                                            model.calibrator is not None),
                               WITH_OPTIONS_SIGNATURE: with_options_signature(search, model.calibrator is not None)}
        self.max_beam_size = max(int(manifest.get("max_beam_size", 0)), int(search["beam_size"]))
        if model.manifest["files"].get("target_sentencepiece"):      # scoring reads the target's pieces
            self.signature_defs["score"] = score_signature()
        self.signatures = list(self.signature_defs)
        self.alignment_shape = alignment_bound(model.max_input_length, search)
        self.search_cost = SearchCost.of_settings(search, model.max_input_length, 1, model.pieces,
                                                  self.max_beam_size)
        self.metadata = {key: manifest[key] for key in ("src_lang", "tgt_lang", "model", "architecture",
                                                        "max_input_length") if key in manifest}
        # what the page offers: the beams of translate_with_options
        self.metadata.update(search={"beam_size": int(search["beam_size"])}, max_beam_size=self.max_beam_size)
        self.client([WARM_UP_LINE])
        self.warmed_up = 1

    def run(self, signature: str, feeds: dict, outputs) -> dict:
        self.acquire()
        try:
            if signature == "score":
                result = self.client.score(feeds["source"].reshape(-1), feeds["target"].reshape(-1))
            elif signature == WITH_OPTIONS_SIGNATURE:
                search = request_search(feeds, self.client.options, self.max_beam_size)
                result = self.client(feeds["text"].reshape(-1), search)
            else:
                result = self.client(feeds["text"].reshape(-1))
        finally:
            self.release()
        return {alias: result[alias] for alias in outputs}

    def _free(self) -> None:
        self.client = None
