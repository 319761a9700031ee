r"""What single hostile requests cost a running nmt_tf.serve: prints one JSON object.

  python benchmarks/hostile_requests.py --preset=multi30k_en_fr
  python benchmarks/hostile_requests.py --model_base_path=exports/nmt

Starts nmt_tf.serve (gRPC and REST, --max_message_mb=32) on the model, sends
one normal request to warm it, then each case of issue 95's probe --rounds
times, and reports per case its answer (HTTP or gRPC status and the first
characters of the message), the median wall time of the call, how far
the server's resident memory rose above its level before each call (its
peak, VmHWM reset through /proc/PID/clear_refs), and its memory after:

  rest_32mb_array      '[' x 300, ~11 million "", ']' x 300: a 32 MB body that is no JSON object
  rest_object_junk     {"instances": "a", "junk": <the same nested array>}: 32 MB into the error path
  grpc_58kb_x128       one 58 KB line declared once at shape [128], output_filter=translation

and, for the connection bounds, the median time of a normal REST request
sent from 127.0.0.2 alone, then while 127.0.0.1 holds 64 idle connections
and 64 that send a header byte a second (`rest_while_held`; what one
address holds past --rest_max_connections_per_client is refused at once).
Stalled TLS handshakes are admitted and counted as the same connections
(the server does no handshake before admitting one); they are not sent here.
And for the decoding turns (`grpc_other_client_during_flood`): the median
time of a one-sentence gRPC request from ::1 alone, then while 127.0.0.1
keeps sending the same request every 2 ms (3,000 calls in all, each
refused, answered or waiting for its turn), with the flood's statuses.
The server listens on :: (IPv4 and IPv6) for these two addresses.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app
from absl import flags as absl_flags

from nmt_tf import flags as nmt_flags  # noqa: F401  (--preset, --model_name)

absl_flags.DEFINE_string("model_base_path", None, "Export directory to serve (or --preset).")
absl_flags.DEFINE_integer("rounds", 3, "Calls per case (the median is reported).", lower_bound=1)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(source_flag: str):
    import subprocess
    import threading

    grpc_port, rest_port = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "nmt_tf.serve", source_flag, f"--port={grpc_port}",
                             f"--rest_api_port={rest_port}", "--host=::", "--max_message_mb=32"],
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        if line.startswith("Serving model"):
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, grpc_port, rest_port
    raise RuntimeError("the server did not start")


def memory(pid: int) -> dict:
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {name: int(fields[name].split()[0]) // 1024 for name in ("VmRSS", "VmHWM")}


def rest_call(port: int, body: bytes):
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models/nmt:predict", data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=600) as reply:
            return reply.status, reply.read()[:160].decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read()[:160].decode("utf-8", "replace")


def rest_call_from(port: int, body: bytes, source: str) -> tuple[int, float]:
    """(HTTP status, seconds) of one REST predict sent from the address `source` (a raw request)."""
    import socket

    start = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=600, source_address=(source, 0)) as s:
        s.sendall(b"POST /v1/models/nmt:predict HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    return int(reply.split(b" ", 2)[1]), time.perf_counter() - start


def held_connections(port: int, body: bytes, rounds: int) -> dict:
    """rest_while_held: a normal request's median time alone and while one other address holds 128 connections."""
    import socket
    import threading

    alone = [rest_call_from(port, body, "127.0.0.2") for _ in range(rounds)]
    held, stop = [], threading.Event()
    for _ in range(64):
        held.append(socket.create_connection(("127.0.0.1", port), timeout=10))
    slow = []
    for _ in range(64):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        try:
            s.sendall(b"POST /v1/models/nmt:predict HTTP/1.1\r\n")
        except OSError:
            pass
        slow.append(s)

    def drip():
        while not stop.wait(1.0):
            for s in slow:
                try:
                    s.sendall(b"X")
                except OSError:
                    pass
    dripping = threading.Thread(target=drip, daemon=True)
    dripping.start()
    try:
        time.sleep(1.0)
        loaded = [rest_call_from(port, body, "127.0.0.2") for _ in range(rounds)]
    finally:
        stop.set()
        for s in held + slow:
            s.close()
    median = lambda calls: round(1000 * statistics.median(seconds for _, seconds in calls), 2)    # noqa: E731
    return {"answers_alone": sorted({status for status, _ in alone}),
            "answers_while_held": sorted({status for status, _ in loaded}),
            "alone_median_ms": median(alone), "while_held_median_ms": median(loaded),
            "ratio": round(median(loaded) / median(alone), 2)}


