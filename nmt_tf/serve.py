r"""A gRPC server speaking TensorFlow Serving's protocol, for machines without it.

Usage:
  python -m nmt_tf.serve --port=8500 --model_name=nmt --model_base_path=exports/nmt

Production deployments should use the official `tensorflow_model_server`
(see export/README.md: docker-compose, models.config, batching parameters).
This server exists for machines where that binary cannot be installed, and
for tests: it implements the same services on the same protos (from the
tensorflow-serving-api package), so clients cannot tell the difference:

  tensorflow.serving.PredictionService  Predict, GetModelMetadata
                                        (Classify, Regress, MultiInference: UNIMPLEMENTED)
  tensorflow.serving.ModelService       GetModelStatus (HandleReloadConfigRequest: UNIMPLEMENTED)

It serves the highest numbered version under --model_base_path and loads a
new version when one appears (checked every --poll_seconds; like TF Serving's
default "latest" policy, the older version is then unloaded). Requests follow
TF Serving's rules: an empty signature name means "serving_default"; an
unknown model or version is NOT_FOUND, an unknown signature
FAILED_PRECONDITION; a wrong, missing or extra input alias, an unknown
output_filter alias, a wrong dtype or rank is INVALID_ARGUMENT; a message
larger than --max_message_mb is RESOURCE_EXHAUSTED (TF Serving's limit is
2 GiB; this server's is lower by default to protect its memory). Batches
larger than --max_batch_size sentences are INVALID_ARGUMENT, and so are,
before any decoding, batches whose alignment output could exceed
--max_message_mb (batch x the export's longest output x its longest input x
4 bytes; 324 sentences at the defaults): ask for fewer sentences, or for
the outputs without alignment (output_filter). No request can
stop the server: every failure becomes a status. A port that another
process holds is refused at start (exit code 1), as TF Serving refuses it.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import sys
import threading

from absl import app
from absl import flags as absl_flags
from absl import logging

from nmt_tf import flags as nmt_flags  # also defines --model_name

absl_flags.DEFINE_integer("port", 8500, "gRPC port (TF Serving's default is 8500).")
absl_flags.DEFINE_string("host", "0.0.0.0", "Address to listen on.")
absl_flags.DEFINE_string("model_base_path", None, "Directory holding numbered SavedModel versions (nmt_tf.export's --export_dir).")
absl_flags.DEFINE_float("poll_seconds", 2.0, "How often to look for a new version.", lower_bound=0.1)
absl_flags.DEFINE_integer("threads", 8, "Concurrent requests served.", lower_bound=1)
absl_flags.DEFINE_float("max_message_mb", 32.0, "Largest request or response message, in MiB.", lower_bound=0.01)
absl_flags.DEFINE_integer("max_batch_size", 1024, "Most sentences one request may carry.", lower_bound=1)
absl_flags.DEFINE_boolean(
    "onednn", False,
    "Use TensorFlow's oneDNN CPU kernels (sets TF_ENABLE_ONEDNN_OPTS for this process). Off by default: "
    "on the 2-core reference machine one-sentence requests are faster with TensorFlow's Eigen kernels, "
    "batches of 64 faster with oneDNN (BUILD_NOTES.md, 'Serving latency').")

absl_flags.DEFINE_integer(
    "intra_op_threads", 1,
    "Threads one TensorFlow op may use (intra-op parallelism; 0: TensorFlow's default, one per core). "
    "1 by default: one-sentence requests are fastest that way, the decoder's small matmuls losing more "
    "to splitting than they gain, while independent ops (the output layer's column blocks, the next "
    "step's state products) run side by side on the inter-op threads (BUILD_NOTES.md, 'Serving latency'). "
    "TF Serving's flag: --tensorflow_intra_op_parallelism.", lower_bound=0)
absl_flags.DEFINE_integer(
    "inter_op_threads", 0,
    "TensorFlow ops run at once (inter-op parallelism; 0: TensorFlow's default, one per core). "
    "TF Serving's flag: --tensorflow_inter_op_parallelism.", lower_bound=0)

TOOL_FLAGS = nmt_flags.tool_flags(__name__, ("model_name",))
DEFAULT_SIGNATURE = "serving_default"


class ServingError(Exception):
    """A request failure with the gRPC status TF Serving would return."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


