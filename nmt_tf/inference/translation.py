"""Translating streams of lines: the library behind `python -m nmt_tf.translate`
(whose help describes the input and output formats), usable from Python
without command-line flags:

    import sys
    from nmt_tf.inference import translation
    from nmt_tf.inference.client import SignatureClient
    client = SignatureClient("serving_default", saved_model="exports/nmt/1",
                             outputs=translation.needed_outputs(1, False, False))
    translation.translate_lines(client, translation.read_lines("input.en"), sys.stdout, batch_size=64,
                                n_best=1, with_scores=False, with_alignments=False)

`translate_lines` sends lines to a signature (locally or on a server) in
batches of similar length and writes one line per input line, in order:
the translation, or a JSON object with scores, n-best lists and
alignments (`format_result`). `steered_lines` gives lines their target
prefixes and required terms for the translate_constrained signature. For
translations as Python objects, use `nmt_tf.Translator`.
"""

from __future__ import annotations

import copy
import dataclasses
import html
import json
import sys

import numpy as np

from nmt_tf.core.files import InputError, input_lines
from nmt_tf.core.progress import Progress
from nmt_tf.inference import markup as markup_module
from nmt_tf.inference import placeholders
from nmt_tf.inference.glossary import target_of
from nmt_tf.inference.line_batches import as_text, batches_by_length, rows_by_line
from nmt_tf.inference.translation_graph import MAX_REQUIRED_TERMS

CONSTRAINED_SIGNATURE = "translate_constrained"


class TranslationError(RuntimeError):
    """A problem the user can fix, in one sentence."""


ALIGNMENT_OUTPUTS = ("source_tokens", "target_tokens", "alignment")


def needed_outputs(n_best: int, with_scores: bool, with_alignments: bool, steered: bool = False, *,
                   with_confidence: bool = False, markup: str | None = None) -> list[str]:
    """The outputs that `format_result` writes for these flags (`steered`: of
    the translate_constrained signature; `markup`: the tokens and alignment
    that put the markup back). Placeholders need them only for the lines
    that hold items, and `translate_lines` asks for them there."""
    outputs = ["translation", "truncated"] + (["terms_met"] if steered else [])
    if with_confidence:
        outputs += ["confidence"]
    if with_scores:
        outputs += ["score", "log_prob"]
    if n_best > 1:
        outputs += ["nbest_translations", "nbest_scores"]
    if with_alignments or markup:
        outputs += list(ALIGNMENT_OUTPUTS)
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
                  warn=lambda message: print(message, file=sys.stderr), sourced: bool = True):
    """(line, target prefix, required terms) items for the translate_constrained
    signature: the prefixes and terms from the lines of their files, and the
    glossary's (a `nmt_tf.inference.glossary.Glossary`) terms of each line; the lines
    themselves when none of these is given. A line with more than
    MAX_REQUIRED_TERMS terms keeps its first ones (its own before the
    glossary's), with a warning naming it. The glossary's terms name their
    source terms ("source|||target") if `sourced`."""
    if not (prefix_path or terms_path or glossary):
        yield from lines
        return
    pairs = _beside(_beside(lines, prefix_path, "target_prefix"), terms_path, "required_terms")
    for number, ((line, prefix), terms) in enumerate(pairs, 1):
        wanted = [t for t in terms.decode("utf-8", errors="replace").split("\t") if t.strip()]
        if glossary is not None:
            wanted += glossary.required_terms(line.decode("utf-8", errors="replace"), sourced)
        first = {}          # each target term once, in its first form (the line's own before the glossary's)
        for term in wanted:
            first.setdefault(target_of(term), term)
        wanted = list(first.values())
        if len(wanted) > MAX_REQUIRED_TERMS:
            warn(f"warning: line {number} has {len(wanted)} required terms; the model takes {MAX_REQUIRED_TERMS}, "
                 f"the first ones (dropped: {', '.join(wanted[MAX_REQUIRED_TERMS:])})")
            wanted = wanted[:MAX_REQUIRED_TERMS]
        yield line, prefix, "\t".join(wanted).encode("utf-8")


