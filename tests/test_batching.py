"""Server-side batching (nmt_tf.serving.batching; nmt_tf.serve --enable_batching) as TF Serving does it."""

import concurrent.futures
import os
import shutil
import threading
import time

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import prediction_service_pb2_grpc
from test_serve import request, status_of

from conftest import REPO, run_cli
from nmt_tf.serving import batching, rest
from nmt_tf.serving import server as nmt_server
from nmt_tf.serving.batching import Batcher, BatchingError, BatchingParameters, parse_batching_parameters
from nmt_tf.serving.http_server import RestSettings

SENTENCES = ["A man in a blue shirt.", "Two dogs run.", "A girl is eating.", "People walk on a street.",
             "A woman sings.", "The boy jumps into the water.", "A dog catches a ball.", "Men play music."]


def test_the_shipped_parameters_file_parses_with_tf_servings_meanings():
    params = batching.read_batching_parameters(os.path.join(REPO, "export", "batching_parameters.txt"))
    assert (params.max_batch_size, params.batch_timeout_micros, params.max_enqueued_batches,
            params.num_batch_threads, params.pad_variable_length_inputs) == (64, 5000, 100, 2, True)
    default = BatchingParameters()
    assert (default.max_batch_size, default.batch_timeout_micros, default.max_enqueued_batches) == (1000, 0, 10)
    assert default.num_batch_threads == os.cpu_count()


@pytest.mark.parametrize("text, fragment", [
    ("max_batch_size { value: 8 }\nmax_batch_sise { value: 3 }", "2:1"),      # the line of an unknown field
    ("max_batch_size: 8", "max_batch_size"),                                     # a wrapper needs { value: }
    ("max_batch_size { value: 8 } allowed_batch_sizes: 4 allowed_batch_sizes: 6", "must equal max_batch_size"),
    ("max_batch_size { value: 8 } allowed_batch_sizes: 4 allowed_batch_sizes: 2 allowed_batch_sizes: 8",
     "increasing"),
    ("num_batch_threads { value: 0 }", "num_batch_threads must be at least 1"),
    ("batch_timeout_micros { value: -1 }", "must not be negative"),
    # issue 95: int64's largest killed the batch thread at the first request; 100,000 threads, a traceback
    ("batch_timeout_micros { value: 9223372036854775807 }", "must be at most 300,000,000 \\(300 s"),
    ("num_batch_threads { value: 100000 }", "num_batch_threads must be at most 256"),
])
def test_a_bad_parameters_file_is_one_error_naming_it(text, fragment):
    with pytest.raises(BatchingError, match=fragment) as e:
        parse_batching_parameters(text, "params.txt")
    assert "params.txt" in str(e.value)


def test_serve_refuses_a_missing_parameters_file_at_start(tmp_path):
    out = run_cli("-m", "nmt_tf.serve", "--model_base_path=/nonexistent", f"--batching_parameters_file={tmp_path}/x")
    assert out.returncode == 1 and f"cannot read the batching parameters file {tmp_path}/x" in out.stderr


class Recorder:
    """A signature that doubles its input and records the batch sizes it was called with."""

    def __init__(self, delay=0.0, fail_on=None):
        self.sizes, self.delay, self.fail_on = [], delay, fail_on
        self.lock = threading.Lock()

    def __call__(self, feeds):
        with self.lock:
            self.sizes.append(len(feeds["x"]))
        time.sleep(self.delay)
        if self.fail_on is not None and self.fail_on in feeds["x"]:
            raise ValueError(f"bad value {self.fail_on}")
        return {"y": feeds["x"] * 2, "total": np.float32(feeds["x"].sum())}


def submit_all(batcher, call, values, timeout=10.0, key="k"):
    with concurrent.futures.ThreadPoolExecutor(len(values)) as pool:
        futures = [pool.submit(batcher.run, key, call, {"x": np.array(v)}, len(v), timeout) for v in values]
        return [f.exception() or f.result() for f in futures]


