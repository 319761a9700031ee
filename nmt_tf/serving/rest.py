"""TensorFlow Serving's REST API for nmt_tf.serve (--rest_api_port).

TF Serving answers REST beside gRPC (model_servers/http_rest_api_handler.cc,
util/json_tensor.cc); this module does the same on the functions the gRPC
front end calls (nmt_tf.serving.versions), so that both answer alike:

  POST /v1/models/NAME[/versions/N|/labels/L]:predict   {"instances": [...]} -> {"predictions": [...]}
                                                         {"inputs": ...}      -> {"outputs": ...}
  GET  /v1/models/NAME[/versions/N|/labels/L]           model status (GetModelStatus as JSON)
  GET  /v1/models/NAME[/versions/N|/labels/L]/metadata  {"model_spec": ..., "metadata": {"signature_def": ...}}
  GET  /                                                 the translation page (nmt_tf.serving.page; not TF Serving's)

A predict body may also say "markup": "html" (or "xml") and "protect":
"all" (or "none", or kinds such as "url,number"), nmt_tf extensions (TF
Serving ignores the keys): the "text" inputs' tags are taken out and their
URLs, numbers and the like masked before the model runs, and put back into
"translation" (nmt_tf.inference.markup, nmt_tf.inference.placeholders);
the other outputs are the model's, of the prepared sentences. Without
"protect" nothing is masked: the body is the model's input, as in TF
Serving (the page asks for "all").

with TF Serving's JSON encoding (strings as JSON strings, {"b64": ...} for
binary input and for outputs whose alias ends with "_bytes") and its errors:
{"error": "..."} with the HTTP status TF Serving maps from the gRPC one
(`HTTP_STATUS`). The HTTP server under it is aiohttp's
(nmt_tf.serving.http_server: deadlines and connection caps, so slow clients
hold no worker, then a fixed pool of worker threads answers); a request body
larger than the message limit is refused with 413 before it is read.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import functools
import json
import math
import re
import struct
import sys
import threading
import urllib.parse

import grpc
import numpy as np
from absl import logging
from google.protobuf import json_format

from nmt_tf.inference import markup as markup_module
from nmt_tf.inference import placeholders
from nmt_tf.inference.translation import ALIGNMENT_OUTPUTS, prepare, put_back
from nmt_tf.serving import api_protos as serving_protos
from nmt_tf.serving.http_server import RestServer, RestSettings, error_json
from nmt_tf.serving.page import page_file
from nmt_tf.serving.versions import (
    BATCH_WAIT_SECONDS,
    DEFAULT_SIGNATURE,
    ModelRegistry,
    ServingError,
    check_batch_size,
    check_rank,
    model_metadata,
    model_status,
    run_predict,
)

# TF Serving's HTTP status for each gRPC status (model_servers/http_server.cc, ToHTTPStatusCode).
HTTP_STATUS = {"OK": 200, "CANCELLED": 499, "UNKNOWN": 500, "INVALID_ARGUMENT": 400, "DEADLINE_EXCEEDED": 504,
               "NOT_FOUND": 404, "ALREADY_EXISTS": 409, "PERMISSION_DENIED": 403, "RESOURCE_EXHAUSTED": 429,
               "FAILED_PRECONDITION": 400, "ABORTED": 409, "OUT_OF_RANGE": 400, "UNIMPLEMENTED": 501,
               "INTERNAL": 500, "UNAVAILABLE": 503, "DATA_LOSS": 500, "UNAUTHENTICATED": 401}
_REST_PATH = re.compile(r"/v1/.*", re.I | re.S)
_PREDICT_PATH = re.compile(r"/v1/models/([^/:]+)(?:/versions/(\d+)|/labels/([^/:]+))?:(classify|regress|predict)",
                           re.I | re.A)
_STATUS_PATH = re.compile(r"/v1/models(?:/([^/:]+))?(?:/versions/(\d+)|/labels/([^/:]+))?(?:/(metadata))?",
                          re.I | re.A)
_JSON_TYPES = ((type(None), "Null"), (dict, "Object"), (list, "Array"), (str, "String"))


# Error messages show at most this many characters of the input they name.
_ERROR_ECHO_CHARS = 1000
# A body that is no JSON object is parsed (for TF Serving's exact message) only up to this size.
_PARSED_NON_OBJECT_BYTES = 1 << 16
# Predict bodies over this size are parsed and converted one at a time in a process (issue 95: a 32 MB
# object of junk takes about 0.4 s and 200 MB to parse; the REST workers at once would hold that many
# times over). A large body waits at most _LARGE_BODY_WAIT_SECONDS for its turn, then is refused (429).
_LARGE_BODY_BYTES = 1 << 20
_LARGE_BODY_WAIT_SECONDS = 10.0
_large_body = threading.BoundedSemaphore(1)
# Before such a body is parsed, its JSON tokens (strings, and the characters [ { , : outside them) are counted,
# up to what max_batch_size rows can need: _TOKENS_PER_ROW per row (an instance of four inputs, each as a
# {"b64": ...} object, takes 29), and _TOKENS_OUTSIDE_ROWS for the rest. More is refused unparsed: a 32 MB
# object with a junk array beside "instances" took 0.3 s and 117-159 MB to parse into the lists it names.
_TOKENS_PER_ROW = 32
_TOKENS_OUTSIDE_ROWS = 256
_JSON_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[{,:]')


@contextlib.contextmanager
def _large_body_turn(size: int):
    """Holds the process's one turn for parsing a body of more than
    _LARGE_BODY_BYTES (nothing for a smaller one)."""
    if size <= _LARGE_BODY_BYTES:
        yield
        return
    if not _large_body.acquire(timeout=_LARGE_BODY_WAIT_SECONDS):
        raise ServingError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                           f"the server is reading other large requests: a body of {size:,} bytes waited "
                           f"{_LARGE_BODY_WAIT_SECONDS:g} s for its turn; send it again later")
    try:
        yield
    finally:
        _large_body.release()


def _invalid(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.INVALID_ARGUMENT, message)


def _decimal(value: float, single: bool) -> str:
    """A float as TF Serving writes it (json_tensor.cc, WriteDecimal): six
    digits when they give the value back, else all it needs; whole numbers
    with ".0"; NaN, Infinity, -Infinity."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    text = "%g" % value
    back = float(text)
    if single:
        back = struct.unpack("f", struct.pack("f", back))[0]
    if back != value:
        text = "%.9g" % value if single else "%.17g" % value
    return text if "." in text or "e" in text else text + ".0"