class LoadedVersion:
    """One SavedModel version: its signatures and their SignatureDefs."""

    def __init__(self, path: str, version: int):
        from tensorflow.core.protobuf import saved_model_pb2

        from nmt_tf.translator import load_saved_model

        self.path, self.version = path, version
        self.saved_model = load_saved_model(path)
        self.signatures = dict(self.saved_model.signatures)
        proto = saved_model_pb2.SavedModel()
        with open(os.path.join(path, "saved_model.pb"), "rb") as f:
            proto.ParseFromString(f.read())
        self.signature_defs = dict(proto.meta_graphs[0].signature_def)
        self.alignment_shape = _alignment_bound(path)


def _alignment_bound(path: str) -> tuple[int, int] | None:
    """(T, S): the largest output and source lengths an nmt_tf export can
    return in its alignment output ([batch, T, S] float32), from the limits
    fixed at export (--max_input_length, --max_length_ratio,
    --max_output_length); None for a SavedModel that is not an nmt_tf export."""
    import math

    from nmt_tf.export import read_metadata

    try:
        meta = read_metadata(path)
        source = int(meta["max_input_length"]) + 1                       # with [EOS]
        search = meta["search"]
        output = min(int(search["max_length"]), math.ceil(float(search["max_length_ratio"]) * source))
    except (FileNotFoundError, KeyError, TypeError, ValueError):
        return None
    return max(output, 1), source


def _files_stamp(path: str) -> tuple:
    """(name, size, mtime) of every file of a SavedModel folder: changes when a version is re-copied."""
    stamp = []
    for root, _, files in os.walk(path):
        for name in sorted(files):
            try:
                st = os.stat(os.path.join(root, name))
            except OSError:
                continue
            stamp.append((os.path.relpath(os.path.join(root, name), path), st.st_size, st.st_mtime_ns))
    return tuple(sorted(stamp))


class ModelRegistry:
    """The versions of one model under a base path; serves the highest."""

    def __init__(self, name: str, base_path: str, log=logging.info):
        self.name, self.base_path, self.log = name, base_path, log
        self._current: LoadedVersion | None = None
        self._failed: dict[int, tuple[tuple, str]] = {}     # version -> (its files' stamp, error)
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def available_versions(self) -> list[int]:
        if not os.path.isdir(self.base_path):
            return []
        return sorted(int(d) for d in os.listdir(self.base_path)
                      if re.fullmatch(r"\d+", d) and os.path.exists(os.path.join(self.base_path, d, "saved_model.pb")))

    def poll(self) -> None:
        """Loads the highest version if it is newer than the one served."""
        versions = self.available_versions()
        if not versions or (self._current and versions[-1] <= self._current.version):
            return
        version = versions[-1]
        path = os.path.join(self.base_path, str(version))
        stamp = _files_stamp(path)
        with self._lock:
            if version in self._failed and self._failed[version][0] == stamp:
                return          # reported once; tried again when its files change
        try:
            loaded = LoadedVersion(path, version)
        except Exception as e:   # a broken version never takes the served one down
            message = f"{type(e).__name__}: {str(e).strip() or 'could not be loaded'}"
            with self._lock:
                self._failed[version] = (stamp, message)
            self.log(f"could not load {self.name} version {version} ({message}); "
                     "it is tried again when its files change")
            return
        with self._lock:
            self._current = loaded
            self._failed.pop(version, None)
        self.log(f"serving {self.name} version {version} from {loaded.path}")

    @property
    def failed(self) -> dict[int, str]:
        """Versions that could not be loaded, with their errors."""
        with self._lock:
            return {v: message for v, (_, message) in self._failed.items()}

    def watch(self, seconds: float) -> threading.Thread:
        def loop():
            while not self._stop.wait(seconds):
                self.poll()
        thread = threading.Thread(target=loop, daemon=True, name="version-poller")
        thread.start()
        return thread

    def stop(self):
        self._stop.set()

    def get(self, model_spec) -> LoadedVersion:
        """The version a ModelSpec asks for, or the TF Serving error."""
        import grpc

        if not model_spec.name:
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, "ModelSpec has no name specified.")
        which = model_spec.WhichOneof("version_choice")
        if model_spec.name != self.name:
            label = f"Specific({model_spec.name}, {model_spec.version.value})" if which == "version" \
                else f"Latest({model_spec.name})"
            raise ServingError(grpc.StatusCode.NOT_FOUND, f"Servable not found for request: {label}")
        with self._lock:
            current = self._current
        if which == "version_label":
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"Unrecognized servable version label: {model_spec.version_label}")
        if current is None:
            raise ServingError(grpc.StatusCode.NOT_FOUND, f"Servable not found for request: Latest({self.name})")
        if which == "version" and model_spec.version.value != current.version:
            raise ServingError(grpc.StatusCode.NOT_FOUND,
                               f"Servable not found for request: Specific({self.name}, {model_spec.version.value})")
        return current

    @property
    def current(self) -> LoadedVersion | None:
        with self._lock:
            return self._current


