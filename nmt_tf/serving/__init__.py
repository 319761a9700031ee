"""nmt_tf.serve's library: the server (server), model versions and their
requests (versions), TF Serving's REST API and the page (rest, page, web/),
batching, TLS, the API's protobuf messages without TensorFlow (api_protos)
and LiteRT versions (litert)."""
