r"""Translates a file or stdin, one line in, one line out, order kept.

Usage:
  python -m nmt_tf.translate --saved_model=exports/nmt/1 < input.en > output.fr
  python -m nmt_tf.translate --preset=multi30k_en_fr < input.en > output.fr      # the shipped model
  python -m nmt_tf.translate --preset=multi30k_en_fr --runtime=litert < input.en   # the same, on LiteRT
  python -m nmt_tf.translate --server=localhost:8500 --model_name=nmt --input=input.en --output=out.fr
  python -m nmt_tf.translate --saved_model=E --input=in.en --n_best=5 --with_scores --with_alignments
  python -m nmt_tf.translate --preset=multi30k_en_fr --input=in.en --target_prefix=prefixes.fr
  python -m nmt_tf.translate --preset=multi30k_en_fr --input=in.en --glossary=terms.en-fr.tsv
  echo 'A <b>black dog</b> runs.' | python -m nmt_tf.translate --preset=multi30k_en_fr --markup=html

With --runtime=litert a LiteRT model runs in this process instead, without
TensorFlow (--litert_model=FOLDER, from nmt_tf.export --format=litert; or
--preset's, built on first use with --litert_weights, int8 by default):
the same outputs; one sentence at a time 2.4-3.1x as fast as the SavedModel
on an AMX Xeon, batches of 64 slower from beam 3 up (docs/litert.md). Its
search runs here, so --beam_size, --length_penalty and --length_alpha
apply (and --n_best up to --beam_size when that is given).

A SavedModel, a preset or a server takes --beam_size and --length_alpha
too (and then --n_best up to --beam_size): the lines go through the
export's translate_with_options signature, which searches with the
request's settings (beams up to the export's --max_beam_size; the preset's:
10). Without them the export's own settings serve; --length_penalty stays
the export's.

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
must contain (a term written "source|||target" is placed where the attention
is on its source words); --glossary=FILE ("source term<TAB>target term"
lines) adds the target term of every source term found in a line as whole
words, placed so. Terms
that do not fit in the length limit give the best partial translation
("terms_met": false in JSON lines; in plain-text mode a warning on
stderr). These lines go through the export's translate_constrained
signature, which searches the whole target vocabulary (an export made with
--shortlist_size has no such signature).

--markup=html (or xml) translates lines that hold inline markup: the tags
are taken out, the plain sentence is translated, and the tags are put back
around the target words the attention aligns to the words they wrapped
(nmt_tf.inference.markup; docs/translating.md, "Inline markup").

URLs, e-mail addresses, @handles, hashtags, numbers and emoji are carried
through verbatim: each is replaced by a mask (°1°, °2°, ...) before
translation and put back where the model wrote it, or where the attention
places it, with a warning (--protect chooses the kinds or turns it off;
nmt_tf.inference.placeholders; docs/translating.md, "Placeholders").

Output: plain text, one translation per line. With --with_scores,
--with_alignments, --with_confidence or --n_best > 1, one JSON object per line instead:
  {"translation": ..., "confidence": 0.93,                        (--with_confidence)
   "score": ..., "log_prob": ...,                                 (--with_scores)
   "nbest": [{"translation": ..., "score": ...}, ...],            (--n_best > 1)
   "source_tokens": [...], "target_tokens": [...],
   "alignment": [[...], ...], "truncated": false}                 (--with_alignments)
alignment[i][j] is the weight of source token j when output token i was
generated; both token lists end with "[EOS]". --n_best cannot exceed the
n-best size fixed at export (or --beam_size, when given). Input longer than the export's
--max_input_length tokens is cut (its "truncated" is true; in plain-text
mode a warning goes to stderr); so is a --target_prefix line. Undecodable bytes become U+FFFD. On a
terminal, progress with an ETA goes to stderr.
"""

from __future__ import annotations

import sys

from absl import app
from absl import flags as absl_flags

from nmt_tf import flags as nmt_flags  # also defines --saved_model, --server, --n_best, ...
from nmt_tf import presets
from nmt_tf.core.files import count_lines
from nmt_tf.core.progress import Progress
from nmt_tf.inference import placeholders
from nmt_tf.inference.client import ClientError, SignatureClient
from nmt_tf.inference.glossary import Glossary, reads_term_sources
from nmt_tf.inference.litert_runtime import LiteRTClient
from nmt_tf.inference.markup import KINDS
from nmt_tf.inference.saved_models import read_metadata
from nmt_tf.inference.translation_graph import WITH_OPTIONS_SIGNATURE, beam_bound_text
from nmt_tf.inference.translation import (
    CONSTRAINED_SIGNATURE,
    TranslationError,
    needed_outputs,
    read_lines,
    steered_lines,
    translate_lines,
)

