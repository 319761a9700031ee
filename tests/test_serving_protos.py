"""nmt_tf.serving.api_protos: TF Serving's messages without TensorFlow, the same on the wire
and in NumPy as TensorFlow's own."""

import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2

from nmt_tf.serving import api_protos as serving_protos


def test_the_committed_descriptors_are_the_installed_tf_serving_apis():
    with open(serving_protos.DESCRIPTOR_SET, "rb") as f:
        committed = f.read()
    assert committed == serving_protos.descriptor_set(), (
        "nmt_tf/serving/tf_serving_apis.binpb differs from the installed tensorflow-serving-api: write it again "
        "(serving_protos.descriptor_set's docstring says how)")


def test_importing_the_messages_leaves_tensorflow_out():
    code = ("import sys; from nmt_tf.serving import api_protos, rest, server; "
            "print('tensorflow' in sys.modules, 'tensorflow.python' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


ARRAYS = [
    np.array([b"a", "\u00e9t\u00e9".encode(), b""], dtype=object),
    np.array([[b"x", b"y"], [b"z", b""]], dtype=object),
    np.arange(6, dtype=np.float32).reshape(2, 3) / 7,
    np.array([1, -2, 3], np.int32), np.array([2**40, -1], np.int64), np.array([True, False]),
    np.zeros([2, 0, 3], np.float32), np.array(3.5, np.float64), np.array([1.5, -2], np.float16),
    np.array([7, 255], np.uint8), np.array([1 + 2j, 3], np.complex64), np.array([1, 65535], np.uint16),
    np.array([4.25], np.float32),
]


@pytest.mark.parametrize("array", ARRAYS, ids=lambda a: f"{a.dtype}{list(a.shape)}")
def test_arrays_go_and_come_back_as_with_tensorflow(array):
    ours = serving_protos.from_array(array)
    theirs = tf.make_tensor_proto(array)
    assert ours.SerializeToString() == theirs.SerializeToString()
    back = serving_protos.to_array(theirs)
    assert back.dtype == tf.make_ndarray(theirs).dtype and back.shape == array.shape
    np.testing.assert_array_equal(back, array)


@pytest.mark.parametrize("proto_text", [
    'dtype: DT_STRING tensor_shape { dim { size: 3 } } string_val: "a"',          # the last value repeated
    'dtype: DT_STRING tensor_shape { dim { size: 2 } }',                          # no value: empty strings
    'dtype: DT_FLOAT tensor_shape { dim { size: 4 } } float_val: 1 float_val: 2',
    'dtype: DT_INT32 tensor_shape { dim { size: 2 } dim { size: 2 } }',           # no value: zeros
    'dtype: DT_INT64 tensor_shape { dim { size: 2 } } int64_val: 5',
    'dtype: DT_BOOL tensor_shape { dim { size: 3 } } bool_val: true',
    'dtype: DT_HALF tensor_shape { dim { size: 2 } } half_val: 15360',
    'dtype: DT_COMPLEX64 tensor_shape { dim { size: 1 } } scomplex_val: 1 scomplex_val: 2',
    'dtype: DT_UINT8 tensor_shape { dim { size: 2 } } int_val: 200',
])
def test_sparse_tensor_protos_are_read_as_tf_make_ndarray_reads_them(proto_text):
    from google.protobuf import text_format

    proto = text_format.Parse(proto_text, tf.make_tensor_proto([0]).__class__())
    expected = tf.make_ndarray(proto)
    got = serving_protos.to_array(proto)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got.astype(expected.dtype) if got.dtype != object else [bytes(v) for v in
                                  got.reshape(-1)], expected if got.dtype != object else
                                  [v if isinstance(v, bytes) else v.encode() for v in expected.reshape(-1)])


def test_a_request_of_either_kind_parses_as_the_other():
    theirs = predict_pb2.PredictRequest()
    theirs.model_spec.name, theirs.model_spec.signature_name = "nmt", "serving_default"
    theirs.inputs["text"].CopyFrom(tf.make_tensor_proto(["Two dogs run."]))
    theirs.output_filter.append("translation")
    ours = serving_protos.PredictRequest.FromString(theirs.SerializeToString())
    assert ours.model_spec.name == "nmt" and list(ours.output_filter) == ["translation"]
    assert serving_protos.to_array(ours.inputs["text"]).tolist() == [b"Two dogs run."]
    assert predict_pb2.PredictRequest.FromString(ours.SerializeToString()) == theirs
    with pytest.raises(ValueError, match="unsupported tensor type resource"):
        serving_protos.to_array(serving_protos.TensorProto(dtype=serving_protos.DT.DT_RESOURCE))
