"""One model served over TensorFlow Serving's gRPC API, and its REST API and
translation page: the library behind `python -m nmt_tf.serve`, whose help
says what is served and how requests are checked. From Python:

    from nmt_tf.serving import server
    from nmt_tf.config import ServerConfig
    running = server.start(ServerConfig(model_base_path="exports/nmt", port=8500, rest_api_port=8501))
    ...
    running.stop()

`start` reads the configuration's files (model config, batching parameters,
TLS), chooses the CPU kernels and threads (only before TensorFlow's import,
which reads them: a process that imported it keeps its own), builds a
preset if asked, loads the served versions
(nmt_tf.serving.versions) and opens the ports; `start_server` and `make_servicers`
are its gRPC parts.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import sys

import grpc
from absl import logging

from nmt_tf import presets
from nmt_tf.config import ConfigError, ServerConfig
from nmt_tf.core.hardware import set_onednn
from nmt_tf.serving import api_protos as serving_protos
from nmt_tf.serving.batching import Batcher, BatchingParameters, read_batching_parameters, request_threads
from nmt_tf.serving.litert import LiteRTVersion
from nmt_tf.serving.http_server import RestSettings
from nmt_tf.serving.rest import start_rest_server
from nmt_tf.serving.tls import TlsConfig, expiry_warning, read_ssl_config
from nmt_tf.serving.versions import (
    BATCH_WAIT_SECONDS,
    MAX_SEARCH_WORK,
    FairGate,
    LoadedVersion,
    ModelRegistry,
    ServingError,
    VersionPolicy,
    client_address,
    model_metadata,
    model_status,
    read_model_config,
    run_predict,
)


def make_servicers(registry: ModelRegistry, max_batch_size: int, max_message_bytes: int | None = None,
                   batcher: Batcher | None = None, gate: FairGate | None = None):
    """The PredictionService and ModelService implementations (with a
    `batcher`, Predict requests are joined in batches, each waiting at most
    its deadline); with a `gate`, each Predict decodes in its client's turn
    (serving.FairGate). Their methods take (request, context), as gRPC
    calls them (serving_protos.add_services registers them)."""
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

    class PredictionService:
        @guarded
        def Predict(self, request, context):
            remaining = context.time_remaining() if context is not None else None
            client = client_address(context.peer()) if context is not None else ""
            if gate is None:
                return run_predict(registry, request, max_batch_size, max_message_bytes, batcher=batcher,
                                   timeout=remaining, client=client)
            wait = BATCH_WAIT_SECONDS if remaining is None else min(remaining, BATCH_WAIT_SECONDS)
            with gate.turn(client, wait):
                return run_predict(registry, request, max_batch_size, max_message_bytes, timeout=remaining)

        @guarded
        def GetModelMetadata(self, request, context):
            return model_metadata(registry, request)

    class ModelService:
        @guarded
        def GetModelStatus(self, request, context):
            return model_status(registry, request)

    return PredictionService(), ModelService()


PENDING_PER_THREAD = 4


def fair_gate(threads: int) -> FairGate:
    """The decoding turns of one server, shared by its gRPC and REST front
    ends: at most min(threads, cores) decode at once, and a client holds at
    most 3/4 of the calls the gRPC server admits (PENDING_PER_THREAD x threads)."""
    return FairGate(max(1, min(threads, os.cpu_count() or 1)), max(1, PENDING_PER_THREAD * threads * 3 // 4))


def start_server(model_name: str, model_base_path: str, port: int, host: str = "0.0.0.0",
                 threads: int = 8, max_message_mb: float = 32.0, max_batch_size: int = 1024,
                 poll_seconds: float = 2.0, log=logging.info, batcher: Batcher | None = None,
                 policy: VersionPolicy | None = None, labels: dict | None = None, tls: TlsConfig | None = None,
                 max_search_work: int = MAX_SEARCH_WORK, runtime: str = "tensorflow", litert_threads: int = 1,
                 gate: FairGate | None = None):
    """Starts serving; returns (grpc server, registry, bound port). `threads`
    is the gRPC worker count (see batching.request_threads for batching);
    without a `batcher`, calls decode in their client's turn at `gate`
    (default: a `fair_gate` of their own; the REST front end's too when it
    is given the same);
    `max_search_work` bounds each translation request's search, over gRPC
    and REST alike (serving.SearchCost); `runtime` "litert" serves LiteRT
    model folders (nmt_tf.serving.litert) with `litert_threads` threads per
    interpreter."""
    registry = ModelRegistry(model_name, model_base_path, log=log, policy=policy, labels=labels,
                             max_search_work=max_search_work, litert_threads=litert_threads,
                             version_kind=LiteRTVersion if runtime == "litert" else LoadedVersion)
    registry.poll()
    if registry.current is None:
        found = registry.available_versions()
        if not found:
            kind = registry.version_kind
            raise FileNotFoundError(f"no {kind.KIND} version (a numbered folder with {kind.MARKER}) under "
                                    f"{model_base_path}" + ("" if runtime == "litert" else
                                                            " (a LiteRT model folder is served with --runtime=litert)"))
        failed = registry.failed
        raise FileNotFoundError(
            f"no version under {model_base_path} could be served: found {', '.join(map(str, found))}; "
            + (f"{registry.policy.describe()} failed to load: " + "; ".join(f"{v}: {m}" for v, m in failed.items())
               if failed else f"the version policy serves {registry.policy.describe()}"))
    unserved = {label: version for label, version in registry.labels.items() if version not in registry.versions}
    if unserved:       # as TF Serving: a label must name a version that is served
        registry.stop()
        raise ValueError(f"version_labels {unserved} name versions that are not served (served: "
                         f"{', '.join(map(str, registry.versions))})")
    registry.watch(poll_seconds)
    limit = int(max_message_mb * 1024 * 1024)
    # grpcio sets SO_REUSEPORT by default: a second server on a taken port
    # would start and share the connections. TF Serving refuses the port.
    # The server admits at most PENDING_PER_THREAD x threads calls (running or waiting for a worker): one
    # more is refused at once (RESOURCE_EXHAUSTED) instead of joining an unbounded queue (issue 95: 3,000
    # pending calls of one client made another's time out). (A per-connection limit of HTTP/2 streams was
    # tried: a client bursting its concurrent calls on a new connection, as batching clients do, had the
    # excess reset, UNAVAILABLE.)
    # Without batching, calls take decoding turns client by client (serving.FairGate: issue 95, 3,000
    # pending calls of one client made another's time out): at most min(threads, cores) decode at once,
    # each admitted call waits for its turn on a thread of its own (so the executor has one per admitted
    # call and never queues one behind another client's), and a client holds at most 3/4 of the admitted
    # calls. With batching the batcher joins the calls instead, and they run as before.
    # The REST front end takes its turns at the same gate when it is given it (`gate`; serve() does).
    admitted = PENDING_PER_THREAD * threads
    gate = None if batcher is not None else (gate or fair_gate(threads))
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=admitted if gate else threads),
                         options=[("grpc.max_receive_message_length", limit),
                                  ("grpc.max_send_message_length", limit),
                                  ("grpc.so_reuseport", 0)],
                         maximum_concurrent_rpcs=admitted)
    prediction, model_service = make_servicers(registry, max_batch_size, limit, batcher, gate)
    serving_protos.add_services(server, prediction, model_service)
    try:
        # An IPv6 address goes in brackets ("::" alone was refused: "Misformatted domain name").
        address = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
        bound = (server.add_secure_port(address, tls.grpc_credentials()) if tls
                 else server.add_insecure_port(address))
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


STOP_GRACE_SECONDS = 2.0


@dataclasses.dataclass
class RunningServer:
    """What `start` started: the gRPC server and its port, the REST server
    (None without a REST port) and the registry of served versions."""
    grpc_server: object
    registry: ModelRegistry
    port: int
    rest: object = None

    def wait(self, log=None) -> None:
        """Serves until the process is interrupted (Ctrl-C, or SIGTERM where
        python -m nmt_tf.serve turns it into one), then stops, giving the
        requests in flight STOP_GRACE_SECONDS; `log` hears it."""
        try:
            self.grpc_server.wait_for_termination()
        except KeyboardInterrupt:
            if log:
                log(f"Stopping: the requests in flight have {STOP_GRACE_SECONDS:g} s to finish")
            self.stop(grace=STOP_GRACE_SECONDS)

    def stop(self, grace: float = 0) -> None:
        """Closes the ports (gRPC after `grace` seconds for requests in flight) and stops watching for
        new versions."""
        if self.rest:
            self.rest.stop()
        self.grpc_server.stop(grace=grace).wait()
        self.registry.stop()


def rest_settings(config: ServerConfig, threads: int) -> RestSettings:
    """The REST API's settings of a server configuration (its --rest_* flags)."""
    return RestSettings(port=config.rest_api_port, host=config.host, threads=threads,
                        max_message_mb=config.max_message_mb, max_batch_size=config.max_batch_size,
                        max_connections=config.rest_max_connections,
                        max_connections_per_client=config.rest_max_connections_per_client,
                        allowed_hosts=tuple(config.rest_allowed_hosts))


