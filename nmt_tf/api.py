"""The Python API: translate and score with a trained model in three lines.

    import nmt_tf
    translator = nmt_tf.Translator.from_preset("multi30k_en_fr")     # the shipped model, no training
    result = translator.translate("A man is riding a bicycle.")
    result.text, result.score, result.nbest, result.alignment

`Translator.from_preset(name)` builds the preset's SavedModel on first use
(with runtime="litert", its LiteRT model: `from_litert(path)` translates a
LiteRT folder without TensorFlow)
(nmt_tf.presets, cached), `from_saved_model(path)` loads any nmt_tf export,
`from_model_dir(model_dir, ...)` translates with a training run's weights
(best, last, averaged or the mean of several) and search settings of your
choice, `from_server("host:8500")` sends the sentences to a TF Serving (or
nmt_tf.serve) gRPC endpoint. All four run the same graph code as TF Serving
does: the translations are the ones the exported model gives.

`translate(sentences)` returns a `Translation` per sentence (one for a
single string): the best translation, its score (log-probability divided
by the length penalty) and log-probability, the n-best list with scores,
the source and output tokens the model saw and produced (each ending with
"[EOS]"), the attention matrix alpha (one row per output token, one column
per source token) and whether the source was cut to the model's input
limit. `translate(sentences, target_prefix=...)` makes each translation
start with the given text (byte for byte) and lets the model continue it,
for interactive translation; `required_terms=` makes each contain the given
target terms (the export's translate_constrained signature).
`score(sources, targets)` returns log p(target | source) per pair.
Sentences are batched by length internally (`batch_size`); the results come
back in input order.
"""

from __future__ import annotations

import dataclasses
import sys
import weakref

import numpy as np

from nmt_tf import presets
from nmt_tf.config import DecodingConfig, SearchOptions
from nmt_tf.core import custom_gradients, startup
from nmt_tf.data.lexicon import for_search
from nmt_tf.exporting import saved_model as exporter
from nmt_tf.inference import placeholders
from nmt_tf.inference.client import ClientError, SignatureClient
from nmt_tf.inference.glossary import reads_term_sources, sourced_term
from nmt_tf.inference.line_batches import as_text, batches_by_length, rows_by_line, scored_pairs
from nmt_tf.inference.litert_runtime import LiteRTClient
from nmt_tf.inference.restore import restore_model
from nmt_tf.inference.saved_models import load_saved_model, read_metadata, signature_defaults
from nmt_tf.inference.translation import finish, prepare
from nmt_tf.inference.translation_graph import (
    MAX_REQUIRED_TERMS,
    SEARCH_SETTINGS,
    WITH_OPTIONS_SIGNATURE,
    TranslationGraph,
    failed_check_text,
)


@dataclasses.dataclass
class Translation:
    text: str                                 # the best translation, detokenized
    score: float                              # its log-probability / length penalty (the beam's ranking)
    log_prob: float                           # its log-probability, [EOS] included
    nbest: list[tuple[str, float]]            # (translation, score), best first; nbest[0] is `text`
    source_tokens: list[str]                  # what the model read, ending with "[EOS]"
    target_tokens: list[str]                  # what it wrote, ending with "[EOS]"
    alignment: np.ndarray                     # [len(target_tokens), len(source_tokens)] attention weights
    truncated: bool                           # the source (or its target prefix) was cut to the model's input limit
    terms_met: bool | None = None             # with required_terms: all of them are in `text`
    confidence: float | None = None           # the probability that `text` is acceptable (a calibrated model), or
                                              # None: the model has no calibrator (docs/translating.md, "Confidence")
    markup_warning: str | None = None         # with markup=: why the markup was left as text or placed by position
    placeholder_warning: str | None = None    # with protect=: a placeholder the model lost, put back by attention


@dataclasses.dataclass
class PairScore:
    log_prob: float                           # log p(target | source), [EOS] included
    log_prob_per_token: float                 # log_prob / target_length
    target_length: int                        # target tokens with [EOS]
    token_log_probs: list[float]              # one per target token
    truncated: bool                           # either side cut to the model's input limit


def _strings(items) -> list[str]:
    return [as_text(t) for t in items if t]


