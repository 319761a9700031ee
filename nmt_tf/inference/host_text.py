"""The exports' source-side text processing outside TensorFlow.

An export cleans and tokenizes its input inside the graph (nmt_tf.data.text:
clean(), then tensorflow-text's SentencePiece op). This module does the same
in plain Python with SentencePiece's own library and the export's model
files, without importing TensorFlow: the server counts a request's source
tokens with it before any search runs (nmt_tf.serving.versions's work limit), and a
runtime with no TensorFlow can tokenize with it.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import unicodedata

import sentencepiece

# clean() turns runs of these into one space: RE2's \\pC (Cc, Cf, Co, Cs: RE2 has no Cn) and \\pZ, and \\s.
_SPACE_CATEGORIES = ("Cc", "Cf", "Co", "Cs", "Zs", "Zl", "Zp")


@functools.cache
def _space_runs() -> re.Pattern:
    """A regex of runs of clean()'s space characters, made once (~0.3 s) from Python's Unicode tables."""
    ranges, start = [], None
    for code in range(sys.maxunicode + 2):
        inside = code <= sys.maxunicode and (unicodedata.category(chr(code)) in _SPACE_CATEGORIES
                                             or chr(code) in " \t\n\f\r\v")
        if inside and start is None:
            start = code
        elif not inside and start is not None:
            ranges.append(re.escape(chr(start)) + ("" if code - 1 == start else "-" + re.escape(chr(code - 1))))
            start = None
    return re.compile("[" + "".join(ranges) + "]+")


def clean(text: bytes | str) -> str:
    """nmt_tf.data.text.clean of one line: invalid UTF-8 replaced by U+FFFD, control
    characters and runs of whitespace one space, no space at either end."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return _space_runs().sub(" ", text).strip(" ")


class SentencePieceSource:
    """The source pieces of an export whose tokenizer is SentencePiece, from
    its assets/sentencepiece.src.model."""

    def __init__(self, model_file: str):
        if not os.path.isfile(model_file):
            raise FileNotFoundError(f"{model_file}: no SentencePiece model there")
        self.processor = sentencepiece.SentencePieceProcessor(model_file=model_file)
        # No piece spans more than this many bytes (16 characters of at most 4 bytes by default).
        self.longest_piece_bytes = max(len(self.processor.id_to_piece(i).encode()) for i in
                                       range(self.processor.get_piece_size()))

    def pieces(self, text: bytes | str) -> list[str]:
        return self.processor.encode(clean(text), out_type=str)

    def count(self, text: bytes, at_most: int) -> int:
        """How many pieces `text` has, or `at_most` if it has at least that
        many; only the bytes that can hold `at_most` pieces are read."""
        head = text[:at_most * max(self.longest_piece_bytes, 1) + 1]
        return min(at_most, len(self.processor.encode(clean(head))))


class CharacterBound:
    """For the other tokenizers (words, WordPiece): no token is shorter than
    a character, so a line has at most as many tokens as non-space characters."""

    def count(self, text: bytes, at_most: int) -> int:
        return min(at_most, len(clean(text[:at_most * 4 + 4]).replace(" ", "")))


def source_counter(export_dir: str, tokenizer: str):
    """The counter of an export's source tokens: SentencePieceSource for a
    SentencePiece export, else CharacterBound (an upper bound)."""
    clean("")            # Unicode tables read now (~0.3 s), not during a request
    model = os.path.join(export_dir, "assets", "sentencepiece.src.model")
    if tokenizer == "sentencepiece" and os.path.isfile(model):
        return SentencePieceSource(model)
    return CharacterBound()