def start(config: ServerConfig, log=print) -> RunningServer:
    """Starts serving `config`'s model; `log` gets what was chosen and where it
    listens. Raises ConfigError or another ValueError naming the file or
    setting at fault, FileNotFoundError when no version can be served, and
    OSError when a port cannot be had."""
    model_name, labels, base_path = config.model_name, {}, config.model_base_path
    if config.model_config_file:
        model_config = read_model_config(config.model_config_file)
        model_name, policy, labels, base_path = (model_config.name, model_config.policy, model_config.labels,
                                                 model_config.base_path)
    else:
        try:
            policy = VersionPolicy.parse(config.model_version_policy)
        except ValueError as e:
            raise ConfigError(f"--model_version_policy: {e}") from None
    litert = config.runtime == "litert"
    if litert:
        log(f"Runtime: LiteRT, one interpreter of {config.litert_threads} thread"
            f"{'s' if config.litert_threads > 1 else ''} per request in flight, up to one per core "
            "(TensorFlow is not imported)")
    elif "tensorflow" in sys.modules:       # its kernels and thread pools are this process's already
        log("CPU kernels and TensorFlow threads: this process's (TensorFlow was imported before "
            "nmt_tf.serving.server.start; --onednn and the thread settings take effect in a fresh process, as "
            "python -m nmt_tf.serve starts)")
    else:
        log(f"CPU kernels: {choose_kernels(config.onednn)}")
        log(f"TensorFlow threads: {set_threads(config.inter_op_threads, config.intra_op_threads)}")
    params = None
    if config.enable_batching or config.batching_parameters_file:
        params = (read_batching_parameters(config.batching_parameters_file) if config.batching_parameters_file
                  else BatchingParameters())
    tls = read_ssl_config(config.ssl_config_file) if config.ssl_config_file else None
    warning = tls and expiry_warning(tls)
    if warning:
        log(warning)
    threads = request_threads(config.threads, params)
    batcher = Batcher(params) if params else None
    gate = None if batcher else fair_gate(threads)        # gRPC and REST calls take turns at one gate
    if params:
        log(f"Batching: {params.describe()}; {threads} request threads per front end")
    if config.preset:      # after the kernels' choice: building imports TensorFlow (LiteRT: in a child process)
        base_path = os.path.dirname(presets.litert_model(config.preset, config.litert_weights, log=log) if litert
                                    else presets.build(config.preset))
    grpc_server, registry, port = start_server(
        model_name, base_path, config.port, config.host, threads, config.max_message_mb, config.max_batch_size,
        config.poll_seconds, log=log, batcher=batcher, policy=policy, labels=labels, tls=tls,
        max_search_work=config.max_search_work, runtime=config.runtime, litert_threads=config.litert_threads,
        gate=gate)
    rest = None
    if config.rest_api_port:
        try:
            rest = start_rest_server(registry, rest_settings(config, threads), batcher=batcher, gate=gate,
                                     ssl_context=tls.ssl_context() if tls else None)
        except OSError:
            grpc_server.stop(grace=0)
            registry.stop()
            raise
    secure = " over TLS" if tls else ""
    ports = f"port {port} (TF Serving gRPC API{secure})" + (f" and {rest.port} (REST API{secure})" if rest else "")
    versions = ", ".join(map(str, registry.versions))
    log(f"Serving model '{model_name}' version{'s' if len(registry.versions) > 1 else ''} {versions} "
        f"({policy.describe()}) on {ports}; "
        "production deployments use tensorflow_model_server, see export/README.md")
    if rest:
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(config.host, config.host)
        log(f"Translation page: http{'s' if tls else ''}://{f'[{host}]' if ':' in host else host}:{rest.port}/")
    return RunningServer(grpc_server, registry, port, rest)
