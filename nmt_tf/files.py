"""Opening the user's text files: plain or gzip, recognized by content (not by name).

TensorFlow-free, so that light scripts (pipelines/wmt14_en_fr/prepare.py) can use it.
"""

from __future__ import annotations

import gzip


def is_gzip(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def open_binary(path: str):
    """`path` opened for reading bytes, decompressed when it is gzip data.

    Raises FileNotFoundError when it does not exist (callers turn that into
    their own one-sentence error).
    """
    return gzip.open(path, "rb") if is_gzip(path) else open(path, "rb")


def read_lines(path: str) -> list[bytes]:
    """Every line of a plain or gzip text file, as bytes without its line end."""
    with open_binary(path) as f:
        return [line.rstrip(b"\r\n") for line in f]
