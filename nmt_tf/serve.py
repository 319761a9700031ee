r"""A server speaking TensorFlow Serving's gRPC and REST APIs, for machines without it.

Usage:
  python -m nmt_tf.serve --port=8500 --model_name=nmt --model_base_path=exports/nmt
  python -m nmt_tf.serve --port=8500 --rest_api_port=8501 --model_name=nmt --model_base_path=exports/nmt
  python -m nmt_tf.serve --preset=multi30k_en_fr --rest_api_port=8501     # the shipped model; page at :8501/

Production deployments should use the official `tensorflow_model_server`
(see export/README.md: docker-compose, models.config, batching parameters).
This server exists for machines where that binary cannot be installed, and
for tests: it implements the same services on the same protos (from the
tensorflow-serving-api package), so clients cannot tell the difference:

  tensorflow.serving.PredictionService  Predict, GetModelMetadata
                                        (Classify, Regress, MultiInference: UNIMPLEMENTED)
  tensorflow.serving.ModelService       GetModelStatus (HandleReloadConfigRequest: UNIMPLEMENTED)

and, with --rest_api_port (off by default, as in TF Serving), TF Serving's
REST API on the same functions (POST /v1/models/NAME:predict, GET
/v1/models/NAME[/metadata]; see nmt_tf.rest), with TF Serving's JSON and its
errors as {"error": "..."} with the HTTP status it maps from the gRPC one,
and at / a page that translates what you type and shows the n-best list and
the attention as a heatmap, through that REST API (nmt_tf.page). A
request body larger than --max_message_mb is refused with 413 before it is
read. Each front end answers --threads requests at a time; the REST API
reads each request whole on one receiver thread before a worker takes it (a
slow or idle client holds no worker; 30 s for the headers, 120 s for the
body, then 408), with at most --rest_max_connections connections open (one
more: 503 at once). The model versions and the requests'
checks (the same for both) are nmt_tf.serving. With --enable_batching
(or --batching_parameters_file, TF Serving's BatchingParameters text proto)
concurrent Predict requests of both front ends are joined into one call of
the signature and their outputs split back (nmt_tf.batching). It listens on
--host (0.0.0.0: every interface, as TF Serving) without authentication;
--ssl_config_file (TF Serving's SSLConfig) puts both ports behind TLS,
optionally mutual (nmt_tf.tls).

It serves the versions under --model_base_path that --model_version_policy
chooses (TF Serving's model_version_policy: latest, the default, is the
highest; latest=N, all, specific=V1,V2,...), or the model of a TF Serving
--model_config_file (with version_labels), and loads a new version when one
appears (checked every --poll_seconds); a version the policy no longer
chooses is unloaded once a chosen one serves, and at once when its folder
is removed, so removing the served version's folder serves the highest one
left (none left: NOT_FOUND until one appears); folders whose number does
not fit in an int64 are ignored with one log line. Each version runs in a
TF1 session of its own, closed when it is unloaded. Requests follow
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
stop the server: every failure becomes a status. A port (gRPC or REST) that
another process holds is refused at start (exit code 1), as TF Serving refuses it.
"""

from __future__ import annotations

import concurrent.futures
import os

import grpc
from absl import app
from absl import flags as absl_flags
from absl import logging

from nmt_tf import flags as nmt_flags  # also defines --model_name, --preset
from nmt_tf import presets
from nmt_tf.batching import Batcher, BatchingError, BatchingParameters, read_batching_parameters, request_threads
from nmt_tf.hardware import set_onednn
from nmt_tf.tls import TlsConfig, read_ssl_config
from nmt_tf.rest import start_rest_server
from nmt_tf.serving import (ModelRegistry, ServingError, VersionPolicy, model_metadata, model_status,
                            read_model_config, run_predict)

absl_flags.DEFINE_integer("port", 8500, "gRPC port (TF Serving's default is 8500).")
absl_flags.DEFINE_integer(
    "rest_api_port", 0,
    "Port of TF Serving's REST API (/v1/models/...), served besides gRPC; 0 (the default, as in TF Serving): "
    "no REST API. TF Serving's Docker image uses 8501.", lower_bound=0)
absl_flags.DEFINE_string("host", "0.0.0.0", "Address to listen on.")
absl_flags.DEFINE_string("model_base_path", None, "Directory holding numbered SavedModel versions (nmt_tf.export's --export_dir).")
absl_flags.DEFINE_string(
    "ssl_config_file", None,
    "TF Serving's SSLConfig text proto (server_key, server_cert, custom_ca: PEM text; client_verify): gRPC and "
    "the REST API (HTTPS) then take TLS connections only; client_verify requires client certificates signed by "
    "custom_ca. Without it both ports speak plain text, as TF Serving's do.")