def _json_text(value, limit: int = _ERROR_ECHO_CHARS) -> str:
    """A JSON value as TF Serving's error messages show it, cut at `limit`
    characters: json.dumps(value, indent=4)'s text, of which only the first
    `limit` characters are ever written, so a bad document of millions of
    values costs no more than a small one (issue 95: the whole text of a
    deeply nested 2.86 MB body took 12.4 s and 2.3 GB)."""
    if isinstance(value, float):
        text = _decimal(value, single=not abs(value) > 3.4028234e38)
        return text if len(text) <= limit else text[:limit] + "..."
    pieces, size = [], 0
    for piece in _pretty_json_pieces(value):
        pieces.append(piece)
        size += len(piece)
        if size > limit:
            return "".join(pieces)[:limit] + "..."
    return "".join(pieces)


_SCALAR_JSON = {None: "null", True: "true", False: "false"}


def _scalar_json(value) -> str:
    if isinstance(value, (bool, type(None))):
        return _SCALAR_JSON[value]
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(value) if isinstance(value, float) else str(value)


def _pretty_json_pieces(value, indent: str = "    "):
    """The pieces of json.dumps(value, indent=4, ensure_ascii=False), made one
    at a time with a stack of iterators rather than recursion, so that a
    caller can stop after the first few at any depth."""
    stack = []

    def opening(item, depth):
        """The text that starts `item`, pushing the iterator of its members."""
        if isinstance(item, dict) and item:
            stack.append((iter(item.items()), depth + 1, True, "}"))
            return "{"
        if isinstance(item, list) and item:
            stack.append((iter(item), depth + 1, False, "]"))
            return "["
        if isinstance(item, (dict, list)):
            return "{}" if isinstance(item, dict) else "[]"
        return _scalar_json(item)

    yield opening(value, 0)
    first = True
    while stack:
        members, depth, is_object, closing = stack[-1]
        member = next(members, members)
        if member is members:
            stack.pop()
            yield "\n" + indent * (depth - 1) + closing
            first = False
            continue
        yield ("\n" if first else ",\n") + indent * depth
        if is_object:
            yield json.dumps(str(member[0]), ensure_ascii=False) + ": "
            member = member[1]
        first = True
        text = opening(member, depth)
        first = text in ("{", "[")
        yield text


