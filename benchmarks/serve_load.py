r"""Load test of a TF Serving-compatible gRPC server: prints one JSON object.

  python benchmarks/serve_load.py --model_base_path=exports/nmt            # starts nmt_tf.serve itself
  python benchmarks/serve_load.py --server=localhost:8500 --model_name=nmt # an already running server

Runs --clients concurrent clients on loopback; each sends one-sentence
Predict requests (sentences of the Multi30k test 2016 source, in turn) until
--requests requests have been sent in total, after --warmup requests that are
not timed. Reports throughput (requests/s), latency p50 / p90 / p99 in
milliseconds and the number of failed requests (which must be 0). With
--clients_list, runs one measurement per client count.

With --batching_parameters_file or --litert_base_path (and --model_base_path),
servers are started side by side: "tensorflow" (the SavedModel versions of
--model_base_path), "tensorflow_batched" (the same with `--enable_batching`
and those parameters) and "litert" (`--runtime=litert` on the LiteRT model
versions of --litert_base_path). Each client count is measured on each,
--rounds times, turning which goes first; the output gives each round's
numbers, the medians, each server's resident memory (now and at its peak,
after the load), and every other server's requests/s and p50 over the
"tensorflow" server's, with its p99 against that server's one-client p50:

  python benchmarks/serve_load.py --model_base_path=E --batching_parameters_file=export/batching_parameters.txt
  python benchmarks/serve_load.py --model_base_path=<build>/export --litert_base_path=<build>/litert-int8 --rounds=3

With --beam_sizes, every measurement is made once per beam size, with
requests of the translate_with_options signature asking for that beam (the
export's other settings); each result says its "beam_size".

  python benchmarks/serve_load.py --model_base_path=<build>/export --litert_base_path=<build>/litert-int8 \
      --clients_list=1 --beam_sizes=1,2,3,5,10 --rounds=2
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
from nmt_tf.core.files import read_lines
from nmt_tf.core.hardware import vector_flags

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
absl_flags.DEFINE_string("litert_base_path", None,
                         "Also measure nmt_tf.serve --runtime=litert serving the LiteRT model versions under this "
                         "folder (a preset's: the folder above the one python -m nmt_tf.presets "
                         "--build_litert=multi30k_en_fr prints), side by side.")
absl_flags.DEFINE_list("beam_sizes", [], "Measure each of these beam sizes (translate_with_options requests); "
                       "none: serving_default, the export's search.")
absl_flags.DEFINE_integer("rounds", 1, "With --batching_parameters_file or --litert_base_path: measurements per "
                          "server and client count, turning which server goes first.", lower_bound=1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(base_path: str, model_name: str, onednn: bool, extra_args=()):
    """nmt_tf.serve on a free port, started here; (process, address) once it serves."""
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


def run(address, model_name, sentences, clients, total, warmup, beam_size=None):
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
        if beam_size is not None:
            r.model_spec.signature_name = "translate_with_options"
            r.inputs["beam_size"].CopyFrom(tf.make_tensor_proto(beam_size, dtype=tf.int32))
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
    return {"clients": clients, **({} if beam_size is None else {"beam_size": beam_size}),
            "requests": total, "seconds": round(seconds, 2),
            "requests_per_sec": round(len(lat) / seconds, 2), "p50_ms": q(0.5), "p90_ms": q(0.9),
            "p99_ms": q(0.99), "mean_ms": round(1000 * statistics.fmean(lat), 1) if lat else None,
            "errors": len(errors)}


def memory_mb(pid: int) -> dict:
    """A process's resident memory now and at its peak (MB), from /proc."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = round(int(value.split()[0]) / 1024, 1)
    return {"rss_mb": fields.get("VmRSS"), "peak_rss_mb": fields.get("VmHWM")}


def cases(clients_list, beam_sizes) -> list[tuple[int, int | None]]:
    """(clients, beam size or None) of every measurement, in order."""
    return [(int(c), int(b) if b is not None else None) for c in clients_list for b in (beam_sizes or [None])]