absl_flags.DEFINE_integer("model_version", 0, "Model version on the server (0: the latest).", lower_bound=0)
absl_flags.DEFINE_boolean("with_scores", False, "Write JSON lines with the scores.")
absl_flags.DEFINE_boolean("with_alignments", False, "Write JSON lines with tokens and the attention matrix.")
absl_flags.DEFINE_boolean("with_confidence", False,
                          "Write JSON lines with each translation's confidence: the probability, calibrated on a dev "
                          "set, that it is acceptable (the presets have one; an export of a model directory that "
                          "holds a confidence.json; docs/translating.md, 'Confidence').")
absl_flags.DEFINE_string(
    "target_prefix", None,
    "A file (plain or gzip) with one target prefix per input line (empty line: none): each translation starts "
    "with its prefix byte for byte and the model continues it (the translate_constrained signature).")
absl_flags.DEFINE_string(
    "required_terms", None,
    "A file (plain or gzip) with the target terms each input line's translation must contain, tab-separated, "
    "each 'target' or 'source|||target' (placed where the source words are translated), "
    "one line per input line (empty line: none); a line with more than 16, with the --glossary's, keeps its first "
    "16 and a warning says so: lexically constrained beam search.")
absl_flags.DEFINE_string(
    "glossary", None,
    "A 'source term<TAB>target term' file: wherever a source term occurs in an input line (whole words, "
    "case-sensitive unless --glossary_ignore_case), its target term is required in the translation (as "
    "--required_terms), and placed where the source term is translated (the export's --term_placement).")
absl_flags.DEFINE_boolean(
    "glossary_ignore_case", False,
    "With --glossary: find its source terms in any case ('Snow', 'SNOW' for 'snow'); two entries that differ only "
    "in case are then an error.")
absl_flags.DEFINE_enum(
    "markup", None, list(KINDS),
    "Lines hold inline markup: html or xml. Its tags are taken out, the plain sentence is translated, and the "
    "tags are put back around the target words the attention aligns to the words they wrapped (whole words; "
    "the output is always well-formed; n-best lists stay plain; docs/translating.md, 'Inline markup'). "
    "Unbalanced markup is translated as text, with a warning.")
absl_flags.DEFINE_string(
    "protect", "all",
    "Items carried through verbatim: masked before translation, put back where the model wrote the mask (or by "
    "the attention, with a warning): all, none, or some of " + ", ".join(placeholders.KINDS) + " separated by "
    "commas. A lone digit is left to the model; n-best lists keep the masks (docs/translating.md, 'Placeholders').")
TOOL_FLAGS = nmt_flags.tool_flags(__name__, ("saved_model", "preset", "server", "model_name", "timeout", "input",
                                             "output", "lines_per_batch", "sort_window", "parallel_batches", "n_best",
                                             "beam_size", "length_alpha", "runtime", "litert_model", "litert_weights", "litert_threads"))


# With --runtime=litert the search runs here: these search flags are honoured (a SavedModel fixed them).
LITERT_SEARCH_FLAGS = ("beam_size", "length_penalty", "length_alpha")
# A SavedModel, preset or server takes these per request (translate_with_options), --n_best with them.
REQUEST_SEARCH_FLAGS = ("beam_size", "length_alpha")


def request_settings() -> dict:
    """The search settings the command line gives for translate_with_options
    ({} when none: the export's own search serves, through serving_default)."""
    FLAGS = absl_flags.FLAGS
    settings = {name: FLAGS[name].value for name in REQUEST_SEARCH_FLAGS if FLAGS[name].present}
    if settings and FLAGS["n_best"].present:
        settings["n_best"] = FLAGS.n_best
    return settings


def check_beam_against_export(saved_model: str, settings: dict) -> None:
    """A --beam_size over the export's widest (nmt_tf.json's max_beam_size)
    is the signature's own error, said before TensorFlow loads the
    SavedModel (seconds) rather than after; exports that do not record the
    bound are left to the signature."""
    if "beam_size" not in settings:
        return
    try:
        limit = read_metadata(saved_model).get("max_beam_size")
    except (OSError, ValueError, AttributeError):
        return
    if isinstance(limit, int) and limit > 0 and settings["beam_size"] > limit:
        raise ValueError(beam_bound_text(limit))


def reads_sources(saved_model: str) -> bool:
    """Whether the export takes "source|||target" terms (nmt_tf 0.4 on): the
    glossary then sends its terms so. Through --server the export is not
    known, and the glossary sends target terms only."""
    try:
        return reads_term_sources(read_metadata(saved_model))
    except (OSError, ValueError, AttributeError):
        return False


