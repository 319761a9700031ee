"""nmt_tf.serve speaks TF Serving's gRPC protocol; nmt_tf.translate uses it or a local SavedModel."""

import collections
import io
import json
import os
import re
import shutil
import signal
import threading
import time

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from conftest import REPO, run_cli, wait_until
from nmt_tf.inference import translation
from nmt_tf.inference.client import ClientError, SignatureClient
from nmt_tf.serving import server as nmt_server
from nmt_tf.serving import versions as serving


@pytest.fixture(scope="module")
def server(exported, tmp_path_factory):
    base = str(tmp_path_factory.mktemp("serving") / "nmt")
    shutil.copytree(exported[1], base)
    srv, registry, port = nmt_server.start_server("nmt", base, port=0, host="127.0.0.1", threads=4,
                                             max_message_mb=1.0, max_batch_size=50, poll_seconds=0.2,
                                             log=lambda *a: None)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield {"port": port, "base": base, "registry": registry,
           "predict": prediction_service_pb2_grpc.PredictionServiceStub(channel),
           "models": model_service_pb2_grpc.ModelServiceStub(channel)}
    registry.stop()
    srv.stop(grace=0)


def test_a_server_starts_from_its_configuration_without_flags(exported):
    """nmt_tf.serving.server.start(ServerConfig), what nmt_tf.serve runs, from Python:
    the configuration checks itself, the server answers, and Ctrl-C stops it."""
    from nmt_tf.config import ConfigError, ServerConfig

    with pytest.raises(ConfigError, match="give one of --model_base_path, --preset"):
        ServerConfig()
    with pytest.raises(ConfigError, match=r"--rest_api_port=-1: must be at least 0"):
        ServerConfig(model_base_path=exported[1], rest_api_port=-1)
    with pytest.raises(ConfigError, match="--model_version_policy: "):
        nmt_server.start(ServerConfig(model_base_path=exported[1], model_version_policy="newest"), log=print)
    said = []
    running = nmt_server.start(ServerConfig(model_base_path=exported[1], port=0, host="127.0.0.1",
                                            poll_seconds=0.2), log=said.append)
    try:
        out = SignatureClient(server=f"127.0.0.1:{running.port}", model_name="nmt")(text=["Two dogs run."])
        assert len(out["translation"]) == 1 and out["translation"][0]
        assert said[0].startswith("CPU kernels and TensorFlow threads: this process's")   # TF was imported
        assert said[-1].startswith(f"Serving model 'nmt' version 1 (the latest) on port {running.port} (TF Serving gRPC API)"), said
    except BaseException:
        running.stop()
        raise
    # what python -m nmt_tf.serve runs after start: serving until Ctrl-C, which closes the ports and returns
    # (Python's own SIGINT handler for the while: a pytest-xdist worker ignores SIGINT)
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    ctrl_c = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    try:
        ctrl_c.start()
        running.wait()
    finally:
        ctrl_c.cancel()
        signal.signal(signal.SIGINT, handler)
    with pytest.raises(ClientError, match="UNAVAILABLE"):
        SignatureClient(server=f"127.0.0.1:{running.port}", model_name="nmt", timeout=10)(text=["Two dogs run."])


def request(texts=("A man in a blue shirt.",), name="nmt", signature="", version=None, **inputs):
    req = predict_pb2.PredictRequest()
    req.model_spec.name = name
    req.model_spec.signature_name = signature
    if version is not None:
        req.model_spec.version.value = version
    if not inputs:
        inputs = {"text": tf.make_tensor_proto(list(texts), dtype=tf.string)}
    for alias, proto in inputs.items():
        req.inputs[alias].CopyFrom(proto)
    return req


def status_of(call):
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value.code(), e.value.details()


def still_serving(server):
    out = server["predict"].Predict(request(["Two dogs run."]), timeout=60)
    assert tf.make_ndarray(out.outputs["translation"]).shape == (1,)


def test_predict_matches_the_saved_model(server, exported):
    response = server["predict"].Predict(request(["A man in a blue shirt.", ""]), timeout=60)
    assert response.model_spec.name == "nmt" and response.model_spec.version.value == 1
    assert response.model_spec.signature_name == "serving_default"
    local = tf.saved_model.load(exported[2]).signatures["serving_default"](
        text=tf.constant(["A man in a blue shirt.", ""]))
    for key in ("translation", "score", "alignment", "nbest_translations"):
        np.testing.assert_array_equal(tf.make_ndarray(response.outputs[key]), local[key].numpy())


def test_output_filter_and_score_signature(server):
    req = request(["A man."])
    req.output_filter.append("score")
    response = server["predict"].Predict(req, timeout=60)
    assert list(response.outputs) == ["score"]
    scored = server["predict"].Predict(request(
        signature="score", source=tf.make_tensor_proto(["A man."]), target=tf.make_tensor_proto(["Un homme."])),
        timeout=60)
    assert tf.make_ndarray(scored.outputs["log_prob"]).shape == (1,)


def test_translate_with_options_over_grpc_fills_in_defaults_and_checks_the_settings(server, exported):
    """Issue 91: a request of translate_with_options that leaves a setting
    out gets the export's (as TF Serving fills in a signature's defaults);
    one that gives them gets that search; a beam over the export's widest is
    one INVALID_ARGUMENT naming the bound, before any work."""
    texts = ["A man in a blue shirt.", "Two dogs run."]
    text = tf.make_tensor_proto(texts, dtype=tf.string)
    plain = server["predict"].Predict(request(texts), timeout=60)
    defaulted = server["predict"].Predict(request(signature="translate_with_options", text=text), timeout=60)
    assert defaulted.model_spec.signature_name == "translate_with_options"
    for key in plain.outputs:
        np.testing.assert_array_equal(tf.make_ndarray(defaulted.outputs[key]), tf.make_ndarray(plain.outputs[key]))
    local = tf.saved_model.load(exported[2]).signatures["translate_with_options"](
        text=tf.constant(texts), beam_size=tf.constant(1), n_best=tf.constant(1), length_alpha=tf.constant(0.5))
    greedy = server["predict"].Predict(request(signature="translate_with_options", text=text,
                                               beam_size=tf.make_tensor_proto(1, dtype=tf.int32),
                                               length_alpha=tf.make_tensor_proto(0.5, dtype=tf.float32)),
                                       timeout=60)
    for key in ("translation", "score", "nbest_translations"):
        np.testing.assert_array_equal(tf.make_ndarray(greedy.outputs[key]), local[key].numpy())
    for inputs, fragment in (
            (dict(beam_size=tf.make_tensor_proto(99, dtype=tf.int32)),
             "beam_size must be at most 3, the widest beam of this export (nmt_tf.export --max_beam_size)"),
            (dict(n_best=tf.make_tensor_proto(3, dtype=tf.int32), beam_size=tf.make_tensor_proto(2, dtype=tf.int32)),
             "n_best must be at most beam_size"),
            (dict(beam_size=tf.make_tensor_proto([2], dtype=tf.int32)), "input beam_size must have rank 0"),
            (dict(beam_size=tf.make_tensor_proto(2, dtype=tf.int64)), "Expects arg[0] to be int32 but int64")):
        code, details = status_of(lambda: server["predict"].Predict(
            request(signature="translate_with_options", text=text, **inputs), timeout=60))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith(fragment) or fragment in details, \
            details
    still_serving(server)