class Translator:
    """Translates and scores with one nmt_tf model; make one with a `from_*` class method."""

    def __init__(self, translate_fn, score_fn, n_best: int, description: str, metadata: dict | None = None,
                 constrained_fn=None, gradients: custom_gradients.Registrations | None = None,
                 with_options_fn=None, settings: dict | None = None):
        if gradients is not None:
            # The custom gradients that loading the model registered, and those its functions register when
            # first traced, pin its graphs in TensorFlow's registry: they are let go with this Translator.
            translate_fn, score_fn, constrained_fn, with_options_fn = (
                fn and gradients.recorded(fn) for fn in (translate_fn, score_fn, constrained_fn, with_options_fn))
            weakref.finalize(self, gradients.release).atexit = False     # nothing to let go of at exit
        self._translate, self._score = translate_fn, score_fn
        self._constrained = constrained_fn    # (texts, prefixes, terms) -> outputs, or None: the model has none
        self._with_options = with_options_fn  # (texts, settings) -> outputs (translate_with_options), or None
        self.settings = dict(settings or {})  # search settings of every translate() call (beam_size, ...)
        if self.settings and with_options_fn is None:
            raise ValueError(f"{', '.join(sorted(self.settings))}: {description} takes no search settings per "
                             "request (an export made before nmt_tf 0.3 has no translate_with_options: export it "
                             "again)")
        self.n_best = n_best                  # n-best size the model returns at most
        self.description = description
        self.metadata = metadata or {}        # languages, tokenizer, search settings (an export's nmt_tf.json)

    def __repr__(self):
        return f"Translator({self.description})"

    @classmethod
    def from_preset(cls, name: str, cache_dir: str | None = None, log=None, runtime: str = "tensorflow",
                    litert_weights: str = "int8", **search) -> "Translator":
        """A shipped model by name (`nmt_tf.presets.available()`), or a preset
        folder; its first use builds its SavedModel (about a minute, said on
        standard error, or to `log`). runtime="litert": its LiteRT model
        (`litert_weights` storage), built on first use and cached, translated
        without TensorFlow (`from_litert`), which also takes search settings
        (`beam_size=`, `n_best=`, `length_penalty=`, `length_alpha=`). The
        SavedModel takes `beam_size=`, `n_best=` and `length_alpha=` for
        every call (`from_saved_model`)."""
        log = log or (lambda *a: print(*a, file=sys.stderr))
        startup.quiet_tensorflow_import()      # as the tools: no start-up notices (imports nothing itself)
        if runtime == "litert":
            return cls.from_litert(presets.litert_model(name, litert_weights, cache_dir, log=log),
                                   _description=f"preset {name} on LiteRT ({litert_weights})", **search)
        if runtime != "tensorflow":
            raise ValueError(f"runtime={runtime!r}: choose tensorflow or litert")
        return cls.from_saved_model(presets.build(name, cache_dir, log=log), _description=f"preset {name}", **search)

    @classmethod
    def from_litert(cls, path: str, num_threads: int = 1, _description: str | None = None,
                    **search) -> "Translator":
        """A LiteRT model folder (nmt_tf.export --format=litert), translated
        without TensorFlow (nmt_tf.inference.litert_runtime; docs/litert.md). Its
        search runs on the host, so `beam_size=`, `n_best=`,
        `length_penalty=` and `length_alpha=` override the export's. `score`
        runs forced decoding on the host with the step signatures; target
        prefixes and required terms are not there yet."""
        client = LiteRTClient(path, num_threads=num_threads, search=search)
        return cls(lambda text: client(text=text), client.score, client.output_size("nbest_scores", 1),
                   _description or f"LiteRT model {path}", client.model.manifest,
                   with_options_fn=lambda text, given: client(text, given))

    @classmethod
    def from_saved_model(cls, path: str, _description: str | None = None, **settings) -> "Translator":
        """An nmt_tf SavedModel version directory (nmt_tf.export's output).
        `settings` (`beam_size=`, `n_best=`, `length_alpha=`) choose the
        search of every call, within what the export allows (its
        translate_with_options signature: beams up to --max_beam_size);
        `translate` also takes them per call."""
        startup.quiet_tensorflow_import()      # as the tools: no start-up notices
        import tensorflow as tf

        gradients = custom_gradients.Registrations()
        with gradients.recording():
            signatures = load_saved_model(path).signatures
        translate, score = signatures["serving_default"], signatures["score"]
        constrained = signatures.get("translate_constrained")
        with_options = signatures.get(WITH_OPTIONS_SIGNATURE)
        defaults = signature_defaults(path, WITH_OPTIONS_SIGNATURE) if with_options is not None else {}
        n_best = translate.structured_outputs["nbest_scores"].shape[1]
        strings = lambda values: tf.constant(values, tf.string)
        return cls(lambda text: _numpy(translate(text=strings(text))),
                   lambda source, target: _numpy(score(source=strings(source), target=strings(target))),
                   n_best, _description or f"SavedModel {path}", read_metadata(path),
                   constrained and (lambda text, prefix, terms: _numpy(constrained(
                       text=strings(text), target_prefix=strings(prefix), required_terms=strings(terms)))),
                   gradients, with_options and (lambda text, given: _numpy(with_options(
                       text=strings(text), **_setting_tensors({**defaults, **given})))), settings)

    @classmethod
    def from_model_dir(cls, model_dir: str, checkpoint: str = "best", average_checkpoints: int = 1,
                       average_from: str = "best", max_input_length: int = 100, precision: str = "float32",
                       log=None, **search) -> "Translator":
        """A training run's weights: `checkpoint` (best, last, averaged or a
        path) or the mean of `average_checkpoints` of `average_from`;
        `search`: nmt_tf.config.SearchOptions fields (beam_size=10 and n_best=5
        unless given); `precision`: the Keras dtype policy of the search
        ("mixed_bfloat16" is faster on CPUs with bfloat16 instructions).
        What it loads, and fewer checkpoints than `average_checkpoints` to
        average, are said on standard error as the tools say them (or to
        `log`; `log=lambda *a: None` for silence)."""
        startup.quiet_tensorflow_import()      # as the tools: no start-up notices
        import tensorflow as tf

        from nmt_tf.core.checkpoints import WeightsChoice

        log = log or (lambda *a: print(*a, file=sys.stderr))

        options = SearchOptions(**{"n_best": min(5, search.get("beam_size", 10)), **search})
        decoding = DecodingConfig(options, WeightsChoice(checkpoint, average_checkpoints, average_from), precision,
                                  max_input_length)
        gradients = custom_gradients.Registrations()
        with gradients.recording():
            restored = restore_model(model_dir, decoding.weights, log=log,
                                     precision=decoding.precision)
            graph = TranslationGraph(restored.model, restored.source_tokenizer, restored.target_tokenizer, options,
                                     decoding.max_input_length,
                                     shortlist=for_search(model_dir, restored.model, options),
                                     confidence=exporter.graph_confidence([model_dir], log))
        functions = graph.functions()
        translate, score, constrained, with_options = (functions[name] for name in (
            "translate", "score", "translate_constrained", WITH_OPTIONS_SIGNATURE))
        metadata = exporter.metadata(restored.config, decoding, restored.checkpoint)
        strings = lambda values: tf.constant(values, tf.string)
        return cls(lambda text: _numpy(translate(strings(text))),
                   lambda source, target: _numpy(score(strings(source), strings(target))),
                   options.n_best, f"{model_dir}, {restored.checkpoint}", metadata,
                   lambda text, prefix, terms: _numpy(constrained(strings(text), strings(prefix), strings(terms))),
                   gradients, lambda text, given: _numpy(with_options(strings(text), **_setting_tensors(given))))

    @classmethod
    def from_server(cls, address: str, model_name: str = "nmt", version: int = 0,
                    timeout: float = 60.0, **settings) -> "Translator":
        """A model served over TF Serving's gRPC API (tensorflow_model_server
        or nmt_tf.serve); `settings` as in from_saved_model."""
        startup.quiet_tensorflow_import()      # as the tools: no start-up notices
        where = dict(server=address, model_name=model_name, version=version, timeout=timeout)
        translate = SignatureClient(**where)
        score = SignatureClient("score", **where)
        optional = {}
        for name in ("translate_constrained", WITH_OPTIONS_SIGNATURE):
            try:
                optional[name] = SignatureClient(name, **where)
            except ClientError:        # an older export, or (constrained) one with a shortlist
                optional[name] = None
        constrained, with_options = optional["translate_constrained"], optional[WITH_OPTIONS_SIGNATURE]
        return cls(lambda text: translate(text=text), lambda source, target: score(source=source, target=target),
                   translate.output_size("nbest_scores", 1) or 1, f"{model_name} at {address}",
                   constrained_fn=constrained and (lambda text, prefix, terms: constrained(
                       text=text, target_prefix=prefix, required_terms=terms)),
                   with_options_fn=with_options and (lambda text, given: with_options.call({"text": text}, given)),
                   settings=settings)

    def translate(self, sentences, n_best: int | None = None, batch_size: int = 64, parallel_batches: int = 2,
                  target_prefix=None, required_terms=None, markup: str | None = None, protect="all",
                  beam_size: int | None = None, length_alpha: float | None = None):
        """A `Translation` per sentence (a list for a list; one for a str),
        with at most `n_best` hypotheses (default: all the model returns).
        `beam_size` and `length_alpha` (over the Translator's `settings`)
        choose this call's search (the export's translate_with_options
        signature: beams up to its --max_beam_size; `n_best` then up to
        `beam_size`); a setting out of range is a ValueError naming it.
        Sentences go in batches of `batch_size` of similar length,
        `parallel_batches` at once (as nmt_tf.translate does).
        `target_prefix`: text each translation starts with (a str for a
        str, a list as long as `sentences`; "" for none).
        `required_terms`: target terms each translation must contain (a list
        for a str, a list of such lists as long as `sentences`), each a
        target term, or a (source term, target term) pair: then the term is
        written where the attention is on its source term, not after the
        sentence (nmt_tf.inference.constraints, "Placement");
        `Translation.terms_met` says whether they all fit.
        `markup` ("html" or "xml"): the sentences hold inline markup; it is
        taken out, the plain sentences translated, and put back into
        `Translation.text` by the attention (nmt_tf.inference.markup; the
        tokens, alignment and n-best list are the plain sentence's);
        `Translation.markup_warning` says when it could not be.
        `protect`: the kinds of items carried through verbatim ("all", the
        default: URLs, e-mail addresses, @handles, hashtags, numbers and
        emoji; "none"; or some of nmt_tf.inference.placeholders.KINDS):
        each is masked before translation and put back where the model
        wrote its mask, or where the attention places it
        (`Translation.placeholder_warning`); the n-best list keeps the masks."""
        single = isinstance(sentences, (str, bytes))
        lines = [sentences] if single else list(sentences)
        kinds = placeholders.parse_kinds(protect)
        prepared = None
        if markup is not None or kinds:
            prepared = [prepare(s.decode("utf-8", errors="replace") if isinstance(s, bytes) else s, markup, kinds)
                        for s in lines]
            lines = [p.text for p in prepared]
        given = {name: value for name, value in (("beam_size", beam_size), ("length_alpha", length_alpha))
                 if value is not None}
        settings = {**self.settings, **given}
        items = [(_bytes(s),) for s in lines]
        if settings:
            if self._with_options is None:
                raise ValueError(f"{', '.join(sorted(settings))}: {self.description} takes no search settings per "
                                 "request (an export made before nmt_tf 0.3 has no translate_with_options: export "
                                 "it again)")
            if n_best is not None:
                settings["n_best"] = n_best
            call = lambda batch: self._searched(settings, [item[0] for item in batch])
            n_best = n_best or settings.get("n_best") or self.n_best
        else:
            n_best = self.n_best if n_best is None else n_best
            if not 1 <= n_best <= self.n_best:
                raise ValueError(f"n_best={n_best}: this model returns 1 to {self.n_best} hypotheses "
                                 "(export it again with a larger --n_best, or ask for a beam_size)")
            call = lambda batch: self._translate([item[0] for item in batch])
        if target_prefix is not None or required_terms is not None:
            if settings:
                raise ValueError("beam_size, n_best and length_alpha choose the search of plain translation: with "
                                 "target_prefix or required_terms the export's search serves")
            if self._constrained is None:
                raise ValueError(f"{self.description} has no translate_constrained signature (an export made "
                                 "with --shortlist_size, or before nmt_tf had prefixes and terms): export it again")
            prefixes = [target_prefix or ""] if single else list(target_prefix or [""] * len(lines))
            terms = [required_terms or []] if single else list(required_terms or [[]] * len(lines))
            for name, values in (("target prefixes", prefixes), ("lists of required terms", terms)):
                if len(values) != len(lines):
                    raise ValueError(f"{len(lines)} sentences but {len(values)} {name}")
            if not reads_term_sources(self.metadata):      # an export before nmt_tf 0.4: the target terms only
                terms = [[t[1] if isinstance(t, (tuple, list)) else t for t in ([ts] if isinstance(ts, (str, bytes))
                                                                                else ts)] for ts in terms]
            items = [(s, _bytes(p), _bytes(join_terms(t))) for (s,), p, t in zip(items, prefixes, terms)]
            call = lambda batch: self._constrained(*([item[i] for item in batch] for i in range(3)))
        batched = batches_by_length(call, items, batch_size, parallel_batches, length=lambda item: len(item[0].split()))
        results = [_translation(out, row, n_best) for out, row in rows_by_line(batched, len(items))]
        if prepared is not None:
            results = [dataclasses.replace(t, **dict(zip(("text", "markup_warning", "placeholder_warning"), finish(
                p, t.text, t.source_tokens, t.target_tokens, t.alignment)))) for t, p in zip(results, prepared)]
        return results[0] if single else results

    def _searched(self, settings: dict, texts: list) -> dict:
        """translate_with_options on one batch; a setting out of its range is a ValueError naming it."""
        try:
            return self._with_options(texts, settings)
        except ClientError as e:
            if "INVALID_ARGUMENT" in str(e):
                raise ValueError(str(e)) from None
            raise
        except Exception as e:      # the graph's check (tf.errors.InvalidArgumentError), without importing TF here
            if type(e).__name__ == "InvalidArgumentError":
                raise ValueError(failed_check_text(getattr(e, "message", str(e)))) from None
            raise

    def score(self, sources, targets, batch_size: int = 64) -> list[PairScore]:
        """log p(target | source) of each pair (lists of equal length)."""
        if self._score is None:
            raise ValueError(f"{self.description} cannot score pairs")
        sources, targets = list(sources), list(targets)
        if len(sources) != len(targets):
            raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
        out = []
        for result, row in scored_pairs(self._score, sources, targets, batch_size):
            length = int(result["target_length"][row])
            out.append(PairScore(float(result["log_prob"][row]), float(result["log_prob_per_token"][row]), length,
                                 [float(x) for x in result["token_log_probs"][row][:length]],
                                 bool(result["truncated"][row])))
        return out


