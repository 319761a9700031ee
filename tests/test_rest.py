"""nmt_tf.serve's REST API is TF Serving's: the answers of its gRPC API, in TF
Serving's JSON, with TF Serving's errors and HTTP status codes."""

import base64
import concurrent.futures
import http.client
import json
import shutil
import socket
import threading
import time
import tracemalloc
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import json_format
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    prediction_service_pb2_grpc,
)
from test_serve import request as grpc_request
from test_serve import status_of

from conftest import run_cli, wait_until
from nmt_tf.serving import rest as rest_api
from nmt_tf.serving import server as nmt_server
from nmt_tf.serving import versions as serving
from nmt_tf.serving.http_server import RestSettings

THREADS = 4


@pytest.fixture(scope="module")
def server(exported, tmp_path_factory):
    """One nmt_tf.serve with gRPC and REST (the limits of test_serve's server)."""
    base = str(tmp_path_factory.mktemp("rest") / "nmt")
    shutil.copytree(exported[1], base)
    srv, registry, port = nmt_server.start_server("nmt", base, port=0, host="127.0.0.1", threads=THREADS,
                                             max_message_mb=1.0, max_batch_size=50, poll_seconds=0.2,
                                             log=lambda *a: None)
    rest_server = rest_api.start_rest_server(registry, RestSettings(host="127.0.0.1", threads=THREADS,
                                                                    max_message_mb=1.0, max_batch_size=50))
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield {"base": base, "rest_port": rest_server.port, "registry": registry,
           "predict": prediction_service_pb2_grpc.PredictionServiceStub(channel),
           "models": model_service_pb2_grpc.ModelServiceStub(channel)}
    rest_server.stop()
    registry.stop()
    srv.stop(grace=0)


def rest(server, path, body=None, method=None):
    """(HTTP status, parsed JSON body) of one request; `body` a dict (sent as JSON) or bytes."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    req = urllib.request.Request(f"http://127.0.0.1:{server['rest_port']}{path}", data=data,
                                 method=method or ("GET" if data is None else "POST"))
    try:
        with urllib.request.urlopen(req, timeout=120) as reply:
            assert reply.headers["Content-Type"] == "application/json"
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as e:
        assert e.headers["Content-Type"] == "application/json"
        return e.code, json.loads(e.read())


def grpc_outputs(server, signature="", **inputs):
    reply = server["predict"].Predict(grpc_request(signature=signature, **{
        alias: tf.make_tensor_proto(values, dtype=tf.string) for alias, values in inputs.items()}), timeout=60)
    return {alias: tf.make_ndarray(proto) for alias, proto in reply.outputs.items()}


def as_bytes(value):
    """JSON strings (nested in lists) as the bytes gRPC returns."""
    return [as_bytes(v) for v in value] if isinstance(value, list) else value.encode("utf-8", "surrogateescape")


def assert_same(rest_value, grpc_value: np.ndarray):
    if grpc_value.dtype == object:
        assert as_bytes(rest_value) == grpc_value.tolist()
    else:           # JSON numbers read back in the output's dtype: the very values, not close ones
        np.testing.assert_array_equal(np.asarray(rest_value, dtype=grpc_value.dtype), grpc_value)


def still_serving(server):
    code, out = rest(server, "/v1/models/nmt:predict", {"instances": ["Two dogs run."]})
    assert code == 200 and len(out["predictions"]) == 1, out


TRANSLATE = {"text": ["A man in a blue shirt.", "Two dogs run.", ""]}
SCORE = {"source": ["A man in a blue shirt.", "Two dogs run."], "target": ["Un homme.", "Deux chiens courent."]}


@pytest.mark.parametrize("signature, inputs, form", [
    *[("", TRANSLATE, form) for form in ("instances", "named instances", "inputs", "unnamed inputs")],
    ("translate", {"text": ["A man."]}, "instances"),
    ("translate", {"text": ["A man."]}, "inputs"),
    ("score", SCORE, "named instances"),            # several inputs: always named
    ("translate_constrained", {**TRANSLATE, "target_prefix": ["Un homme", "", "Deux"],
                               "required_terms": ["bleu", "", "chiens\tcourent"]}, "named instances"),
    ("score", SCORE, "inputs"),
])
def test_rest_and_grpc_give_the_same_outputs(server, signature, inputs, form):
    """Row and columnar formats, one or several inputs: every output of the
    signature (REST has no output_filter), value for value as gRPC returns it."""
    body = {"signature_name": signature} if signature else {}
    if form == "instances":
        body["instances"] = inputs["text"]
    elif form == "named instances":
        body["instances"] = [dict(zip(inputs, values)) for values in zip(*inputs.values())]
    else:
        body["inputs"] = inputs if form == "inputs" else inputs["text"]
    code, out = rest(server, "/v1/models/nmt:predict", body)
    assert code == 200, out
    expected = grpc_outputs(server, signature, **inputs)
    if form.endswith("instances"):
        predictions = out["predictions"]
        assert len(predictions) == len(next(iter(inputs.values())))
        got = {alias: [p[alias] for p in predictions] for alias in predictions[0]}
    else:
        got = out["outputs"]
    assert sorted(got) == sorted(expected)
    for alias, value in expected.items():
        assert_same(got[alias], value)


def test_translate_with_options_takes_its_settings_as_scalar_inputs(server):
    """Issue 91 over REST, in TF Serving's columnar form: the settings are
    scalars beside the text; left out, they are the export's."""
    texts = ["A man in a blue shirt.", "Two dogs run."]
    code, greedy = rest(server, "/v1/models/nmt:predict", {
        "signature_name": "translate_with_options", "inputs": {"text": texts, "beam_size": 1, "length_alpha": 0.5}})
    assert code == 200, greedy
    want = grpc_outputs(server, "translate_with_options", text=texts)      # the export's settings
    code, defaulted = rest(server, "/v1/models/nmt:predict", {"signature_name": "translate_with_options",
                                                              "inputs": {"text": texts}})
    assert code == 200 and len(defaulted["outputs"]["nbest_translations"][0]) == 2
    assert_same(defaulted["outputs"]["translation"], want["translation"])
    assert len(greedy["outputs"]["nbest_translations"][0]) == 1
    code, rows = rest(server, "/v1/models/nmt:predict", {"signature_name": "translate_with_options",
                                                         "instances": texts})     # rows: the settings left out
    assert code == 200 and [row["translation"] for row in rows["predictions"]] == defaulted["outputs"]["translation"]
    code, refused = rest(server, "/v1/models/nmt:predict", {"signature_name": "translate_with_options",
                                                            "inputs": {"text": texts, "beam_size": 11}})
    assert code == 400 and refused["error"].startswith("beam_size must be at most 3"), refused