def test_metadata_and_status(server):
    meta_req = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    meta_req.model_spec.name = "nmt"
    meta = server["predict"].GetModelMetadata(meta_req, timeout=30)
    signatures = get_model_metadata_pb2.SignatureDefMap()
    meta.metadata["signature_def"].Unpack(signatures)
    assert {"serving_default", "translate", "score"} <= set(signatures.signature_def)
    assert "text" in signatures.signature_def["serving_default"].inputs
    status_req = get_model_status_pb2.GetModelStatusRequest()
    status_req.model_spec.name = "nmt"
    status = server["models"].GetModelStatus(status_req, timeout=30)
    (version,) = status.model_version_status
    assert version.version == 1 and version.state == get_model_status_pb2.ModelVersionStatus.AVAILABLE
    assert version.status.error_code == 0


@pytest.mark.parametrize("make, code, fragment", [
    (lambda: request(name="other"), grpc.StatusCode.NOT_FOUND, "Servable not found for request: Latest(other)"),
    (lambda: request(version=7), grpc.StatusCode.NOT_FOUND, "Specific(nmt, 7)"),
    (lambda: request(name=""), grpc.StatusCode.INVALID_ARGUMENT, "no name"),
    (lambda: request(signature="nope"), grpc.StatusCode.FAILED_PRECONDITION, 'signature key "nope" not found'),
    (lambda: request(sentence=tf.make_tensor_proto(["x"])), grpc.StatusCode.INVALID_ARGUMENT,
     "Missing but required: {text}"),
    (lambda: request(text=tf.make_tensor_proto(["x"]), extra=tf.make_tensor_proto(["y"])),
     grpc.StatusCode.INVALID_ARGUMENT, "Sent extra: {extra}"),
    (lambda: request(text=tf.make_tensor_proto([1.0, 2.0])), grpc.StatusCode.INVALID_ARGUMENT,
     "Expects arg[0] to be string but float is provided"),
    (lambda: request(text=tf.make_tensor_proto([["a", "b"]])), grpc.StatusCode.INVALID_ARGUMENT, "rank 1"),
    (lambda: request(["x"] * 51), grpc.StatusCode.INVALID_ARGUMENT, "at most 50"),
    (lambda: request(["word " * 300000]), grpc.StatusCode.RESOURCE_EXHAUSTED, ""),   # 1.5 MB > 1 MiB
    (lambda: request(text=declared([-5])), grpc.StatusCode.INVALID_ARGUMENT, "negative dimension: [-5]"),
    (lambda: request(text=declared(None)), grpc.StatusCode.INVALID_ARGUMENT, "unknown rank"),
    (lambda: request(text=declared([1], [b"a", b"b"])), grpc.StatusCode.INVALID_ARGUMENT, "2 values for shape [1]"),
    (lambda: request(text=declared([50], [b"x" * 60_000])), grpc.StatusCode.INVALID_ARGUMENT,
     "would take 3,000,000 bytes"),     # one 60 kB value for 50 elements: 3 MB once repeated, over 1 MiB
    (lambda: request(["short", "w" * 70_000]), grpc.StatusCode.INVALID_ARGUMENT,
     "input text item 1 holds 70,000 bytes; this server takes at most 65,536 per string"),
])
def test_malformed_requests_get_tf_serving_status_codes(server, make, code, fragment):
    got, details = status_of(lambda: server["predict"].Predict(make(), timeout=60))
    assert got == code, details
    assert fragment in (details or ""), details
    still_serving(server)


def declared(dims, values=(b"x",)):
    """A string TensorProto declaring the shape `dims` (None: unknown rank) with only `values` in it."""
    from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2

    shape = tensor_shape_pb2.TensorShapeProto(unknown_rank=dims is None,
                                              dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in dims or []])
    return tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, tensor_shape=shape, string_val=list(values))


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def test_a_shape_bomb_is_refused_before_any_tensor_is_built(server):
    """31 bytes declaring 100 million strings: refused from the declared shape at
    once (it used to take 8 s and over 1 GB of memory to build the tensor first)."""
    bomb = request(text=declared([100_000_000]))
    assert len(bomb.inputs["text"].SerializeToString()) < 40
    server["predict"].Predict(request(), timeout=60)          # warm: the first request's own allocations
    before, start = rss_bytes(), time.monotonic()
    for _ in range(4):
        code, details = status_of(lambda: server["predict"].Predict(bomb, timeout=60))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "at most 50" in details, details
    assert time.monotonic() - start < 2.0
    assert rss_bytes() - before < 10 * 2**20
    still_serving(server)


def test_a_request_whose_search_could_exceed_the_work_limit_is_refused_before_any_work(server, monkeypatch):
    """Issue 95: one long line declared once and repeated to shape [40] (the probe's
    58 KB line x 128 cost 54.5 s of CPU) is refused from what it declares when its
    search could pass --max_search_work: rows x beam x the longest output its
    sources allow, before any tensor is built or any search runs. One row less
    is served; short lines are counted by their own tokens, not by the cap."""
    registry = server["registry"]
    cost = registry.current.search_cost
    assert (cost.beam_size, cost.max_input_length, cost.models) == (3, 20, 1)
    longest = cost.output_limit(b"word " * 1000)               # cut to 20 tokens, + [EOS]: 3 x 21
    # This export's words are counted at most one a character: "A dog." 5 + [EOS].
    assert longest == min(cost.max_length, 63) and cost.output_limit(b"A dog.") == 3 * 6
    monkeypatch.setattr(registry, "max_search_work", 40 * 3 * longest - 1)
    runs, run = [], serving.LoadedVersion.run
    monkeypatch.setattr(serving.LoadedVersion, "run", lambda self, *args: runs.append(1) or run(self, *args))
    long_line = (b"word " * 1000).strip()
    code, details = status_of(lambda: server["predict"].Predict(request(text=declared([40], [long_line])),
                                                                timeout=60))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and not runs, details
    assert (f"could take {40 * 3 * longest:,} hypothesis-steps (40 sentences x beam 3 x up to {longest} output "
            f"tokens), more than this server's limit of {40 * 3 * longest - 1:,} per request (--max_search_work): "
            "send at most 39 such sentences") in details
    out = server["predict"].Predict(request(text=declared([39], [long_line])), timeout=60)
    assert tf.make_ndarray(out.outputs["translation"]).shape == (39,) and runs == [1]
    assert tf.make_ndarray(out.outputs["truncated"]).all()
    out = server["predict"].Predict(request(["A dog."] * 50), timeout=60)       # 50 x 3 x 18, far under it
    assert tf.make_ndarray(out.outputs["translation"]).shape == (50,)
    monkeypatch.setattr(registry, "max_search_work", 3 * longest - 1)        # a target prefix may reach max_length
    prefixed = request(signature="translate_constrained", text=tf.make_tensor_proto(["A dog."]),
                       target_prefix=tf.make_tensor_proto(["Un"]), required_terms=tf.make_tensor_proto([""]))
    code, details = status_of(lambda: server["predict"].Predict(prefixed, timeout=60))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and f"up to {cost.max_length} output tokens" in details
    still_serving(server)