def _dtype_name(dtype_enum) -> str:
    """TensorFlow's C++ name of a DataType (DT_FLOAT -> "float"), as in its error messages."""
    from tensorflow.core.framework import types_pb2

    return types_pb2.DataType.Name(dtype_enum).removeprefix("DT_").lower()


def check_reply_size(loaded: LoadedVersion, outputs: list[str], batch: int, max_message_bytes: int) -> None:
    """Refuses, before any decoding, a batch whose alignment output could be
    larger than a reply may be: [batch, T, S] float32 with the export's
    largest T and S. (The other outputs are a few strings or numbers per token;
    they are not bounded here.)"""
    import grpc

    if "alignment" not in outputs or loaded.alignment_shape is None or not batch:
        return
    per_sentence = loaded.alignment_shape[0] * loaded.alignment_shape[1] * 4
    if batch * per_sentence <= max_message_bytes:
        return
    fits = max_message_bytes // per_sentence
    raise ServingError(
        grpc.StatusCode.INVALID_ARGUMENT,
        f"the reply to {batch} sentences could be {batch * per_sentence / 2**20:.1f} MiB (the alignment output, "
        f"[{batch}, {loaded.alignment_shape[0]}, {loaded.alignment_shape[1]}] float32 at most), more than this "
        f"server's message limit of {max_message_bytes / 2**20:.1f} MiB: send at most {fits} sentences per request "
        "with alignment, or leave alignment out with output_filter")


def run_predict(registry: ModelRegistry, request, max_batch_size: int, max_message_bytes: int | None = None):
    """Predict, following TF Serving's checks and messages (predict_util.cc)."""
    import grpc
    import numpy as np
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    loaded = registry.get(request.model_spec)
    name = request.model_spec.signature_name or DEFAULT_SIGNATURE
    if name not in loaded.signatures:
        raise ServingError(grpc.StatusCode.FAILED_PRECONDITION, f'Serving signature key "{name}" not found.')
    signature_def = loaded.signature_defs[name]
    expected = set(signature_def.inputs)
    sent = set(request.inputs)
    if sent != expected:
        extra, missing = sorted(sent - expected), sorted(expected - sent)
        raise ServingError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"input size does not match signature: {len(sent)}!={len(expected)} "
            f"len({{{','.join(sorted(sent))}}}) != len({{{','.join(sorted(expected))}}}). "
            f"Sent extra: {{{','.join(extra)}}}. Missing but required: {{{','.join(missing)}}}.")
    outputs = list(request.output_filter) or sorted(signature_def.outputs)
    for alias in outputs:
        if alias not in signature_def.outputs:
            raise ServingError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"output tensor alias not found in signature: {alias} Outputs expected to be in the set "
                f"{{{','.join(sorted(signature_def.outputs))}}}.")
    if len(set(outputs)) != len(outputs):
        dup = next(a for a in outputs if outputs.count(a) > 1)
        raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, f"duplicate output tensor alias: {dup}")

    feeds = {}
    for i, alias in enumerate(sorted(expected)):
        info, proto = signature_def.inputs[alias], request.inputs[alias]
        if proto.dtype != info.dtype:
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"Expects arg[{i}] to be {_dtype_name(info.dtype)} but "
                               f"{_dtype_name(proto.dtype) if proto.dtype else 'invalid'} is provided")
        try:
            value = tf.make_ndarray(proto)
        except Exception as e:
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, f"tensor parsing error: {alias}") from e
        rank = len(info.tensor_shape.dim)
        if not info.tensor_shape.unknown_rank and value.ndim != rank:
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"input {alias} must have rank {rank}, got shape {list(value.shape)}")
        if value.ndim and value.shape[0] > max_batch_size:
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"input {alias} holds {value.shape[0]} items; this server accepts at most "
                               f"{max_batch_size} per request")
        feeds[alias] = tf.constant(value)
    sizes = {v.shape[0] for v in feeds.values() if v.shape.rank}
    if len(sizes) > 1:
        raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, f"inputs have different batch sizes: {sorted(sizes)}")
    if max_message_bytes:
        check_reply_size(loaded, outputs, max(sizes, default=0), max_message_bytes)
    try:
        result = loaded.signatures[name](**feeds)
    except tf.errors.InvalidArgumentError as e:
        raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, e.message) from e
    response = predict_pb2.PredictResponse()
    response.model_spec.name = registry.name
    response.model_spec.version.value = loaded.version
    response.model_spec.signature_name = name
    for alias in outputs:
        response.outputs[alias].CopyFrom(tf.make_tensor_proto(np.asarray(result[alias])))
    return response