def test_output_filter_is_grpc_only_and_other_keys_are_ignored(server):
    """TF Serving's REST API has no output_filter; unknown top-level keys are ignored, as there."""
    code, out = rest(server, "/v1/models/nmt:predict", {"instances": ["A man."], "output_filter": ["score"]})
    assert code == 200 and len(out["predictions"][0]) > 1
    assert sorted(out["predictions"][0]) == sorted(grpc_outputs(server, text=["A man."]))


def test_markup_is_taken_out_before_the_model_and_put_back_in_the_translation(server):
    """"markup": "html" (nmt_tf's extension): the model reads the plain sentence
    (its other outputs are those of the untagged line), the translation holds
    each tag once; unbalanced markup is translated as text with a warning; a
    bad value is a 400 naming the key."""
    plain = grpc_outputs(server, text=["A man rides a bike ."])
    code, out = rest(server, "/v1/models/nmt:predict", {"instances": ["A <b>man</b> rides a <i>bike</i> .",
                                                                      "A <b>man rides ."], "markup": "html"})
    assert code == 200, out
    first, second = out["predictions"]
    assert [t for t in as_bytes(first["source_tokens"]) if t] == [t for t in plain["source_tokens"][0] if t]
    assert [first["translation"].count(tag) for tag in ("<b>", "</b>", "<i>", "</i>")] == [1, 1, 1, 1]
    # (this word-level model detaches punctuation, so its words may not be the text's: placed by position)
    assert first["markup_warning"] in ("", "the markup was placed by word position (the model's words are not the "
                                           "text's)")
    assert "never closed" in second["markup_warning"]
    code, out = rest(server, "/v1/models/nmt:predict", {"instances": ["A man."], "markup": "markdown"})
    assert code == 400 and "'markup' must be" in out["error"]
    code, out = rest(server, "/v1/models/nmt:predict", {"signature_name": "score", "markup": "html",
                                                        "instances": [{"source": "A man.", "target": "Un homme."}]})
    assert code == 400 and "'markup' needs a signature" in out["error"]

def test_protect_masks_items_before_the_model_and_keeps_them_verbatim(server):
    """"protect" (nmt_tf's extension): the model reads the masked sentence and
    each item is in the translation once, verbatim (put back by the attention
    when this tiny model loses its mask, with a warning); without the key the
    body is the model's input, as in TF Serving; a bad kind is a 400."""
    masked = grpc_outputs(server, text=["A man at °1° rides °2° ."])
    line = "A man at 7:30 rides www.example.com/a ."
    code, out = rest(server, "/v1/models/nmt:predict", {"instances": [line], "protect": "all"})
    assert code == 200, out
    prediction = out["predictions"][0]
    assert [t for t in as_bytes(prediction["source_tokens"]) if t] == [t for t in masked["source_tokens"][0] if t]
    assert [prediction["translation"].count(item) for item in ("7:30", "www.example.com/a")] == [1, 1]
    assert "°" not in prediction["translation"]
    code, out = rest(server, "/v1/models/nmt:predict", {"instances": [line], "protect": "url"})
    assert code == 200 and out["predictions"][0]["translation"].count("www.example.com/a") == 1
    code, out = rest(server, "/v1/models/nmt:predict", {"instances": [line]})
    raw = grpc_outputs(server, text=[line])
    assert code == 200 and "placeholder_warning" not in out["predictions"][0]
    assert [t for t in as_bytes(out["predictions"][0]["source_tokens"]) if t] == [t for t in raw["source_tokens"][0]
                                                                                    if t]
    code, out = rest(server, "/v1/models/nmt:predict", {"instances": [line], "protect": "phone"})
    assert code == 400 and "unknown kind 'phone'" in out["error"]



def test_binary_input_as_b64_and_raw_bytes_that_are_not_utf8(server):
    """{"b64": ...} carries any bytes; raw bytes that are not UTF-8 inside a JSON
    string pass as they are, as TF Serving's parser passes them (no UTF-8 check)."""
    raw = b"\xff\xfe broken caf\xc3\xa9"
    expected = grpc_outputs(server, text=[raw])
    code, out = rest(server, "/v1/models/nmt:predict", {"instances": [{"b64": base64.b64encode(raw).decode()}]})
    assert code == 200, out
    assert_same([out["predictions"][0]["translation"]], expected["translation"])
    assert_same([out["predictions"][0]["source_tokens"]], expected["source_tokens"])
    code, out = rest(server, "/v1/models/nmt:predict", b'{"inputs": {"text": ["' + raw + b'"]}}')
    assert code == 200, out
    for alias in ("translation", "source_tokens", "score"):
        assert_same(out["outputs"][alias], expected[alias])


