"""Scores sentence pairs with a model: the library behind `python -m nmt_tf.score`
(whose help says what each input format gets), usable from Python without
command-line flags:

    from nmt_tf.inference import scoring
    from nmt_tf.inference.client import SignatureClient
    scorer = scoring.pair_scorer(SignatureClient("score", saved_model="exports/nmt/1"))
    pairs = scoring.score_files(scorer, phrase_table="phrase-table.gz", output="scored.gz")

`score_files` reads one input (a Moses phrase table, a Moses n-best list
with its sources, two line-aligned files, or source<TAB>target lines), sends
its pairs to the scorer through an `OrderedScorer` (batches of similar
length, several at once) and writes every line back in its order, with the
model's log-probability added. A `Malformed` reports the lines it cannot
read (copied unchanged) or stops at the first.
"""

from __future__ import annotations

import gzip
import itertools
import math
import sys

from nmt_tf.core.files import open_binary
from nmt_tf.inference.line_batches import batches_by_length, rows_by_line

_MOSES_ESCAPES = ((b"&#124;", b"|"), (b"&lt;", b"<"), (b"&gt;", b">"), (b"&apos;", b"'"), (b"&quot;", b'"'),
                  (b"&#91;", b"["), (b"&#93;", b"]"), (b"&amp;", b"&"))


class ScoreError(ValueError):
    """A problem with the user's input or flags, in one sentence."""


def moses_unescape(text: bytes) -> bytes:
    for escaped, plain in _MOSES_ESCAPES:
        text = text.replace(escaped, plain)
    return text


def pair_scorer(client):
    """(sources, targets) -> the score signature's outputs, through a `SignatureClient` of it."""
    return lambda sources, targets: client(source=sources, target=targets)


def open_input(path: str):
    try:
        return open_binary(path)
    except FileNotFoundError as e:
        raise ScoreError(f"{path} does not exist.") from e


def open_output(path: str | None):
    if path is None:
        return sys.stdout.buffer
    return gzip.open(path, "wb") if path.endswith(".gz") else open(path, "wb")


class OrderedScorer:
    """Collects lines that need a score and lines that pass through, writes them in order.

    `add(pair, finish)`: a line whose text is finish(result_row) once scored;
    `add_ready(text)`: a line written as it is. Pairs are collected
    `sort_window` at a time (at least `batch_size`) and scored in batches of
    `batch_size` pairs of similar length (by target, then source words; in
    input order for a window of one batch), `parallel_batches` batches at once.
    """

    def __init__(self, scorer, out, batch_size: int, unescape: bool, sort_window: int = 1,
                 parallel_batches: int = 1):
        self.scorer, self.out, self.batch_size, self.unescape = scorer, out, batch_size, unescape
        self.window = max(sort_window, batch_size)
        self.parallel_batches = parallel_batches
        self.pending = []          # (pair or None, finish or ready text)
        self.pairs = 0
        self.scored = 0

    def add(self, source: bytes, target: bytes, finish) -> None:
        if self.unescape:
            source, target = moses_unescape(source), moses_unescape(target)
        self.pending.append(((source.strip(), target.strip()), finish))
        self.pairs += 1
        if self.pairs >= self.window:
            self.flush()

    def add_ready(self, text: bytes) -> None:
        self.pending.append((None, text))
        if not self.pairs:
            self.flush()

    def flush(self) -> None:
        pairs = [p for p, _ in self.pending if p is not None]
        score = lambda batch: self.scorer([s for s, _ in batch], [t for _, t in batch])
        batched = batches_by_length(score, pairs, self.batch_size, self.parallel_batches,
                                    by_length=self.window > self.batch_size,
                                    length=lambda pair: (len(pair[1].split()), len(pair[0].split())))
        scored = iter(rows_by_line(batched, len(pairs)))
        for pair, item in self.pending:
            if pair is None:
                self.out.write(item + b"\n")
            else:
                result, row = next(scored)
                self.out.write(item({k: v[row] for k, v in result.items()}) + b"\n")
        self.scored += len(pairs)
        self.pending, self.pairs = [], 0


class Malformed:
    """Reports malformed lines (or stops at the first, when strict)."""

    def __init__(self, what: str, strict: bool, log=None):
        self.what, self.strict, self.lines = what, strict, []
        self.log = log or (lambda m: print(m, file=sys.stderr))

    def __call__(self, lineno: int, reason: str) -> None:
        if self.strict:
            raise ScoreError(f"{self.what} line {lineno}: {reason}")
        self.lines.append(lineno)
        if len(self.lines) <= 20:
            self.log(f"warning: {self.what} line {lineno}: {reason}; copied unchanged")

    def report(self) -> None:
        if self.lines:
            self.log(f"{len(self.lines):,} malformed {self.what} lines copied unchanged "
                     f"(first: {', '.join(map(str, self.lines[:10]))})")


def _number(x: float) -> bytes:
    return f"{x:.6g}".encode()


def score_phrase_table(lines, ordered: OrderedScorer, malformed: Malformed, phrase_score: str = "logprob"):
    for lineno, line in enumerate(lines, 1):
        line = line.rstrip(b"\r\n")
        fields = line.split(b" ||| ")
        if len(fields) < 3 or not fields[0].strip() or not fields[1].strip():
            malformed(lineno, "expected 'source ||| target ||| scores'")
            ordered.add_ready(line)
            continue

        def finish(r, fields=fields):
            value = float(r["log_prob"]) if phrase_score == "logprob" else math.exp(float(r["log_prob"]))
            scores = fields[2].rstrip()
            extended = fields[:2] + [(scores + b" " if scores else b"") + _number(value)] + fields[3:]
            return b" ||| ".join(extended)
        ordered.add(fields[0], fields[1], finish)
    ordered.flush()