def test_a_reply_that_could_exceed_the_message_limit_is_refused_before_decoding(exported, tmp_path):
    """The alignment output ([batch, T, S] float32) decides a reply's size; a batch
    whose reply could pass the limit is INVALID_ARGUMENT before any work (it used to
    decode for minutes, then fail to send). translate --server asks only for what it
    writes, so its plain-text batches pass."""
    # The export's limits: S = 20 + 1, T = min(256, 3 x 21) = 63: 5,292 bytes per sentence; 0.05 MiB holds 9.
    srv, registry, port = nmt_server.start_server("nmt", exported[1], port=0, host="127.0.0.1", max_message_mb=0.05,
                                             log=lambda *a: None)
    try:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        ten = ["Two dogs run."] * 10
        code, details = status_of(lambda: stub.Predict(request(ten), timeout=60))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, details
        assert "send at most 9 sentences per request with alignment" in details
        filtered = request(ten)
        filtered.output_filter.extend(["translation", "truncated"])
        out = stub.Predict(filtered, timeout=60)
        assert sorted(out.outputs) == ["translation", "truncated"]
        assert tf.make_ndarray(out.outputs["translation"]).shape == (10,)
        assert "alignment" in stub.Predict(request(ten[:9]), timeout=60).outputs
        source = tmp_path / "in.en"
        source.write_text("Two dogs run.\n" * 10)
        plain = run_cli("-m", "nmt_tf.translate", f"--server=127.0.0.1:{port}", f"--input={source}",
                        "--lines_per_batch=10")
        assert plain.returncode == 0 and len(plain.stdout.splitlines()) == 10, plain.stderr[-2000:]
    finally:
        srv.stop(0)
        registry.stop()


def test_translate_asks_the_server_only_for_the_outputs_it_writes():
    assert translation.needed_outputs(1, False, False) == ["translation", "truncated"]
    assert set(translation.needed_outputs(3, True, True)) == {
        "translation", "truncated", "score", "log_prob", "nbest_translations", "nbest_scores",
        "source_tokens", "target_tokens", "alignment"}


def test_bad_output_filter_and_metadata_fields(server):
    req = request()
    req.output_filter.append("nonexistent")
    code, details = status_of(lambda: server["predict"].Predict(req, timeout=60))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "output tensor alias not found" in details
    bad = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["weights"])
    bad.model_spec.name = "nmt"
    code, _ = status_of(lambda: server["predict"].GetModelMetadata(bad, timeout=30))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    unknown = get_model_status_pb2.GetModelStatusRequest()
    unknown.model_spec.name = "other"
    code, _ = status_of(lambda: server["models"].GetModelStatus(unknown, timeout=30))
    assert code == grpc.StatusCode.NOT_FOUND
    still_serving(server)


def test_empty_batch_and_hostile_text_are_served(server):
    empty = server["predict"].Predict(request([]), timeout=60)
    assert tf.make_ndarray(empty.outputs["translation"]).shape == (0,)
    texts = [b"", b"  ", b"\xff\xfe broken", ("mot " * 1000).encode()] + [
        c.encode() for c in ("\u00a0", "\u3000", "\u2028", "\u2029 \u202f")]      # Unicode whitespace only
    out = server["predict"].Predict(request(texts), timeout=120)
    assert tf.make_ndarray(out.outputs["truncated"]).tolist() == [False, False, False, True] + [False] * 4
    translations = tf.make_ndarray(out.outputs["translation"]).tolist()
    assert translations[0] == translations[1] == b"" and translations[4:] == [b""] * 4


def test_a_second_server_on_a_taken_port_exits_with_a_clear_error(server):
    """grpcio's default SO_REUSEPORT let a second server start on the port and take
    half the connections; like TF Serving, it must refuse the port."""
    second = run_cli("-m", "nmt_tf.serve", f"--port={server['port']}", "--host=127.0.0.1",
                     f"--model_base_path={server['base']}", timeout=120)
    assert second.returncode == 1, second.stdout + second.stderr[-2000:]
    assert f"could not listen on 127.0.0.1:{server['port']}: the port is in use" in second.stderr
    assert "Serving model" not in second.stdout
    status = server["models"].GetModelStatus(
        get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "nmt"}), timeout=30)
    assert status.model_version_status[0].state == get_model_status_pb2.ModelVersionStatus.AVAILABLE


def test_a_new_version_is_picked_up(server, exported):
    shutil.copytree(exported[2], os.path.join(server["base"], "2"))
    # Loading a SavedModel takes a few seconds alone and over 30 s on a saturated
    # 2-core machine; the loop ends as soon as version 2 is served.
    assert wait_until(lambda: server["registry"].current.version == 2, 120), "version 2 was not loaded within 120 s"
    response = server["predict"].Predict(request(), timeout=60)
    assert response.model_spec.version.value == 2


def test_a_version_that_fails_to_load_is_reported_once_and_in_the_model_status(exported, tmp_path):
    """TF Serving's behaviour: the served version stays, the broken one is logged once
    (not at every poll) and GetModelStatus shows it as END with its error; once its
    files change it is tried again."""
    base = tmp_path / "nmt"
    shutil.copytree(exported[2], base / "1")
    logs = []
    registry = nmt_server.ModelRegistry("nmt", str(base), log=logs.append)
    registry.poll()
    (base / "2").mkdir()
    (base / "2" / "saved_model.pb").write_bytes(b"not a SavedModel")
    for _ in range(3):
        registry.poll()
    failures = [line for line in logs if line.startswith("could not load nmt version 2")]
    assert len(failures) == 1 and registry.current.version == 1, logs
    _, model_service = nmt_server.make_servicers(registry, max_batch_size=8)
    status = model_service.GetModelStatus(get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "nmt"}), None)
    states = {s.version: (s.state, s.status.error_code, s.status.error_message) for s in status.model_version_status}
    assert states[1] == (get_model_status_pb2.ModelVersionStatus.AVAILABLE, 0, "")
    assert states[2][0] == get_model_status_pb2.ModelVersionStatus.END and states[2][1] == 2 and states[2][2]
    (base / "3").mkdir()
    (base / "3" / "saved_model.pb").write_bytes(b"not a SavedModel either")
    registry.poll()
    shutil.rmtree(base / "3")                            # a failed version deleted: no longer reported
    registry.poll()
    assert sorted(registry.failed) == [2]
    shutil.rmtree(base / "2")
    shutil.copytree(exported[2], base / "2")             # repaired: its files changed
    registry.poll()
    assert registry.current.version == 2 and registry.failed == {}


@pytest.fixture(scope="module")
def cli_source(tmp_path_factory):
    source = tmp_path_factory.mktemp("cli") / "in.en"
    source.write_bytes(b"A man in a blue shirt.\n\nTwo dogs run.\n")
    return source


@pytest.fixture(scope="module")
def translated_locally(exported, cli_source):
    """`nmt_tf.translate --saved_model` of cli_source, without options."""
    local = run_cli("-m", "nmt_tf.translate", f"--saved_model={exported[2]}", f"--input={cli_source}")
    assert local.returncode == 0, local.stderr[-2000:]
    return local.stdout


def test_translate_cli_through_the_server_and_locally(server, cli_source, translated_locally):
    via_server = run_cli("-m", "nmt_tf.translate", f"--server=127.0.0.1:{server['port']}", "--model_name=nmt",
                         f"--input={cli_source}", "--lines_per_batch=2")
    assert via_server.returncode == 0, via_server.stderr[-2000:]
    lines = via_server.stdout.split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""        # one line per input line, order kept
    assert via_server.stdout == translated_locally