def make_servicers(registry: ModelRegistry, max_batch_size: int, max_message_bytes: int | None = None):
    """The PredictionService and ModelService implementations."""
    import grpc
    from google.protobuf import any_pb2
    from tensorflow_serving.apis import (get_model_metadata_pb2, get_model_status_pb2, model_service_pb2_grpc,
                                         prediction_service_pb2_grpc)
    from tensorflow_serving.apis import status_pb2

    def guarded(handler):
        """Every failure becomes a gRPC status; the server keeps serving."""
        def call(self, request, context):
            try:
                return handler(self, request, context)
            except ServingError as e:
                context.abort(e.code, e.message)
            except Exception as e:   # never let one request take the server down
                logging.exception("request failed")
                context.abort(grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}")
        return call

    class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
        @guarded
        def Predict(self, request, context):
            return run_predict(registry, request, max_batch_size, max_message_bytes)

        @guarded
        def GetModelMetadata(self, request, context):
            fields = list(request.metadata_field)
            if not fields:
                raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                                   "GetModelMetadataRequest must specify at least one metadata_field")
            for field in fields:
                if field != "signature_def":
                    raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                                       f"Metadata field {field} is not supported")
            loaded = registry.get(request.model_spec)
            response = get_model_metadata_pb2.GetModelMetadataResponse()
            response.model_spec.name = registry.name
            response.model_spec.version.value = loaded.version
            signature_map = get_model_metadata_pb2.SignatureDefMap()
            for key, value in loaded.signature_defs.items():
                signature_map.signature_def[key].CopyFrom(value)
            packed = any_pb2.Any()
            packed.Pack(signature_map)
            response.metadata["signature_def"].CopyFrom(packed)
            return response

    class ModelService(model_service_pb2_grpc.ModelServiceServicer):
        @guarded
        def GetModelStatus(self, request, context):
            spec = request.model_spec
            if not spec.name:
                raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, "Missing ModelSpec")
            current, failed = registry.current, registry.failed
            # Like TF Serving: the served version AVAILABLE; one that failed to load END with its error.
            states = {version: (get_model_status_pb2.ModelVersionStatus.END,
                                status_pb2.StatusProto(error_code=grpc.StatusCode.UNKNOWN.value[0],
                                                       error_message=message))
                      for version, message in failed.items()}
            if current is not None:
                states[current.version] = (get_model_status_pb2.ModelVersionStatus.AVAILABLE,
                                           status_pb2.StatusProto(error_code=0))
            if spec.name != registry.name or not states:
                raise ServingError(grpc.StatusCode.NOT_FOUND, f"Could not find any versions of model {spec.name}")
            if spec.WhichOneof("version_choice") == "version":
                if spec.version.value not in states:
                    raise ServingError(grpc.StatusCode.NOT_FOUND,
                                       f"Could not find version {spec.version.value} of model {spec.name}")
                states = {spec.version.value: states[spec.version.value]}
            response = get_model_status_pb2.GetModelStatusResponse()
            for version in sorted(states, reverse=True):
                status = response.model_version_status.add()
                status.version = version
                status.state, proto = states[version]
                status.status.CopyFrom(proto)
            return response

    return PredictionService(), ModelService()