def test_outputs_are_written_as_tf_serving_writes_them():
    """json_tensor.cc: floats in six digits when that gives the value back (else
    as many as needed), whole numbers with .0, NaN and Infinity; DT_STRING as the
    bytes themselves (not checked for UTF-8), as {"b64": ...} when the alias ends
    with _bytes; one output unnamed, several keyed by alias."""
    outputs = {"f": tf.make_tensor_proto(np.array([[0.2, 1e-5], [3.0, 1 / 3]], np.float32)),
               "d": tf.make_tensor_proto(np.array([[0.1 + 0.2, np.nan], [-np.inf, 9000000.0]], np.float64)),
               "s": tf.make_tensor_proto([b"caf\xc3\xa9 \"q\"", b"\xff"]),
               "x_bytes": tf.make_tensor_proto([b"\xff\x00", b""]),
               "n": tf.make_tensor_proto(np.array([7, -1], np.int64)),
               "b": tf.make_tensor_proto([True, False])}
    columns = rest_api.predict_response_json(outputs, row=False)
    assert columns == (b'{"outputs": {"b": [true,false], "d": [[0.30000000000000004,NaN],[-Infinity,9e+06]], '
                       b'"f": [[0.2,1e-05],[3.0,0.333333343]], "n": [7,-1], '
                       b'"s": ["caf\xc3\xa9 \\"q\\"","\xff"], "x_bytes": [{"b64": "/wA="},{"b64": ""}]}}')
    rows = rest_api.predict_response_json(outputs, row=True)
    assert rows == (b'{"predictions": [{"b": true, "d": [0.30000000000000004,NaN], "f": [0.2,1e-05], "n": 7, '
                    b'"s": "caf\xc3\xa9 \\"q\\"", "x_bytes": {"b64": "/wA="}}, {"b": false, "d": [-Infinity,9e+06], '
                    b'"f": [3.0,0.333333343], "n": -1, "s": "\xff", "x_bytes": {"b64": ""}}]}')
    one = {"translation": tf.make_tensor_proto([b"a", b"b"])}
    assert rest_api.predict_response_json(one, row=True) == b'{"predictions": ["a", "b"]}'
    assert rest_api.predict_response_json(one, row=False) == b'{"outputs": ["a","b"]}'


# test_serve.py's table of bad requests (test_malformed_requests_get_tf_serving_status_codes), over REST,
# with the HTTP status TF Serving maps from the gRPC one (model_servers/http_server.cc, ToHTTPStatusCode:
# NOT_FOUND 404; INVALID_ARGUMENT and FAILED_PRECONDITION 400), except for a body over --max_message_mb:
# 413, refused before it is read (gRPC: RESOURCE_EXHAUSTED, which TF Serving maps to 429).
# SAME: the REST request runs into the same check of run_predict, so the message is gRPC's, word for word.
# Otherwise TF Serving's REST front end refuses the request before Predict, with its own message
# (http_rest_api_util.cc: the path; json_tensor.cc: the JSON; http_rest_api_handler.cc: the signature).
SAME = object()
TEXT = {"instances": ["A man in a blue shirt."]}
BAD_REQUESTS = [
    (lambda: grpc_request(name="other"), grpc.StatusCode.NOT_FOUND, "/v1/models/other:predict", TEXT, 404, SAME),
    (lambda: grpc_request(version=7), grpc.StatusCode.NOT_FOUND, "/v1/models/nmt/versions/7:predict", TEXT, 404,
     SAME),
    (lambda: grpc_request(name=""), grpc.StatusCode.INVALID_ARGUMENT, "/v1/models/:predict", TEXT, 400,
     "Malformed request: POST /v1/models/:predict"),
    (lambda: grpc_request(signature="nope"), grpc.StatusCode.FAILED_PRECONDITION, "/v1/models/nmt:predict",
     {"signature_name": "nope", **TEXT}, 400, 'Serving signature name: "nope" not found in signature def'),
    (lambda: grpc_request(sentence=tf.make_tensor_proto(["x"])), grpc.StatusCode.INVALID_ARGUMENT,
     "/v1/models/nmt:predict", {"inputs": {"sentence": ["x"]}}, 400, "Missing named input: text in 'inputs' object."),
    (lambda: grpc_request(text=tf.make_tensor_proto(["x"]), extra=tf.make_tensor_proto(["y"])),
     grpc.StatusCode.INVALID_ARGUMENT, "/v1/models/nmt:predict", {"instances": [{"text": "x", "extra": "y"}]}, 400,
     "Failed to process element: 0 key: extra of 'instances' list. Error: INVALID_ARGUMENT: JSON object: "
     "does not have named input: extra"),
    (lambda: grpc_request(text=tf.make_tensor_proto([1.0, 2.0])), grpc.StatusCode.INVALID_ARGUMENT,
     "/v1/models/nmt:predict", {"inputs": [1.0, 2.0]}, 400,
     "JSON Value: 1.0 Type: Number is not of expected type: string"),
    (lambda: grpc_request(text=tf.make_tensor_proto([["a", "b"]])), grpc.StatusCode.INVALID_ARGUMENT,
     "/v1/models/nmt:predict", {"inputs": [["a", "b"]]}, 400, SAME),
    (lambda: grpc_request(["x"] * 51), grpc.StatusCode.INVALID_ARGUMENT, "/v1/models/nmt:predict",
     {"instances": ["x"] * 51}, 400, SAME),
    (lambda: grpc_request(["word " * 300000]), grpc.StatusCode.RESOURCE_EXHAUSTED, "/v1/models/nmt:predict",
     {"instances": ["word " * 300000]}, 413,
     "Request Entity Too Large: the request body is 1500019 bytes, more than this server's limit of 1048576 bytes "
     "(--max_message_mb=1)"),
]


@pytest.mark.parametrize("make, code, path, body, http_code, message", BAD_REQUESTS)
def test_the_bad_requests_of_the_grpc_table_over_rest(server, make, code, path, body, http_code, message):
    got_code, details = status_of(lambda: server["predict"].Predict(make(), timeout=60))
    assert got_code == code, details
    assert rest(server, path, body) == (http_code, {"error": details if message is SAME else message})
    still_serving(server)