absl_flags.DEFINE_float("poll_seconds", 2.0, "How often to look for a new version.", lower_bound=0.1)
absl_flags.DEFINE_string(
    "model_version_policy", "latest",
    "Which versions under --model_base_path are served, as TF Serving's model_version_policy: latest (the "
    "highest), latest=N (the N highest), all, or specific=V1,V2,... A request without a version gets the "
    "highest served.")
absl_flags.DEFINE_string(
    "model_config_file", None,
    "TF Serving's model config file (a ModelServerConfig text proto, as export/models.config) with one model: "
    "its name, base_path (relative: to the file's folder), model_version_policy and version_labels; instead of "
    "--model_name, --model_base_path and --model_version_policy.")
absl_flags.DEFINE_integer("threads", 8, "Concurrent requests served, by gRPC and by the REST API each "
                          "(with --enable_batching at least max_batch_size x num_batch_threads, at most 512: "
                          "requests waiting for their batch hold a thread but no CPU).", lower_bound=1)
absl_flags.DEFINE_boolean(
    "enable_batching", False,
    "Join concurrent Predict requests of the same version, signature and outputs into one call of the "
    "signature and split the replies (TF Serving's flag; nmt_tf.batching). Parameters from "
    "--batching_parameters_file, else TF Serving's defaults (max_batch_size 1000, batch_timeout_micros 0, "
    "max_enqueued_batches 10, num_batch_threads one per core).")
absl_flags.DEFINE_string(
    "batching_parameters_file", None,
    "TF Serving's BatchingParameters text proto (max_batch_size, batch_timeout_micros, max_enqueued_batches, "
    "num_batch_threads, allowed_batch_sizes, pad_variable_length_inputs, thread_pool_name), as in "
    "export/batching_parameters.txt; implies --enable_batching.")
absl_flags.DEFINE_integer(
    "rest_max_connections", 64,
    "REST connections open at once (being read, waiting for a --threads worker, or answered); one more is "
    "answered 503 at once. A request is read whole before a worker takes it, so slow or idle clients hold "
    "only their connection, for at most 30 s of headers and 120 s of body.", lower_bound=1)
absl_flags.DEFINE_float("max_message_mb", 32.0,
                        "Largest request or response message (gRPC) and largest REST request body, in MiB.",
                        lower_bound=0.01)
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

TOOL_FLAGS = nmt_flags.tool_flags(__name__, ("model_name", "preset"))


def make_servicers(registry: ModelRegistry, max_batch_size: int, max_message_bytes: int | None = None,
                   batcher: Batcher | None = None):
    """The PredictionService and ModelService implementations (with a
    `batcher`, Predict requests are joined in batches, each waiting at most
    its deadline)."""
    from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

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
            return run_predict(registry, request, max_batch_size, max_message_bytes, batcher=batcher,
                               timeout=context.time_remaining())

        @guarded
        def GetModelMetadata(self, request, context):
            return model_metadata(registry, request)

    class ModelService(model_service_pb2_grpc.ModelServiceServicer):
        @guarded
        def GetModelStatus(self, request, context):
            return model_status(registry, request)

    return PredictionService(), ModelService()


