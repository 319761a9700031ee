"""Translation quality with the papers' analyses: the library behind
`python -m nmt_tf.evaluate` (whose help says what is measured and written),
usable from Python without command-line flags:

    from nmt_tf.evaluation import quality as evaluation
    from nmt_tf.config import DecodingConfig, SearchOptions
    reports = evaluation.run([("model_dir", "runs/m30k")], None, "test.en", "test.fr", "eval/test",
                             DecodingConfig(SearchOptions(beam_size=10), max_input_length=256), batch_size=64)

`run` evaluates each model (a model directory, its chosen weights or an
ensemble, or a SavedModel) on one test set: `evaluate_subject` translates
and scores, `format_table` and `write_plots` show the reports.
"""

from __future__ import annotations

import dataclasses
import json
import os

from nmt_tf.config import DecodingConfig
from nmt_tf.core import model_dir as layout
from nmt_tf.core.files import read_lines, write_atomically
from nmt_tf.core.progress import Progress
from nmt_tf.data.lexicon import for_search
from nmt_tf.data.tokenizers import tokenizer_class
from nmt_tf.evaluation import metrics, plots
from nmt_tf.inference.client import SignatureClient
from nmt_tf.inference.line_batches import translate_lines
from nmt_tf.inference.restore import restore_ensemble
from nmt_tf.inference.saved_models import read_metadata
from nmt_tf.inference.translation_graph import TranslationGraph, UnkReplacement, compiled_translate


class EvaluationError(ValueError):
    """A problem with the user's files or flags, in one sentence."""


def read_text(path: str, flag: str) -> list[str]:
    if not path:
        raise EvaluationError(f"--{flag} is required.")
    if not os.path.exists(path):
        raise EvaluationError(f"{path} does not exist (--{flag}).")
    return [line.decode("utf-8", errors="replace") for line in read_lines(path)]


@dataclasses.dataclass
class Subject:
    """One model to evaluate and how to run it."""

    label: str
    translate: object                 # [batch] string -> output dict (the serving signature's)
    translate_no_unk: object | None   # the same with [UNK] forbidden (None: not available)
    src_lang: str
    tgt_lang: str
    known_source: set
    known_target: set
    out_dir: str
    description: str


def _word_set(path: str) -> set:
    from nmt_tf.data import text

    return set(text.read_vocabulary(path)[len(text.SPECIAL_TOKENS):])


def subject_from_model_dir(model_dirs, label, decoding: DecodingConfig, out_dir, log):
    """`model_dirs`: one model directory, or several decoded as one ensemble,
    as `decoding` says (which weights, the search, [UNK] replacement, the
    Keras dtype policy of the search)."""
    from nmt_tf.data import pipeline as data

    model_dirs = [model_dirs] if isinstance(model_dirs, str) else list(model_dirs)
    model_dir, options, precision = model_dirs[0], decoding.search, decoding.precision
    unk_replacement = UnkReplacement.of(decoding)
    restored = restore_ensemble(model_dirs, decoding.weights, log=log, precision=precision)
    model, src_tok, tgt_tok, config = restored[:4]
    shortlist = for_search(model_dir, model, options)
    make = lambda o: compiled_translate(TranslationGraph(model, src_tok, tgt_tok, o, decoding.max_input_length,
                                                         unk_replacement, shortlist))
    words = data.word_shortlist_paths(model_dir)
    if not all(os.path.exists(p) for p in words):
        words = data.vocabulary_paths(model_dir) if tokenizer_class(config.tokenizer).word_level else None
    if words is None:
        raise EvaluationError(f"{model_dir} has no words.src.txt / words.tgt.txt (trained by an older nmt_tf)")
    return Subject(label, make(options), make(dataclasses.replace(options, suppress_unk=True)),
                   config.src_lang, config.tgt_lang, _word_set(words[0]), _word_set(words[1]), out_dir,
                   f"{' + '.join(model_dirs)} ({restored.checkpoint}, beam {options.beam_size}"
                   f"{f', shortlist of {options.shortlist_size}' if shortlist is not None else ''}"
                   f"{', [UNK] replaced' if unk_replacement is not None else ''}"
                   f"{'' if precision == 'float32' else f', {precision}'})")


