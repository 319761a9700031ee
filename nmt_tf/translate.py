r"""Translates a file or stdin, one line in, one line out, order kept.

Usage:
  python -m nmt_tf.translate --saved_model=exports/nmt/1 < input.en > output.fr
  python -m nmt_tf.translate --preset=multi30k_en_fr < input.en > output.fr      # the shipped model
  python -m nmt_tf.translate --server=localhost:8500 --model_name=nmt --input=input.en --output=out.fr
  python -m nmt_tf.translate --saved_model=E --input=in.en --n_best=5 --with_scores --with_alignments
  python -m nmt_tf.translate --preset=multi30k_en_fr --input=in.en --target_prefix=prefixes.fr
  python -m nmt_tf.translate --preset=multi30k_en_fr --input=in.en --glossary=terms.en-fr.tsv

With --saved_model the SavedModel runs in this process (--preset: the
SavedModel of a model shipped with nmt_tf, built on first use; see
`python -m nmt_tf.presets --list`); with --server the
lines go to a TF Serving-compatible server over gRPC (the official
tensorflow_model_server or nmt_tf.serve) through the tensorflow-serving-api
stub. Lines are read --sort_window (1,000) at a time and sent in batches of
--lines_per_batch (64) lines of similar length, --parallel_batches (2) at
once; the output keeps the input's order. The input, from --input or
standard input, is plain text or gzip (recognized by its first bytes, not
its name).

--target_prefix=FILE gives each input line a target prefix (line i of FILE
for input line i; an empty line: none): its translation starts with that
text byte for byte (trailing whitespace dropped) and the model continues
it, for interactive translation. --required_terms=FILE gives each input
line target terms (tab-separated; an empty line: none) that its translation
must contain; --glossary=FILE ("source term<TAB>target term" lines) adds the
target term of every source term found in a line as whole words. Terms
that do not fit in the length limit give the best partial translation
("terms_met": false in JSON lines; in plain-text mode a warning on
stderr). These lines go through the export's translate_constrained
signature, which searches the whole target vocabulary (an export made with
--shortlist_size has no such signature).

Output: plain text, one translation per line. With --with_scores,
--with_alignments or --n_best > 1, one JSON object per line instead:
  {"translation": ..., "score": ..., "log_prob": ...,            (--with_scores)
   "nbest": [{"translation": ..., "score": ...}, ...],            (--n_best > 1)
   "source_tokens": [...], "target_tokens": [...],
   "alignment": [[...], ...], "truncated": false}                 (--with_alignments)
alignment[i][j] is the weight of source token j when output token i was
generated; both token lists end with "[EOS]". --n_best cannot exceed the
n-best size fixed at export. Input longer than the export's
--max_input_length tokens is cut (its "truncated" is true; in plain-text
mode a warning goes to stderr). Undecodable bytes become U+FFFD. On a
terminal, progress with an ETA goes to stderr.
"""

from __future__ import annotations

import json
import sys

from absl import app
from absl import flags as absl_flags

from nmt_tf import flags as nmt_flags  # also defines --saved_model, --server, --n_best, ...
from nmt_tf import presets
from nmt_tf.client import ClientError, SignatureClient
from nmt_tf.files import InputError, count_lines, input_lines
from nmt_tf.glossary import Glossary
from nmt_tf.progress import Progress
from nmt_tf.line_batches import as_text, batches_by_length, rows_by_line
from nmt_tf.translation_graph import MAX_REQUIRED_TERMS

absl_flags.DEFINE_integer("model_version", 0, "Model version on the server (0: the latest).", lower_bound=0)
absl_flags.DEFINE_boolean("with_scores", False, "Write JSON lines with the scores.")
absl_flags.DEFINE_boolean("with_alignments", False, "Write JSON lines with tokens and the attention matrix.")
absl_flags.DEFINE_string(
    "target_prefix", None,
    "A file (plain or gzip) with one target prefix per input line (empty line: none): each translation starts "
    "with its prefix byte for byte and the model continues it (the translate_constrained signature).")
absl_flags.DEFINE_string(
    "required_terms", None,
    "A file (plain or gzip) with the target terms each input line's translation must contain, tab-separated, "
    "one line per input line (empty line: none); a line with more than 16, with the --glossary's, keeps its first "
    "16 and a warning says so: lexically constrained beam search.")
absl_flags.DEFINE_string(
    "glossary", None,
    "A 'source term<TAB>target term' file: wherever a source term occurs in an input line (whole words, "
    "case-sensitive), its target term is required in the translation (as --required_terms).")