def compare(sentences, model_name, servers: dict, clients_list, rounds, total, warmup, beam_sizes=()):
    """Servers side by side, {name: (base path, nmt_tf.serve flags)}, the first
    the baseline: each client count on each, --rounds times, the order
    turning round by round. {"rounds": [...], "median": {...}, "memory":
    {...}, "ratios": {...}} with each other server's requests/s and p50 over
    the baseline's."""
    names = list(servers)
    started = {}
    try:
        for name, (base_path, args) in servers.items():
            started[name] = start_server(base_path, model_name, *args)
        rounds_out = []
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            rounds_out.append({name: [run(started[name][1], model_name, sentences, c, total, warmup, b)
                                      for c, b in cases(clients_list, beam_sizes)] for name in order})
        memory = {name: memory_mb(proc.pid) for name, (proc, _) in started.items()}
    finally:
        for proc, _ in started.values():
            proc.terminate()
            proc.wait()
    measured = cases(clients_list, beam_sizes)
    label = lambda c, b: {"clients": c, **({} if b is None else {"beam_size": b})}
    median = {name: [{key: statistics.median(r[name][i][key] for r in rounds_out)
                      for key in ("requests_per_sec", "p50_ms", "p90_ms", "p99_ms", "errors")}
                     | label(c, b) for i, (c, b) in enumerate(measured)]
              for name in names}
    base = names[0]
    ratios = {name: [{**label(c, b),
                      "requests_per_sec": round(median[name][i]["requests_per_sec"]
                                                / median[base][i]["requests_per_sec"], 2),
                      "p50": round(median[name][i]["p50_ms"] / median[base][i]["p50_ms"], 2),
                      "p99_over_lone_baseline_p50": round(median[name][i]["p99_ms"] / median[base][0]["p50_ms"], 2)}
                     for i, (c, b) in enumerate(measured)]
              for name in names[1:]}
    return {"servers": {name: " ".join(["nmt_tf.serve", *(["--onednn"] if onednn else []), *extra])
                        for name, (_, (onednn, extra)) in servers.items()},
            "rounds": rounds_out, "median": median, "memory": memory, "ratios_over_" + base: ratios}


def main(argv):
    FLAGS = absl_flags.FLAGS
    sentences = read_lines(FLAGS.source)
    if FLAGS.batching_parameters_file or FLAGS.litert_base_path:
        if not FLAGS.model_base_path:
            raise app.UsageError("--batching_parameters_file and --litert_base_path need --model_base_path "
                                 "(the servers are started here)")
        plain = (FLAGS.model_base_path, (FLAGS.server_onednn, FLAGS.server_args))
        servers = {"tensorflow": plain}
        if FLAGS.batching_parameters_file:
            batching = ["--enable_batching", f"--batching_parameters_file={FLAGS.batching_parameters_file}"]
            servers["tensorflow_batched"] = (FLAGS.model_base_path,
                                             (FLAGS.server_onednn, [*FLAGS.server_args, *batching]))
        if FLAGS.litert_base_path:
            servers["litert"] = (FLAGS.litert_base_path, (False, [*FLAGS.server_args, "--runtime=litert"]))
        out = compare(sentences, FLAGS.model_name, servers, FLAGS.clients_list, FLAGS.rounds, FLAGS.requests,
                      FLAGS.warmup, FLAGS.beam_sizes)
        if FLAGS.batching_parameters_file:
            with open(FLAGS.batching_parameters_file) as f:
                out["batching_parameters"] = f.read()
        print(json.dumps({"cpu_flags": vector_flags(), **out}))
        return
    proc = None
    address = FLAGS.server
    if not address:
        if not FLAGS.model_base_path:
            raise app.UsageError("give --server or --model_base_path")
        proc, address = start_server(FLAGS.model_base_path, FLAGS.model_name, FLAGS.server_onednn,
                                     FLAGS.server_args)
    try:
        results = [run(address, FLAGS.model_name, sentences, c, FLAGS.requests, FLAGS.warmup, b)
                   for c, b in cases(FLAGS.clients_list, FLAGS.beam_sizes)]
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