def subject_from_saved_model(path, label, out_dir):
    from nmt_tf.data import pipeline as data

    meta = read_metadata(path)
    client = SignatureClient(saved_model=path)
    extra = os.path.join(path, "assets.extra")
    words = [os.path.join(extra, os.path.basename(p)) for p in data.word_shortlist_paths(".")]
    if not all(os.path.exists(p) for p in words):
        words = [os.path.join(path, "assets", n) for n in layout.VOCABULARIES]
    return Subject(label, lambda lines: client(text=lines), None,
                   meta["src_lang"], meta["tgt_lang"], _word_set(words[0]), _word_set(words[1]), out_dir,
                   f"{path} (beam {meta['search']['beam_size']}, fixed at export)")


def evaluate_subject(subject: Subject, sources: list[str], references: list[str], batch_size: int,
                     log=print) -> dict:
    """Translates, scores and analyses one model; writes its files; returns its report."""
    from nmt_tf.data.text import UNK, words_of_lines

    os.makedirs(subject.out_dir, exist_ok=True)
    log(f"Translating {len(sources):,} sentences with {subject.label}: {subject.description}")
    progress = Progress(len(sources))
    out = translate_lines(subject.translate, sources, batch_size, progress, keys=("translation",))
    progress.close()
    hyps = out["translation"]
    _write_lines(os.path.join(subject.out_dir, "hypotheses.txt"), hyps)

    src_words = words_of_lines(sources, subject.src_lang)
    ref_words = words_of_lines(references, subject.tgt_lang)
    unknown = [a + b for a, b in zip(metrics.count_unknown(src_words, subject.known_source),
                                     metrics.count_unknown(ref_words, subject.known_target))]
    no_unk = [i for i, n in enumerate(unknown) if n == 0]
    if subject.translate_no_unk is not None:
        no_unk_decoding = "[UNK] forbidden"
        fixed = []
        if no_unk:
            log(f"Translating the {len(no_unk):,} sentences without unknown words with [UNK] forbidden")
            progress = Progress(len(no_unk))
            fixed = translate_lines(subject.translate_no_unk, [sources[i] for i in no_unk], batch_size, progress,
                                    keys=("translation",))["translation"]
            progress.close()
    else:
        fixed = [hyps[i] for i in no_unk]
        no_unk_decoding = "normal search (fixed at export)"
    _write_lines(os.path.join(subject.out_dir, "hypotheses.no_unk.txt"), fixed)
    with_unk = [i for i, n in enumerate(unknown) if n > 0]

    report = {
        "label": subject.label, "model": subject.description, "sentences": len(sources),
        "all": metrics.corpus_scores(hyps, references, subject.tgt_lang),
        "no_unk": {**metrics.corpus_scores(fixed, [references[i] for i in no_unk], subject.tgt_lang),
                   "decoding": no_unk_decoding},
        # Where [UNK] replacement can act: the other pairs, from the normal output.
        "with_unk": metrics.corpus_scores([hyps[i] for i in with_unk], [references[i] for i in with_unk],
                                          subject.tgt_lang),
        "unk_in_output": sum(h.count(UNK) for h in hyps),
        "bleu_by_length": metrics.bleu_by_length([len(w) for w in src_words], hyps, references),
        "bleu_by_unknown": metrics.bleu_by_unknown(unknown, hyps, references),
    }
    write_atomically(os.path.join(subject.out_dir, "report.json"), json.dumps(report, indent=2))
    write_atomically(os.path.join(subject.out_dir, "report.txt"), format_table([report]) + "\n")
    return report


def _write_lines(path, lines):
    write_atomically(path, "".join(line + "\n" for line in lines))


def _fmt(value, digits=2):
    return "-" if value is None else f"{value:.{digits}f}"