def with_outputs(client, names):
    """`client` (a SignatureClient or LiteRTClient) asking for `names` too:
    a copy on the same model, connection or interpreters."""
    if getattr(client, "outputs", None) is None:      # it returns every output already
        return client
    other = copy.copy(client)
    other.outputs = list(client.outputs) + [n for n in names if n not in client.outputs]
    return other


@dataclasses.dataclass
class Prepared:
    """A line made ready for the model: its markup taken out
    (nmt_tf.inference.markup), then its placeholders masked
    (nmt_tf.inference.placeholders)."""

    text: str                                           # what the model translates
    marked: markup_module.Marked | None = None
    protected: placeholders.Protected | None = None


def prepare(line: str, markup: str | None = None, protect=()) -> Prepared:
    """`line` without its markup (`markup`: "html", "xml" or None) and with
    the items of the kinds in `protect` masked."""
    marked = markup_module.strip(line, markup) if markup else None
    text = marked.text if marked else line
    protected = placeholders.protect(text, protect) if protect else None
    return Prepared(protected.text if protected else text, marked, protected)


def put_back(prepared: Prepared, out: dict, row: int) -> tuple[str, str | None, str | None]:
    """Row `row`'s translation with the markup and placeholders of
    `prepared` put back, and the warnings of each (`finish`)."""
    if "alignment" not in out:        # a batch without items or markup: nothing to place
        return finish(prepared, as_text(out["translation"][row]), None, None, None)
    source = [as_text(t) for t in out["source_tokens"][row] if t]
    target = [as_text(t) for t in out["target_tokens"][row] if t]
    return finish(prepared, as_text(out["translation"][row]), source, target,
                  np.asarray(out["alignment"][row])[:len(target), :len(source)])


def finish(prepared: Prepared, translation: str, source_tokens, target_tokens,
           alignment) -> tuple[str, str | None, str | None]:
    """`translation` (the model's, of `prepared.text`) with the markup and
    placeholders put back; the markup's warning and the placeholders'
    (None: nothing to say). With markup, a placeholder the model lost goes
    at the end (the text with tags has no word alignment)."""
    text, markup_warning, placeholder_warning = translation, None, None
    if prepared.marked is not None:
        text, markup_warning = markup_module.restore(prepared.marked, translation, source_tokens, target_tokens,
                                                     alignment)
    protected = prepared.protected
    if protected is not None:
        if prepared.marked is not None and prepared.marked.elements:
            text, placeholder_warning = placeholders.restore(protected, text, escape=lambda item: html.escape(
                item, quote=False))
        else:
            text, placeholder_warning = placeholders.restore(protected, text, source_tokens, target_tokens,
                                                             alignment)
        placeholder_warning = placeholder_warning or protected.warning
    return text, markup_warning, placeholder_warning