TOOL_FLAGS = nmt_flags.tool_flags(__name__, ("saved_model", "preset", "server", "model_name", "timeout", "input",
                                             "output", "lines_per_batch", "sort_window", "parallel_batches", "n_best"))
CONSTRAINED_SIGNATURE = "translate_constrained"


class TranslationError(RuntimeError):
    """A problem the user can fix, in one sentence."""


def needed_outputs(n_best: int, with_scores: bool, with_alignments: bool, steered: bool = False) -> list[str]:
    """The outputs that `format_result` writes for these flags (`steered`: of
    the translate_constrained signature)."""
    outputs = ["translation", "truncated"] + (["terms_met"] if steered else [])
    if with_scores:
        outputs += ["score", "log_prob"]
    if n_best > 1:
        outputs += ["nbest_translations", "nbest_scores"]
    if with_alignments:
        outputs += ["source_tokens", "target_tokens", "alignment"]
    return outputs


def read_lines(path: str | None, flag: str = "input"):
    """Lines as bytes, without the newline (undecodable bytes pass through);
    gzip data is decompressed, from a file or from standard input
    (files.input_lines, its errors as TranslationErrors naming `--flag`)."""
    try:
        yield from input_lines(path, flag)
    except InputError as e:
        raise TranslationError(str(e)) from None


def _beside(lines, path: str | None, flag: str):
    """(line, line i of `path` or b"") pairs; unequal counts are a
    TranslationError naming the file."""
    other = read_lines(path, flag) if path else None
    count = 0
    for count, line in enumerate(lines, 1):
        value = next(other, None) if other else b""
        if value is None:
            raise TranslationError(f"{path} (--{flag}) has {count - 1} lines, fewer than the input")
        yield line, value
    if other and next(other, None) is not None:
        raise TranslationError(f"{path} (--{flag}) has more lines than the input ({count})")


def steered_lines(lines, prefix_path: str | None = None, terms_path: str | None = None, glossary=None,
                  warn=lambda message: print(message, file=sys.stderr)):
    """(line, target prefix, required terms) items for the translate_constrained
    signature: the prefixes and terms from the lines of their files, and the
    glossary's (a `nmt_tf.glossary.Glossary`) terms of each line; the lines
    themselves when none of these is given. A line with more than
    MAX_REQUIRED_TERMS terms keeps its first ones (its own before the
    glossary's), with a warning naming it."""
    if not (prefix_path or terms_path or glossary):
        yield from lines
        return
    pairs = _beside(_beside(lines, prefix_path, "target_prefix"), terms_path, "required_terms")
    for number, ((line, prefix), terms) in enumerate(pairs, 1):
        wanted = [t for t in terms.decode("utf-8", errors="replace").split("\t") if t.strip()]
        if glossary is not None:
            wanted += glossary.terms(line.decode("utf-8", errors="replace"))
        wanted = list(dict.fromkeys(wanted))
        if len(wanted) > MAX_REQUIRED_TERMS:
            warn(f"warning: line {number} has {len(wanted)} required terms; the model takes {MAX_REQUIRED_TERMS}, "
                 f"the first ones (dropped: {', '.join(wanted[MAX_REQUIRED_TERMS:])})")
            wanted = wanted[:MAX_REQUIRED_TERMS]
        yield line, prefix, "\t".join(wanted).encode("utf-8")


def format_result(out: dict, i: int, n_best: int, with_scores: bool, with_alignments: bool) -> str:
    """One output line for row i of a batch result."""
    translation = as_text(out["translation"][i])
    if not (with_scores or with_alignments or n_best > 1):
        return translation
    record = {"translation": translation}
    if "terms_met" in out:
        record["terms_met"] = bool(out["terms_met"][i])
    if with_scores:
        record["score"] = float(out["score"][i])
        record["log_prob"] = float(out["log_prob"][i])

    if n_best > 1:
        record["nbest"] = [{"translation": as_text(t), "score": float(s)}
                           for t, s in zip(out["nbest_translations"][i][:n_best], out["nbest_scores"][i][:n_best])
                           if s > -1e8]
    if with_alignments:
        src = [as_text(t) for t in out["source_tokens"][i] if t]
        tgt = [as_text(t) for t in out["target_tokens"][i] if t]
        record["source_tokens"], record["target_tokens"] = src, tgt
        record["alignment"] = [[round(float(a), 4) for a in row[:len(src)]]
                               for row in out["alignment"][i][:len(tgt)]]
        record["truncated"] = bool(out["truncated"][i])
    return json.dumps(record, ensure_ascii=False)


