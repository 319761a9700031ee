"""TLS for nmt_tf.serve's gRPC and REST ports, from TF Serving's
`--ssl_config_file`: an SSLConfig text proto whose fields hold PEM text (not
file names), as tensorflow_model_server reads it:

  server_key     the server's private key
  server_cert    its certificate (chain)
  custom_ca      certificates that client certificates must chain to
  client_verify  require a client certificate (mutual TLS; needs custom_ca)

Without the flag both ports speak plain text, as TF Serving's do.
"""

from __future__ import annotations

import dataclasses
import os
import ssl
import tempfile
import time

import grpc

from nmt_tf.serving import config_protos as protos

# TF Serving's tensorflow_serving/config/ssl_config.proto.
_FIELDS = (("server_key", 1, "string"), ("server_cert", 2, "string"), ("custom_ca", 3, "string"),
           ("client_verify", 4, "bool"))


@dataclasses.dataclass(frozen=True)
class TlsConfig:
    server_key: str
    server_cert: str
    custom_ca: str = ""
    client_verify: bool = False

    def grpc_credentials(self):
        return grpc.ssl_server_credentials([(self.server_key.encode(), self.server_cert.encode())],
                                           root_certificates=self.custom_ca.encode() or None,
                                           require_client_auth=self.client_verify)

    def ssl_context(self) -> ssl.SSLContext:
        """A server-side context (TLS 1.2 or newer) with the key and
        certificate, verifying client certificates against custom_ca when
        client_verify is set. Raises ValueError for PEM text that does not load."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        # load_cert_chain reads files only: the PEM text goes through a private
        # temporary folder, removed at once.
        with tempfile.TemporaryDirectory() as folder:
            key, cert = os.path.join(folder, "key.pem"), os.path.join(folder, "cert.pem")
            for path, text in ((key, self.server_key), (cert, self.server_cert)):
                with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w", encoding="utf-8") as f:
                    f.write(text)
            try:
                # An encrypted key would make OpenSSL ask for its pass phrase on the terminal (issue 95).
                context.load_cert_chain(cert, key, password=_no_pass_phrase)
            except ssl.SSLError as e:
                raise ValueError(f"server_key and server_cert are not a PEM private key and a certificate "
                                 f"that match ({e.reason or e})") from None
        if self.custom_ca:
            try:
                context.load_verify_locations(cadata=self.custom_ca)
            except ssl.SSLError as e:
                raise ValueError(f"custom_ca holds no PEM certificate that loads ({e.reason or e})") from None
        if self.client_verify:
            context.verify_mode = ssl.CERT_REQUIRED
        return context


def _no_pass_phrase():
    raise ValueError("server_key is an encrypted private key; the server takes an unencrypted PEM key, as "
                     "tensorflow_model_server does (decrypt it: openssl pkey -in key.pem -out plain.pem, and keep "
                     "the file readable by the server only)")


def expiry_warning(config: TlsConfig, now: float | None = None) -> str | None:
    """A warning when server_cert's (first) certificate has expired or is not
    valid yet: clients refuse it, and the server would start as if all were
    well. None when it is valid, or when the certificate cannot be read here."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "cert.pem")
        with open(path, "w", encoding="utf-8") as f:
            f.write(config.server_cert)
        try:
            # The standard library's only reader of a certificate file's dates (private, in CPython since 3.3).
            fields = ssl._ssl._test_decode_cert(path)
        except (AttributeError, ssl.SSLError, ValueError):
            return None
    now = time.time() if now is None else now
    try:
        not_before, not_after = (ssl.cert_time_to_seconds(fields[key]) for key in ("notBefore", "notAfter"))
    except (KeyError, ValueError):
        return None
    if now > not_after:
        return (f"warning: the server certificate expired on {fields['notAfter']}: clients that verify it will "
                "refuse every connection; renew it")
    if now < not_before:
        return f"warning: the server certificate is not valid before {fields['notBefore']}: clients will refuse it"
    return None


def read_ssl_config(path: str) -> TlsConfig:
    """The SSLConfig at `path`, checked: a ValueError names the file and what is wrong."""
    proto = protos.parse_text(protos.message_class("nmt_tf.serving.versions.SSLConfig", _FIELDS),
                              protos.read_text_file(path, "SSL config file"), path)
    config = TlsConfig(**protos.field_values(proto, _FIELDS))
    if not config.server_key.strip() or not config.server_cert.strip():
        raise ValueError(f"{path}: give server_key and server_cert (PEM text)")
    if config.client_verify and not config.custom_ca.strip():
        raise ValueError(f"{path}: client_verify needs custom_ca, the certificates client certificates chain to")
    try:
        config.ssl_context()
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return config