@pytest.mark.parametrize("method, path, body, code, message", [
    ("POST", "/v1/models/nmt:predict", b"", 400, "JSON Parse error: The document is empty"),
    ("POST", "/v1/models/nmt:predict", b'{"instances": ["a"', 400,
     "JSON Parse error: Expecting ',' delimiter at offset: 18"),
    ("POST", "/v1/models/nmt:predict", b"[1, 2]", 400, "JSON Value: [\n    1,\n    2\n] Is not object"),
    ("POST", "/v1/models/nmt:predict", b'{"a": ' + b"[" * 100000 + b"]" * 100000 + b"}", 400,
     "JSON Parse error: the document is nested too deeply"),
    ("POST", "/v1/models/nmt:predict", b"[" * 100000 + b"]" * 100000, 400,
     "JSON Value: " + "[" * 1000 + "... Is not object (a body of 200,000 bytes that does not start with '{' is not "
     "parsed further)"),
    ("POST", "/v1/models/nmt:predict", {}, 400, "Missing 'inputs' or 'instances' key"),
    ("POST", "/v1/models/nmt:predict", {"instances": ["a"], "inputs": ["b"]}, 400,
     'JSON Value: {\n    "instances": [\n        "a"\n    ],\n    "inputs": [\n        "b"\n    ]\n} '
     "Not formatted correctly expecting only one of 'inputs' or 'instances' keys to exist "),
    ("POST", "/v1/models/nmt:predict", {"instances": []}, 400,
     'JSON Value: {\n    "instances": []\n} No values in \'instances\' array'),
    ("POST", "/v1/models/nmt:predict", {"instances": "a"}, 400,
     'JSON Value: {\n    "instances": "a"\n} Excepting \'instances\' to be an list/array'),
    ("POST", "/v1/models/nmt:predict", {"signature_name": 5, "inputs": ["a"]}, 400,
     'JSON Value: {\n    "signature_name": 5,\n    "inputs": [\n        "a"\n    ]\n} not formatted correctly. '
     "'signature_name' key must be a string value."),
    ("POST", "/v1/models/nmt:predict", {"instances": [{"b64": "not base64!"}]}, 400,
     "Failed to process element: 0 of 'instances' list. Error: INVALID_ARGUMENT: Unable to base64 decode"),
    ("POST", "/v1/models/nmt:predict", {"instances": ["a", ["b"]]}, 400,
     "Failed to process element: 1 of 'instances' list. Error: INVALID_ARGUMENT: Expecting shape [] but got: [1]"),
    ("POST", "/v1/models/nmt:predict", {"instances": ["a", {"text": "b"}]}, 400,
     "Expecting value/list but got object at item 1 of input list"),
    # TF Serving would first find "b" at the wrong level; the rank is checked before any value is converted.
    ("POST", "/v1/models/nmt:predict", {"inputs": [["a"], "b"]}, 400, "input text must have rank 1, got shape [2, 1]"),
    ("POST", "/v1/models/nmt:predict", {"inputs": ["a", ["b"]]}, 400,
     "Encountered list at unexpected level: 1 expected < 1"),
    ("POST", "/v1/models/nmt:predict", {"signature_name": "score", "instances": ["a"]}, 400,
     "instances is a plain list, but expecting list of objects as multiple input tensors required as per "
     "tensorinfo_map"),
    ("POST", "/v1/models/nmt:predict", {"signature_name": "score", "instances": [{"source": "a"}]}, 400,
     "Failed to process element: 0 of 'instances' list. JSON object: {\n    \"source\": \"a\"\n} must only have "
     "keys: source,target"),
    ("POST", "/v1/models/nmt:predict", {"inputs": "a"}, 400, "input text must have rank 1, got shape []"),
    ("POST", "/v1/models/nmt/labels/stable:predict", TEXT, 400, "Unrecognized servable version label: stable"),
    ("POST", "/v1/models/nmt/versions/99999999999999999999:predict", TEXT, 400,
     "Failed to convert version: 99999999999999999999 to numeric."),
    ("POST", "/v1/models/nmt/versions/one:predict", TEXT, 400,
     "Malformed request: POST /v1/models/nmt/versions/one:predict"),
    ("POST", "/v1/models/nmt:PREDICT", TEXT, 400, "Malformed request: POST /v1/models/nmt:PREDICT"),
    ("POST", "/v1/models/nmt:classify", TEXT, 501,
     "classify is not implemented by nmt_tf.serve (nor by its gRPC API): nmt_tf exports have predict signatures only"),
    ("PUT", "/v1/models/nmt:predict", b"{}", 400, "Malformed request: PUT /v1/models/nmt:predict"),
    ("DELETE", "/v1/models/nmt", None, 400, "Malformed request: DELETE /v1/models/nmt"),
    ("GET", "/v1/models", None, 400, "Missing model name in request."),
    ("GET", "/v1/models/nmt/labels/stable/metadata", None, 400, "Unrecognized servable version label: stable"),
    ("GET", "/v2/models/nmt", None, 404, "Not found: /v2/models/nmt (TF Serving's REST API paths start with /v1/)"),
    ("FOO", "/v1/models/nmt", None, 501, "Unsupported method: this server answers GET, HEAD and POST"),
    ("PROPFIND", "/v1/models/nmt", None, 501, "Unsupported method: this server answers GET, HEAD and POST ('PROPFIND')"),
])
def test_malformed_rest_requests_get_tf_serving_errors(server, method, path, body, code, message):
    assert rest(server, path, body, method) == (code, {"error": message})
    still_serving(server)


