r"""Scores sentence pairs with a model: phrase tables, n-best lists, parallel text.

Usage:
  python -m nmt_tf.score --saved_model=E --phrase_table=phrase-table.gz --output=scored.gz
  python -m nmt_tf.score --saved_model=E --nbest=nbest.txt --source=test.en --output=nbest.rescored.txt
  python -m nmt_tf.score --saved_model=E --source=test.en --target=test.fr --output=scores.tsv
  python -m nmt_tf.score --saved_model=E --tsv=pairs.tsv --output=scores.tsv
  python -m nmt_tf.score --server=localhost:8500 --model_name=nmt ...      # through TF Serving

Every pair goes through the SavedModel's `score` signature (forced decoding:
log p(target | source), [EOS] included), locally (--saved_model) or on a TF
Serving-compatible server (--server): --sort_window pairs (1,000) at a time,
in batches of --lines_per_batch pairs of similar length, --parallel_batches
(2) at once.
Inputs stream (plain or gzip, chosen by content); the output is gzipped when
its name ends in .gz. Line order is always kept.

--phrase_table: a Moses phrase table, `src ||| tgt ||| scores [||| ...]`.
  The model's score of (src, tgt) is appended to the scores field (paper 004
  §3.1: "add a new score for each phrase pair to the existing phrase table");
  every other field is kept. --phrase_score=logprob (default) appends
  log p(tgt | src); Moses' standard phrase-table loader takes the logarithm of
  every score, so with it use --phrase_score=prob (p = exp(log p)).
--nbest: a Moses n-best list, `id ||| hypothesis ||| features ||| total`,
  with --source holding the source sentences (id 0 is the first line). The
  feature `<--feature_name>= <log p(hypothesis | source)>` is appended to
  the features field; the total is kept (tune the new weight, e.g. with MERT).
--source/--target or --tsv: writes `source<TAB>target<TAB>log_prob<TAB>
  log_prob_per_token<TAB>target_length` per pair.

Moses-escaped text (&apos; &quot; &amp; &lt; &gt; &#91; &#93; &#124;) is
unescaped before scoring (--moses_unescape). Malformed lines (too few
fields, a bad n-best id) are copied to the output unchanged and reported on
stderr with their line numbers; --strict makes them an error instead.
"""

from __future__ import annotations

import gzip
import itertools
import math
import sys

from absl import app
from absl import flags as absl_flags

from nmt_tf import flags as nmt_flags  # also defines --saved_model, --server, --model_name, ...
from nmt_tf.client import ClientError, SignatureClient
from nmt_tf.files import open_binary
from nmt_tf.line_batches import batches_by_length, rows_by_line

absl_flags.DEFINE_string("phrase_table", None, "A Moses phrase table to extend with the model's score.")
absl_flags.DEFINE_string("nbest", None, "A Moses n-best list to add the model's score to (needs --source).")
absl_flags.DEFINE_string("source", None, "Source sentences: of the n-best list, or of the pairs (with --target).")
absl_flags.DEFINE_string("target", None, "Target sentences, line-aligned with --source.")
absl_flags.DEFINE_string("tsv", None, "Pairs as source<TAB>target lines.")
absl_flags.DEFINE_enum("phrase_score", "logprob", ["logprob", "prob"],
                       "Score appended to phrase tables: log p(tgt | src), or p for Moses' loader (which takes logs).")
absl_flags.DEFINE_string("feature_name", "NMT", "Name of the n-best feature.")
absl_flags.DEFINE_boolean("moses_unescape", True, "Undo Moses' escaping of special characters before scoring.")
absl_flags.DEFINE_boolean("strict", False, "Stop at the first malformed line instead of copying it through.")
TOOL_FLAGS = nmt_flags.tool_flags(__name__, ("saved_model", "server", "model_name", "timeout", "output",
                                             "lines_per_batch", "sort_window", "parallel_batches"))

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


def _two_files(src_path, tgt_path):
    with open_input(src_path) as s, open_input(tgt_path) as t:
        for lineno, (a, b) in enumerate(itertools.zip_longest(s, t), 1):
            if a is None or b is None:
                raise ScoreError(f"{src_path} (--source) and {tgt_path} (--target) have different numbers of "
                                 f"lines (the shorter ends before line {lineno}).")
            yield lineno, a.rstrip(b"\r\n"), b.rstrip(b"\r\n"), a.rstrip(b"\r\n")


def _tsv(path):
    with open_input(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip(b"\r\n")
            fields = line.split(b"\t")
            yield (lineno, fields[0], fields[1], line) if len(fields) == 2 else (lineno, line, None, line)


def main(argv):
    nmt_flags.start_cli(argv, accepts=TOOL_FLAGS)
    FLAGS = absl_flags.FLAGS
    try:
        if bool(FLAGS.saved_model) == bool(FLAGS.server):
            raise ScoreError("give exactly one of --saved_model and --server.")
        modes = [m for m in ("phrase_table", "nbest", "tsv") if FLAGS[m].value] + (
            ["pairs"] if FLAGS.target else [])
        if len(modes) != 1:
            raise ScoreError("give one of --phrase_table, --nbest (with --source), --source with --target, --tsv.")
        client = SignatureClient("score", saved_model=FLAGS.saved_model, server=FLAGS.server,
                                 model_name=FLAGS.model_name, timeout=FLAGS.timeout)
        scorer = pair_scorer(client)
        out = open_output(FLAGS.output)
        try:
            ordered = OrderedScorer(scorer, out, FLAGS.lines_per_batch, FLAGS.moses_unescape and modes[0] != "pairs"
                                    and modes[0] != "tsv", FLAGS.sort_window, FLAGS.parallel_batches)
            mode = modes[0]
            if mode == "phrase_table":
                malformed = Malformed("phrase table", FLAGS.strict)
                with open_input(FLAGS.phrase_table) as lines:
                    score_phrase_table(lines, ordered, malformed, FLAGS.phrase_score)
            elif mode == "nbest":
                if not FLAGS.source:
                    raise ScoreError("--nbest needs --source (the source sentences of the n-best list).")
                with open_input(FLAGS.source) as f:
                    sources = [l.rstrip(b"\r\n") for l in f]
                malformed = Malformed("n-best", FLAGS.strict)
                with open_input(FLAGS.nbest) as lines:
                    score_nbest(lines, sources, ordered, malformed, FLAGS.feature_name)
            else:
                malformed = Malformed("pair", FLAGS.strict)
                score_pairs(_two_files(FLAGS.source, FLAGS.target) if mode == "pairs" else _tsv(FLAGS.tsv),
                            ordered, malformed)
            malformed.report()
        finally:
            if FLAGS.output:
                out.close()
        print(f"scored {ordered.scored:,} pairs", file=sys.stderr)
    except (ScoreError, ClientError, FileNotFoundError) as e:
        return nmt_flags.user_error(e)
    return 0


if __name__ == "__main__":
    app.run(main)