def test_translate_cli_chooses_the_search_through_the_server_and_locally(server, exported, cli_source):
    """Issue 91: --beam_size and --length_alpha with a SavedModel or a server
    go through translate_with_options: the same lines either way, those of
    that search (the SavedModel's signature called with the settings); a
    beam over the export's widest is one error line."""
    settings = ("--beam_size=1", "--length_alpha=0.5")
    runs = [run_cli("-m", "nmt_tf.translate", where, f"--input={cli_source}", *settings, "--with_scores")
            for where in (f"--server=127.0.0.1:{server['port']}", f"--saved_model={exported[2]}")]
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
    assert runs[0].stdout == runs[1].stdout
    records = [json.loads(line) for line in runs[0].stdout.splitlines()]
    sentences = cli_source.read_text().splitlines()
    want = tf.saved_model.load(exported[2]).signatures["translate_with_options"](
        text=tf.constant(sentences), beam_size=tf.constant(1), n_best=tf.constant(1), length_alpha=tf.constant(0.5))
    assert [r["translation"] for r in records] == [t.decode() for t in want["translation"].numpy()]
    wide = run_cli("-m", "nmt_tf.translate", f"--saved_model={exported[2]}", f"--input={cli_source}",
                   "--beam_size=4")
    assert wide.returncode == 1 and "beam_size must be at most 3" in wide.stderr, wide.stderr[-2000:]
    assert len([line for line in wide.stderr.splitlines() if not line.startswith("E0000")]) == 1, wide.stderr


def test_a_beam_over_the_exports_widest_is_refused_from_its_metadata(tmp_path):
    """translate --beam_size over nmt_tf.json's max_beam_size is the
    signature's own error, said before TensorFlow loads the SavedModel; an
    export that records no bound is left to the signature."""
    from nmt_tf import translate as translate_tool

    export = tmp_path / "export"
    (export / "assets.extra").mkdir(parents=True)
    metadata = export / "assets.extra" / "nmt_tf.json"
    metadata.write_text(json.dumps({"format_version": 1, "max_beam_size": 3}))
    with pytest.raises(ValueError, match=r"beam_size must be at most 3, the widest beam of this export"):
        translate_tool.check_beam_against_export(str(export), {"beam_size": 4})
    translate_tool.check_beam_against_export(str(export), {"beam_size": 3, "length_alpha": 0.5})
    translate_tool.check_beam_against_export(str(export), {"length_alpha": 0.5})
    metadata.write_text(json.dumps({"format_version": 1}))
    translate_tool.check_beam_against_export(str(export), {"beam_size": 40})


def test_translate_cli_with_target_prefixes_through_the_server_and_locally(server, exported, cli_source,
                                                                          translated_locally, tmp_path):
    """Prefixes locally and through the server; required terms, a glossary and
    the input errors through the server (the same steering code as locally)."""
    source, prefixes = cli_source, tmp_path / "prefixes.fr"
    server_address = f"--server=127.0.0.1:{server['port']}"
    prefixes.write_bytes(b"Un homme  en\nVide\n\n")
    runs = [run_cli("-m", "nmt_tf.translate", where, f"--input={source}", f"--target_prefix={prefixes}")
            for where in (server_address, f"--saved_model={exported[2]}")]
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
    lines = runs[0].stdout.split("\n")
    assert lines[0].startswith("Un homme  en") and lines[1] == "" and len(lines) == 4     # no source: no output
    assert lines[2] == translated_locally.split("\n")[2] and runs[0].stdout == runs[1].stdout
    terms, glossary = tmp_path / "terms.fr", tmp_path / "glossary.tsv"
    terms.write_bytes(b"chemise\n\n\n")
    glossary.write_text("dogs\tchiens\ndog\tchien\nblue shirt\tchemise bleue\n")
    steered = run_cli("-m", "nmt_tf.translate", server_address, f"--input={source}",
                      f"--required_terms={terms}", f"--glossary={glossary}", "--with_scores")
    assert steered.returncode == 0, steered.stderr[-2000:]
    records = [json.loads(line) for line in steered.stdout.splitlines()]
    assert "chemise bleue" in records[0]["translation"] and "chiens" in records[2]["translation"]
    assert all(r["terms_met"] for r in records) and records[1]["translation"] == ""
    glossary.write_text("dogs\tchiens\ndogs\tchien\n")
    repeated = run_cli("-m", "nmt_tf.translate", server_address, f"--input={source}",
                       f"--glossary={glossary}")
    assert repeated.returncode == 1 and "line 2: 'dogs' has an entry already" in repeated.stderr
    prefixes.write_bytes(b"Un\n")
    short = run_cli("-m", "nmt_tf.translate", server_address, f"--input={source}",
                    f"--target_prefix={prefixes}")
    assert short.returncode == 1 and f"{prefixes} (--target_prefix) has 1 lines, fewer than the input" in short.stderr


def test_translate_keeps_a_lines_first_16_required_terms_and_says_so():
    warnings = []
    lines = [b"a", b"b"]
    terms = ["t%d" % i for i in range(18)]

    class Glossary:
        def required_terms(self, line, sourced=True):
            return terms if line == "b" else ["x"]

    items = list(translation.steered_lines(iter(lines), glossary=Glossary(), warn=warnings.append))
    assert [item[2] for item in items] == [b"x", "\t".join(terms[:16]).encode()]
    assert len(warnings) == 1 and "line 2 has 18 required terms" in warnings[0] and "t16, t17" in warnings[0]


def test_too_many_required_terms_are_one_invalid_argument_and_the_server_goes_on(server):
    from nmt_tf.inference.client import ClientError

    client = SignatureClient("translate_constrained", server=f"127.0.0.1:{server['port']}", model_name="nmt")
    with pytest.raises(ClientError, match="(?s)INVALID_ARGUMENT: .*more than 16 required terms"):
        client(text=[b"A man."], target_prefix=[b""], required_terms=["\t".join(["chien"] * 17).encode()])
    assert client(text=[b"A man."], target_prefix=[b""], required_terms=[b"chien"])["terms_met"].all()


def test_translate_reads_gzip_from_standard_input_as_from_files(monkeypatch, tmp_path):
    import gzip
    import sys

    lines = [b"A man .", "caf\u00e9".encode(), b"", b"\xff ok"]
    raw = b"".join(line + b"\n" for line in lines)
    for data in (raw, gzip.compress(raw)):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(io.BytesIO(data))))
        assert list(translation.read_lines(None)) == lines
        path = tmp_path / "in.txt"
        path.write_bytes(data)
        assert list(translation.read_lines(str(path))) == lines
    cut = gzip.compress(raw * 100)[:-30]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(io.BytesIO(cut))))
    with pytest.raises(translation.TranslationError, match="standard input is damaged gzip data"):
        list(translation.read_lines(None))
    path.write_bytes(cut)
    with pytest.raises(translation.TranslationError, match=f"{path} is damaged gzip data"):
        list(translation.read_lines(str(path)))


def test_translate_json_lines(exported):
    backend = SignatureClient(saved_model=exported[2])
    out = io.StringIO()
    n = translation.translate_lines(backend, [b"A man.", b"Two dogs run."], out, batch_size=1, n_best=2,
                                  with_scores=True, with_alignments=True)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert n == 2 and len(records) == 2
    r = records[0]
    assert r["source_tokens"] == ["A", "man", ".", "[EOS]"] and r["target_tokens"][-1] == "[EOS]"
    assert len(r["alignment"]) == len(r["target_tokens"])
    assert all(len(row) == len(r["source_tokens"]) for row in r["alignment"])
    assert len(r["nbest"]) == 2 and r["nbest"][0]["translation"] == r["translation"]
    assert r["score"] == pytest.approx(r["nbest"][0]["score"])
    with pytest.raises(translation.TranslationError, match="n-best"):
        translation.translate_lines(backend, [b"x"], io.StringIO(), 1, n_best=5, with_scores=False,
                                  with_alignments=False)