def test_concurrent_calls_are_joined_and_split_back_by_rows():
    batcher = Batcher(BatchingParameters(max_batch_size=16, batch_timeout_micros=200_000, num_batch_threads=1))
    call = Recorder()
    values = [[i, 10 * i] for i in range(1, 7)]
    results = submit_all(batcher, call, values)
    for v, r in zip(values, results):
        np.testing.assert_array_equal(r["y"], np.array(v) * 2)         # each call gets its own rows back
    assert sum(call.sizes) == 12 and len(call.sizes) < 6              # joined: fewer calls than requests
    assert max(call.sizes) <= 16
    batcher.stop()


def in_background(batcher, call, values, settle=0.1):
    """Starts batcher.run on `values` in a thread and gives it `settle` s to be taken or queued."""
    thread = threading.Thread(target=batcher.run, args=("k", call, {"x": np.array(values)}, len(values), 5.0))
    thread.start()
    time.sleep(settle)
    return thread


def test_a_full_queue_is_refused_at_once_and_a_large_request_is_refused():
    batcher = Batcher(BatchingParameters(max_batch_size=2, max_enqueued_batches=1, num_batch_threads=1))
    slow = Recorder(delay=0.5)
    first = in_background(batcher, slow, [1, 2], 0.2)          # the first batch runs; one more batch may wait
    waiting = in_background(batcher, slow, [3, 4], 0.05)
    start = time.perf_counter()
    with pytest.raises(batching.QueueFull, match="queue to which this task was submitted is full"):
        batcher.run("k", slow, {"x": np.array([5])}, 1, 5.0)
    assert time.perf_counter() - start < 0.1
    with pytest.raises(batching.TooLarge, match="Task size 3 is larger than maximum input batch size 2"):
        batcher.run("k", slow, {"x": np.array([1, 2, 3])}, 3, 5.0)
    first.join(), waiting.join()
    batcher.stop()


def test_one_client_holds_at_most_its_share_of_the_queues_and_gets_it_back():
    """Issue 95: with batching, one client's flood could fill every queue.
    A client address holds at most 3/4 of the sentences the queues can hold
    (here 2 batches x 4 = 8: 6); one more of its requests is refused at
    once, another client's is queued, and the share comes back as its
    requests finish."""
    batcher = Batcher(BatchingParameters(max_batch_size=4, max_enqueued_batches=2, num_batch_threads=1))
    assert batcher.client_share == 6
    slow = Recorder(delay=0.6)
    flood = [threading.Thread(target=batcher.run, args=("k", slow, {"x": np.array([i, i])}, 2, 5.0, "10.0.0.1"))
             for i in range(3)]
    for thread in flood:
        thread.start()
    time.sleep(0.2)
    start = time.perf_counter()
    with pytest.raises(batching.OverShare, match="this client has 6 sentences queued or running, its share"):
        batcher.run("k", slow, {"x": np.array([9])}, 1, 5.0, "10.0.0.1")
    assert time.perf_counter() - start < 0.1
    np.testing.assert_array_equal(batcher.run("k", slow, {"x": np.array([7])}, 1, 5.0, "10.0.0.2")["y"], [14])
    for thread in flood:
        thread.join()
    np.testing.assert_array_equal(batcher.run("k", slow, {"x": np.array([9])}, 1, 5.0, "10.0.0.1")["y"], [18])
    batcher.stop()


def test_a_request_that_fails_in_a_merged_batch_fails_only_itself():
    batcher = Batcher(BatchingParameters(max_batch_size=16, batch_timeout_micros=200_000, num_batch_threads=1))
    results = submit_all(batcher, Recorder(fail_on=7), [[1], [7], [3]])
    np.testing.assert_array_equal(results[0]["y"], [2])
    assert isinstance(results[1], ValueError) and "bad value 7" in str(results[1])
    np.testing.assert_array_equal(results[2]["y"], [6])
    batcher.stop()


