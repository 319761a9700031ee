r"""Load test of a TF Serving-compatible gRPC server: prints one JSON object.

  python benchmarks/serve_load.py --model_base_path=exports/nmt            # starts nmt_tf.serve itself
  python benchmarks/serve_load.py --server=localhost:8500 --model_name=nmt # an already running server

Runs --clients concurrent clients on loopback; each sends one-sentence
Predict requests (sentences of the Multi30k test 2016 source, in turn) until
--requests requests have been sent in total, after --warmup requests that are
not timed. Reports throughput (requests/s), latency p50 / p90 / p99 in
milliseconds and the number of failed requests (which must be 0). With
--clients_list, runs one measurement per client count.

With --batching_parameters_file (and --model_base_path), two servers are
started, one without and one with `--enable_batching` and those parameters,
and each client count is measured on both, --rounds times, alternating which
goes first; the output gives each round's numbers, the medians, and the
batched/unbatched ratios of requests/s, with p99 against the unbatched
one-client p50:

  python benchmarks/serve_load.py --model_base_path=E --batching_parameters_file=export/batching_parameters.txt
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app
from absl import flags as absl_flags

from nmt_tf import flags as nmt_flags  # noqa: F401  (--model_name, --server: a running server, else one is started)
from nmt_tf.files import read_lines

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
absl_flags.DEFINE_string("model_base_path", None, "Export directory to serve with nmt_tf.serve.")
absl_flags.DEFINE_list("clients_list", ["1", "32"], "Numbers of concurrent clients to measure.")
absl_flags.DEFINE_integer("requests", 400, "Timed requests per measurement.", lower_bound=1)
absl_flags.DEFINE_integer("warmup", 20, "Untimed requests first.", lower_bound=0)
absl_flags.DEFINE_boolean("server_onednn", False, "Start nmt_tf.serve with --onednn (its CPU kernels).")
absl_flags.DEFINE_list("server_args", [], "More flags for the nmt_tf.serve it starts, e.g. "
                       "--server_args=--intra_op_threads=0,--inter_op_threads=2.")
absl_flags.DEFINE_string("source", os.path.join(REPO, "data/multi30k/test_2016_flickr.en.gz"), "Sentences.")
absl_flags.DEFINE_string("batching_parameters_file", None,
                         "Also measure a server with --enable_batching and these parameters, side by side.")
absl_flags.DEFINE_integer("rounds", 1, "With --batching_parameters_file: measurements per server and client "
                          "count, alternating which server goes first.", lower_bound=1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(base_path: str, model_name: str, onednn: bool, extra_args=()):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "nmt_tf.serve", f"--port={port}", "--host=127.0.0.1",
                             f"--model_base_path={base_path}", f"--model_name={model_name}", "--threads=32",
                             f"--{'' if onednn else 'no'}onednn", *extra_args],
                            cwd=REPO, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:                     # wait for "Serving model ..."
        if line.startswith("Serving model"):
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, f"127.0.0.1:{port}"
    raise RuntimeError("the server did not start")


def run(address, model_name, sentences, clients, total, warmup):
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    # One connection per client, as separate client processes have (channels of one process to one target
    # share a connection by default).
    channels = [grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(clients)]
    stubs = [prediction_service_pb2_grpc.PredictionServiceStub(c) for c in channels]
    requests = []
    for s in sentences:
        r = predict_pb2.PredictRequest()
        r.model_spec.name = model_name
        r.inputs["text"].CopyFrom(tf.make_tensor_proto([s], dtype=tf.string))
        r.output_filter.append("translation")
        requests.append(r)
    lock = threading.Lock()
    counter = {"next": 0}
    latencies, errors = [], []

    def take():
        with lock:
            i = counter["next"]
            counter["next"] += 1
        return i

    def client(stub, limit):
        while (i := take()) < limit:
            start = time.perf_counter()
            try:
                stub.Predict(requests[i % len(requests)], timeout=60)
                elapsed = time.perf_counter() - start
                with lock:
                    latencies.append(elapsed)
            except grpc.RpcError as e:
                with lock:
                    errors.append(e.code().name)

    for limit, timed in ((warmup, False), (warmup + total, True)):
        if not timed:
            threads = [threading.Thread(target=client, args=(stubs[0], limit))]
        else:
            latencies.clear()
            threads = [threading.Thread(target=client, args=(stub, limit)) for stub in stubs]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.perf_counter() - start
    lat = sorted(latencies)
    q = lambda p: round(1000 * lat[min(len(lat) - 1, int(p * len(lat)))], 1) if lat else None
    for c in channels:
        c.close()
    return {"clients": clients, "requests": total, "seconds": round(seconds, 2),
            "requests_per_sec": round(len(lat) / seconds, 2), "p50_ms": q(0.5), "p90_ms": q(0.9),
            "p99_ms": q(0.99), "mean_ms": round(1000 * statistics.fmean(lat), 1) if lat else None,
            "errors": len(errors)}


def compare_batching(sentences, model_name, base_path, onednn, extra_args, params_file, clients_list, rounds,
                     total, warmup):
    """Both servers side by side: {"rounds": [...], "median": {...}, "ratios": {...}}."""
    servers = {"unbatched": start_server(base_path, model_name, onednn, extra_args),
               "batched": start_server(base_path, model_name, onednn,
                                       [*extra_args, "--enable_batching", f"--batching_parameters_file={params_file}"])}
    rounds_out = []
    try:
        for r in range(rounds):
            order = ["unbatched", "batched"] if r % 2 == 0 else ["batched", "unbatched"]
            rounds_out.append({name: [run(servers[name][1], model_name, sentences, int(c), total, warmup)
                                      for c in clients_list] for name in order})
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait()
    median = {name: [{key: statistics.median(r[name][i][key] for r in rounds_out)
                      for key in ("requests_per_sec", "p50_ms", "p90_ms", "p99_ms", "errors")}
                     | {"clients": int(c)} for i, c in enumerate(clients_list)]
              for name in ("unbatched", "batched")}
    lone_p50 = median["unbatched"][0]["p50_ms"]
    ratios = [{"clients": int(c),
               "requests_per_sec_batched_over_unbatched":
                   round(median["batched"][i]["requests_per_sec"] / median["unbatched"][i]["requests_per_sec"], 2),
               "batched_p99_over_lone_p50": round(median["batched"][i]["p99_ms"] / lone_p50, 2)}
              for i, c in enumerate(clients_list)]
    return {"rounds": rounds_out, "median": median, "ratios": ratios,
            "lone_request_p50_ms": lone_p50, "batching_parameters": open(params_file).read()}


def main(argv):
    FLAGS = absl_flags.FLAGS
    sentences = read_lines(FLAGS.source)
    if FLAGS.batching_parameters_file:
        if not FLAGS.model_base_path:
            raise app.UsageError("--batching_parameters_file needs --model_base_path (both servers are started here)")
        out = compare_batching(sentences, FLAGS.model_name, FLAGS.model_base_path, FLAGS.server_onednn,
                               FLAGS.server_args, FLAGS.batching_parameters_file, FLAGS.clients_list,
                               FLAGS.rounds, FLAGS.requests, FLAGS.warmup)
        print(json.dumps({"server": " ".join(["nmt_tf.serve"] + (["--onednn"] if FLAGS.server_onednn else [])
                                             + FLAGS.server_args), **out}))
        return
    proc = None
    address = FLAGS.server
    if not address:
        if not FLAGS.model_base_path:
            raise app.UsageError("give --server or --model_base_path")
        proc, address = start_server(FLAGS.model_base_path, FLAGS.model_name, FLAGS.server_onednn,
                                     FLAGS.server_args)
    try:
        results = [run(address, FLAGS.model_name, sentences, int(c), FLAGS.requests, FLAGS.warmup)
                   for c in FLAGS.clients_list]
    finally:
        if proc:
            proc.terminate()
            proc.wait()
    server = address
    if proc:
        server = " ".join(["nmt_tf.serve"] + (["--onednn"] if FLAGS.server_onednn else []) + FLAGS.server_args)
    print(json.dumps({"server": server, "results": results}))


if __name__ == "__main__":
    app.run(main)
