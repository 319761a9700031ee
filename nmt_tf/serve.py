r"""A server speaking TensorFlow Serving's gRPC and REST APIs, for machines without it.

Usage:
  python -m nmt_tf.serve --port=8500 --model_name=nmt --model_base_path=exports/nmt
  python -m nmt_tf.serve --port=8500 --rest_api_port=8501 --model_name=nmt --model_base_path=exports/nmt
  python -m nmt_tf.serve --preset=multi30k_en_fr --rest_api_port=8501     # the shipped model; page at :8501/
  python -m nmt_tf.serve --preset=multi30k_en_fr --rest_api_port=8501 --runtime=litert   # the same on LiteRT

Production deployments should use the official `tensorflow_model_server`
(see export/README.md: docker-compose, models.config, batching parameters).
This server exists for machines where that binary cannot be installed, and
for tests: it implements the same services on the same protos (the
tensorflow-serving-api package's, read from their descriptors without
importing TensorFlow: nmt_tf.serving.api_protos), so clients cannot tell the
difference:

  tensorflow.serving.PredictionService  Predict, GetModelMetadata
                                        (Classify, Regress, MultiInference: UNIMPLEMENTED)
  tensorflow.serving.ModelService       GetModelStatus (HandleReloadConfigRequest: UNIMPLEMENTED)

and, with --rest_api_port (off by default, as in TF Serving), TF Serving's
REST API on the same functions (POST /v1/models/NAME:predict, GET
/v1/models/NAME[/metadata]; see nmt_tf.serving.rest), with TF Serving's JSON and its
errors as {"error": "..."} with the HTTP status it maps from the gRPC one,
and at / a page that translates what you type and shows the n-best list and
the attention as a heatmap, through that REST API (nmt_tf.serving.page). A
request body larger than --max_message_mb is refused with 413 before it is
read. Each front end answers --threads requests at a time; the REST API's
HTTP server (aiohttp's) reads every connection on one event loop before a
worker takes the request (a slow or idle client holds no worker; 30 s for
the headers, 120 s for the body, then 408), with at most --rest_max_connections connections open, and
--rest_max_connections_per_client from one client address (one more: 503
at once). The model versions and the requests'
checks (the same for both) are nmt_tf.serving.versions. With --enable_batching
(or --batching_parameters_file, TF Serving's BatchingParameters text proto)
concurrent Predict requests of both front ends are joined into one call of
the signature and their outputs split back (nmt_tf.serving.batching). It listens on
--host (0.0.0.0: every interface, as TF Serving) without authentication;
--ssl_config_file (TF Serving's SSLConfig) puts both ports behind TLS,
optionally mutual (nmt_tf.serving.tls).

With --runtime=litert the versions are LiteRT model folders (nmt_tf.export
--format=litert; --preset's is built on first use) run by the LiteRT
interpreter, and the process never imports TensorFlow: the same gRPC and
REST requests and the page, for the serving_default signature only (score,
prefixes and required terms are the SavedModel's; docs/litert.md).

It serves the versions under --model_base_path that --model_version_policy
chooses (TF Serving's model_version_policy: latest, the default, is the
highest; latest=N, all, specific=V1,V2,...), or the model of a TF Serving
--model_config_file (with version_labels), and loads a new version when one
appears (checked every --poll_seconds); a version the policy no longer
chooses is unloaded once a chosen one serves, and at once when its folder
is removed, so removing the served version's folder serves the highest one
left (none left: NOT_FOUND until one appears); folders whose number does
not fit in an int64 are ignored with one log line. Each version runs in a
TF1 session of its own, closed when it is unloaded. Requests follow
TF Serving's rules: an empty signature name means "serving_default"; an
unknown model or version is NOT_FOUND, an unknown signature
FAILED_PRECONDITION; a wrong, missing or extra input alias, an unknown
output_filter alias, a wrong dtype or rank is INVALID_ARGUMENT; a message
larger than --max_message_mb is RESOURCE_EXHAUSTED (TF Serving's limit is
2 GiB; this server's is lower by default to protect its memory). Batches
larger than --max_batch_size sentences are INVALID_ARGUMENT, and so are,
before any decoding, batches whose alignment output could exceed
--max_message_mb (batch x the export's longest output x its longest input x
4 bytes; 324 sentences at the defaults): ask for fewer sentences, or for
the outputs without alignment (output_filter). No request can
stop the server: every failure becomes a status. A port (gRPC or REST) that
another process holds is refused at start (exit code 1), as TF Serving refuses it.
Ctrl-C or SIGTERM (docker stop, systemd) stops it, giving the requests in
flight 2 s; the exit code is then 0.

This tool parses the flags and calls nmt_tf/serving/server.py, which serves from
Python without flags (nmt_tf.config.ServerConfig).
"""

from __future__ import annotations

import signal

from absl import app

from nmt_tf import flags as nmt_flags  # also defines --model_name, --preset
from nmt_tf.config import ServerConfig
from nmt_tf.serving import server

# nmt_tf.serve's own flags: the fields of ServerConfig that no other tool takes.
nmt_flags.define_settings(ServerConfig, [name for name in ServerConfig.__dataclass_fields__
                                         if name not in nmt_flags.SHARED_SERVER_FLAGS], module_name=__name__)
TOOL_FLAGS = nmt_flags.tool_flags(__name__, nmt_flags.SHARED_SERVER_FLAGS)


def main(argv):
    nmt_flags.start_cli(argv, verbose=True, accepts=TOOL_FLAGS)
    FLAGS = nmt_flags.FLAGS
    say = lambda line: print(line, flush=True)     # noqa: E731
    # SIGTERM (docker stop, systemd, kill) stops as Ctrl-C does: the requests in flight get their grace
    # period and the exit status is 0 (it was -15 at once: issue 95). One that comes while the server
    # starts is kept until it serves (raised inside start, it cut the start short after "Serving model").
    state = {"serving": False, "pending": False}

    def on_sigterm(signum, frame):
        if state["serving"]:
            raise KeyboardInterrupt
        state["pending"] = True

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        config = nmt_flags.server_config()
        if config.model_config_file:
            given = [f"--{n}" for n in ("model_name", "model_version_policy") if FLAGS[n].present]
            if given:
                return nmt_flags.user_error(f"--model_config_file names the model and its version policy: "
                                            f"leave out {' and '.join(given)}.")
        running = server.start(config, log=say)
    except (ValueError, OSError) as e:     # ConfigError, the files' errors, PresetError; FileNotFoundError, ports
        return nmt_flags.user_error(e)
    except KeyboardInterrupt:              # Ctrl-C while it starts
        say("Stopped before serving")
        return 0
    try:
        state["serving"] = True
        if state["pending"]:
            raise KeyboardInterrupt
        running.wait(log=say)
    except KeyboardInterrupt:
        say(f"Stopping: the requests in flight have {server.STOP_GRACE_SECONDS:g} s to finish")
        running.stop(grace=server.STOP_GRACE_SECONDS)
    return 0


if __name__ == "__main__":
    app.run(main)
