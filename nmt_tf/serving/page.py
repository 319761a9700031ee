"""The translation page that nmt_tf.serve shows at http://HOST:REST_PORT/.

Type a sentence, press Enter: the page sends it to the server's own REST API
(POST /v1/models/NAME:predict, the serving_default signature) and shows the
translation, the n-best list with scores, the attention matrix as a heatmap
(hovering a target token highlights the source tokens it attended to, and
back), the time the request took, and a message for an empty line, a line
over the length limit, a line the model cut to its input limit, or a server
that answers an error or not at all. Plain HTML, CSS and JavaScript from
nmt_tf/serving/web/ (no CDN, nothing fetched from elsewhere), readable on a phone.

`page_file(registry, method, path)` answers the page's three paths; every
other path is the REST API's (nmt_tf.serving.rest).
"""

from __future__ import annotations

import functools
import html
import os

from nmt_tf.inference.translation_graph import WITH_OPTIONS_SIGNATURE

WEB_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "web")
# path -> (file in nmt_tf/serving/web/, Content-Type)
PAGE_FILES = {"/": ("index.html", "text/html; charset=utf-8"),
              "/page/app.js": ("app.js", "text/javascript; charset=utf-8"),
              "/page/style.css": ("style.css", "text/css; charset=utf-8")}
# Sent with every page file: only this server's own scripts, styles and API.
PAGE_HEADERS = {"Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                                           "connect-src 'self'; img-src 'self' data:; base-uri 'none'; "
                                           "form-action 'none'; frame-ancestors 'none'",
                "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}
LANGUAGES = {"en": "English", "fr": "French", "de": "German", "cs": "Czech", "es": "Spanish", "it": "Italian"}
MAX_LINE_CHARACTERS = 2000      # longer lines are refused by the page before they are sent


@functools.cache
def _read(name: str) -> bytes:
    with open(os.path.join(WEB_DIR, name), "rb") as f:
        return f.read()


def index_html(model_name: str, metadata: dict, version: int | None, beams: bool = False) -> bytes:
    """index.html with the served model's name, languages and input limit
    filled in (HTML-escaped); `beams`: the served version has
    translate_with_options, so the page offers a beam size up to its
    nmt_tf.json's max_beam_size."""
    src, tgt = metadata.get("src_lang", "?"), metadata.get("tgt_lang", "?")
    values = {"model_name": model_name, "src_lang": src, "tgt_lang": tgt,
              "src_language": LANGUAGES.get(src, src), "tgt_language": LANGUAGES.get(tgt, tgt),
              "max_input_tokens": str(metadata.get("max_input_length", "")),
              "max_line_characters": str(MAX_LINE_CHARACTERS),
              "version": "" if version is None else str(version),
              "beam_size": str((metadata.get("search") or {}).get("beam_size", "")),
              "max_beam_size": str(metadata.get("max_beam_size", "") if beams else ""),
              "architecture": metadata.get("architecture") or metadata.get("model", "an nmt_tf model")}
    text = _read("index.html").decode("utf-8")
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", html.escape(value, quote=True))
    return text.encode("utf-8")


def page_file(registry, method: str, path: str) -> tuple[bytes, str] | None:
    """(body, Content-Type) of a page path for GET or HEAD; None for any other request."""
    if method not in ("GET", "HEAD") or path not in PAGE_FILES:
        return None
    name, content_type = PAGE_FILES[path]
    if name != "index.html":
        return _read(name), content_type
    loaded = registry.current
    metadata = loaded.metadata if loaded is not None else {}    # {} without nmt_tf.json: the page says less
    beams = loaded is not None and WITH_OPTIONS_SIGNATURE in loaded.signatures
    return index_html(registry.name, metadata, loaded.version if loaded is not None else None, beams), content_type