def start_server(model_name: str, model_base_path: str, port: int, host: str = "0.0.0.0",
                 threads: int = 8, max_message_mb: float = 32.0, max_batch_size: int = 1024,
                 poll_seconds: float = 2.0, log=logging.info, batcher: Batcher | None = None,
                 policy: VersionPolicy | None = None, labels: dict | None = None, tls: TlsConfig | None = None):
    """Starts serving; returns (grpc server, registry, bound port). `threads`
    is the gRPC worker count (see batching.request_threads for batching)."""
    from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

    registry = ModelRegistry(model_name, model_base_path, log=log, policy=policy, labels=labels)
    registry.poll()
    if registry.current is None:
        found = registry.available_versions()
        if not found:
            raise FileNotFoundError(
                f"no SavedModel version (a numbered folder with saved_model.pb) under {model_base_path}")
        failed = registry.failed
        raise FileNotFoundError(
            f"no version under {model_base_path} could be served: found {', '.join(map(str, found))}; "
            + (f"{registry.policy.describe()} failed to load: " + "; ".join(f"{v}: {m}" for v, m in failed.items())
               if failed else f"the version policy serves {registry.policy.describe()}"))
    registry.watch(poll_seconds)
    limit = int(max_message_mb * 1024 * 1024)
    # grpcio sets SO_REUSEPORT by default: a second server on a taken port
    # would start and share the connections. TF Serving refuses the port.
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=threads),
                         options=[("grpc.max_receive_message_length", limit),
                                  ("grpc.max_send_message_length", limit),
                                  ("grpc.so_reuseport", 0)])
    prediction, model_service = make_servicers(registry, max_batch_size, limit, batcher)
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(prediction, server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(model_service, server)
    try:
        bound = (server.add_secure_port(f"{host}:{port}", tls.grpc_credentials()) if tls
                 else server.add_insecure_port(f"{host}:{port}"))
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
    set_onednn(onednn, "choose_kernels()")
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
    if sum(bool(x) for x in (FLAGS.model_base_path, FLAGS.preset, FLAGS.model_config_file)) != 1:
        return nmt_flags.user_error("give one of --model_base_path, --preset (a model shipped with nmt_tf) or "
                                    "--model_config_file.")
    model_name, labels = FLAGS.model_name, {}
    if FLAGS.model_config_file:
        given = [f"--{n}" for n in ("model_name", "model_version_policy") if FLAGS[n].present]
        if given:
            return nmt_flags.user_error(f"--model_config_file names the model and its version policy: "
                                        f"leave out {' and '.join(given)}.")
        try:
            config = read_model_config(FLAGS.model_config_file)
        except ValueError as e:
            return nmt_flags.user_error(e)
        model_name, policy, labels = config.name, config.policy, config.labels
    else:
        try:
            policy = VersionPolicy.parse(FLAGS.model_version_policy)
        except ValueError as e:
            return nmt_flags.user_error(f"--model_version_policy: {e}")
    print(f"CPU kernels: {choose_kernels(FLAGS.onednn)}", flush=True)
    print(f"TensorFlow threads: {set_threads(FLAGS.inter_op_threads, FLAGS.intra_op_threads)}", flush=True)
    params = None
    if FLAGS.enable_batching or FLAGS.batching_parameters_file:
        try:
            params = (read_batching_parameters(FLAGS.batching_parameters_file) if FLAGS.batching_parameters_file
                      else BatchingParameters())
        except BatchingError as e:
            return nmt_flags.user_error(e)
    tls = None
    if FLAGS.ssl_config_file:
        try:
            tls = read_ssl_config(FLAGS.ssl_config_file)
        except ValueError as e:
            return nmt_flags.user_error(e)
    threads = request_threads(FLAGS.threads, params)
    batcher = Batcher(params) if params else None
    if params:
        print(f"Batching: {params.describe()}; {threads} request threads per front end", flush=True)
    model_base_path = config.base_path if FLAGS.model_config_file else FLAGS.model_base_path
    if FLAGS.preset:      # after the kernels' choice: building imports TensorFlow
        try:
            model_base_path = os.path.dirname(presets.build(FLAGS.preset))
        except presets.PresetError as e:
            return nmt_flags.user_error(e)
    try:
        server, registry, port = start_server(
            model_name, model_base_path, FLAGS.port, FLAGS.host, threads, FLAGS.max_message_mb,
            FLAGS.max_batch_size, FLAGS.poll_seconds, log=print, batcher=batcher, policy=policy, labels=labels,
            tls=tls)
    except (FileNotFoundError, OSError) as e:
        return nmt_flags.user_error(e)
    rest = None
    if FLAGS.rest_api_port:
        try:
            rest = start_rest_server(registry, FLAGS.rest_api_port, FLAGS.host, threads,
                                     FLAGS.max_message_mb, FLAGS.max_batch_size,
                                     max_connections=FLAGS.rest_max_connections, batcher=batcher,
                                     ssl_context=tls.ssl_context() if tls else None)
        except OSError as e:
            server.stop(grace=0)
            registry.stop()
            return nmt_flags.user_error(e)
    secure = " over TLS" if tls else ""
    ports = f"port {port} (TF Serving gRPC API{secure})" + (f" and {rest.port} (REST API{secure})" if rest else "")
    versions = ", ".join(map(str, registry.versions))
    print(f"Serving model '{model_name}' version{'s' if len(registry.versions) > 1 else ''} {versions} "
          f"({policy.describe()}) on {ports}; "
          "production deployments use tensorflow_model_server, see export/README.md", flush=True)
    if rest:
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(FLAGS.host, FLAGS.host)
        print(f"Translation page: http{'s' if tls else ''}://{f'[{host}]' if ':' in host else host}:{rest.port}/",
              flush=True)
    try:
        server.wait_for_termination()
    except KeyboardInterrupt:
        if rest:
            rest.stop()
        server.stop(grace=2)
    return 0


if __name__ == "__main__":
    app.run(main)