class RecordingClient:
    """A serving_default stand-in: "translates" a line into its words reversed
    and records the batches it was sent."""

    def __init__(self):
        self.batches = []

    def output_size(self, output, axis):
        return 1

    def __call__(self, text):
        self.batches.append(list(text))
        return {"translation": np.array([b" ".join(line.split()[::-1]) for line in text], object),
                "truncated": np.zeros(len(text), bool)}


@pytest.mark.parametrize("parallel_batches", [1, 2])
@pytest.mark.parametrize("sort_window", [1, 3, 7, 100])
def test_translate_batches_a_window_by_length_and_writes_in_input_order(sort_window, parallel_batches):
    """--sort_window lines are translated shortest first in batches of
    --lines_per_batch, --parallel_batches at once; the output is in input
    order whatever the window (a window of at most one batch keeps the
    input's order in the batches)."""
    lines = [b"a b c d e", b"f", b"g h h h h h h", b"", b"i j", b"k l m", b"n", b"o p q r"]
    client = RecordingClient()
    out = io.StringIO()
    assert translation.translate_lines(client, lines, out, 3, 1, False, False, sort_window=sort_window,
                                     parallel_batches=parallel_batches) == len(lines)
    assert out.getvalue().splitlines() == [" ".join(line.decode().split()[::-1]) for line in lines]
    window = max(sort_window, 3)
    expected = []
    for start in range(0, len(lines), window):
        chunk = lines[start:start + window]
        chunk = sorted(chunk, key=lambda line: len(line.split())) if window > 3 else chunk
        expected += [chunk[i:i + 3] for i in range(0, len(chunk), 3)]
    if parallel_batches == 1:
        assert client.batches == expected
    else:        # the batches of a window may reach the client in either order
        assert sorted(client.batches) == sorted(expected)


def test_translate_stops_with_the_error_of_a_failed_batch_in_flight():
    from nmt_tf.inference.client import ClientError

    class Failing(RecordingClient):
        def __call__(self, text):
            if b"x" in text:
                raise ClientError("the server said no")
            return super().__call__(text)

    with pytest.raises(ClientError, match="the server said no"):
        translation.translate_lines(Failing(), [b"a", b"b c", b"x", b"d e f"] * 3, io.StringIO(), 2, 1, False, False,
                                  sort_window=12, parallel_batches=2)


@pytest.mark.parametrize("onednn", [False, True])
def test_serve_chooses_its_cpu_kernels_and_threads_before_tensorflow_starts(onednn, tmp_path):
    """--onednn sets TF_ENABLE_ONEDNN_OPTS before TensorFlow is imported; TensorFlow
    itself then says whether its oneDNN operations are on. The thread pools are
    set before anything runs (TensorFlow reports them back: default intra-op 1)."""
    flags = ["--onednn", "--intra_op_threads=2", "--inter_op_threads=3"] if onednn else ["--noonednn"]
    result = run_cli("-m", "nmt_tf.serve", *flags, f"--model_base_path={tmp_path}", timeout=120,
                     env={"TF_CPP_MIN_LOG_LEVEL": "0", "TF_ENABLE_ONEDNN_OPTS": "0" if onednn else "1"})
    assert result.returncode == 1 and "no SavedModel version" in result.stderr
    assert ("CPU kernels: oneDNN" if onednn else "CPU kernels: Eigen") in result.stdout
    assert ("oneDNN custom operations are on" in result.stderr) == onednn
    threads = "intra-op 2, inter-op 3" if onednn else "intra-op 1, inter-op one per core"
    assert f"TensorFlow threads: {threads}" in result.stdout


def test_one_client_for_a_signature_here_or_on_the_server(server, exported):
    """nmt_tf.inference.client.SignatureClient gives the same outputs in this process and
    over gRPC, for both signatures; only the outputs asked for come back; the
    export's n-best size is read from either; bad names are one error."""
    import numpy as np

    from nmt_tf.inference.client import ClientError

    address = f"127.0.0.1:{server['port']}"
    texts = [b"A man in a blue shirt.", b"Two dogs run."]
    for signature, inputs in (("serving_default", {"text": texts}),
                              ("translate_constrained", {"text": texts, "target_prefix": [b"Un homme", b""],
                                                        "required_terms": [b"", b"chiens\tblanc"]}),
                              ("score", {"source": texts, "target": [b"Un homme.", b"Deux chiens."]})):
        here = SignatureClient(signature, saved_model=exported[2])(**inputs)
        there = SignatureClient(signature, server=address, model_name="nmt")(**inputs)
        assert sorted(here) == sorted(there) and len(here) >= 5
        for name in here:
            if here[name].dtype.kind in "fc":
                np.testing.assert_allclose(there[name], here[name], rtol=1e-5, atol=1e-6, err_msg=name)
            else:
                np.testing.assert_array_equal(there[name], here[name], err_msg=name)
    wanted = ["translation", "score"]
    for client in (SignatureClient(saved_model=exported[2], outputs=wanted),
                   SignatureClient(server=address, model_name="nmt", outputs=wanted)):
        assert sorted(client(text=texts)) == sorted(wanted)
        assert client.output_size("nbest_scores", 1) >= 1
    with pytest.raises(FileNotFoundError, match="no 'nope' signature"):
        SignatureClient("nope", saved_model=exported[2])
    with pytest.raises(ClientError, match="no 'nope' signature"):
        SignatureClient("nope", server=address, model_name="nmt")
    with pytest.raises(ClientError, match="NOT_FOUND"):
        SignatureClient(server=address, model_name="other")


def test_a_removed_version_falls_back_to_the_highest_left_and_odd_names_are_ignored(exported, tmp_path):
    """As TF Serving's latest-version policy: deleting the served version serves
    the highest remaining one (none left: none served, NOT_FOUND); a folder
    whose name is no int64 is ignored with one log line, and never breaks
    the served versions."""
    from tensorflow_serving.apis import model_pb2

    from nmt_tf.serving.versions import ModelRegistry, ServingError

    base = tmp_path / "nmt"
    for version in (1, 2):
        shutil.copytree(exported[2], base / str(version))
    lines = []
    registry = ModelRegistry("nmt", str(base), log=lines.append)
    registry.poll()
    assert registry.current.version == 2
    shutil.copytree(exported[2], base / "99999999999999999999")
    registry.poll()
    registry.poll()
    assert registry.current.version == 2
    assert [line for line in lines if "int64" in line] == [
        f"ignoring {base / '99999999999999999999'}: a version number must fit in int64"]
    for alias in ("\u0663\u0661", "02"):          # Arabic-Indic 31, and 2 with a leading zero (issue 95)
        shutil.copytree(exported[2], base / alias)
    registry.poll()
    registry.poll()
    assert registry.available_versions() == [1, 2] and registry.current.version == 2
    assert sorted(line for line in lines if "no leading zero" in line) == sorted(
        f"ignoring {base / alias}: a version folder is named with ASCII digits and no leading zero"
        for alias in ("\u0663\u0661", "02"))
    shutil.rmtree(base / "2")
    registry.poll()
    assert registry.current.version == 1
    shutil.rmtree(base / "1")
    registry.poll()
    assert registry.current is None and "no other version is left" in lines[-1]
    with pytest.raises(ServingError) as e:
        registry.get(model_pb2.ModelSpec(name="nmt"))
    assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_a_version_is_warmed_up_before_it_is_served_and_a_failing_warm_up_fails_its_load(exported, tmp_path):
    """TF Serving's warm-up: the export's assets.extra/tf_serving_warmup_requests
    are replayed when a version loads, before it answers; a record that fails
    (here: an input the signature does not have) makes the load fail."""
    from tensorflow_serving.apis import prediction_log_pb2

    from nmt_tf.serving.versions import ModelRegistry

    base = tmp_path / "nmt"
    shutil.copytree(exported[2], base / "1")
    registry = ModelRegistry("nmt", str(base), log=lambda *a: None)
    registry.poll()
    assert registry.current.warmed_up == 1        # nmt_tf.export writes one request (3 sentences)

    shutil.copytree(exported[2], base / "2")
    bad = request(sentence=tf.make_tensor_proto(["x"]))
    log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=bad))
    with tf.io.TFRecordWriter(str(base / "2" / "assets.extra" / "tf_serving_warmup_requests")) as writer:
        writer.write(log.SerializeToString())
    registry.poll()
    assert registry.current.version == 1
    assert "warm-up request 1 of" in registry.failed[2] and "failed" in registry.failed[2]