def join_terms(terms) -> str:
    """A sentence's required terms as the signature takes them: tab-separated;
    a (source term, target term) pair as "source|||target"."""
    terms = [terms] if isinstance(terms, (str, bytes)) else list(terms)
    text = lambda t: t.decode("utf-8") if isinstance(t, bytes) else t
    terms = [sourced_term(text(t[0]), text(t[1])) if isinstance(t, (tuple, list)) else text(t) for t in terms]
    for term in terms:
        if any(c in term for c in "\t\r\n"):
            raise ValueError(f"a required term holds a tab or a line break: {term[:60]!r}")
    if len(terms) > MAX_REQUIRED_TERMS:
        raise ValueError(f"{len(terms)} required terms for one sentence; the model takes at most {MAX_REQUIRED_TERMS}")
    return "\t".join(terms)


def _bytes(text) -> bytes:
    return text.encode("utf-8") if isinstance(text, str) else text


def _setting_tensors(settings: dict) -> dict:
    """translate_with_options' scalar inputs as tensors of their dtypes."""
    import tensorflow as tf

    return {name: tf.constant(value, SEARCH_SETTINGS[name]) for name, value in settings.items()}


def _numpy(outputs: dict) -> dict:
    return {name: value.numpy() for name, value in outputs.items()}


def _translation(out: dict, row: int, n_best: int) -> Translation:
    source, target = _strings(out["source_tokens"][row]), _strings(out["target_tokens"][row])
    nbest = [(as_text(t), float(s)) for t, s in zip(out["nbest_translations"][row][:n_best],
                                                  out["nbest_scores"][row][:n_best]) if s > -1e8]
    return Translation(as_text(out["translation"][row]), float(out["score"][row]), float(out["log_prob"][row]), nbest,
                       source, target, np.asarray(out["alignment"][row][:len(target), :len(source)]),
                       bool(out["truncated"][row]), bool(out["terms_met"][row]) if "terms_met" in out else None,
                       float(out["confidence"][row]) if "confidence" in out else None)
