"""A calibrated confidence for each translation: the probability, fitted on a
dev set, that the translation is acceptable.

The signals come from the search's own outputs for one sentence, with no
second pass:

  lp_mean        log p(translation) / its tokens ([EOS] included)
  nbest_margin   the best hypothesis' score minus the second's (10 when there is none)
  coverage_dev   mean |attention a source token received - 1| over the source tokens
  att_entropy    mean entropy of the attention rows / log(source tokens + 1)
  len_ratio      log(target tokens / source tokens, [EOS] included on both sides)
  rare_source    share of the source tokens seen fewer than `rare_below` times in
                 the calibrator's training corpus (any token outside its list)

A `Calibrator` is a logistic regression of the standardised signals, fitted
with `fit` on a dev set whose translations were judged acceptable or not
(pipelines/multi30k_en_fr/confidence.py: sentence chrF2 >= 50 against the
reference). It is stored as `confidence.json` in a model directory (and a
preset); an export of a model directory that has one gets a `confidence`
output in its translate signatures (`graph_confidence`, in TF ops), and the
LiteRT runtime computes the same from its outputs (`confidence_of_outputs`,
NumPy). Both implement one definition, tested to agree.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os

import numpy as np

from nmt_tf.core import model_dir as layout
from nmt_tf.core.files import write_atomically

FEATURES = ("lp_mean", "nbest_margin", "coverage_dev", "att_entropy", "len_ratio", "rare_source")
FORMAT = 1
NO_SECOND = 10.0          # nbest_margin when there is no second hypothesis
DEAD = -1e8               # a hypothesis slot scored below this holds no hypothesis
EOS_TOKEN = "[EOS]"


class CalibratorError(ValueError):
    """A confidence.json that cannot be read, or a fit that cannot be made."""


@dataclasses.dataclass(frozen=True)
class Calibrator:
    mean: tuple[float, ...]
    std: tuple[float, ...]
    coefficients: tuple[float, ...]
    intercept: float
    frequent_source_tokens: tuple[str, ...]       # tokens seen at least `rare_below` times
    rare_below: int
    acceptable: str                                # what "acceptable" meant when it was fitted
    fitted_on: str

    @functools.cached_property
    def frequent(self) -> frozenset:
        """`frequent_source_tokens` as a set, made once (rare_source looks every source token up)."""
        return frozenset(self.frequent_source_tokens)

    def probability(self, signals: np.ndarray) -> np.ndarray:
        """[N] confidences of [N, len(FEATURES)] signals."""
        z = (np.asarray(signals, np.float64) - np.array(self.mean)) / np.array(self.std)
        return 1.0 / (1.0 + np.exp(-(z @ np.array(self.coefficients) + self.intercept)))

    def to_json(self) -> dict:
        return {"format": FORMAT, "features": list(FEATURES), **dataclasses.asdict(self)}

    def save(self, path: str) -> None:
        write_atomically(path, json.dumps(self.to_json(), indent=1, ensure_ascii=False).encode("utf-8"))


def path_in(model_dir: str) -> str:
    return layout.path(model_dir, layout.CONFIDENCE)


def load(path: str) -> Calibrator:
    """The calibrator stored at `path`; CalibratorError names what is wrong."""
    try:
        with open(path, encoding="utf-8") as f:
            stored = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CalibratorError(f"{path} cannot be read ({type(e).__name__}: {e})") from None
    if not isinstance(stored, dict) or stored.get("format") != FORMAT:
        raise CalibratorError(f"{path} is not a confidence calibrator of format {FORMAT}")
    if stored.get("features") != list(FEATURES):
        raise CalibratorError(f"{path} was fitted on the signals {stored.get('features')}, "
                              f"not this nmt_tf's {list(FEATURES)}: fit it again")
    try:
        calibrator = Calibrator(tuple(map(float, stored["mean"])), tuple(map(float, stored["std"])),
                                tuple(map(float, stored["coefficients"])), float(stored["intercept"]),
                                tuple(map(str, stored["frequent_source_tokens"])), int(stored["rare_below"]),
                                str(stored["acceptable"]), str(stored["fitted_on"]))
    except (KeyError, TypeError, ValueError) as e:
        raise CalibratorError(f"{path}: a field is missing or not a number ({type(e).__name__}: {e})") from None
    if not all(len(v) == len(FEATURES) for v in (calibrator.mean, calibrator.std, calibrator.coefficients)):
        raise CalibratorError(f"{path}: mean, std and coefficients must have {len(FEATURES)} values each")
    if not all(math.isfinite(v) for v in (*calibrator.mean, *calibrator.coefficients, calibrator.intercept)) or \
            not all(s > 0 and math.isfinite(s) for s in calibrator.std):
        raise CalibratorError(f"{path}: its numbers must be finite and its std positive")
    return calibrator


def find(model_dir: str) -> Calibrator | None:
    """The model directory's calibrator, or None when it has none."""
    path = path_in(model_dir)
    return load(path) if os.path.exists(path) else None