def format_table(reports: list[dict]) -> str:
    """A readable table of the main scores and the analyses."""
    lines = [f"{'model':<22} {'BLEU':>6} {'BLEU lc':>8} {'chrF':>6} {'lc Moses-tok BLEU':>18} "
             f"{'no-UNK BLEU':>12} {'(n)':>6}"]
    for r in reports:
        lines.append(f"{r['label'][:22]:<22} {_fmt(r['all']['bleu']):>6} {_fmt(r['all']['bleu_lc']):>8} "
                     f"{_fmt(r['all']['chrf']):>6} {_fmt(r['all'].get('bleu_lc_moses')):>18} "
                     f"{_fmt(r['no_unk']['bleu']):>12} {r['no_unk']['sentences']:>6}")
    lines.append("")
    for r in reports:
        w = r["with_unk"]
        lines.append(f"{r['label'][:22]:<22} pairs with an unknown word ({w['sentences']}): BLEU {_fmt(w['bleu'])}, "
                     f"lc Moses-tok {_fmt(w.get('bleu_lc_moses'))}; [UNK] in the output: {r['unk_in_output']}")
    lines.append("")
    bins = [b["bin"] for b in reports[0]["bleu_by_length"]]
    lines.append("BLEU by source length (words): " + " ".join(f"{b:>7}" for b in bins))
    for r in reports:
        lines.append(f"  {r['label'][:28]:<28} " + " ".join(f"{_fmt(b['bleu']):>7}" for b in r["bleu_by_length"]))
    lines.append("  sentences per bin:           " + " ".join(f"{b['sentences']:>7}" for b in reports[0]["bleu_by_length"]))
    lines.append("BLEU with at most k unknown words: k = " + " ".join(
        f"{b['max_unknown']:>5}" for b in reports[0]["bleu_by_unknown"]))
    for r in reports:
        lines.append(f"  {r['label'][:36]:<36} " + " ".join(f"{_fmt(b['bleu'], 1):>5}" for b in r["bleu_by_unknown"]))
    lines.append("")
    lines.append(f"BLEU: {reports[0]['all'].get('bleu_signature')}")
    lines.append(f"BLEU lc: {reports[0]['all'].get('bleu_lc_signature')}")
    lines.append(f"chrF: {reports[0]['all'].get('chrf_signature')}")
    lines.append(f"lc Moses-tok BLEU (as the Multi30k papers score): {reports[0]['all'].get('bleu_lc_moses_signature')}")
    return "\n".join(lines)


def write_plots(reports: list[dict], out_dir: str, src_name: str) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for key, x, xlabel, title, name in (
            ("bleu_by_length", "bin", "source sentence length (words)",
             f"BLEU by sentence length ({src_name})", "bleu_by_length.png"),
            ("bleu_by_unknown", "max_unknown", "maximum number of unknown words (source + reference)",
             f"BLEU by number of unknown words ({src_name})", "bleu_by_unknown.png")):
        counts = [b["sentences"] for b in reports[0][key]]
        series = {r["label"]: [(f"{b[x]}\n(n={n})", b["bleu"]) for b, n in zip(r[key], counts)] for r in reports}
        path = os.path.join(out_dir, name)
        with open(path, "wb") as f:
            f.write(plots.bleu_png(series, xlabel, title))
        written.append(path)
    return written


def run(models: list[tuple[str, str]], labels: list[str] | None, src: str, ref: str, out_dir: str | None,
        decoding: DecodingConfig, batch_size: int, log=print, ensemble: list[str] | None = None) -> list[dict]:
    """Evaluates every (kind, path) model; returns their reports.

    `decoding`: how model directories are decoded (which weights, the
    search, the longest input, [UNK] replacement, precision; a SavedModel
    has its own). `ensemble`: further model directories decoded with the
    (one) --model_dir as one ensemble."""
    if not isinstance(decoding, DecodingConfig):
        raise TypeError(f"decoding: a DecodingConfig, not {type(decoding).__name__} (the search options go in as "
                        "DecodingConfig(SearchOptions(...)))")
    sources, references = read_text(src, "src"), read_text(ref, "ref")
    if len(sources) != len(references):
        raise EvaluationError(f"{src} (--src) has {len(sources):,} lines but {ref} (--ref) has "
                              f"{len(references):,} lines.")
    if not models:
        raise EvaluationError("give --model_dir or --saved_model (either may be repeated).")
    if ensemble and (len(models) != 1 or models[0][0] != "model_dir"):
        raise EvaluationError("--ensemble goes with exactly one --model_dir (the ensemble's first member).")
    labels = list(labels or [])
    if len(labels) > len(models):
        raise EvaluationError(f"{len(labels)} --label flags for {len(models)} models.")
    src_name = os.path.basename(src).removesuffix(".gz")
    several = len(models) > 1
    reports = []
    for i, (kind, path) in enumerate(models):
        label = labels[i] if i < len(labels) else os.path.basename(os.path.normpath(path))
        if not os.path.exists(path):
            raise EvaluationError(f"{path} does not exist (--{kind}).")
        default_dir = layout.eval_dir(path if kind == "model_dir" else "", src_name)
        model_out = os.path.join(out_dir, label) if out_dir and several else (out_dir or default_dir)
        subject = (subject_from_model_dir([path, *(ensemble or [])], label, decoding, model_out, log)
                   if kind == "model_dir" else subject_from_saved_model(path, label, model_out))
        reports.append(evaluate_subject(subject, sources, references, batch_size, log))
        write_plots([reports[-1]], model_out, src_name)
    if several and out_dir:
        write_plots(reports, out_dir, src_name)
        write_atomically(os.path.join(out_dir, "report.txt"), format_table(reports) + "\n")
    return reports