def format_result(out: dict, i: int, n_best: int, with_scores: bool, with_alignments: bool, *,
                  with_confidence: bool = False, translation: str | None = None) -> str:
    """One output line for row i of a batch result (`translation`: instead
    of the model's, e.g. with the line's markup put back)."""
    translation = as_text(out["translation"][i]) if translation is None else translation
    if not (with_scores or with_alignments or with_confidence or n_best > 1):
        return translation
    record = {"translation": translation}
    if with_confidence:
        record["confidence"] = round(float(out["confidence"][i]), 4)
    if "terms_met" in out:
        record["terms_met"] = bool(out["terms_met"][i])
    if "terms_spellable" in out:        # False: a term has a token outside the target vocabulary
        record["terms_spellable"] = bool(out["terms_spellable"][i])
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
                    parallel_batches: int = 1, *, with_confidence: bool = False, markup: str | None = None,
                    protect=()) -> int:
    """Translates an iterable of byte lines into the text stream `out` with a
    `nmt_tf.inference.client.SignatureClient` of the serving_default signature; returns lines done.
    Items may also be (line, target prefix, required terms) (`steered_lines`),
    for a client of the translate_constrained signature.

    Lines are read `sort_window` at a time (at least `batch_size`); a window
    is translated in batches of `batch_size` lines of similar length (by
    words, shortest first; with a window of one batch, in input order) and
    written in input order. `parallel_batches` batches are translated at
    once (requests in flight, or signature calls on as many threads).
    `with_confidence`: JSON lines with the export's calibrated confidence
    (a model with a confidence.json; nmt_tf.inference.confidence).
    `markup` ("html" or "xml"): each line's tags are taken out, the plain
    sentence translated and the tags put back by the attention
    (nmt_tf.inference.markup); n-best hypotheses stay plain text.
    `protect` (kinds of nmt_tf.inference.placeholders): URLs, numbers and the
    like are masked before translation and put back verbatim where the model
    wrote their masks; n-best hypotheses keep the masks. A batch whose lines
    hold items also asks the client for the tokens and the alignment
    (`with_outputs`), which place a mask the model lost."""
    if with_confidence and not client.has_output("confidence"):
        raise TranslationError(f"{client.where} has no confidence output: export a model directory that holds "
                               "a confidence calibrator (confidence.json; docs/translating.md, 'Confidence'), or "
                               "use a preset that ships one")
    exported = client.output_size("nbest_scores", 1)       # None: the request chooses (translate_with_options)
    if exported is not None and n_best > exported:
        raise TranslationError(f"--n_best={n_best} but the model was exported with n-best "
                               f"{exported} (re-export with --n_best={n_best})")
    window_size = max(sort_window, batch_size)
    done, window, prepared = 0, [], []
    aligned = with_outputs(client, ALIGNMENT_OUTPUTS) if protect else client
    masked = placeholders.OPEN.encode("utf-8")

    def call(batch):
        holds_items = protect and any(masked in item[0] for item in batch)
        return (aligned if holds_items else client)(**signature_inputs(batch))

    def flush():
        nonlocal done
        batched = batches_by_length(call, window, batch_size,
                                    parallel_batches, by_length=window_size > batch_size,
                                    length=lambda item: len(item[0].split()))
        for i, (result, row) in enumerate(rows_by_line(batched, len(window), progress and progress.update)):
            plain = not (with_alignments or with_scores or with_confidence or n_best > 1)
            if plain and result["truncated"][row]:
                print(f"warning: line {done + i + 1} (or its target prefix) was longer than the model's input "
                      "limit and was cut",
                      file=sys.stderr)
            if plain and "terms_met" in result and not result["terms_met"][row]:
                unspellable = "terms_spellable" in result and not result["terms_spellable"][row]
                print(f"warning: line {done + i + 1}: " + (
                    "a required term cannot be spelled with the model's target vocabulary (a token of it is "
                    "[UNK], or it holds a control character); it was left out" if unspellable else
                    "its required terms did not fit in the length limit; its translation is the best partial one"),
                    file=sys.stderr)
            text = None
            if markup or protect:
                text, *warnings = put_back(prepared[i], result, row)
                for warning in filter(None, warnings):
                    print(f"warning: line {done + i + 1}: {warning}", file=sys.stderr)
            out.write(format_result(result, row, n_best, with_scores, with_alignments,
                                    with_confidence=with_confidence, translation=text) + "\n")
        out.flush()
        done += len(window)
        window.clear()
        prepared.clear()

    for line in lines:
        item = line if isinstance(line, tuple) else (line,)
        if markup or protect:
            prepared.append(prepare(item[0].decode("utf-8", errors="replace"), markup, protect))
            item = (prepared[-1].text.encode("utf-8"),) + item[1:]
        window.append(item)
        if len(window) == window_size:
            flush()
    if window:
        flush()
    return done