def fit(signals: np.ndarray, acceptable: np.ndarray, frequent_source_tokens, rare_below: int,
        acceptable_means: str, fitted_on: str, l2: float = 1.0, steps: int = 50) -> Calibrator:
    """A logistic regression of the standardised `signals` ([N, len(FEATURES)])
    on the 0/1 `acceptable`, by Newton's method with an L2 penalty `l2` on
    the coefficients (as scikit-learn's LogisticRegression(C=1/l2))."""
    x = np.asarray(signals, np.float64)
    if x.ndim != 2 or x.shape[1] != len(FEATURES):
        raise CalibratorError(f"signals of shape {x.shape}: need [N, {len(FEATURES)}]")
    mean, std, w = logistic_regression(x, acceptable, l2, steps)
    return Calibrator(tuple(mean.tolist()), tuple(std.tolist()), tuple(w[:-1].tolist()), float(w[-1]),
                      tuple(sorted(frequent_source_tokens)), int(rare_below), acceptable_means, fitted_on)


def logistic_regression(signals, labels, l2: float = 1.0, steps: int = 50):
    """(mean, std, weights with the intercept last) of an L2-penalised
    logistic regression of the standardised columns of `signals` on the 0/1
    `labels`, by Newton's method."""
    x = np.asarray(signals, np.float64)
    y = np.asarray(labels, np.float64)
    if x.ndim != 2 or len(x) != len(y) or not len(y):
        raise CalibratorError(f"signals of shape {x.shape} and {len(y)} labels: need [N, k] and N")
    if y.min() == y.max():
        raise CalibratorError("every dev translation has the same label: nothing to calibrate against")
    mean, std = x.mean(0), x.std(0) + 1e-9
    z = np.hstack([(x - mean) / std, np.ones((len(x), 1))])
    w = np.zeros(z.shape[1])
    penalty = np.full(z.shape[1], l2)
    penalty[-1] = 0.0                                   # the intercept is not penalised
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-(z @ w)))
        gradient = z.T @ (p - y) + penalty * w
        hessian = (z * (p * (1 - p))[:, None]).T @ z + np.diag(penalty)
        step = np.linalg.solve(hessian, gradient)
        w -= step
        if np.abs(step).max() < 1e-10:
            break
    return mean, std, w


# --- the signals in NumPy (the LiteRT runtime, fitting) ---

def _as_str(token) -> str:
    return token.decode("utf-8", errors="replace") if isinstance(token, bytes) else str(token)


def signals_of_outputs(outputs: dict, frequent_source_tokens) -> np.ndarray:
    """[B, len(FEATURES)] signals of a translate signature's outputs (NumPy
    arrays: log_prob, target_tokens, source_tokens, alignment, nbest_scores);
    `frequent_source_tokens`: a set of them (`Calibrator.frequent`)."""
    rows = []
    for i in range(len(outputs["log_prob"])):
        source = [_as_str(t) for t in outputs["source_tokens"][i]]
        source = [t for t in source if t]
        t = sum(1 for token in outputs["target_tokens"][i] if _as_str(token))
        s = len(source)
        words = [token for token in source if token != EOS_TOKEN]
        alpha = np.asarray(outputs["alignment"][i], np.float64)[:t, :s]
        scores = np.asarray(outputs["nbest_scores"][i], np.float64)
        rows.append(_signals(float(outputs["log_prob"][i]), t, s, len(words), alpha, scores,
                             sum(token not in frequent_source_tokens for token in words)))
    return np.array(rows, np.float64).reshape(-1, len(FEATURES))