def test_an_error_message_writes_only_the_start_of_a_bad_document():
    """Issue 95: the message of a bad document shows json.dumps(doc, indent=4)'s
    first 1,000 characters, and only those are ever written: the probe's body
    ('[' x 300, a million "", ']' x 300; 2.86 MB) took 12.4 s and 2.3 GB when
    the whole text was made and then cut."""

    deep = json.loads("[" * 300 + ",".join(['""'] * 1_000_000) + "]" * 300)
    small = json.loads("[" * 300 + '""' + "]" * 300)      # the same first 1,000 characters
    tracemalloc.start()
    try:
        text = rest_api._json_text(deep)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert text == json.dumps(small, indent=4)[:1000] + "..." and peak < 2**20
    for doc in ({"instances": "a", "x": [1.5, None, True, {"k": []}, {}]}, [[], [{}], "é\n"], 7, "s"):
        for limit in (1000, 10, 31):
            whole = json.dumps(doc, indent=4, ensure_ascii=False)
            assert rest_api._json_text(doc, limit) == (whole if len(whole) <= limit else whole[:limit] + "...")


def test_bad_documents_of_many_values_are_refused_cheaply_with_a_short_message(server):
    """Each way of the probe into the error path, with ~0.9 MB of nested values
    (the test server's limit is 1 MiB): a non-list 'instances', both keys, a
    non-string signature_name, a nested text value, and a body that is no JSON
    object (over 64 KiB: refused from its first bytes, unparsed). Every message
    shows at most the document's first 1,000 characters."""
    junk = json.loads("[" * 300 + ",".join(['""'] * 200_000) + "]" * 300)
    cases = [({"instances": "a", "junk": junk}, "Excepting 'instances' to be an list/array"),
             ({"instances": ["a"], "inputs": junk}, "expecting only one of 'inputs' or 'instances'"),
             ({"signature_name": junk, "instances": ["a"]}, "'signature_name' key must be a string value."),
             ({"instances": [junk]}, "input text must have rank 1, got shape [1, 1, 1, 1, 1, 1, 1, 1, ...] "
                                     "(rank 301)"),
             ({"inputs": junk}, "input text must have rank 1, got shape [1, 1, 1, 1, 1, 1, 1, 1, ...] (rank 300)"),
             (json.dumps(junk).encode(), "Is not object (a body of 800,598 bytes that does not start with '{' "
                                         "is not parsed further)")]
    for body, message in cases:
        code, reply = rest(server, "/v1/models/nmt:predict", body)
        assert code == 400 and message in reply["error"], reply["error"][-300:]
        assert len(reply["error"]) < 1300
    still_serving(server)


def test_the_search_work_limit_holds_over_rest(server, monkeypatch):
    """--max_search_work is the registry's, so REST requests are bounded as gRPC ones
    (test_serve.py's test of the limit)."""
    registry = server["registry"]
    longest = registry.current.search_cost.output_limit(b"word " * 100)
    monkeypatch.setattr(registry, "max_search_work", 8 * 3 * longest - 1)
    code, reply = rest(server, "/v1/models/nmt:predict", {"instances": ["word " * 100] * 8})
    assert code == 400 and "(--max_search_work): send at most 7 such sentences" in reply["error"]
    assert rest(server, "/v1/models/nmt:predict", {"instances": ["word " * 100] * 7})[0] == 200


def test_a_body_over_the_limit_is_refused_unread_and_chunked_bodies_need_a_length(server):
    """413 from the headers alone: a client that declares 10 GB and sends
    nothing gets it at once (the server cannot have waited for the body)."""
    conn = http.client.HTTPConnection("127.0.0.1", server["rest_port"], timeout=30)
    conn.putrequest("POST", "/v1/models/nmt:predict")
    conn.putheader("Content-Length", str(10**10))
    conn.endheaders()
    reply = conn.getresponse()
    assert reply.status == 413 and json.loads(reply.read())["error"].startswith(
        "Request Entity Too Large: the request body is 10000000000 bytes")
    conn.close()
    conn = http.client.HTTPConnection("127.0.0.1", server["rest_port"], timeout=30)
    conn.request("POST", "/v1/models/nmt:predict", body=iter([b'{"instances": ["a"]}']), encode_chunked=True)
    reply = conn.getresponse()
    assert reply.status == 411 and "Content-Length" in json.loads(reply.read())["error"]
    conn.close()
    conn = http.client.HTTPConnection("127.0.0.1", server["rest_port"], timeout=30)
    conn.putrequest("POST", "/v1/models/nmt:predict")
    conn.putheader("Content-Length", "20")
    conn.putheader("Content-Length", "5")          # two framings of one body: refused, neither is trusted
    conn.endheaders(b'{"instances": ["a"]}')
    reply = conn.getresponse()
    assert reply.status == 400 and json.loads(reply.read())["error"] == "Bad Request: Duplicate Content-Length"
    conn.close()
    still_serving(server)


def test_32_concurrent_clients_are_served_by_a_bounded_pool(server):
    """32 clients at once on THREADS workers: every answer is the one gRPC gives
    for that sentence, none fails, and the server runs no thread per connection."""
    sentences = ["A man.", "Two dogs run.", "A girl in a red dress.", "People walk.", "A black dog.", "",
                 "Men play football.", "A woman sings."]
    expected = {s: grpc_outputs(server, text=[s]) for s in sentences}
    before = {t.ident for t in threading.enumerate()}
    most, done = [0], threading.Event()

    def watch():            # server threads started during the burst (clients and this watcher aside)
        while not done.wait(0.005):
            new = [t for t in threading.enumerate() if t.ident not in before
                   and not t.name.startswith(("rest-client", "watcher"))]
            most[0] = max(most[0], len(new))

    def client(i):
        sentence = sentences[i % len(sentences)]
        return sentence, rest(server, "/v1/models/nmt:predict", {"inputs": {"text": [sentence]}})

    watcher = threading.Thread(target=watch, name="watcher")
    watcher.start()
    with concurrent.futures.ThreadPoolExecutor(32, thread_name_prefix="rest-client") as pool:
        results = list(pool.map(client, range(32)))
    done.set()
    watcher.join()
    assert all(code == 200 for _, (code, _) in results), [out for _, (code, out) in results if code != 200]
    for sentence, (_, out) in results:
        for alias in ("translation", "score", "alignment", "nbest_translations"):
            assert_same(out["outputs"][alias], expected[sentence][alias])
    assert most[0] <= THREADS, most[0]