def test_memory_stays_flat_across_version_loads(exported):
    """Each version lives in a session of its own, closed when the version is
    unloaded: with tf.saved_model.load, every load of this tiny export kept
    ~85 MB after the version was dropped; a closed session's graph waited
    for Python's cyclic collector, 23-79 MB per load until it ran (without
    the collection at unload, these 6 loads grew it by 92 MB). Measured in a
    fresh process, as a server runs."""
    out = run_cli(os.path.join(REPO, "tests", "version_loads_memory.py"), exported[2], "6")
    assert out.returncode == 0, out.stderr[-3000:]
    grown = float(re.search(r"grown (-?[\d.]+) MB", out.stdout).group(1))
    assert grown < 40, out.stdout


def test_an_unloaded_version_waits_for_its_requests(exported, tmp_path):
    from tensorflow_serving.apis import model_pb2

    from nmt_tf.serving.versions import ModelRegistry

    base = tmp_path / "nmt"
    shutil.copytree(exported[2], base / "1")
    registry = ModelRegistry("nmt", str(base), log=lambda *a: None)
    registry.poll()
    with registry.use(model_pb2.ModelSpec(name="nmt")) as held:     # a request in flight
        shutil.copytree(exported[2], base / "2")
        registry.poll()
        assert registry.current.version == 2 and not held.closed
        out = held.run("serving_default", {"text": np.array([b"Two dogs run."], dtype=object)}, ["translation"])
        assert out["translation"].shape == (1,)
    assert held.closed and not registry.current.closed


@pytest.mark.parametrize("text, kind, versions", [
    ("latest", "latest", [5]), ("latest=2", "latest", [5, 3]), ("all", "all", [5, 3, 1]),
    ("specific=1,3,9", "specific", [3, 1]),
])
def test_version_policies_choose_as_tf_serving(text, kind, versions):
    from nmt_tf.serving.versions import VersionPolicy

    policy = VersionPolicy.parse(text)
    assert policy.kind == kind and policy.select([1, 3, 5]) == versions


@pytest.mark.parametrize("text", ["latest=0", "newest", "specific=", "specific=a", "all=2", "latest=x"])
def test_a_bad_version_policy_is_one_error(text):
    from nmt_tf.serving.versions import VersionPolicy

    with pytest.raises(ValueError, match="model version policy"):
        VersionPolicy.parse(text)


def test_latest_two_versions_and_labels_are_served_and_fall_back(exported, tmp_path):
    from tensorflow_serving.apis import get_model_status_pb2, model_pb2

    from nmt_tf.serving.versions import ModelRegistry, ServingError, VersionPolicy, model_status

    base = tmp_path / "nmt"
    for version in (1, 2, 3):
        shutil.copytree(exported[2], base / str(version))
    registry = ModelRegistry("nmt", str(base), log=lambda *a: None, policy=VersionPolicy.parse("latest=2"),
                             labels={"stable": 2})
    registry.poll()
    assert registry.versions == [3, 2] and registry.current.version == 3
    spec = lambda **kw: model_pb2.ModelSpec(name="nmt", **kw)
    assert registry.get(spec()).version == 3
    assert registry.get(spec(version={"value": 2})).version == 2
    assert registry.get(spec(version_label="stable")).version == 2
    for bad, code in ((spec(version={"value": 1}), grpc.StatusCode.NOT_FOUND),
                      (spec(version_label="canary"), grpc.StatusCode.INVALID_ARGUMENT)):
        with pytest.raises(ServingError) as e:
            registry.get(bad)
        assert e.value.code == code
    status = model_status(registry, get_model_status_pb2.GetModelStatusRequest(model_spec=spec()))
    assert [(s.version, s.state) for s in status.model_version_status] == [
        (3, get_model_status_pb2.ModelVersionStatus.AVAILABLE), (2, get_model_status_pb2.ModelVersionStatus.AVAILABLE)]
    three = registry.get(spec())
    shutil.rmtree(base / "3")               # removed: unloaded, and the next highest loads
    registry.poll()
    assert registry.versions == [2, 1] and three.closed


def test_a_version_label_naming_a_version_not_served_is_refused_at_start(exported, tmp_path):
    """As TF Serving (issue 95): version_labels {"stable": 7} with versions 1 and 2 on disk is one error."""
    base = tmp_path / "nmt"
    for version in (1, 2):
        shutil.copytree(exported[2], base / str(version))
    with pytest.raises(ValueError, match=r"version_labels \{'stable': 7\} name versions that are not served "
                                         r"\(served: 2\)"):
        nmt_server.start_server("nmt", str(base), port=0, host="127.0.0.1", log=lambda *a: None,
                                labels={"stable": 7})


def test_a_new_version_that_fails_to_load_leaves_the_old_one_serving(exported, tmp_path):
    from nmt_tf.serving.versions import ModelRegistry

    base = tmp_path / "nmt"
    shutil.copytree(exported[2], base / "1")
    registry = ModelRegistry("nmt", str(base), log=lambda *a: None)
    registry.poll()
    (base / "2").mkdir()
    (base / "2" / "saved_model.pb").write_bytes(b"broken")
    registry.poll()
    assert registry.versions == [1] and 2 in registry.failed
    shutil.rmtree(base / "2")
    shutil.copytree(exported[2], base / "3")
    registry.poll()
    assert registry.versions == [3]          # the policy's version serves: the old one is unloaded


def test_a_version_with_a_damaged_vocabulary_asset_is_refused_and_the_old_one_stays(exported, tmp_path):
    """Issue 95: a new version whose assets/vocab.tgt.txt was cut short loaded, passed
    warm-up and answered "Un[UNK][UNK]..."; its assets are now checked against the
    digests the export recorded, and it is refused with one message naming the file."""
    from nmt_tf.serving.versions import ModelRegistry

    base = tmp_path / "nmt"
    shutil.copytree(exported[2], base / "1")
    logs = []
    registry = ModelRegistry("nmt", str(base), log=logs.append)
    registry.poll()
    shutil.copytree(exported[2], base / "2")
    vocab = base / "2" / "assets" / "vocab.tgt.txt"
    vocab.write_text("\n".join(vocab.read_text().splitlines()[:6]) + "\n")
    registry.poll()
    assert registry.versions == [1]
    assert "assets/vocab.tgt.txt is not the file the graph was exported with" in registry.failed[2]
    assert sum("could not load nmt version 2" in line for line in logs) == 1


