"""TLS on nmt_tf.serve's gRPC and REST ports (--ssl_config_file, TF Serving's SSLConfig)."""

import json
import shutil
import socket
import ssl
import subprocess
import urllib.error
import urllib.request

import grpc
import pytest
import tensorflow as tf
from tensorflow_serving.apis import prediction_service_pb2_grpc
from test_serve import request

from nmt_tf.serving import rest, tls
from nmt_tf.serving.http_server import RestSettings
from nmt_tf.serving import server as nmt_server


def make_cert(folder, name):
    """A self-signed certificate for localhost / 127.0.0.1 (openssl, as on every Debian machine): (key, cert) PEM."""
    key, cert = folder / f"{name}.key", folder / f"{name}.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return key.read_text(), cert.read_text()


def ssl_config(path, key, cert, ca="", verify=False):
    quote = lambda text: json.dumps(text)          # a protobuf text string: JSON's escapes are valid
    path.write_text(f"server_key: {quote(key)}\nserver_cert: {quote(cert)}\n"
                    + (f"custom_ca: {quote(ca)}\n" if ca else "") + ("client_verify: true\n" if verify else ""))
    return str(path)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("certs")
    return {"server": make_cert(folder, "server"), "client": make_cert(folder, "client"), "folder": folder}


@pytest.fixture(scope="module")
def tls_server(exported, certs, tmp_path_factory):
    base = str(tmp_path_factory.mktemp("tls") / "nmt")
    shutil.copytree(exported[1], base)
    key, cert = certs["server"]
    config = tls.read_ssl_config(ssl_config(certs["folder"] / "mutual.config", key, cert, certs["client"][1], True))
    srv, registry, port = nmt_server.start_server("nmt", base, port=0, host="127.0.0.1", threads=2, poll_seconds=60,
                                             log=lambda *a: None, tls=config)
    plain_config = tls.read_ssl_config(ssl_config(certs["folder"] / "server.config", key, cert))
    web = rest.start_rest_server(registry, RestSettings(host="127.0.0.1", threads=2),
                                ssl_context=plain_config.ssl_context())
    yield {"port": port, "rest_port": web.port}
    web.stop()
    registry.stop()
    srv.stop(grace=0)


def grpc_stub(port, root=None, client=None):
    credentials = grpc.ssl_channel_credentials(root_certificates=root.encode() if root else None,
                                               private_key=client[0].encode() if client else None,
                                               certificate_chain=client[1].encode() if client else None)
    channel = grpc.secure_channel(f"127.0.0.1:{port}", credentials,
                                  options=[("grpc.ssl_target_name_override", "localhost")])
    return prediction_service_pb2_grpc.PredictionServiceStub(channel)


def test_grpc_over_mutual_tls(tls_server, certs):
    stub = grpc_stub(tls_server["port"], certs["server"][1], certs["client"])
    reply = stub.Predict(request(["Two dogs run."]), timeout=60)
    assert tf.make_ndarray(reply.outputs["translation"]).shape == (1,)
    for refused in (grpc_stub(tls_server["port"], certs["server"][1]),                     # no client certificate
                    prediction_service_pb2_grpc.PredictionServiceStub(
                        grpc.insecure_channel(f"127.0.0.1:{tls_server['port']}"))):        # plain text
        with pytest.raises(grpc.RpcError) as e:
            refused.Predict(request(["Two dogs run."]), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE


def test_rest_over_https_and_plain_http_refused(tls_server, certs, tmp_path):
    (tmp_path / "ca.pem").write_text(certs["server"][1])
    context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    url = f"https://localhost:{tls_server['rest_port']}/v1/models/nmt:predict"
    body = json.dumps({"instances": ["Two dogs run."]}).encode()
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context))
    with opener.open(urllib.request.Request(url.replace("localhost", "127.0.0.1"), body), timeout=60) as reply:
        assert isinstance(json.loads(reply.read())["predictions"][0]["translation"], str)
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):      # plain HTTP to the TLS port
        urllib.request.urlopen(urllib.request.Request(url.replace("https", "http").replace("localhost", "127.0.0.1"),
                                                      body), timeout=10).read()
    with socket.create_connection(("127.0.0.1", tls_server["rest_port"]), timeout=10) as s:   # still serving
        with context.wrap_socket(s, server_hostname="localhost") as t:
            t.sendall(b"GET /v1/models/nmt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert t.recv(64).startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("change, fragment", [
    (dict(key=""), "give server_key and server_cert"),
    (dict(verify=True), "client_verify needs custom_ca"),
    (dict(key="-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n"), "are not a PEM private key"),
])
def test_a_bad_ssl_config_is_one_error_naming_the_file(certs, tmp_path, change, fragment):
    key, cert = certs["server"]
    args = {"key": key, "cert": cert, **change}
    path = ssl_config(tmp_path / "bad.config", args["key"], args["cert"], verify=args.get("verify", False))
    with pytest.raises(ValueError, match=fragment) as e:
        tls.read_ssl_config(path)
    assert path in str(e.value)
    (tmp_path / "unknown.config").write_text("server_kee: 'x'")
    with pytest.raises(ValueError, match="unknown.config: 1:1 .*no field named \"server_kee\""):
        tls.read_ssl_config(str(tmp_path / "unknown.config"))


def test_an_encrypted_key_is_one_error_not_a_pass_phrase_prompt(certs, tmp_path):
    """Issue 95: an encrypted server_key made OpenSSL prompt "Enter PEM pass
    phrase:" on the terminal (and fail with a traceback without one)."""
    folder = certs["folder"]
    encrypted = subprocess.run(["openssl", "pkey", "-in", str(folder / "server.key"), "-aes256", "-passout",
                                "pass:secret"], check=True, capture_output=True, text=True).stdout
    path = ssl_config(tmp_path / "encrypted.config", encrypted, certs["server"][1])
    with pytest.raises(ValueError, match="server_key is an encrypted private key") as e:
        tls.read_ssl_config(path)
    assert path in str(e.value)


def test_an_expired_certificate_is_said_at_start(certs, tmp_path):
    """Issue 95: a server with an expired certificate started without a word."""
    folder = certs["folder"]
    request = tmp_path / "server.csr"
    subprocess.run(["openssl", "req", "-new", "-key", str(folder / "server.key"), "-subj", "/CN=localhost",
                    "-out", str(request)], check=True, capture_output=True)
    expired = subprocess.run(["openssl", "x509", "-req", "-in", str(request), "-signkey", str(folder / "server.key"),
                              "-days", "-1"], check=True, capture_output=True, text=True).stdout
    config = tls.read_ssl_config(ssl_config(tmp_path / "expired.config", certs["server"][0], expired))
    assert tls.expiry_warning(config).startswith("warning: the server certificate expired on ")
    assert tls.expiry_warning(tls.TlsConfig(*certs["server"])) is None
