"""One client for an exported model's signatures, in this process or on a server.

`SignatureClient("serving_default", saved_model=PATH)` calls the SavedModel's
signature here; `SignatureClient("score", server="host:8500",
model_name="nmt")` sends Predict requests to TF Serving or nmt_tf.serve over
gRPC. Either way a call takes the signature's string inputs by name and
returns its outputs as NumPy arrays, so the tools (translate, score,
evaluate, visualize) do not care where the model runs. A client of
translate_with_options sends the search `settings` it was made with
(beam_size, n_best, length_alpha) with every call.
"""

from __future__ import annotations

import grpc

from nmt_tf.inference.saved_models import load_signature, signature_defaults
from nmt_tf.inference.translation_graph import SEARCH_SETTINGS, failed_check_text


class ClientError(RuntimeError):
    """A server that refused or failed, or has no such model or signature, in
    one sentence. (A missing or broken SavedModel, or one without the
    signature, is the FileNotFoundError of `nmt_tf.inference.saved_models.load_signature`.)"""


class SignatureClient:
    """One signature of an exported nmt_tf model.

    Args:
      signature: the signature's name ("serving_default" translates, "score"
        scores pairs).
      saved_model: a SavedModel version directory, run in this process; or
      server: a host:port speaking TF Serving's gRPC API, with
      model_name, version (0: the newest), timeout (seconds per request).
      outputs: the outputs to ask for (all when None). A server then sends
        only these (output_filter: the alignment tensor is by far the
        largest part of a reply).
      settings: search settings sent with every call, by name
        (translate_with_options' scalar inputs: SEARCH_SETTINGS); those
        left out are the export's (the signature's defaults).
    """

    def __init__(self, signature: str = "serving_default", *, saved_model: str | None = None,
                 server: str | None = None, model_name: str = "nmt", version: int = 0, timeout: float = 60.0,
                 outputs: list[str] | None = None, settings: dict | None = None):
        if bool(saved_model) == bool(server):
            raise ValueError("give exactly one of a SavedModel and a server.")
        self.signature, self.outputs = signature, list(outputs) if outputs else None
        self.where = saved_model or server
        self.settings = dict(settings or {})
        if saved_model:
            self._function = load_signature(saved_model, signature)      # FileNotFoundError, one sentence
            self._shapes = {name: spec.shape.as_list() for name, spec in self._function.structured_outputs.items()}
            self._stub = None
            inputs = set(self._function.structured_input_signature[1])
            # A signature called here takes every input: the settings not given are the export's.
            self.settings = {**signature_defaults(saved_model, signature), **self.settings}
        else:
            inputs = self._connect(server, model_name, version, timeout)
        self._setting_inputs = inputs & set(SEARCH_SETTINGS)
        self._check_settings(self.settings)

    def _check_settings(self, settings: dict) -> None:
        unknown = sorted(set(settings) - self._setting_inputs)
        if unknown:
            raise ClientError(f"{self.where}: the '{self.signature}' signature takes no {', '.join(unknown)} (search "
                              "settings go to translate_with_options, which exports made before nmt_tf 0.3 lack: "
                              "export it again)")

    def _connect(self, address, model_name, version, timeout):
        from tensorflow_serving.apis import get_model_metadata_pb2, prediction_service_pb2_grpc

        self._stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(
            address, options=[("grpc.max_receive_message_length", 256 * 1024 * 1024)]))
        self._model_name, self._version, self._timeout = model_name, version, timeout
        request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        self._spec(request.model_spec)
        reply = self._rpc(self._stub.GetModelMetadata, request)
        signatures = get_model_metadata_pb2.SignatureDefMap()
        reply.metadata["signature_def"].Unpack(signatures)
        if self.signature not in signatures.signature_def:
            raise ClientError(f"{address}: model {model_name} has no '{self.signature}' signature")
        outputs = signatures.signature_def[self.signature].outputs
        self._shapes = {name: [None if d.size < 0 else d.size for d in info.tensor_shape.dim]
                        for name, info in outputs.items()}
        return set(signatures.signature_def[self.signature].inputs)

    def _spec(self, spec):
        spec.name = self._model_name
        spec.signature_name = self.signature
        if self._version:
            spec.version.value = self._version

    def _rpc(self, method, request):
        try:
            return method(request, timeout=self._timeout)
        except grpc.RpcError as e:
            raise ClientError(f"{self.where}: {e.code().name}: {e.details()}") from e

    def has_output(self, output: str) -> bool:
        """Whether the signature has this output (`confidence`: only an export with a calibrator)."""
        return output in self._shapes

    def output_size(self, output: str, axis: int) -> int | None:
        """The static size of one axis of an output (e.g. the n-best size an
        export fixed), or None when it varies."""
        return self._shapes[output][axis]

    def __call__(self, **inputs) -> dict:
        """Calls the signature on string vectors given by input name (lists of
        bytes or str); returns {output name: NumPy array}."""
        return self.call(inputs)

    def call(self, inputs: dict, settings: dict | None = None) -> dict:
        """`__call__` with search `settings` for this call over the client's."""
        import tensorflow as tf

        self._check_settings(settings or {})
        settings = {name: (value, SEARCH_SETTINGS[name]) for name, value in {**self.settings, **(settings or {})}.items()}
        if self._stub is None:
            try:
                result = self._function(**{name: tf.constant(value, tf.string) for name, value in inputs.items()},
                                        **{name: tf.constant(value, dtype) for name, (value, dtype) in settings.items()})
            except tf.errors.InvalidArgumentError as e:      # a setting out of its range: the graph's own words
                raise ClientError(f"{self.where}: INVALID_ARGUMENT: {failed_check_text(e.message)}") from None
            return {name: value.numpy() for name, value in result.items()
                    if self.outputs is None or name in self.outputs}
        from tensorflow_serving.apis import predict_pb2

        request = predict_pb2.PredictRequest()
        self._spec(request.model_spec)
        for name, value in inputs.items():
            request.inputs[name].CopyFrom(tf.make_tensor_proto(value, dtype=tf.string))
        for name, (value, dtype) in settings.items():
            request.inputs[name].CopyFrom(tf.make_tensor_proto(value, dtype=dtype))
        request.output_filter.extend(self.outputs or [])
        reply = self._rpc(self._stub.Predict, request)
        return {name: tf.make_ndarray(value) for name, value in reply.outputs.items()}