def _signals(log_prob, t, s, words, alpha, scores, rare) -> list:
    t1, s1 = max(t, 1), max(s, 1)
    coverage = alpha.sum(0)[:words] if words else np.zeros(0)
    entropy = -(alpha * np.log(np.maximum(alpha, 1e-12))).sum(1)
    return [log_prob / t1,
            float(scores[0] - scores[1]) if len(scores) > 1 and scores[1] > DEAD else NO_SECOND,
            float(np.abs(coverage - 1.0).sum() / max(words, 1)),
            float(entropy.sum() / t1 / math.log(max(s, 2))),
            math.log(t1 / s1),
            rare / max(words, 1)]


def confidence_of_outputs(outputs: dict, calibrator: Calibrator) -> np.ndarray:
    """[B] confidences of a translate signature's outputs; 1 for an empty source."""
    signals = signals_of_outputs(outputs, calibrator.frequent)
    empty = np.array([not any(_as_str(t) not in ("", EOS_TOKEN) for t in row) for row in outputs["source_tokens"]])
    return np.where(empty, 1.0, calibrator.probability(signals))


# --- the same in TF ops (the exported graph) ---

class GraphConfidence:
    """The calibrator as TF ops for TranslationGraph: built once (its token
    table is tracked by the saved module), called inside the translate
    functions."""

    def __init__(self, calibrator: Calibrator):
        import tensorflow as tf

        self.calibrator = calibrator
        tokens = list(calibrator.frequent_source_tokens) or [""]
        self.table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(tf.constant(tokens, tf.string), tf.ones([len(tokens)], tf.float32)),
            default_value=0.0)

    def __call__(self, log_prob, best_ids, source_tokens, alignment, nbest_scores, pad_id: int):
        """[B] confidences: log_prob [B], best_ids [B, T] (pad_id after [EOS]),
        source_tokens [B, S] strings ("" padding, "[EOS]" last), alignment
        [B, T, S], nbest_scores [B, N]."""
        import tensorflow as tf

        c = self.calibrator
        f32 = tf.float32
        target_mask = tf.cast(best_ids != pad_id, f32)                                  # [B, T]
        t = tf.reduce_sum(target_mask, 1)
        present = tf.cast(source_tokens != "", f32)                                     # [B, S]
        s = tf.reduce_sum(present, 1)
        word_mask = present * tf.cast(source_tokens != EOS_TOKEN, f32)
        words = tf.reduce_sum(word_mask, 1)
        alpha = tf.cast(alignment, f32) * target_mask[:, :, None] * present[:, None, :]
        coverage = tf.reduce_sum(alpha, 1)                                              # [B, S]
        coverage_dev = tf.reduce_sum(tf.abs(coverage - 1.0) * word_mask, 1) / tf.maximum(words, 1.0)
        row_entropy = -tf.reduce_sum(alpha * tf.math.log(tf.maximum(alpha, 1e-12)), 2)   # [B, T]
        t1, s1 = tf.maximum(t, 1.0), tf.maximum(s, 1.0)
        entropy = tf.reduce_sum(row_entropy * target_mask, 1) / t1 / tf.math.log(tf.maximum(s, 2.0))
        scores = tf.cast(nbest_scores, f32)
        if scores.shape[1] == 1:
            margin = tf.fill(tf.shape(t), NO_SECOND)
        else:
            # N may be known only when the graph runs (translate_with_options' n_best): a second column
            # of dead slots is added where there is none.
            scores = tf.pad(scores, [[0, 0], [0, tf.maximum(0, 2 - tf.shape(scores)[1])]], constant_values=2 * DEAD)
            margin = tf.where(scores[:, 1] > DEAD, scores[:, 0] - scores[:, 1], NO_SECOND)
        frequent = self.table.lookup(source_tokens)
        rare = tf.reduce_sum((1.0 - frequent) * word_mask, 1) / tf.maximum(words, 1.0)
        signals = tf.stack([tf.cast(log_prob, f32) / t1, margin, coverage_dev, entropy, tf.math.log(t1 / s1), rare],
                           axis=1)
        z = (signals - tf.constant(c.mean, f32)) / tf.constant(c.std, f32)
        logit = tf.linalg.matvec(z, tf.constant(c.coefficients, f32)) + c.intercept
        return tf.where(words > 0, tf.sigmoid(logit), 1.0)        # an empty source: nothing to get wrong
