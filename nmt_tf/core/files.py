"""Opening the user's text files: plain or gzip, recognized by content (not by
name); writing the project's own files atomically; a file's SHA-256.

TensorFlow-free, so that light scripts (pipelines/wmt14_en_fr/prepare.py) can use it.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import io
import os
import sys
import zlib

GZIP_MAGIC = b"\x1f\x8b"


def is_gzip(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def open_binary(path: str):
    """`path` opened for reading bytes, decompressed when it is gzip data.

    Raises FileNotFoundError when it does not exist (callers turn that into
    their own one-sentence error).
    """
    return gzip.open(path, "rb") if is_gzip(path) else open(path, "rb")


def open_binary_stream(stream):
    """A binary stream (standard input) read as `open_binary` reads a file:
    decompressed when its first bytes are gzip's magic number. Looks ahead
    without consuming, so a pipe is read once."""
    if not hasattr(stream, "peek"):
        stream = io.BufferedReader(stream)
    return gzip.GzipFile(fileobj=stream, mode="rb") if stream.peek(2)[:2] == GZIP_MAGIC else stream


class WriteFailed(OSError):
    """A file of the project could not be written (a full disk, a read-only or
    vanished directory); the message names the file and says what is left."""

    def __init__(self, path: str, cause: BaseException, kept: str | None = None):
        reason = getattr(cause, "strerror", None) or getattr(cause, "message", None) or str(cause)
        kept = kept or (f"the previous {os.path.basename(path)} is unchanged" if os.path.exists(path)
                        else "nothing was written")
        super().__init__(getattr(cause, "errno", None), f"could not write {path}: {reason.strip()} ({kept})")
        self.path = path

    def __str__(self) -> str:
        return self.strerror

    @property
    def remedy(self) -> str:
        """What the user does about it: free space for a full disk, rights for a
        read-only or forbidden directory, else look at the cause."""
        text = self.strerror.lower()
        if self.errno in (errno.ENOSPC, errno.EDQUOT) or "no space" in text or "quota" in text:
            return "Free some space"
        if self.errno in (errno.EROFS, errno.EACCES, errno.EPERM) or "read-only" in text or "permission" in text:
            return f"Make {os.path.dirname(os.path.abspath(self.path))} writable (or choose another directory)"
        return "Fix the cause above"


def write_atomically(path: str, content: str | bytes) -> None:
    """Writes `content` (text as UTF-8, or bytes) to `path` through a
    temporary file, flushed to the disk, and a rename, so that `path` is
    either the old file or the whole new one, never a part. Raises
    WriteFailed (an OSError naming `path`) when the disk is full or the
    directory cannot be written; the temporary file is removed."""
    tmp = path + ".tmp"
    try:
        with (open(tmp, "wb") if isinstance(content, bytes) else open(tmp, "w", encoding="utf-8")) as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise WriteFailed(path, e) from e


def sha256(path: str) -> str:
    """The SHA-256 of a file, read in blocks of 1 MiB (presets' and exports' manifests)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def files_stamp(path: str) -> tuple:
    """(name, size, mtime) of every file under the folder `path`, sorted: it
    changes when a file is added, removed or written again (a SavedModel
    version re-copied, a model directory a test must not touch)."""
    stamp = []
    for root, _, files in os.walk(path):
        for name in files:
            file = os.path.join(root, name)
            try:
                st = os.stat(file)
            except OSError:
                continue
            stamp.append((os.path.relpath(file, path), st.st_size, st.st_mtime_ns))
    return tuple(sorted(stamp))


def count_lines(path: str) -> int:
    """Number of lines of a plain or gzip file (a last line without a newline
    counts), read in chunks; OSError / EOFError / zlib.error for a file that
    cannot be read whole."""
    lines, last = 0, b"\n"
    with open_binary(path) as f:
        while chunk := f.read(1 << 22):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines + (last != b"\n")


def corpus_files(path: str | None) -> list[str]:
    """The files of a corpus flag (--train_src, --train_tgt, ...): one path,
    or several separated by commas, read one after another as one corpus."""
    return [part for part in (path or "").split(",") if part]


def corpus_line_stream(path: str):
    """The lines of a corpus (`corpus_files`), as bytes with their line ends
    (a file's last line without one gets one), file after file, streamed."""
    for part in corpus_files(path):
        with open_binary(part) as f:
            for line in f:
                yield line if line.endswith(b"\n") else line + b"\n"


def read_lines(path: str) -> list[bytes]:
    """Every line of a plain or gzip text file, as bytes without its line end."""
    with open_binary(path) as f:
        return [line.rstrip(b"\r\n") for line in f]


class InputError(ValueError):
    """A user's input file that cannot be read, in one sentence naming it and its flag."""


def input_lines(path: str | None, flag: str):
    """The lines of a user's input file (or standard input when `path` is
    None), plain or gzip, as bytes without their line end, streamed; a
    missing file, a directory or damaged gzip data is one InputError naming
    it and `--flag`."""
    name = path or "standard input"
    try:
        with (open_binary(path) if path else open_binary_stream(sys.stdin.buffer)) as f:
            for line in f:
                yield line.rstrip(b"\r\n")
    except FileNotFoundError:
        raise InputError(f"{path} does not exist (--{flag}).") from None
    except IsADirectoryError:
        raise InputError(f"{path} is a directory, not a file (--{flag}).") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:     # a damaged or cut gzip stream
        raise InputError(f"{name} is damaged gzip data: {e}") from e