def signature_inputs(batch: list) -> dict:
    """A batch of (line,) or (line, prefix, terms) items as the signature's inputs."""
    inputs = {"text": [item[0] for item in batch]}
    if batch and len(batch[0]) > 1:
        inputs["target_prefix"] = [item[1] for item in batch]
        inputs["required_terms"] = [item[2] for item in batch]
    return inputs


def translate_lines(client, lines, out, batch_size: int, n_best: int, with_scores: bool,
                    with_alignments: bool, progress: Progress | None = None, sort_window: int = 1,
                    parallel_batches: int = 1) -> int:
    """Translates an iterable of byte lines into the text stream `out` with a
    `nmt_tf.client.SignatureClient` of the serving_default signature; returns lines done.
    Items may also be (line, target prefix, required terms) (`steered_lines`),
    for a client of the translate_constrained signature.

    Lines are read `sort_window` at a time (at least `batch_size`); a window
    is translated in batches of `batch_size` lines of similar length (by
    words, shortest first; with a window of one batch, in input order) and
    written in input order. `parallel_batches` batches are translated at
    once (requests in flight, or signature calls on as many threads)."""
    exported = client.output_size("nbest_scores", 1)
    if n_best > exported:
        raise TranslationError(f"--n_best={n_best} but the model was exported with n-best "
                               f"{exported} (re-export with --n_best={n_best})")
    window_size = max(sort_window, batch_size)
    done, window = 0, []

    def flush():
        nonlocal done
        batched = batches_by_length(lambda batch: client(**signature_inputs(batch)), window, batch_size,
                                    parallel_batches, by_length=window_size > batch_size,
                                    length=lambda item: len(item[0].split()))
        for i, (result, row) in enumerate(rows_by_line(batched, len(window), progress and progress.update)):
            plain = not (with_alignments or with_scores or n_best > 1)
            if plain and result["truncated"][row]:
                print(f"warning: line {done + i + 1} was longer than the model's input limit and was cut",
                      file=sys.stderr)
            if plain and "terms_met" in result and not result["terms_met"][row]:
                print(f"warning: line {done + i + 1}: its required terms did not fit in the length limit; "
                      "its translation is the best partial one", file=sys.stderr)
            out.write(format_result(result, row, n_best, with_scores, with_alignments) + "\n")
        out.flush()
        done += len(window)
        window.clear()

    for line in lines:
        window.append(line if isinstance(line, tuple) else (line,))
        if len(window) == window_size:
            flush()
    if window:
        flush()
    return done


def main(argv):
    nmt_flags.start_cli(argv, accepts=TOOL_FLAGS,
                        reasons={name: nmt_flags.FIXED_AT_EXPORT_REASON for name in nmt_flags.FIXED_AT_EXPORT})
    FLAGS = absl_flags.FLAGS
    if sum(bool(x) for x in (FLAGS.saved_model, FLAGS.preset, FLAGS.server)) != 1:
        return nmt_flags.user_error("give exactly one of --saved_model, --preset and --server.")
    try:
        saved_model = presets.saved_model_for(FLAGS.saved_model, FLAGS.preset,
                                              log=lambda *a: print(*a, file=sys.stderr))
        steering = FLAGS.target_prefix or FLAGS.required_terms or FLAGS.glossary
        glossary = Glossary(FLAGS.glossary) if FLAGS.glossary else None
        signature = CONSTRAINED_SIGNATURE if steering else "serving_default"
        client = SignatureClient(signature, saved_model=saved_model, server=FLAGS.server, model_name=FLAGS.model_name,
                                 version=FLAGS.model_version, timeout=FLAGS.timeout,
                                 outputs=needed_outputs(FLAGS.n_best, FLAGS.with_scores, FLAGS.with_alignments,
                                                        bool(steering)))
        progress = Progress(count_lines(FLAGS.input) if sys.stderr.isatty() and FLAGS.input else None)
        out = open(FLAGS.output, "w", encoding="utf-8") if FLAGS.output else sys.stdout
        try:
            translate_lines(client, steered_lines(read_lines(FLAGS.input), FLAGS.target_prefix,
                                                  FLAGS.required_terms, glossary), out,
                            FLAGS.lines_per_batch, FLAGS.n_best,
                            FLAGS.with_scores, FLAGS.with_alignments, progress, FLAGS.sort_window,
                            FLAGS.parallel_batches)
        finally:
            progress.close()
            if FLAGS.output:
                out.close()
    except (TranslationError, ClientError, FileNotFoundError, ValueError, presets.PresetError) as e:
        return nmt_flags.user_error(e)
    return 0


if __name__ == "__main__":
    app.run(main)
