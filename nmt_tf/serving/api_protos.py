"""TF Serving's API messages without TensorFlow: what nmt_tf.serve speaks.

The tensorflow-serving-api package's modules (predict_pb2, ...) import
`tensorflow.core.framework.tensor_pb2`, and with it all of TensorFlow: 4.4 s
and 641 MB before the first request (measured on the AMX Xeon), which a
server translating with LiteRT (`nmt_tf.serve --runtime=litert`) has no
use for. The same messages are built here from their descriptors:
`tf_serving_apis.binpb` is the FileDescriptorSet of TF Serving's
predict.proto, get_model_metadata.proto and get_model_status.proto with
every file they import, as the installed tensorflow-serving-api and
TensorFlow declare them (`descriptor_set()` writes it again from them;
tests/test_serve.py checks that the committed file is still the same). They
live in a descriptor pool of their own, so a process that has imported
TensorFlow too (a test, a notebook) has no clash between the two; on the
wire they are TF Serving's messages, and a client of either kind reads them.

`to_array` and `from_array` convert TensorProtos the way tf.make_ndarray and
tf.make_tensor_proto do, in NumPy; `add_services` registers the gRPC methods
of PredictionService and ModelService by their TF Serving names.
"""

from __future__ import annotations

import functools
import math
import os
import types

import grpc
import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

DESCRIPTOR_SET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tf_serving_apis.binpb")


@functools.cache
def pool() -> descriptor_pool.DescriptorPool:
    """The descriptor pool of TF Serving's messages (not protobuf's default pool)."""
    files = descriptor_pb2.FileDescriptorSet()
    with open(DESCRIPTOR_SET, "rb") as f:
        files.ParseFromString(f.read())
    own = descriptor_pool.DescriptorPool()
    for file in files.file:          # in dependency order, as descriptor_set() writes them
        own.Add(file)
    return own


def message(full_name: str):
    """The message class `full_name` ("tensorflow.serving.PredictRequest")."""
    return message_factory.GetMessageClass(pool().FindMessageTypeByName(full_name))


PredictRequest = message("tensorflow.serving.PredictRequest")
PredictResponse = message("tensorflow.serving.PredictResponse")
TensorProto = message("tensorflow.TensorProto")
ModelSpec = message("tensorflow.serving.ModelSpec")
GetModelMetadataRequest = message("tensorflow.serving.GetModelMetadataRequest")
GetModelMetadataResponse = message("tensorflow.serving.GetModelMetadataResponse")
SignatureDefMap = message("tensorflow.serving.SignatureDefMap")
SignatureDef = message("tensorflow.SignatureDef")
GetModelStatusRequest = message("tensorflow.serving.GetModelStatusRequest")
GetModelStatusResponse = message("tensorflow.serving.GetModelStatusResponse")
ModelVersionStatus = message("tensorflow.serving.ModelVersionStatus")
StatusProto = message("tensorflow.serving.StatusProto")
Any = message("google.protobuf.Any")

_DATA_TYPE = pool().FindEnumTypeByName("tensorflow.DataType")
# The DataType values by name, as tensorflow.core.framework.types_pb2 has them: DT.DT_FLOAT, DT.DT_STRING, ...
DT = types.SimpleNamespace(**{value.name: value.number for value in _DATA_TYPE.values})
DT_STRING = DT.DT_STRING


def dtype_name(dtype_enum: int) -> str:
    """TensorFlow's C++ name of a DataType (DT_FLOAT -> "float"), as in its error messages."""
    value = _DATA_TYPE.values_by_number.get(dtype_enum)
    return value.name.removeprefix("DT_").lower() if value is not None else str(dtype_enum)


# DataType -> (NumPy dtype, the TensorProto field that holds its values); DT_HALF and DT_BFLOAT16 hold
# their bits in half_val. The rest (quantized and resource types) is refused as tf.make_ndarray refuses it.
_NUMPY = {
    "DT_FLOAT": (np.float32, "float_val"), "DT_DOUBLE": (np.float64, "double_val"),
    "DT_INT32": (np.int32, "int_val"), "DT_UINT8": (np.uint8, "int_val"), "DT_INT16": (np.int16, "int_val"),
    "DT_INT8": (np.int8, "int_val"), "DT_UINT16": (np.uint16, "int_val"), "DT_INT64": (np.int64, "int64_val"),
    "DT_UINT32": (np.uint32, "uint32_val"), "DT_UINT64": (np.uint64, "uint64_val"), "DT_BOOL": (np.bool_, "bool_val"),
    "DT_HALF": (np.float16, "half_val"), "DT_COMPLEX64": (np.complex64, "scomplex_val"),
    "DT_COMPLEX128": (np.complex128, "dcomplex_val"),
}
_BY_NUMBER = {_DATA_TYPE.values_by_name[name].number: kind for name, kind in _NUMPY.items()}
_BY_NUMPY = {np.dtype(numpy_type): number for number, (numpy_type, _) in _BY_NUMBER.items()}
# Written value by value even when there are several, as tf.make_tensor_proto writes them.
_TYPED_ONLY = {np.dtype(np.bool_), np.dtype(np.uint16), np.dtype(np.complex64), np.dtype(np.complex128)}