def _json_type(value) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    return next((name for kind, name in _JSON_TYPES if isinstance(value, kind)), "Number")


def _utf8(text: str) -> bytes:
    """A JSON string's bytes: raw bytes of the body that were not UTF-8 are
    kept as they came (TF Serving's parser does not check UTF-8)."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise _invalid("JSON Parse error: The surrogate pair in string is invalid.") from None


def _is_b64(value) -> bool:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("b64"), str)


def _b64_decode(value) -> bytes:
    if not _is_b64(value):
        raise _invalid(f"JSON Value: {_json_text(value)} not formatted correctly for base64 data")
    data = re.sub(r"\s", "", value["b64"])
    try:
        return base64.b64decode(data + "=" * (-len(data) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise _invalid("Unable to base64 decode") from None


@functools.cache
def _integer_fields() -> dict:
    """The TensorProto field of each integer dtype and the JSON integers it
    takes (json_tensor.cc: IsInt, IsInt64, IsUint, IsUint64)."""
    t = serving_protos.DT
    int32 = ("int_val", -2**31, 2**31)
    return {t.DT_INT32: int32, t.DT_INT16: int32, t.DT_INT8: int32, t.DT_UINT8: int32,
            t.DT_INT64: ("int64_val", -2**63, 2**63), t.DT_UINT32: ("uint32_val", 0, 2**32),
            t.DT_UINT64: ("uint64_val", 0, 2**64)}


def _add_value(value, dtype: int, proto) -> None:
    """One JSON scalar into a TensorProto of `dtype` (json_tensor.cc, AddValueToTensor)."""
    t = serving_protos.DT
    integer = isinstance(value, int) and not isinstance(value, bool)
    if integer and not -2**63 <= value < 2**64:       # no 64-bit integer: a double, as for TF Serving's parser
        try:
            value, integer = float(value), False
        except OverflowError:
            raise _invalid("JSON Parse error: Number too big to be stored in double.") from None
    number = integer or isinstance(value, float)
    fields = _integer_fields()
    if dtype in (t.DT_FLOAT, t.DT_DOUBLE):
        if not number:
            raise _type_error(value, dtype)
        single = dtype == t.DT_FLOAT
        if math.isfinite(value) and (abs(value) > (2**24 - 1 if single else 2**53 - 1) if integer else
                                     abs(value) > (3.4028234663852886e38 if single else sys.float_info.max)):
            raise _invalid(f"Cannot convert JSON value: {_json_text(value)} to {'float' if single else 'double'} "
                           "without loss of precision.")
        (proto.float_val if single else proto.double_val).append(float(value))
    elif dtype in fields:
        name, low, high = fields[dtype]
        if not integer or not low <= value < high:
            raise _type_error(value, dtype)
        getattr(proto, name).append(value)
    elif dtype == t.DT_STRING:
        if not isinstance(value, str):
            raise _type_error(value, dtype)
        proto.string_val.append(_utf8(value))
    elif dtype == t.DT_BOOL:
        if not isinstance(value, bool):
            raise _type_error(value, dtype)
        proto.bool_val.append(value)
    else:
        raise ServingError(grpc.StatusCode.UNIMPLEMENTED,
                           f"Conversion of JSON Value: {_json_text(value)} to type: {serving_protos.dtype_name(dtype)}")


def _type_error(value, dtype: int) -> ServingError:
    return _invalid(f"JSON Value: {_json_text(value)} Type: {_json_type(value)} is not of expected type: "
                    f"{serving_protos.dtype_name(dtype)}")


def _dense_shape(value) -> list[int]:
    """The shape of a nested JSON list, read along its first elements (GetDenseTensorShape)."""
    shape = []
    while isinstance(value, list):
        shape.append(len(value))
        if not value:
            break
        value = value[0]
    return shape


def _fill(value, level: int, shape: list[int], dtype: int, proto) -> None:
    """The values of a nested JSON list of `shape` into `proto` (FillTensorProto)."""
    if not isinstance(value, list):
        if level != len(shape):
            raise _invalid(f"JSON Value: {_json_text(value)} found at incorrect level: {level + 1} in the JSON DOM. "
                           f"Expected at level: {len(shape)}")
        if isinstance(value, dict):
            if dtype != serving_protos.DT_STRING:
                raise _type_error(value, dtype)
            proto.string_val.append(_b64_decode(value))
        else:
            _add_value(value, dtype, proto)
        return
    if level >= len(shape):
        raise _invalid(f"Encountered list at unexpected level: {level} expected < {len(shape)}")
    if len(value) != shape[level]:
        raise _invalid(f"Encountered list at unexpected size: {len(value)} at level: {level} "
                       f"expected size: {shape[level]}")
    for item in value:
        _fill(item, level + 1, shape, dtype, proto)


def _status_text(error: ServingError) -> str:
    return f"{error.code.name}: {error.message}"


def _inputs_from_instances(instances: list, infos, tensors) -> None:
    """Row format: one item per batch element, an object of inputs when the
    signature has several (FillTensorMapFromInstancesList)."""
    names = sorted(infos)
    if not isinstance(instances[0], dict) and len(names) > 1:
        raise _invalid("instances is a plain list, but expecting list of objects as multiple input tensors required "
                       "as per tensorinfo_map")
    is_object = lambda value: isinstance(value, dict) and not _is_b64(value)   # noqa: E731
    objects = is_object(instances[0])
    shapes = {}

    def add(item, name):
        if name not in infos:
            raise _invalid(f"JSON object: does not have named input: {name}")
        shape = _dense_shape(item)
        _fill(item, 0, shape, infos[name].dtype, tensors[name])
        if name not in shapes:
            shapes[name] = shape
        elif math.prod(shapes[name]) != math.prod(shape):
            raise _invalid(f"Expecting tensor size: {math.prod(shapes[name])} but got: {math.prod(shape)}")
        elif shapes[name] != shape:
            text = lambda dims: "[" + ",".join(map(str, dims)) + "]"   # noqa: E731
            raise _invalid(f"Expecting shape {text(shapes[name])} but got: {text(shape)}")

    for i, item in enumerate(instances):
        if i == 0:       # the first item's rank, checked before any value is converted; the rest must match it
            for name, value in (item.items() if objects and is_object(item) else [(names[0], item)]):
                if name in infos:
                    check_rank(name, [len(instances)] + _dense_shape(value), infos[name])
        if objects:
            if not is_object(item):
                raise _invalid(f"Expecting object but got list at item {i} of input list")
            for name, value in item.items():
                try:
                    add(value, name)
                except ServingError as e:
                    raise _invalid(f"Failed to process element: {i} key: {name} of 'instances' list. "
                                   f"Error: {_status_text(e)}") from None
            if sorted(item) != names:
                raise _invalid(f"Failed to process element: {i} of 'instances' list. JSON object: {_json_text(item)} "
                               f"must only have keys: {','.join(names)}")
        else:
            if is_object(item):
                raise _invalid(f"Expecting value/list but got object at item {i} of input list")
            try:
                add(item, names[0])
            except ServingError as e:
                raise _invalid(f"Failed to process element: {i} of 'instances' list. "
                               f"Error: {_status_text(e)}") from None
    for name, shape in shapes.items():
        tensors[name].dtype = infos[name].dtype
        for size in [len(instances)] + shape:
            tensors[name].tensor_shape.dim.add(size=size)


def _inputs_from_columns(inputs, infos, tensors, max_batch_size: int, defaulted=frozenset()) -> None:
    """Columnar format: the tensor itself when the signature has one input
    (besides those with a default, `defaulted`), else an object of inputs
    (FillTensorMapFromInputsMap; as there, keys that are not inputs of the
    signature are not looked at; an input with a default may be left out)."""
    if not isinstance(inputs, dict) or _is_b64(inputs):
        if len(set(infos) - set(defaulted)) > 1:
            raise _invalid("inputs is a plain value/list, but expecting an object as multiple input tensors required "
                           "as per tensorinfo_map")
        columns = {min(set(infos) - set(defaulted) or infos): inputs}
    else:
        columns = {}
        for name in sorted(infos):
            if name not in inputs and name in defaulted:
                continue
            if name not in inputs:
                raise _invalid(f"Missing named input: {name} in 'inputs' object.")
            columns[name] = inputs[name]
    for name, value in columns.items():
        if isinstance(value, list):         # refused before converting a batch that run_predict would refuse
            check_batch_size(name, len(value), max_batch_size)
        shape = _dense_shape(value)
        check_rank(name, shape, infos[name])        # before any value is converted
        tensors[name].dtype = infos[name].dtype
        for size in shape:
            tensors[name].tensor_shape.dim.add(size=size)
        _fill(value, 0, shape, infos[name].dtype, tensors[name])


def _check_json_tokens(body: bytes, max_batch_size: int) -> None:
    """Refuses a body of more than _LARGE_BODY_BYTES whose JSON tokens are more
    than max_batch_size rows can need (_TOKENS_PER_ROW each, and
    _TOKENS_OUTSIDE_ROWS), counting no further than that (no copy of the
    body, one step per token: a few milliseconds at the most)."""
    if len(body) <= _LARGE_BODY_BYTES:
        return
    limit = max_batch_size * _TOKENS_PER_ROW + _TOKENS_OUTSIDE_ROWS
    for count, _ in enumerate(_JSON_TOKEN.finditer(body), 1):
        if count > limit:
            raise _invalid(f"a body of {len(body):,} bytes with more than {limit:,} JSON tokens (strings, and "
                           f"the characters '[{{,:' outside them) is not parsed: {_TOKENS_PER_ROW} per sentence "
                           f"of --max_batch_size={max_batch_size:,} and {_TOKENS_OUTSIDE_ROWS} more are the most "
                           "a predict request can need")


def _parse_json_object(body: bytes, max_batch_size: int) -> dict:
    """The request body as a JSON object, or TF Serving's parse error. NaN,
    Infinity and -Infinity are numbers, as there. A large body that is no
    object, or holds more JSON than max_batch_size rows can need
    (`_check_json_tokens`), is refused unparsed."""
    start = re.match(rb"[ \t\n\r]*", body).end()      # (body.strip() would copy the body)
    if start == len(body):
        raise _invalid("JSON Parse error: The document is empty")
    if body[start:start + 1] != b"{" and len(body) > _PARSED_NON_OBJECT_BYTES:
        # No object can follow: refused from its first bytes, unparsed (parsing a 32 MB array of
        # empty strings alone takes 0.4 s and 128 MB).
        head = body[start:start + _ERROR_ECHO_CHARS].decode("utf-8", "replace")
        raise _invalid(f"JSON Value: {head}... Is not object (a body of {len(body):,} bytes that does not start "
                       "with '{' is not parsed further)")
    _check_json_tokens(body, max_batch_size)
    text = body.decode("utf-8", "surrogateescape")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        offset = len(text[:e.pos].encode("utf-8", "surrogateescape"))
        raise _invalid(f"JSON Parse error: {e.msg} at offset: {offset}") from None
    except ValueError as e:             # an integer of more digits than Python converts
        raise _invalid(f"JSON Parse error: {e}") from None
    if not isinstance(doc, dict):
        raise _invalid(f"JSON Value: {_json_text(doc)} Is not object")
    return doc


def predict_request_from_json(registry: ModelRegistry, model_spec, body: bytes, max_batch_size: int):
    """A PredictRequest from a REST predict body, whether it was in row
    format ("instances") rather than columnar ("inputs"), and with "markup"
    or "protect" the texts' `nmt_tf.inference.translation.Prepared` lines
    (else None; `_take_text_options`); TF Serving's
    rules and messages (json_tensor.cc, FillPredictRequestFromJson). Batches
    over `max_batch_size` are refused before their items are converted. A
    body over _LARGE_BODY_BYTES waits for its turn (`_large_body_turn`), and
    is refused unparsed if it holds more JSON than such a batch can need
    (`_check_json_tokens`)."""
    with _large_body_turn(len(body)):
        doc = _parse_json_object(body, max_batch_size)
        request, row, signature = _predict_request(registry, model_spec, doc, max_batch_size)
        return request, row, _take_text_options(signature, request, doc)


PUT_BACK_OUTPUTS = ("translation",) + ALIGNMENT_OUTPUTS       # what puts markup and placeholders back


def _take_text_options(signature, request, doc: dict):
    """With "markup" or "protect" in `doc`: the "text" input's tags taken out
    and its items masked (the request then carries the prepared sentences),
    the Prepared lines returned (else None). `signature`: the SignatureDef
    the request calls."""
    if "markup" not in doc and "protect" not in doc:
        return None
    kind = doc.get("markup")
    if kind is not None and kind not in markup_module.KINDS:
        raise _invalid(f"'markup' must be \"html\" or \"xml\", not {_json_text(kind)}")
    try:
        kinds = placeholders.parse_kinds(doc.get("protect", "none"))
    except ValueError as e:
        raise _invalid(f"{e} (not {_json_text(doc['protect'])})") from None
    if kind is None and not kinds:
        return None
    name = "'markup'" if kind else "'protect'"
    outputs = signature.outputs
    text = request.inputs["text"] if "text" in request.inputs else None
    if text is None or text.dtype != serving_protos.DT.DT_STRING or not all(k in outputs for k in PUT_BACK_OUTPUTS):
        raise _invalid(f"{name} needs a signature with a string input 'text' and the outputs "
                       f"{', '.join(PUT_BACK_OUTPUTS)} (serving_default, translate_with_options, "
                       "translate_constrained)")
    prepared = [prepare(value.decode("utf-8", "replace"), kind, kinds) for value in text.string_val]
    del text.string_val[:]
    text.string_val.extend(p.text.encode("utf-8") for p in prepared)
    return prepared


def _put_back(outputs, prepared: list):
    """The "translation" output with each line's markup and placeholders put
    back (in place), and outputs "markup_warning" and "placeholder_warning"
    added when a line has one ("" for the lines without)."""
    arrays = {k: serving_protos.to_array(outputs[k]) for k in PUT_BACK_OUTPUTS}
    texts, warnings = [], []
    for i, p in enumerate(prepared):
        text, *warning = put_back(p, arrays, i)
        texts.append(text.encode("utf-8"))
        warnings.append([w or "" for w in warning])
    proto = outputs["translation"]
    del proto.string_val[:]
    proto.string_val.extend(texts)
    for k, name in enumerate(("markup_warning", "placeholder_warning")):
        if any(w[k] for w in warnings):
            serving_protos.from_array(np.array([w[k].encode() for w in warnings], object), outputs[name])


def _predict_request(registry: ModelRegistry, model_spec, doc: dict, max_batch_size: int):
    """(the PredictRequest of a predict body's JSON object, whether it was in
    row format, the SignatureDef it calls on the version it names)."""
    request = serving_protos.PredictRequest()
    request.model_spec.CopyFrom(model_spec)
    if "signature_name" in doc:
        if not isinstance(doc["signature_name"], str):
            raise _invalid(f"JSON Value: {_json_text(doc)} not formatted correctly. 'signature_name' key must be a "
                           "string value.")
        request.model_spec.signature_name = _utf8(doc["signature_name"]).decode("utf-8", "replace")
    loaded = registry.get(request.model_spec)
    name = request.model_spec.signature_name or DEFAULT_SIGNATURE
    if name not in loaded.signature_defs:
        raise _invalid(f'Serving signature name: "{name}" not found in signature def')
    signature = loaded.signature_defs[name]
    infos = signature.inputs
    if not infos:
        raise _invalid(f"Failed to get input map for signature: {request.model_spec.signature_name or 'DEFAULT'}")
    if "instances" in doc:
        if "inputs" in doc:
            raise _invalid(f"JSON Value: {_json_text(doc)} Not formatted correctly expecting only one of 'inputs' or "
                           "'instances' keys to exist ")
        if not isinstance(doc["instances"], list):
            raise _invalid(f"JSON Value: {_json_text(doc)} Excepting 'instances' to be an list/array")
        if not doc["instances"]:
            raise _invalid(f"JSON Value: {_json_text(doc)} No values in 'instances' array")
        # Inputs with a default (translate_with_options' settings, one per call) are not per instance: left out.
        rows = {alias: info for alias, info in infos.items() if alias not in signature.defaults} or infos
        check_batch_size(min(rows), len(doc["instances"]), max_batch_size)
        _inputs_from_instances(doc["instances"], rows, request.inputs)
        return request, True, signature
    if "inputs" in doc:
        _inputs_from_columns(doc["inputs"], infos, request.inputs, max_batch_size, set(signature.defaults))
        return request, False, signature
    raise _invalid("Missing 'inputs' or 'instances' key")


def _json_leaf(alias: str, dtype: int):
    """How TF Serving writes one value of an output tensor (json_tensor.cc,
    AddSingleValueAndAdvance): DT_STRING as a JSON string of its bytes (not
    checked for UTF-8, as TF Serving does not), or as {"b64": ...} when the
    alias ends with "_bytes"; floats by _decimal."""
    t = serving_protos.DT
    if dtype == t.DT_STRING:
        if alias.endswith("_bytes"):
            return lambda v: '{"b64": "%s"}' % base64.b64encode(v).decode("ascii")
        return lambda v: json.dumps(v.decode("utf-8", "surrogateescape"), ensure_ascii=False)
    if dtype in (t.DT_FLOAT, t.DT_DOUBLE):
        return functools.partial(_decimal, single=dtype == t.DT_FLOAT)
    if dtype == t.DT_BOOL:
        return lambda v: "true" if v else "false"
    if dtype in (t.DT_INT8, t.DT_UINT8, t.DT_INT16, t.DT_INT32, t.DT_INT64, t.DT_UINT32, t.DT_UINT64):
        return str
    raise _invalid(f"Failed to write JSON value for tensor type: {serving_protos.dtype_name(dtype)}")


def _nested_json(array, leaf) -> str:
    """A NumPy array as nested JSON lists of leaf(value)."""
    if array.ndim == 0:
        return leaf(array.item())
    if array.ndim == 1:
        return "[" + ",".join(map(leaf, array.tolist())) + "]"
    return "[" + ",".join(_nested_json(part, leaf) for part in array) + "]"


def predict_response_json(outputs, row: bool) -> bytes:
    """A PredictResponse's outputs as TF Serving's REST API returns them
    (json_tensor.cc, MakeJsonFromTensors): {"predictions": [...]}, one item per
    batch element, for a row-format request; {"outputs": ...} for a columnar
    one; objects keyed by output alias when there are several outputs."""
    if not outputs:
        raise _invalid("Cannot convert empty tensor map to JSON")
    aliases = sorted(outputs)
    leaves = {alias: _json_leaf(alias, outputs[alias].dtype) for alias in aliases}
    arrays = {alias: serving_protos.to_array(outputs[alias]) for alias in aliases}

    def record(part) -> str:       # part(alias) -> that output's JSON
        if len(aliases) == 1:
            return part(aliases[0])
        return "{" + ", ".join(f"{json.dumps(alias)}: {part(alias)}" for alias in aliases) + "}"

    if not row:
        text = '{"outputs": ' + record(lambda alias: _nested_json(arrays[alias], leaves[alias])) + "}"
        return text.encode("utf-8", "surrogateescape")
    batch = 0
    for alias in aliases:
        if arrays[alias].ndim == 0:
            raise _invalid(f"Tensor name: {alias} has no shape information ")
        size = arrays[alias].shape[0]
        if size < 1:
            raise _invalid(f"Tensor name: {alias} has invalid batch size: {size}")
        if batch and size != batch:
            raise _invalid(f"Tensor name: {alias} has inconsistent batch size: {size} expecting: {batch}")
        batch = size
    items = [record(lambda alias: _nested_json(arrays[alias][i, ...], leaves[alias])) for i in range(batch)]
    return ('{"predictions": [' + ", ".join(items) + "]}").encode("utf-8", "surrogateescape")


def _proto_json(message, field_names: bool) -> str:
    """protobuf's JSON of a message with every field printed, as TF Serving
    prints its REST replies (JsonPrintOptions.always_print_primitive_fields)."""
    return json_format.MessageToJson(message, preserving_proto_field_name=field_names, indent=1,
                                     always_print_fields_with_no_presence=True)


def _metadata_json(response) -> str:
    """GetModelMetadataResponse as TF Serving's REST API writes it
    (http_rest_api_util.cc, ToJsonString): the SignatureDefMap unpacked."""
    signatures = serving_protos.SignatureDefMap()
    response.metadata["signature_def"].Unpack(signatures)
    return (f'{{\n"model_spec":{_proto_json(response.model_spec, True)},\n'
            f'"metadata": {{"signature_def": {_proto_json(signatures, True)}}}\n}}\n')


def _rest_model_spec(name: str, version: str | None, label: str | None):
    """The ModelSpec of a REST path's parts (http_rest_api_util.cc, ParseModelInfo):
    name and label %-decoded, the version a 64-bit integer."""
    def decode(text: str) -> str:
        return urllib.parse.unquote_to_bytes(text.encode("latin-1", "replace")).decode("utf-8", "replace")

    spec = serving_protos.ModelSpec(name=decode(name or ""))
    if version:
        if len(version) > 19 or int(version) >= 2**63:
            raise _invalid(f"Failed to convert version: {version} to numeric.")
        spec.version.value = int(version)
    if label:
        spec.version_label = decode(label)
    return spec


def _rest_answer(registry: ModelRegistry, method: str, path: str, body: bytes, max_batch_size: int,
                 max_message_bytes: int | None, batcher=None, gate=None, client: str = "") -> bytes:
    if not _REST_PATH.fullmatch(path):
        raise ServingError(grpc.StatusCode.NOT_FOUND,
                           f"Not found: {path} (TF Serving's REST API paths start with /v1/)")
    malformed = _invalid(f"Malformed request: {method} {path}")
    pattern = {"POST": _PREDICT_PATH, "GET": _STATUS_PATH}.get(method)
    match = pattern.fullmatch(path) if pattern else None
    if match is None:
        raise malformed
    spec = _rest_model_spec(*match.group(1, 2, 3))
    if method == "POST":
        if match.group(4) == "predict":
            request, row, prepared = predict_request_from_json(registry, spec, body, max_batch_size)
            turn = gate.turn(client, BATCH_WAIT_SECONDS) if gate is not None else contextlib.nullcontext()
            with turn:
                response = run_predict(registry, request, max_batch_size, max_message_bytes, can_filter=False,
                                       batcher=batcher, client=client)
            if prepared is not None:
                _put_back(response.outputs, prepared)
            return predict_response_json(response.outputs, row)
        if match.group(4) in ("classify", "regress"):
            raise ServingError(grpc.StatusCode.UNIMPLEMENTED,
                               f"{match.group(4)} is not implemented by nmt_tf.serve (nor by its gRPC API): nmt_tf "
                               "exports have predict signatures only")
        raise malformed       # the verb matched case-insensitively, as TF Serving's does, then is compared exactly
    if not spec.name:
        raise _invalid("Missing model name in request.")
    if match.group(4) == "metadata":
        request = serving_protos.GetModelMetadataRequest(model_spec=spec, metadata_field=["signature_def"])
        return _metadata_json(model_metadata(registry, request)).encode()
    request = serving_protos.GetModelStatusRequest(model_spec=spec)
    return _proto_json(model_status(registry, request), False).encode()


def rest_response(registry: ModelRegistry, method: str, path: str, body: bytes, max_batch_size: int = 1024,
                  max_message_bytes: int | None = None, batcher=None, gate=None, client: str = "") -> tuple[int, bytes]:
    """(HTTP status, JSON body) of one REST request, as TF Serving's REST API
    answers it (model_servers/http_rest_api_handler.cc): the same functions as
    the gRPC services, their status mapped to HTTP as TF Serving maps it.
    `path` without the query string, as the request line has it.
    `batcher`: nmt_tf.serving.batching's, to join concurrent predictions;
    else `gate` (nmt_tf.serving.versions.FairGate, shared with the gRPC
    front end): a prediction decodes in the turn of its `client` (address)."""
    try:
        return 200, _rest_answer(registry, method, path, body, max_batch_size, max_message_bytes, batcher, gate,
                                 client)
    except ServingError as e:
        return HTTP_STATUS[e.code.name], error_json(e.message)
    except RecursionError:   # JSON nested deeper than Python's parser or these functions go
        return 400, error_json("JSON Parse error: the document is nested too deeply")
    except Exception as e:   # never let one request take the server down
        logging.exception("REST request failed")
        return 500, error_json(f"{type(e).__name__}: {e}")


def start_rest_server(registry: ModelRegistry, settings: RestSettings, batcher=None, gate=None,
                      ssl_context=None) -> RestServer:
    """Serves TF Serving's REST API for `registry` as `settings` say (port 0:
    a free one, then in .port), with the translation page at / (nmt_tf.serving.page)
    unless settings.page is False; a port that another process holds is
    refused. `batcher` and `gate` as in rest_response; with an `ssl_context`
    (nmt_tf.serving.tls) it speaks HTTPS."""
    answer = functools.partial(rest_response, registry, max_batch_size=settings.max_batch_size,
                               max_message_bytes=settings.max_body_bytes, batcher=batcher, gate=gate)
    try:
        return RestServer(settings, answer, functools.partial(page_file, registry) if settings.page else None,
                          ssl_context)
    except OSError as e:
        reason = {errno.EADDRINUSE: "the port is in use",
                  errno.EADDRNOTAVAIL: "the address is not this machine's"}.get(e.errno, e.strerror or str(e))
        raise OSError(f"could not listen on {settings.host}:{settings.port} for the REST API: {reason}; "
                      "choose another --rest_api_port") from None