def test_allowed_batch_sizes_pad_with_the_first_row_and_drop_its_outputs():
    batcher = Batcher(BatchingParameters(max_batch_size=8, allowed_batch_sizes=(4, 8), num_batch_threads=1))
    call = Recorder()
    result = batcher.run("k", call, {"x": np.array([5, 6, 7])}, 3, 5.0)
    assert call.sizes == [4]
    np.testing.assert_array_equal(result["y"], [10, 12, 14])
    assert result["total"] == 5 + 6 + 7 + 5                           # an output without the batch axis: whole
    batcher.stop()


def test_a_request_that_waits_past_its_timeout_is_left_out_of_its_batch():
    batcher = Batcher(BatchingParameters(max_batch_size=1, num_batch_threads=1, max_enqueued_batches=5))
    slow = Recorder(delay=0.6)
    busy = in_background(batcher, slow, [1])
    with pytest.raises(batching.WaitedTooLong):
        batcher.run("k", slow, {"x": np.array([2])}, 1, 0.2)
    busy.join()
    time.sleep(0.2)
    assert slow.sizes == [1]                          # the abandoned request never ran
    batcher.stop()


@pytest.fixture(scope="module")
def batching_server(exported, tmp_path_factory):
    base = str(tmp_path_factory.mktemp("batching") / "nmt")
    shutil.copytree(exported[1], base)
    params = BatchingParameters(max_batch_size=8, batch_timeout_micros=100_000, num_batch_threads=1,
                                max_enqueued_batches=4)
    batcher = Batcher(params)
    threads = batching.request_threads(2, params)
    srv, registry, port = nmt_server.start_server("nmt", base, port=0, host="127.0.0.1", threads=threads,
                                             poll_seconds=60, log=lambda *a: None, batcher=batcher)
    web = rest.start_rest_server(registry, RestSettings(host="127.0.0.1", threads=threads), batcher=batcher)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield {"predict": prediction_service_pb2_grpc.PredictionServiceStub(channel), "batcher": batcher,
           "rest_port": web.port, "registry": registry}
    web.stop()
    registry.stop()
    srv.stop(grace=0)
    batcher.stop()


def test_batched_predictions_equal_the_saved_models_own(batching_server, exported):
    stub, batcher = batching_server["predict"], batching_server["batcher"]
    before = batcher.batches_run
    with concurrent.futures.ThreadPoolExecutor(len(SENTENCES)) as pool:
        replies = list(pool.map(lambda s: stub.Predict(request([s]), timeout=60), SENTENCES))
    assert batcher.batches_run - before < len(SENTENCES)              # requests were joined
    local = tf.saved_model.load(exported[2]).signatures["serving_default"]
    for sentence, reply in zip(SENTENCES, replies):
        alone = local(text=tf.constant([sentence]))
        assert tf.make_ndarray(reply.outputs["translation"])[0] == alone["translation"].numpy()[0]
        np.testing.assert_allclose(tf.make_ndarray(reply.outputs["score"]), alone["score"].numpy(), atol=1e-4)
        tokens = [t for t in tf.make_ndarray(reply.outputs["target_tokens"])[0] if t]   # padded to the batch
        assert tokens == [t for t in alone["target_tokens"].numpy()[0] if t]


def test_requests_with_different_output_filters_share_one_queue(batching_server):
    """Issue 95: the batch queue was keyed by the output filter too, so
    permuted filters each opened a queue of their own past
    max_enqueued_batches. Now one queue per version and signature: requests
    with different filters join one batch, and each gets its own outputs."""
    stub, batcher = batching_server["predict"], batching_server["batcher"]
    filters = [["translation", "score"], ["score", "translation"], ["truncated"], ["translation"],
               ["score", "truncated", "translation"], ["log_prob"]]

    def ask(i):
        req = request([SENTENCES[i % len(SENTENCES)]])
        req.output_filter.extend(filters[i])
        return stub.Predict(req, timeout=60)

    before = batcher.batches_run
    with concurrent.futures.ThreadPoolExecutor(len(filters)) as pool:
        replies = list(pool.map(ask, range(len(filters))))
    assert batcher.batches_run - before < len(filters)               # joined across filters
    for wanted, reply in zip(filters, replies):
        assert sorted(reply.outputs) == sorted(wanted)