def flooded(grpc_port: int, request, calls: int = 3000, rounds: int = 15) -> dict:
    """grpc_other_client_during_flood: another address's median request time alone and during a flood."""
    import collections
    import threading

    import grpc

    from tensorflow_serving.apis import prediction_service_pb2_grpc

    flooder = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(f"127.0.0.1:{grpc_port}"))
    other = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(f"[::1]:{grpc_port}"))

    def timed() -> float:
        start = time.perf_counter()
        other.Predict(request, timeout=600)
        return time.perf_counter() - start

    timed()
    alone = statistics.median(timed() for _ in range(rounds))
    sent, done = [], threading.Event()

    def flood():
        for _ in range(calls):
            if done.is_set():
                break
            sent.append(flooder.Predict.future(request, timeout=600))
            time.sleep(0.002)
    flooding = threading.Thread(target=flood, daemon=True)
    flooding.start()
    time.sleep(0.5)
    during = statistics.median(timed() for _ in range(rounds))
    done.set()
    flooding.join()
    codes = collections.Counter()
    for call in sent:
        try:
            call.result()
            codes["OK"] += 1
        except grpc.RpcError as e:
            codes[e.code().name] += 1
    return {"alone_median_ms": round(1000 * alone, 2), "during_flood_median_ms": round(1000 * during, 2),
            "ratio": round(during / alone, 2), "flood_calls": len(sent), "flood_statuses": dict(codes)}


def grpc_call(stub, request):
    import grpc

    try:
        stub.Predict(request, timeout=600)
        return "OK", ""
    except grpc.RpcError as e:
        return e.code().name, (e.details() or "")[:160]


def main(argv):
    import grpc
    from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    FLAGS = absl_flags.FLAGS
    if bool(FLAGS.preset) == bool(FLAGS.model_base_path):
        raise app.UsageError("give one of --preset and --model_base_path")
    proc, grpc_port, rest_port = start(f"--preset={FLAGS.preset}" if FLAGS.preset
                                       else f"--model_base_path={FLAGS.model_base_path}")
    stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(
        f"127.0.0.1:{grpc_port}", options=[("grpc.max_send_message_length", 64 << 20)]))
    try:
        rest_call(rest_port, json.dumps({"instances": ["A man in a blue shirt."]}).encode())
        count = (32 * 2**20 - 700) // 3
        array = "[" * 300 + ",".join(['""'] * count) + "]" * 300
        line = ("A man in a blue shirt is standing on a ladder cleaning windows. " * 900)[:58_000].encode()
        wide = predict_pb2.PredictRequest()
        wide.model_spec.name = "nmt"
        wide.output_filter.append("translation")
        wide.inputs["text"].CopyFrom(tensor_pb2.TensorProto(
            dtype=types_pb2.DT_STRING, string_val=[line],
            tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=128)])))
        cases = {"rest_32mb_array": lambda: rest_call(rest_port, array.encode()),
                 "rest_object_junk": lambda: rest_call(rest_port, ('{"instances": "a", "junk": ' + array + "}")
                                                       .encode()),
                 "grpc_58kb_x128": lambda: grpc_call(stub, wide)}
        before = memory(proc.pid)
        results = {}
        for name, call in cases.items():
            seconds, peaks = [], []
            for _ in range(FLAGS.rounds):
                with open(f"/proc/{proc.pid}/clear_refs", "w") as f:      # VmHWM := VmRSS (Linux >= 4.0)
                    f.write("5")
                start_rss = memory(proc.pid)["VmRSS"]
                start_time = time.perf_counter()
                answer = call()
                seconds.append(time.perf_counter() - start_time)
                peaks.append(memory(proc.pid)["VmHWM"] - start_rss)
            results[name] = {"answer": list(answer), "median_ms": round(1000 * statistics.median(seconds), 2),
                             "peak_rss_growth_mb": peaks,
                             "ms": [round(1000 * s, 2) for s in seconds], "rss_mb_after": memory(proc.pid)["VmRSS"]}
        one = predict_pb2.PredictRequest()
        one.model_spec.name = "nmt"
        one.output_filter.append("translation")
        one.inputs["text"].CopyFrom(tensor_pb2.TensorProto(
            dtype=types_pb2.DT_STRING, string_val=[b"A man in a blue shirt is standing on a ladder cleaning windows."],
            tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=1)])))
        results["grpc_other_client_during_flood"] = flooded(grpc_port, one)
        results["rest_while_held"] = held_connections(
            rest_port, json.dumps({"instances": ["A man in a blue shirt."]}).encode(), max(FLAGS.rounds, 5))
        print(json.dumps({"server_rss_mb_before": before["VmRSS"], "cases": results}, indent=1))
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    app.run(main)