def test_an_unexpected_failure_is_a_json_500_and_the_server_keeps_serving(server, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")
    monkeypatch.setattr(rest_api, "run_predict", broken)
    assert rest(server, "/v1/models/nmt:predict", TEXT) == (500, {"error": "RuntimeError: boom"})
    monkeypatch.undo()
    still_serving(server)


def test_rest_predictions_decode_in_their_clients_turn_at_the_shared_gate(server):
    """Issue 95: REST predictions take decoding turns at the gate the gRPC
    front end uses (serve() gives both the same): a client at its share is
    refused (429), another waits for the turn and is answered after it."""
    from nmt_tf.serving.versions import FairGate

    gate = FairGate(slots=1, per_client=1)
    body = json.dumps({"instances": ["A man is sleeping."]}).encode()
    answer = lambda client: rest_api.rest_response(server["registry"], "POST", "/v1/models/nmt:predict", body,
                                                   max_batch_size=50, gate=gate, client=client)
    done = []
    with gate.turn("10.0.0.1", 1.0):            # that client decodes; the only turn is taken
        status, reply = answer("10.0.0.1")
        assert status == 429 and "its share of this server" in json.loads(reply)["error"]
        waiting = threading.Thread(target=lambda: done.append(answer("10.0.0.2")))
        waiting.start()
        time.sleep(0.3)
        assert not done                          # another client waits for the turn
    waiting.join(30)
    assert done and done[0][0] == 200 and "predictions" in json.loads(done[0][1])


def test_a_large_body_of_more_json_than_its_rows_can_need_is_refused_unparsed(server):
    """Issue 95: a 32 MB object with a junk array beside "instances" cost
    0.3 s and 117-159 MB to parse. Over _LARGE_BODY_BYTES, a body's JSON
    tokens are counted first, up to what --max_batch_size rows can need:
    past that it is refused with the limit named, nothing parsed; a large
    body of that many rows is served."""
    answer = lambda body: rest_api.rest_response(server["registry"], "POST", "/v1/models/nmt:predict", body,
                                                 max_batch_size=50)
    junk = json.dumps({"instances": "a", "junk": [0] * 600_000}).encode()
    assert len(junk) > rest_api._LARGE_BODY_BYTES
    tracemalloc.start()
    try:
        status, reply = answer(junk)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert status == 400 and peak < 2**20
    assert (f"a body of {len(junk):,} bytes with more than 1,856 JSON tokens" in json.loads(reply)["error"]
            and "--max_batch_size=50" in json.loads(reply)["error"])
    # b64 instances of every input of translate_constrained, 50 rows of ~25 KB each: under the count
    row = {"text": {"b64": base64.b64encode(b"A man is sleeping." + b" " * 25_000).decode()},
           "target_prefix": {"b64": base64.b64encode(b"Un").decode()}, "required_terms": {"b64": ""}}
    large = json.dumps({"signature_name": "translate_constrained", "instances": [row] * 50}).encode()
    assert len(large) > rest_api._LARGE_BODY_BYTES
    status, reply = answer(large)
    assert status == 200 and len(json.loads(reply)["predictions"]) == 50


def test_large_bodies_are_parsed_one_at_a_time_and_a_long_wait_is_refused(server, monkeypatch):
    """Issue 95: a 32 MB body of junk costs ~0.4 s and ~200 MB to parse; the
    REST workers must not do that all at once. Bodies over the size parse one
    at a time, and one that waits too long for its turn gets 429."""
    monkeypatch.setattr(rest_api, "_LARGE_BODY_BYTES", 100)
    parsing, most = [0], [0]
    lock = threading.Lock()
    parse = rest_api._parse_json_object

    def slow_parse(body, max_batch_size):
        with lock:
            parsing[0] += 1
            most[0] = max(most[0], parsing[0])
        time.sleep(0.3)
        with lock:
            parsing[0] -= 1
        return parse(body, max_batch_size)

    monkeypatch.setattr(rest_api, "_parse_json_object", slow_parse)
    large = json.dumps({"instances": ["A man is sleeping." + " " * 200]}).encode()
    answer = lambda: rest_api.rest_response(server["registry"], "POST", "/v1/models/nmt:predict", large,
                                            max_batch_size=50)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        statuses = [status for status, _ in pool.map(lambda _: answer(), range(3))]
    assert statuses == [200] * 3 and most[0] == 1
    monkeypatch.setattr(rest_api, "_LARGE_BODY_WAIT_SECONDS", 0.05)
    with rest_api._large_body_turn(10**6):        # another large body is being read
        status, reply = answer()
    assert status == 429 and "waited 0.05 s for its turn" in json.loads(reply)["error"]


def test_model_status_and_metadata(server):
    ok = {"model_version_status": [{"version": "1", "state": "AVAILABLE",
                                    "status": {"error_code": "OK", "error_message": ""}}]}
    assert rest(server, "/v1/models/nmt") == (200, ok)
    assert rest(server, "/v1/models/nmt/versions/1") == (200, ok)
    assert rest(server, "/v1/models/nmt?ignored=query") == (200, ok)
    assert rest(server, "/v1/models/nmt/labels/stable") == (200, ok)        # as gRPC: labels not looked at
    for path, spec in (("/v1/models/nmt/versions/7", {"name": "nmt", "version": {"value": 7}}),
                       ("/v1/models/other", {"name": "other"})):
        _, details = status_of(lambda: server["models"].GetModelStatus(
            get_model_status_pb2.GetModelStatusRequest(model_spec=spec), timeout=30))
        assert rest(server, path) == (404, {"error": details})
    meta_request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    meta_request.model_spec.name = "nmt"
    signatures = get_model_metadata_pb2.SignatureDefMap()
    server["predict"].GetModelMetadata(meta_request, timeout=30).metadata["signature_def"].Unpack(signatures)
    for path in ("/v1/models/nmt/metadata", "/v1/models/nmt/versions/1/metadata"):
        code, out = rest(server, path)
        assert code == 200
        assert out["model_spec"] == {"name": "nmt", "version": "1", "signature_name": ""}
        assert out["metadata"]["signature_def"] == json_format.MessageToDict(
            signatures, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
        assert {"serving_default", "translate", "score"} <= set(out["metadata"]["signature_def"]["signature_def"])
        assert out["metadata"]["signature_def"]["signature_def"]["score"]["inputs"]["target"]["dtype"] == "DT_STRING"
    assert rest(server, "/v1/models/nmt/versions/7/metadata") == (
        404, {"error": "Servable not found for request: Specific(nmt, 7)"})


def test_a_version_that_failed_to_load_is_in_the_rest_model_status(exported, tmp_path):
    base = tmp_path / "nmt"
    shutil.copytree(exported[2], base / "1")
    registry = serving.ModelRegistry("nmt", str(base), log=lambda *a: None)
    registry.poll()
    (base / "2").mkdir()
    (base / "2" / "saved_model.pb").write_bytes(b"not a SavedModel")
    registry.poll()
    code, body = rest_api.rest_response(registry, "GET", "/v1/models/nmt", b"")
    statuses = json.loads(body)["model_version_status"]
    assert code == 200 and [s["version"] for s in statuses] == ["2", "1"]
    assert statuses[1] == {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
    assert statuses[0]["state"] == "END" and statuses[0]["status"]["error_code"] == "UNKNOWN"
    assert statuses[0]["status"]["error_message"] == registry.failed_public[2]
    assert "version 2 could not be loaded" in registry.failed_public[2]        # not the server's own path
    assert "/" not in registry.failed_public[2].split("(")[0] and str(tmp_path) in registry.failed[2]
    code, body = rest_api.rest_response(registry, "GET", "/v1/models/nmt/versions/2", b"")
    assert code == 200 and [s["state"] for s in json.loads(body)["model_version_status"]] == ["END"]


def test_a_second_server_on_a_taken_rest_port_exits_with_a_clear_error(server):
    second = run_cli("-m", "nmt_tf.serve", "--port=0", f"--rest_api_port={server['rest_port']}", "--host=127.0.0.1",
                     f"--model_base_path={server['base']}", timeout=120)
    assert second.returncode == 1, second.stdout + second.stderr[-2000:]
    assert (f"error: could not listen on 127.0.0.1:{server['rest_port']} for the REST API: the port is in use; "
            "choose another --rest_api_port") in second.stderr.splitlines()
    assert "Serving model" not in second.stdout
    still_serving(server)


def test_slow_and_idle_clients_hold_no_worker_and_meet_a_deadline(exported, tmp_path):
    """16 clients sending one header line every 0.3 s and 8 that send nothing, on
    a REST API with 2 workers: a normal request is answered at once (these used to
    hold every worker until their 30 s read timeout); past the header deadline
    they get 408; a connection over --rest_max_connections gets 503 at once."""
    base = str(tmp_path / "nmt")
    shutil.copytree(exported[1], base)
    srv, registry, _ = nmt_server.start_server("nmt", base, port=0, host="127.0.0.1", threads=2, log=lambda *a: None)
    rest_server = rest_api.start_rest_server(registry, RestSettings(
        host="127.0.0.1", threads=2, max_connections=26, header_seconds=3.0, max_connections_per_client=26))
    address = ("127.0.0.1", rest_server.port)
    stop, extra = threading.Event(), []
    slow = [socket.create_connection(address, timeout=10) for _ in range(16)]
    idle = [socket.create_connection(address, timeout=10) for _ in range(8)]
    connected = time.monotonic()

    def drip():
        for s in slow:
            s.sendall(b"POST /v1/models/nmt:predict HTTP/1.1\r\n")
        while not stop.wait(0.3):
            for s in slow:
                try:
                    s.sendall(b"X-Slow: 1\r\n")
                except OSError:
                    pass
    dripping = threading.Thread(target=drip)
    dripping.start()
    try:
        time.sleep(0.5)
        start = time.monotonic()
        code, body = rest({"rest_port": rest_server.port}, "/v1/models/nmt:predict", TEXT)
        assert code == 200 and "predictions" in body
        assert time.monotonic() - start < 2.0
        # The answered one is closed just after its reply.
        assert wait_until(lambda: rest_server.open_connections <= 24, 30, interval=0.01), rest_server.open_connections
        extra = [socket.create_connection(address, timeout=10) for _ in range(2)]       # 26 open: the cap
        assert wait_until(lambda: rest_server.open_connections >= 26, 30, interval=0.01), rest_server.open_connections
        over = socket.create_connection(address, timeout=10)
        assert over.recv(4096).startswith(b"HTTP/1.1 503 Service Unavailable")
        over.close()
        time.sleep(max(0.0, connected + 3.5 - time.monotonic()))
        for s in slow + idle:
            reply = s.recv(4096)
            assert reply.startswith(b"HTTP/1.1 408 Request Timeout") and b"took more than 3 s" in reply, reply
    finally:
        stop.set()
        dripping.join()
        for s in slow + idle + extra:
            s.close()
        rest_server.stop()
        registry.stop()
        srv.stop(grace=0)


def raw_http(port: int, head: str, body: bytes = b"", source: str = "127.0.0.1") -> bytes:
    """The whole reply to one request written by hand (`head`: request line and headers, no blank line),
    sent from the loopback address `source`."""
    with socket.create_connection(("127.0.0.1", port), timeout=60, source_address=(source, 0)) as s:
        s.sendall(head.encode() + f"\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
        return reply


def test_one_client_address_holds_at_most_its_share_of_the_connections(exported, tmp_path):
    """Issue 95: 64 idle sockets of one client used to take every REST slot for
    30 s. With --rest_max_connections_per_client=4, a fifth connection of that
    address is answered 503 naming the limit, while another address
    (127.0.0.2) is served at once; a closed connection gives its slot back."""
    base = str(tmp_path / "nmt")
    shutil.copytree(exported[1], base)
    srv, registry, _ = nmt_server.start_server("nmt", base, port=0, host="127.0.0.1", threads=2, log=lambda *a: None)
    rest_server = rest_api.start_rest_server(registry, RestSettings(
        host="127.0.0.1", threads=2, max_connections=20, max_connections_per_client=4))
    address = ("127.0.0.1", rest_server.port)
    idle = [socket.create_connection(address, timeout=10) for _ in range(4)]

    def request_from(source: str) -> bytes:
        return raw_http(rest_server.port, "POST /v1/models/nmt:predict HTTP/1.1\r\nHost: x", json.dumps(TEXT).encode(),
                        source=source)

    try:
        assert wait_until(lambda: rest_server.open_connections == 4, 30, interval=0.01)
        refused = request_from("127.0.0.1")
        assert refused.startswith(b"HTTP/1.1 503 Service Unavailable"), refused[:200]
        assert b"--rest_max_connections_per_client" in refused
        start = time.monotonic()
        other = request_from("127.0.0.2")
        assert other.startswith(b"HTTP/1.1 200 OK") and b"predictions" in other, other[:300]
        assert time.monotonic() - start < 10
        idle.pop().close()
        assert wait_until(lambda: rest_server.open_connections == 3, 30, interval=0.01)
        assert request_from("127.0.0.1").startswith(b"HTTP/1.1 200 OK")
        assert wait_until(lambda: rest_server.open_connections == 3, 30, interval=0.01)
    finally:
        for s in idle:
            s.close()
        rest_server.stop()
        registry.stop()
        srv.stop(grace=0)


def test_a_post_from_another_origins_page_and_an_unknown_host_are_refused(server):
    """Issue 95: another site's page could post text/plain translations here
    (a browser sends those without asking), and any Host was answered. A
    request with an Origin other than its Host is 403; the page's own
    requests and clients without an Origin are answered; with
    --rest_allowed_hosts, another Host is 403."""
    port = server["rest_port"]
    body = json.dumps(TEXT).encode()
    head = f"POST /v1/models/nmt:predict HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: text/plain"
    assert raw_http(port, head, body).startswith(b"HTTP/1.1 200")
    assert raw_http(port, head + f"\r\nOrigin: http://127.0.0.1:{port}", body).startswith(b"HTTP/1.1 200")
    for origin in ("http://evil.example", "null", f"http://localhost:{port}"):
        refused = raw_http(port, head + f"\r\nOrigin: {origin}", body)
        assert refused.startswith(b"HTTP/1.1 403") and b"a page of another origin" in refused, refused[:300]
    assert raw_http(port, f"GET /v1/models/nmt HTTP/1.1\r\nHost: x\r\nOrigin: http://evil.example"
                    ).startswith(b"HTTP/1.1 200")                       # reading the status: a GET, no work
    named = rest_api.start_rest_server(server["registry"], RestSettings(
        host="127.0.0.1", threads=1, allowed_hosts=("LOCALHOST", "[::1]")))
    try:
        ok = raw_http(named.port, f"POST /v1/models/nmt:predict HTTP/1.1\r\nHost: localhost:{named.port}", body)
        assert ok.startswith(b"HTTP/1.1 200"), ok[:300]
        other = raw_http(named.port, "GET / HTTP/1.1\r\nHost: rebound.example")
        assert other.startswith(b"HTTP/1.1 403") and b"--rest_allowed_hosts" in other
    finally:
        named.stop()


def test_a_client_that_does_not_read_its_answer_is_cut_off():
    """A client that sends a request and never reads the (large) answer would
    hold its connection, and a slot of the limits, for ever: after
    reply_seconds the connection is cut and counted out."""
    web = rest_api.RestServer(RestSettings(host="127.0.0.1", threads=1, reply_seconds=1.0),
                              lambda *a, **k: (200, b" " * (64 << 20)))
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        s.connect(("127.0.0.1", web.port))
        s.sendall(b"GET /v1/models/nmt HTTP/1.1\r\nHost: x\r\n\r\n")
        assert wait_until(lambda: web.open_connections == 1, 30, interval=0.01)
        time.sleep(0.5)
        assert web.open_connections == 1                   # being written, slower than it is read
        assert wait_until(lambda: web.open_connections == 0, 30, interval=0.05)
    finally:
        s.close()
        web.stop()


def test_connections_open_as_the_server_stops_are_closed_not_left_open():
    """Connections open when the REST server stops (idle, or in the middle of a
    request) are closed and counted out: left open, a browser would send its
    next request on one (a preconnected socket) and wait for an answer that
    never comes, instead of learning at once that the server is gone."""
    web = rest_api.RestServer(RestSettings(host="127.0.0.1", threads=1), lambda *a, **k: (200, b"{}"))
    sockets = [socket.create_connection(("127.0.0.1", web.port), timeout=10) for _ in range(20)]
    sockets[0].sendall(b"POST /v1/models/nmt:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    try:
        assert wait_until(lambda: web.open_connections == 20, 30, interval=0.01), web.open_connections
        web.stop()
        assert web.open_connections == 0
        for s in sockets:
            try:
                assert s.recv(16) == b""
            except ConnectionResetError:
                pass
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", web.port), timeout=10)
    finally:
        for s in sockets:
            s.close()
        web.stop()