def test_the_model_config_file_of_tf_serving_is_read(tmp_path):
    from nmt_tf.serving.versions import read_model_config

    shipped = read_model_config(os.path.join(REPO, "export", "models.config"))
    assert (shipped.name, shipped.base_path, shipped.policy.kind, shipped.policy.num_versions) == (
        "nmt", "/models/nmt", "latest", 1)
    path = tmp_path / "models.config"
    path.write_text('model_config_list { config { name: "fr" base_path: "exports/fr" '
                    'model_version_policy { specific { versions: 4 versions: 2 } } '
                    'version_labels { key: "stable" value: 2 } } }')
    config = read_model_config(str(path))
    assert config.base_path == str(tmp_path / "exports" / "fr") and config.policy.versions == (2, 4)
    assert config.labels == {"stable": 2}
    for text, fragment in (('model_config_list { config { name: "a" base_path: "/a" } config { name: "b" '
                            'base_path: "/b" } }', "serves one model"),
                           ('model_config_list { config { name: "a" base_path: "/a" model_platform: "pytorch" } }',
                            "model_platform"),
                           ("model_config_list { config { nam: 1 } }", "not a TF Serving model config"),
                           ('model_config_list { config { name: "a" base_path: "/a" model_version_policy '
                            '{ latest { num_versions: 0 } } } }', None)):
        path.write_text(text)
        if fragment is None:          # num_versions 0 is TF Serving's default: 1
            assert read_model_config(str(path)).policy.num_versions == 1
            continue
        with pytest.raises(ValueError, match=fragment):
            read_model_config(str(path))


def test_serve_takes_one_model_source_and_a_config_file_names_the_model(tmp_path):
    out = run_cli("-m", "nmt_tf.serve", "--model_base_path=/x", "--model_config_file=/y")
    assert out.returncode == 1 and "give one of --model_base_path" in out.stderr
    (tmp_path / "m.config").write_text('model_config_list { config { name: "a" base_path: "/a" } }')
    out = run_cli("-m", "nmt_tf.serve", f"--model_config_file={tmp_path}/m.config", "--model_name=b")
    assert out.returncode == 1 and "leave out --model_name" in out.stderr
    out = run_cli("-m", "nmt_tf.serve", "--model_base_path=/x", "--model_version_policy=newest")
    assert out.returncode == 1 and "--model_version_policy" in out.stderr


def test_a_policy_that_serves_nothing_on_disk_is_a_clear_error_at_start(exported, tmp_path):
    from nmt_tf.serving.versions import VersionPolicy

    shutil.copytree(exported[2], tmp_path / "nmt" / "1")
    with pytest.raises(FileNotFoundError, match="found 1; the version policy serves versions 5"):
        nmt_server.start_server("nmt", str(tmp_path / "nmt"), port=0, host="127.0.0.1", log=lambda *a: None,
                           policy=VersionPolicy.parse("specific=5"))


def test_a_glossary_finds_whole_words_longest_first(tmp_path):
    from nmt_tf.inference.glossary import Glossary

    path = tmp_path / "glossary.tsv"
    path.write_text("dog\tchien\nhot dog\thot-dog\nshirt\tchemise\nA.C.\tclim\n", encoding="utf-8")
    glossary = Glossary(str(path))
    assert len(glossary) == 4
    assert glossary.terms("A dog eats a hot dog, dogs watch; shirts, shirt, A.C.") == ["chien", "hot-dog", "chemise",
                                                                                       "clim"]
    assert glossary.terms("Hotdogs and DOGS.") == []
    path.write_text("dog\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 1: expected 'source<TAB>target'"):
        Glossary(str(path))
    with pytest.raises(FileNotFoundError, match=r"\(--glossary\)"):
        Glossary(str(tmp_path / "missing.tsv"))
    # Issue 95: the check split lines at line feeds, the reader at any line break too: a bare carriage
    # return passed the check, then failed to unpack with no file or line named.
    path.write_bytes(b"dog\tchien\ncat\rx\tchat\n")
    with pytest.raises(ValueError, match=r"line 2: a line break other than a line feed inside the entry"):
        Glossary(str(path))
    path.write_bytes(b"dog\tchien\r\ncat\tchat\r\n")                 # Windows line ends are fine
    assert Glossary(str(path)).entries == {"dog": "chien", "cat": "chat"}
    # Issue 93: case-insensitive matching, as an option.
    path.write_text("dog\tchien\nhot dog\thot-dog\nSnow\tneige\n", encoding="utf-8")
    assert Glossary(str(path)).terms("A DOG in the snow, a Hot Dog.") == []
    assert Glossary(str(path), ignore_case=True).terms("A DOG in the snow, a Hot Dog.") == ["chien", "neige",
                                                                                           "hot-dog"]
    # Issue 93: the terms go to the search with the source words they translate, for placement; an export
    # older than nmt_tf 0.4 (no term_placement in its nmt_tf.json) gets the target terms alone.
    from nmt_tf.api import join_terms
    from nmt_tf.inference.glossary import reads_term_sources

    sourced = Glossary(str(path), ignore_case=True).required_terms("A DOG in the snow, a Hot Dog, a dog.")
    assert sourced == ["DOG|||chien", "snow|||neige", "Hot Dog|||hot-dog"]
    assert Glossary(str(path)).required_terms("a dog", sourced=False) == ["chien"]
    steered = translation.steered_lines(iter([b"a dog"]), glossary=Glossary(str(path)), sourced=False)
    assert [item[2] for item in steered] == [b"chien"]
    terms_path = tmp_path / "terms.fr"
    terms_path.write_bytes(b"bleu\n")
    steered = translation.steered_lines(iter([b"a dog in the snow"]), terms_path=str(terms_path),
                                        glossary=Glossary(str(path), ignore_case=True))
    assert [item[2] for item in steered] == [b"bleu\tdog|||chien\tsnow|||neige"]
    own = tmp_path / "own.fr"
    own.write_bytes(b"chien\n")            # a target term given twice is required once, in its first form
    steered = translation.steered_lines(iter([b"a dog"]), terms_path=str(own), glossary=Glossary(str(path)))
    assert [item[2] for item in steered] == [b"chien"]
    assert join_terms([("snow", "poudreuse"), "chien"]) == "snow|||poudreuse\tchien"
    with pytest.raises(ValueError, match="holds '\\|\\|\\|'"):
        join_terms([("a|||b", "c")])
    assert reads_term_sources({"search": {"beam_size": 5, "term_placement": 1.0}}) and reads_term_sources({})
    assert not reads_term_sources({"search": {"beam_size": 5}})
    path.write_text("snow\tneige\nSnow\tNeige\n", encoding="utf-8")
    assert len(Glossary(str(path))) == 2
    with pytest.raises(ValueError, match="'snow' and 'Snow' are one term when case is ignored"):
        Glossary(str(path), ignore_case=True)
    with pytest.raises(IsADirectoryError, match=r"is a directory, not a file \(--glossary\)"):
        Glossary(str(tmp_path))


def statuses(calls) -> collections.Counter:
    """How many of these gRPC futures ended with each status (by name), once all have."""
    codes = collections.Counter()
    for call in calls:
        try:
            call.result()
            codes["OK"] += 1
        except grpc.RpcError as e:
            codes[e.code().name] += 1
    return codes