def score_nbest(lines, sources: list[bytes], ordered: OrderedScorer, malformed: Malformed, feature_name: str):
    for lineno, line in enumerate(lines, 1):
        line = line.rstrip(b"\r\n")
        fields = line.split(b" ||| ")
        try:
            index = int(fields[0]) if len(fields) >= 4 else -1
        except ValueError:
            index = -1
        if not 0 <= index < len(sources):
            malformed(lineno, "expected 'id ||| hypothesis ||| features ||| total' with an id of a --source line")
            ordered.add_ready(line)
            continue

        def finish(r, fields=fields):
            features = fields[2].rstrip() + f" {feature_name}= ".encode() + _number(float(r["log_prob"]))
            return b" ||| ".join(fields[:2] + [features.lstrip()] + fields[3:])
        ordered.add(sources[index], fields[1], finish)
    ordered.flush()


def score_pairs(pairs, ordered: OrderedScorer, malformed: Malformed):
    """pairs: iterable of (lineno, source, target or None when the line is malformed, raw line)."""
    for lineno, source, target, raw in pairs:
        if target is None:
            malformed(lineno, "expected 'source<TAB>target'")
            ordered.add_ready(raw)
            continue

        def finish(r, source=source, target=target):
            return b"\t".join([source, target, _number(float(r["log_prob"])),
                               _number(float(r["log_prob_per_token"])), str(int(r["target_length"])).encode()])
        ordered.add(source, target, finish)
    ordered.flush()


def two_files(src_path, tgt_path):
    """The pairs of two line-aligned files, as score_pairs takes them; a
    ScoreError where one ends before the other."""
    with open_input(src_path) as s, open_input(tgt_path) as t:
        for lineno, (a, b) in enumerate(itertools.zip_longest(s, t), 1):
            if a is None or b is None:
                raise ScoreError(f"{src_path} (--source) and {tgt_path} (--target) have different numbers of "
                                 f"lines (the shorter ends before line {lineno}).")
            yield lineno, a.rstrip(b"\r\n"), b.rstrip(b"\r\n"), a.rstrip(b"\r\n")


def tsv_pairs(path):
    """The pairs of source<TAB>target lines, as score_pairs takes them (a line
    without exactly one tab: malformed)."""
    with open_input(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip(b"\r\n")
            fields = line.split(b"\t")
            yield (lineno, fields[0], fields[1], line) if len(fields) == 2 else (lineno, line, None, line)


def input_kind(phrase_table: str | None, nbest: str | None, source: str | None, target: str | None,
               tsv: str | None) -> str:
    """Which one input `score_files` is given: phrase_table, nbest, pairs (source
    and target) or tsv; a ScoreError for none, several, or --nbest without its
    source sentences."""
    kinds = [name for name, given in (("phrase_table", phrase_table), ("nbest", nbest), ("tsv", tsv),
                                      ("pairs", target)) if given]
    if len(kinds) != 1:
        raise ScoreError("give one of --phrase_table, --nbest (with --source), --source with --target, --tsv.")
    if kinds[0] == "nbest" and not source:
        raise ScoreError("--nbest needs --source (the source sentences of the n-best list).")
    return kinds[0]


def score_files(scorer, *, phrase_table: str | None = None, nbest: str | None = None, source: str | None = None,
                target: str | None = None, tsv: str | None = None, output: str | None = None, batch_size: int = 64,
                moses_unescape: bool = True, sort_window: int = 1000, parallel_batches: int = 2,
                phrase_score: str = "logprob", feature_name: str = "NMT", strict: bool = False, log=None) -> int:
    """Scores the pairs of one input and writes it to `output` (gzipped when
    its name ends in .gz; None: standard output) with the model's score added;
    returns how many pairs were scored.

    The input is one of `phrase_table`, `nbest` (with `source`, its source
    sentences), `source` with `target`, or `tsv` (plain or gzip, by content).
    `scorer`: (sources, targets) -> the score signature's outputs
    (`pair_scorer`). `moses_unescape`: undo Moses' escaping in phrase tables
    and n-best lists. `strict`: a malformed line is a ScoreError instead of
    being copied with a warning to `log` (default: standard error).
    The other arguments are nmt_tf.score's flags of the same names
    (`batch_size` is --lines_per_batch)."""
    mode = input_kind(phrase_table, nbest, source, target, tsv)
    out = open_output(output)
    try:
        ordered = OrderedScorer(scorer, out, batch_size, moses_unescape and mode in ("phrase_table", "nbest"),
                                sort_window, parallel_batches)
        if mode == "phrase_table":
            malformed = Malformed("phrase table", strict, log)
            with open_input(phrase_table) as lines:
                score_phrase_table(lines, ordered, malformed, phrase_score)
        elif mode == "nbest":
            with open_input(source) as f:
                sources = [line.rstrip(b"\r\n") for line in f]
            malformed = Malformed("n-best", strict, log)
            with open_input(nbest) as lines:
                score_nbest(lines, sources, ordered, malformed, feature_name)
        else:
            malformed = Malformed("pair", strict, log)
            score_pairs(two_files(source, target) if mode == "pairs" else tsv_pairs(tsv), ordered, malformed)
        malformed.report()
    finally:
        if output is not None:
            out.close()
    return ordered.scored