def litert_client(outputs: list[str]):
    """The LiteRT model of --litert_model or --preset (built on first use), as
    a client with the search flags given (LITERT_SEARCH_FLAGS, --n_best)."""
    FLAGS = absl_flags.FLAGS
    if FLAGS.saved_model or FLAGS.server:
        raise ValueError("--runtime=litert runs a LiteRT model: give --litert_model or --preset, not "
                         "--saved_model or --server")
    if bool(FLAGS.litert_model) == bool(FLAGS.preset):
        raise ValueError("--runtime=litert: give exactly one of --litert_model and --preset")
    folder = FLAGS.litert_model or presets.litert_model(FLAGS.preset, FLAGS.litert_weights,
                                                        log=lambda *a: print(*a, file=sys.stderr))
    search = {name: FLAGS[name].value for name in LITERT_SEARCH_FLAGS + ("n_best",) if FLAGS[name].present}
    if "n_best" in search and "beam_size" not in search:
        search.pop("n_best")        # within the export's n-best, checked as for a SavedModel
    return LiteRTClient(folder, outputs=outputs, num_threads=FLAGS.litert_threads, search=search)
def main(argv):
    FLAGS = absl_flags.FLAGS
    litert = FLAGS.runtime == "litert"
    nmt_flags.start_cli(argv, accepts=TOOL_FLAGS | (frozenset(LITERT_SEARCH_FLAGS) if litert else frozenset()),
                        reasons={name: nmt_flags.FIXED_AT_EXPORT_REASON for name in nmt_flags.FIXED_AT_EXPORT})
    if not litert and sum(bool(x) for x in (FLAGS.saved_model, FLAGS.preset, FLAGS.server)) != 1:
        return nmt_flags.user_error("give exactly one of --saved_model, --preset and --server.")
    try:
        steering = FLAGS.target_prefix or FLAGS.required_terms or FLAGS.glossary
        glossary = Glossary(FLAGS.glossary, FLAGS.glossary_ignore_case) if FLAGS.glossary else None
        protect = placeholders.parse_kinds(FLAGS.protect)
        outputs = needed_outputs(FLAGS.n_best, FLAGS.with_scores, FLAGS.with_alignments, bool(steering),
                                 with_confidence=FLAGS.with_confidence, markup=FLAGS.markup)
        saved_model = None
        if litert:
            if steering:
                raise ValueError("--runtime=litert has no target prefixes or required terms yet: translate them "
                                 "with --runtime=tensorflow")
            client = litert_client(outputs)
        else:
            saved_model = presets.saved_model_for(FLAGS.saved_model, FLAGS.preset,
                                                  log=lambda *a: print(*a, file=sys.stderr))
            settings = request_settings()
            if settings and steering:
                raise ValueError("--beam_size and --length_alpha choose the search of plain translation: with "
                                 "--target_prefix, --required_terms or --glossary the export's search serves")
            if saved_model:
                check_beam_against_export(saved_model, settings)
            signature = (CONSTRAINED_SIGNATURE if steering else WITH_OPTIONS_SIGNATURE if settings
                         else "serving_default")
            client = SignatureClient(signature, saved_model=saved_model, server=FLAGS.server,
                                     model_name=FLAGS.model_name, version=FLAGS.model_version, timeout=FLAGS.timeout,
                                     outputs=outputs, settings=settings)
        progress = Progress(count_lines(FLAGS.input) if sys.stderr.isatty() and FLAGS.input else None)
        out = open(FLAGS.output, "w", encoding="utf-8") if FLAGS.output else sys.stdout
        try:
            translate_lines(client, steered_lines(read_lines(FLAGS.input), FLAGS.target_prefix,
                                                  FLAGS.required_terms, glossary,
                                                  sourced=bool(saved_model) and reads_sources(saved_model)), out,
                            FLAGS.lines_per_batch, FLAGS.n_best,
                            FLAGS.with_scores, FLAGS.with_alignments, progress, FLAGS.sort_window,
                            FLAGS.parallel_batches, with_confidence=FLAGS.with_confidence, markup=FLAGS.markup,
                            protect=protect)
        finally:
            progress.close()
            if FLAGS.output:
                out.close()
    except (TranslationError, ClientError, OSError, ValueError, presets.PresetError) as e:   # LiteRTModelError
        return nmt_flags.user_error(e)
    except KeyboardInterrupt:       # Ctrl-C: one line, not a traceback (issue 95)
        print("interrupted: the output holds the lines translated before it, in input order", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    app.run(main)