def test_one_client_flooding_the_server_is_refused_at_once_and_another_is_served(exported, tmp_path):
    """Issue 95: 3,000 pending Predicts from one client queued without bound, and
    another client's call timed out behind them. Now the server admits at most
    4 x threads calls: the flood's excess is refused at once (RESOURCE_EXHAUSTED,
    the status to retry later on) and another client, retrying so, is answered
    within seconds."""
    srv, registry, port = nmt_server.start_server("nmt", exported[1], port=0, host="127.0.0.1", threads=4,
                                                  log=lambda *a: None)
    try:
        # Each its own connection (channels of one process to one target share theirs by default).
        connect = lambda: prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(   # noqa: E731
            f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]))
        flooder, other = connect(), connect()
        other.Predict(request(["A dog."]), timeout=60)
        flood = [flooder.Predict.future(request(["A man in a blue shirt is standing on a ladder."] * 8), timeout=60)
                 for _ in range(3000)]

        def answered(deadline=30.0):
            """Behind an unbounded queue of 3,000 such calls on 4 workers this would wait for minutes. (Both
            clients are 127.0.0.1, one address to the server's turns: under a loaded suite, with other test
            files beside it, 10 s was once too short.)"""
            start = time.monotonic()
            while True:
                try:
                    return other.Predict(request(["Two dogs run."]), timeout=max(0.1, start + deadline
                                                                                 - time.monotonic()))
                except grpc.RpcError as e:
                    if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or time.monotonic() > start + deadline:
                        raise
                    time.sleep(0.05)

        answers = [answered() for _ in range(5)]
        assert all(tf.make_ndarray(a.outputs["translation"]).shape == (1,) for a in answers)
        assert set(statuses(flood)) == {"OK", "RESOURCE_EXHAUSTED"}
    finally:
        srv.stop(0)
        registry.stop()


def test_a_client_flooding_without_pause_leaves_another_client_its_turns(exported):
    """Issue 95, fair shares: one client (127.0.0.1) keeps hundreds of calls
    coming; another (::1, another address) is answered every time, in about
    its time alone, not behind the flood: decoding turns go client by
    client (serving.FairGate) and a client holds at most 3/4 of the
    admitted calls. (Before, the flood held every admitted slot: the other
    client's calls were refused, or, retried, waited behind all of them.)"""
    srv, registry, port = nmt_server.start_server("nmt", exported[1], port=0, host="[::]", threads=2,
                                                  log=lambda *a: None)
    stop = threading.Event()
    try:
        flooder = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        other = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(f"[::1]:{port}"))
        sentence = request(["A man in a blue shirt is standing on a ladder cleaning windows."])

        def timed():
            """One answered request's time; refused at admission (RESOURCE_EXHAUSTED: the server's 4 x threads
            calls are taken, for a moment, by the flood's excess before their turn refuses them), it tries
            again, as a client should."""
            start = time.perf_counter()
            while True:
                try:
                    other.Predict(sentence, timeout=60)
                    return time.perf_counter() - start
                except grpc.RpcError as e:
                    if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or time.perf_counter() - start > 30:
                        raise
                    time.sleep(0.01)

        for _ in range(3):
            timed()
        alone = sorted(timed() for _ in range(7))[3]
        calls = []

        def flood():
            while not stop.is_set():
                calls.append(flooder.Predict.future(sentence, timeout=60))
                time.sleep(0.002)

        flooding = threading.Thread(target=flood)
        flooding.start()
        time.sleep(0.5)
        during = sorted(timed() for _ in range(7))[3]
        stop.set()
        flooding.join()
        codes = statuses(calls)
        assert codes["OK"] > 0 and codes["RESOURCE_EXHAUSTED"] > 0, codes
        # Taking turns it waited 2.1-3.1x its time alone here, behind the flood's queue 4.8-6x (the tiny
        # model, 2 cores); bounded loosely for a machine busy with other tests: FairGate's order is tested
        # exactly below, the ratio on the shipped model is benchmarks/hostile_requests.py's.
        assert during < 10 * alone + 0.2, (during, alone, codes)
    finally:
        stop.set()
        srv.stop(0)
        registry.stop()


def test_decoding_turns_go_client_by_client_and_a_client_holds_at_most_its_share():
    """serving.FairGate with one slot: client a takes it and queues five
    more requests, then b queues one; as turns end, b's request comes after
    a's first waiting one, not after all five (first come, first served). A
    client over its share is refused at once; a wait past its timeout
    leaves the queue and says so."""
    gate = serving.FairGate(slots=1, per_client=6)
    order, started = [], []
    release = {name: threading.Event() for name in ("a0", "a1", "a2", "a3", "a4", "a5", "b0")}

    def ask(client, name):
        with gate.turn(client, 30):
            order.append(name)
            release[name].wait(30)

    def start(client, name):
        thread = threading.Thread(target=ask, args=(client, name))
        thread.start()
        started.append(thread)
        time.sleep(0.05)             # in the queue before the next one

    for i in range(6):
        start("a", f"a{i}")
    start("b", "b0")
    with pytest.raises(serving.ServingError, match="requests in progress, its share") as refused:
        with gate.turn("a", 1):
            pass
    assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    with pytest.raises(serving.ServingError, match="no decoding turn came within 0.2 s") as late:
        with gate.turn("c", 0.2):
            pass
    assert late.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    for name in ("a0", "a1", "b0", "a2", "a3", "a4", "a5"):
        assert wait_until(lambda: name in order, 10), order
        release[name].set()
    for thread in started:
        thread.join(10)
    assert order == ["a0", "a1", "b0", "a2", "a3", "a4", "a5"]       # b after a's first waiting request


def test_sigterm_stops_serve_gracefully_and_ctrl_c_stops_translate_in_one_line(exported, tmp_path):
    """Issue 95: `serve` died at once on SIGTERM (exit status -15, requests in
    flight cut); now it stops as on Ctrl-C, saying so, with status 0.
    `translate` printed a KeyboardInterrupt traceback on Ctrl-C; now one line
    and status 130, the lines before it written."""
    import subprocess

    from conftest import start_cli

    base = tmp_path / "nmt"
    shutil.copytree(exported[1], base)
    serve = start_cli("-m", "nmt_tf.serve", f"--model_base_path={base}", "--port=0", "--host=127.0.0.1",
                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in serve.stdout:
            if line.startswith("Serving model"):
                break
        serve.send_signal(signal.SIGTERM)
        said = serve.stdout.read()
        assert serve.wait(timeout=60) == 0, said
        assert "Stopping: the requests in flight have 2 s to finish" in said and "Traceback" not in said
    finally:
        serve.kill()
    translate = start_cli("-m", "nmt_tf.translate", f"--saved_model={exported[2]}", "--lines_per_batch=1",
                          "--sort_window=1", stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
    try:
        translate.stdin.write("A man in a blue shirt.\n")
        translate.stdin.flush()
        first = translate.stdout.readline()          # translated; the next read of stdin blocks
        translate.send_signal(signal.SIGINT)
        rest, errors = translate.communicate(timeout=60)
        assert translate.returncode == 130, errors[-2000:]
        assert first.strip() and "Traceback" not in errors
        assert errors.strip().splitlines()[-1] == ("interrupted: the output holds the lines translated before it, "
                                                   "in input order")
    finally:
        translate.kill()