def start_server(model_name: str, model_base_path: str, port: int, host: str = "0.0.0.0",
                 threads: int = 8, max_message_mb: float = 32.0, max_batch_size: int = 1024,
                 poll_seconds: float = 2.0, log=logging.info):
    """Starts serving; returns (grpc server, registry, bound port)."""
    import grpc
    from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

    registry = ModelRegistry(model_name, model_base_path, log=log)
    registry.poll()
    if registry.current is None:
        raise FileNotFoundError(f"no SavedModel version (a numbered folder with saved_model.pb) under {model_base_path}")
    registry.watch(poll_seconds)
    limit = int(max_message_mb * 1024 * 1024)
    # grpcio sets SO_REUSEPORT by default: a second server on a taken port
    # would start and share the connections. TF Serving refuses the port.
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=threads),
                         options=[("grpc.max_receive_message_length", limit),
                                  ("grpc.max_send_message_length", limit),
                                  ("grpc.so_reuseport", 0)])
    prediction, model_service = make_servicers(registry, max_batch_size, limit)
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(prediction, server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(model_service, server)
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError:       # newer grpcio versions raise where older ones returned 0
        bound = 0
    if not bound:
        registry.stop()
        raise OSError(f"could not listen on {host}:{port}: the port is in use (or the address is not "
                      "this machine's); choose another --port")
    server.start()
    return server, registry, bound


def choose_kernels(onednn: bool) -> str:
    """Sets TF_ENABLE_ONEDNN_OPTS, which TensorFlow reads when it is imported
    (so this must run first), and says which CPU kernels the process uses."""
    if "tensorflow" in sys.modules:
        raise RuntimeError("choose_kernels() must run before TensorFlow is imported")
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1" if onednn else "0"
    return "oneDNN" if onednn else "Eigen (TensorFlow's default kernels without oneDNN)"


def set_threads(inter_op: int, intra_op: int) -> str:
    """Sets TensorFlow's thread pools (before anything runs) and says what
    TensorFlow reports back."""
    import tensorflow as tf

    tf.config.threading.set_inter_op_parallelism_threads(inter_op)
    tf.config.threading.set_intra_op_parallelism_threads(intra_op)
    describe = lambda n: "one per core" if n == 0 else str(n)
    return (f"intra-op {describe(tf.config.threading.get_intra_op_parallelism_threads())}, "
            f"inter-op {describe(tf.config.threading.get_inter_op_parallelism_threads())}")


def main(argv):
    nmt_flags.start_cli(argv, verbose=True, accepts=TOOL_FLAGS)
    FLAGS = absl_flags.FLAGS
    if not FLAGS.model_base_path:
        print("error: --model_base_path is required.", file=sys.stderr)
        return 1
    print(f"CPU kernels: {choose_kernels(FLAGS.onednn)}", flush=True)
    print(f"TensorFlow threads: {set_threads(FLAGS.inter_op_threads, FLAGS.intra_op_threads)}", flush=True)
    try:
        server, registry, port = start_server(
            FLAGS.model_name, FLAGS.model_base_path, FLAGS.port, FLAGS.host, FLAGS.threads,
            FLAGS.max_message_mb, FLAGS.max_batch_size, FLAGS.poll_seconds, log=print)
    except (FileNotFoundError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"Serving model '{FLAGS.model_name}' version {registry.current.version} on port {port} "
          "(TF Serving gRPC API; production deployments use tensorflow_model_server, see export/README.md)",
          flush=True)
    try:
        server.wait_for_termination()
    except KeyboardInterrupt:
        server.stop(grace=2)
    return 0


if __name__ == "__main__":
    app.run(main)