def to_array(proto) -> np.ndarray:
    """A TensorProto's value as tf.make_ndarray gives it: packed
    tensor_content, or the typed values with the last one repeated to the
    shape's size (zeros when there is none); strings as bytes in an object
    array. Raises ValueError for a type it cannot hold or values that do not
    fit the shape. (The caller bounds the declared size first:
    serving.check_declared_size.)"""
    shape = [d.size for d in proto.tensor_shape.dim]
    elements = math.prod(shape)
    if proto.dtype == DT_STRING:
        values = list(proto.string_val)
        if len(values) < elements:
            values += [values[-1] if values else b""] * (elements - len(values))
        array = np.empty(len(values), dtype=object)
        array[:] = values
        return array.reshape(shape)
    if proto.dtype not in _BY_NUMBER:
        raise ValueError(f"unsupported tensor type {dtype_name(proto.dtype)}")
    numpy_type, field = _BY_NUMBER[proto.dtype]
    if proto.tensor_content:
        return np.frombuffer(proto.tensor_content, dtype=numpy_type).copy().reshape(shape)
    values = getattr(proto, field)
    if field == "half_val":
        flat = np.array(values, dtype=np.uint16).view(np.float16)
    elif field in ("scomplex_val", "dcomplex_val"):
        pairs = np.array(values, dtype=np.float32 if field == "scomplex_val" else np.float64)
        flat = (pairs[0::2] + 1j * pairs[1::2]).astype(numpy_type)
    else:
        flat = np.array(values, dtype=numpy_type)
    if flat.size == 0:
        return np.zeros(shape, numpy_type)
    if flat.size < elements:
        flat = np.pad(flat, (0, elements - flat.size), mode="edge")
    return flat.reshape(shape)


def from_array(array, proto=None):
    """`array` as a TensorProto (into `proto` when given), as
    tf.make_tensor_proto writes it, byte for byte: strings (bytes or str) in
    string_val, several numbers packed in tensor_content (booleans, uint16
    and complex numbers, and a single number, in their typed field)."""
    array = np.asarray(array)
    proto = TensorProto() if proto is None else proto
    proto.tensor_shape.SetInParent()
    for size in array.shape:
        proto.tensor_shape.dim.add(size=size)
    if array.dtype.kind in "OSU":
        proto.dtype = DT_STRING
        proto.string_val.extend(v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in array.reshape(-1))
        return proto
    if array.dtype not in _BY_NUMPY:
        raise ValueError(f"cannot send a {array.dtype} array as a TensorProto")
    proto.dtype = _BY_NUMPY[array.dtype]
    if array.size > 1 and array.dtype not in _TYPED_ONLY:
        proto.tensor_content = np.ascontiguousarray(array).tobytes()
        return proto
    field, flat = _BY_NUMBER[proto.dtype][1], array.reshape(-1)
    if field == "half_val":
        getattr(proto, field).extend(flat.view(np.uint16).tolist())
    elif field in ("scomplex_val", "dcomplex_val"):
        getattr(proto, field).extend(np.stack([flat.real, flat.imag], axis=-1).reshape(-1).tolist())
    else:
        getattr(proto, field).extend(flat.tolist())
    return proto


def add_services(server: grpc.Server, prediction, model_service) -> None:
    """Registers `prediction` (Predict, GetModelMetadata) and `model_service`
    (GetModelStatus) under TF Serving's service and method names; each
    method is called (request, context). ModelService's
    HandleReloadConfigRequest is not served (UNIMPLEMENTED), as before."""
    def unary(method, request_class, response_class):
        return grpc.unary_unary_rpc_method_handler(method, request_deserializer=request_class.FromString,
                                                   response_serializer=response_class.SerializeToString)

    server.add_generic_rpc_handlers((
        grpc.method_handlers_generic_handler("tensorflow.serving.PredictionService", {
            "Predict": unary(prediction.Predict, PredictRequest, PredictResponse),
            "GetModelMetadata": unary(prediction.GetModelMetadata, GetModelMetadataRequest,
                                      GetModelMetadataResponse)}),
        grpc.method_handlers_generic_handler("tensorflow.serving.ModelService", {
            "GetModelStatus": unary(model_service.GetModelStatus, GetModelStatusRequest, GetModelStatusResponse)}),
    ))


def descriptor_set() -> bytes:
    """The FileDescriptorSet of the messages above as the installed
    tensorflow-serving-api and TensorFlow declare them (imports TensorFlow):
    what tf_serving_apis.binpb holds. To write it again after an upgrade:
    python -c "from nmt_tf.serving import api_protos as p; open(p.DESCRIPTOR_SET, 'wb').write(p.descriptor_set())"
    """
    from tensorflow_serving.apis import get_model_metadata_pb2, get_model_status_pb2, predict_pb2

    seen, ordered = set(), []

    def visit(file):
        if file.name not in seen:
            seen.add(file.name)
            for dependency in file.dependencies:
                visit(dependency)
            ordered.append(file)

    for module in (predict_pb2, get_model_metadata_pb2, get_model_status_pb2):
        visit(module.DESCRIPTOR)
    files = descriptor_pb2.FileDescriptorSet()
    for file in ordered:
        file.CopyToProto(files.file.add())
    return files.SerializeToString(deterministic=True)