def test_requests_with_other_search_settings_are_never_merged(batching_server, exported):
    """Issue 91: translate_with_options requests are batched with those of
    the same settings only, and each gets the translation of its own
    settings (the SavedModel's, alone)."""
    stub, batcher = batching_server["predict"], batching_server["batcher"]
    settings = [(1, 0.5), (3, 1.0), (1, 0.5), (3, 1.0), (2, 1.0), (1, 0.5)]

    def ask(i):
        beam, alpha = settings[i]
        return stub.Predict(request(signature="translate_with_options",
                                    text=tf.make_tensor_proto([SENTENCES[i]], dtype=tf.string),
                                    beam_size=tf.make_tensor_proto(beam, dtype=tf.int32),
                                    length_alpha=tf.make_tensor_proto(alpha, dtype=tf.float32)), timeout=60)

    before = batcher.batches_run
    with concurrent.futures.ThreadPoolExecutor(len(settings)) as pool:
        replies = list(pool.map(ask, range(len(settings))))
    runs = batcher.batches_run - before
    assert len(set(settings)) <= runs < len(settings)           # joined within settings, never across
    local = tf.saved_model.load(exported[2]).signatures["translate_with_options"]
    for i, reply in enumerate(replies):
        beam, alpha = settings[i]
        alone = local(text=tf.constant([SENTENCES[i]]), beam_size=tf.constant(beam), n_best=tf.constant(0),
                      length_alpha=tf.constant(alpha))
        assert tf.make_ndarray(reply.outputs["translation"])[0] == alone["translation"].numpy()[0]
        assert tf.make_ndarray(reply.outputs["nbest_translations"]).shape == alone["nbest_translations"].shape


def test_batching_keeps_tf_servings_errors(batching_server):
    stub = batching_server["predict"]
    code, details = status_of(lambda: stub.Predict(request(SENTENCES + ["One more."]), timeout=60))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "larger than maximum input batch size 8" in details
    code, _ = status_of(lambda: stub.Predict(request(name="other"), timeout=60))
    assert code == grpc.StatusCode.NOT_FOUND
    reply = stub.Predict(request(SENTENCES[:2]), timeout=60)            # still serving
    assert tf.make_ndarray(reply.outputs["translation"]).shape == (2,)


def test_rest_predictions_are_batched_too(batching_server):
    import json
    import urllib.request

    batcher = batching_server["batcher"]
    before = batcher.batches_run
    url = f"http://127.0.0.1:{batching_server['rest_port']}/v1/models/nmt:predict"

    def post(sentence):
        body = json.dumps({"instances": [sentence]}).encode()
        with urllib.request.urlopen(urllib.request.Request(url, body), timeout=60) as reply:
            return json.loads(reply.read())["predictions"][0]["translation"]

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        translations = list(pool.map(post, SENTENCES[:6]))
    assert all(isinstance(t, str) for t in translations)
    assert batcher.batches_run - before < 6


def test_stopping_fails_the_queued_requests_at_once():
    batcher = Batcher(BatchingParameters(max_batch_size=1, num_batch_threads=1, max_enqueued_batches=5))
    slow = Recorder(delay=0.5)
    busy = in_background(batcher, slow, [1])
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        queued = pool.submit(batcher.run, "k", slow, {"x": np.array([2])}, 1, 30.0)
        time.sleep(0.1)
        start = time.perf_counter()
        batcher.stop()
        with pytest.raises(batching.QueueFull, match="stopping"):
            queued.result(timeout=5)
        assert time.perf_counter() - start < 1.0
    busy.join()
