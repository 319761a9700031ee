"""The configuration of a training job and of search: typed, with its defaults, checked, in one place.

`SearchOptions` holds how beam search runs (the search flags of export,
evaluate, visualize). `TrainingConfig` holds every setting of a run (data, model, training); its
fields are the single source of the defaults and of the help texts, and
nmt_tf.flags turns each field into the command-line flag of the same name
(`--batch_size` is `TrainingConfig.batch_size`). The library takes a
`TrainingConfig` and never reads command-line flags, so it is usable from
Python without them, and importing it defines no flag:

    from nmt_tf import config, train
    train.train(config.TrainingConfig(train_src="a.en", train_tgt="a.fr", model_dir="runs/a"))

A run stores its configuration in <model_dir>/flags.json (`save`); `load`
reads it back over the defaults, so every tool needs only --model_dir.
No absl and no TensorFlow here.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from nmt_tf import model_dir as layout
from nmt_tf.files import write_atomically
from nmt_tf.models import ARCHITECTURES
from nmt_tf.tokenizers import TOKENIZERS


def _flag(kind: str, default, help: str, choices=None, lower=None, upper=None, name=None):
    """A field of the configuration and the command-line flag it becomes:
    `kind` is absl's DEFINE_<kind> (string, integer, float, boolean, enum,
    list), `choices` an enum's values, `lower` / `upper` a number's bounds,
    `name` the flag's name where it is not the field's."""
    metadata = {"flag": kind, "help": help, "choices": choices, "lower": lower, "upper": upper, "name": name}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


class ConfigError(ValueError):
    """A value the configuration cannot take, named as its flag."""


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    """Every setting of a training job; the defaults are the paper's (Adadelta
    rho = 0.95, eps = 1e-6, gradient norm clipped at 1, batches of 80,
    m = 620, n = n' = 1000, l = 500, 30k vocabularies)."""

    # data
    train_src: str | None = _flag('string', None,
            "Training source text: one sentence per line, plain or gzip.")
    train_tgt: str | None = _flag('string', None,
            "Training target text, line-aligned with --train_src.")
    dev_src: str | None = _flag('string', None,
            "Development (validation) source text, for dev loss and early stopping.")
    dev_tgt: str | None = _flag('string', None,
            "Development target text, line-aligned with --dev_src.")
    src_lang: str = _flag('string', 'en',
            "Source language code; selects the tokenizer's apostrophe and abbreviation rules (en, fr, de;"
            " others get generic rules).")
    tgt_lang: str = _flag('string', 'fr',
            "Target language code (see --src_lang).")
    tokenizer: str = _flag('enum', 'word',
            "word: the paper's Moses-like words with a shortlist of the most frequent words plus [UNK]. "
            "wordpiece: the same words cut into WordPiece sub-words (tensorflow-text "
            "FastWordpieceTokenizer, vocabulary learned by keras-hub compute_word_piece_vocabulary). "
            "sentencepiece: SentencePiece sub-words of the raw text (learned with the sentencepiece "
            "package, applied by tensorflow-text's SentencepieceTokenizer; see --sentencepiece_type, "
            "--joint_vocabulary).", choices=list(TOKENIZERS))
    sentencepiece_type: str = _flag('enum', 'unigram',
            "SentencePiece model of --tokenizer=sentencepiece: unigram language model (Kudo 2018) or BPE "
            "(Sennrich et al. 2016).", choices=['unigram', 'bpe'])
    joint_vocabulary: bool = _flag('boolean', False,
            "--tokenizer=sentencepiece: learn one vocabulary on source and target text together "
            "(--src_vocab_size pieces; --tgt_vocab_size must be equal), as BPE recipes often do; needed "
            "by --tied_embeddings=all.")
    sentencepiece_character_coverage: float = _flag('float', 1.0,
            "Share of the training characters that get pieces of their own; the rest become [UNK] (1.0 "
            "for alphabetic scripts, 0.9995 is usual for Chinese or Japanese).", lower=0.9, upper=1.0)
    sentencepiece_sample_size: int = _flag('integer', 1000000,
            "Sentences (a random sample of the training lines) SentencePiece learns from, per model.", lower=1)
    src_vocab_size: int = _flag('integer', 30000,
            "Source vocabulary size, the special tokens [PAD] [UNK] [BOS] [EOS] included (paper: 30,000).", lower=5)
    tgt_vocab_size: int = _flag('integer', 30000,
            "Target vocabulary size, special tokens included (paper: 30,000).", lower=5)
    max_len: int = _flag('integer', 50,
            "Training pairs with more tokens than this on either side are skipped and counted (paper: 30 "
            "or 50 words). Tokens are words, or sub-words with --tokenizer=wordpiece / sentencepiece.", lower=1)
    batch_size: int = _flag('integer', 80,
            "Batch size, in sentence pairs (--batch_type=sentences; paper: 80) or in padded tokens of the"
            " longer side (--batch_type=tokens).", lower=1)
    batch_type: str = _flag('enum', 'sentences',
            "Unit of --batch_size.", choices=['sentences', 'tokens'])
    pool_size: int = _flag('integer', 1600,
            "Pairs read, sorted by length and cut into batches together, as in the paper (1,600 pairs = "
            "20 batches of 80); larger pools give batches of more similar length.", lower=1)
    prepared_shards: int = _flag('integer', 0,
            "Tokenize the training corpus once into this many TFRecord shards in <model_dir>/prepared/ "
            "(made at the first start, made again when the corpus files, the vocabularies or --max_len "
            "change) and read them every epoch instead of the text: for corpora of hundreds of millions "
            "of words. 0: tokenize the text in every epoch.", lower=0)
    shuffle_buffer: int = _flag('integer', 200000,
            "Number of sentence pairs held in memory for shuffling the training stream; memory use does "
            "not grow with the corpus.", lower=1)

    # model
    model: str = _flag('enum', 'rnnsearch',
            "Model architecture: rnnsearch (attention; Bahdanau et al. 2015) or rnnencdec (a fixed-length"
            " summary of the source; Cho et al. 2014a).", choices=list(ARCHITECTURES))
    encoder: str = _flag('enum', 'rnn',
            "Encoder of --model=rnnencdec: rnn (a GRU) or grconv (gated recursive convolution, Cho et al."
            " 2014b). RNNsearch always uses its bidirectional GRU.", choices=['rnn', 'grconv'])
    grconv_size: int = _flag('integer', 2000,
            "Node size of the grConv encoder (paper: 2,000).", lower=1)
    embedding_size: int = _flag('integer', 620,
            "Word embedding size m (paper: 620).", lower=1)
    hidden_size: int = _flag('integer', 1000,
            "GRU state size n, per encoder direction and in the decoder (paper: 1000).", lower=1)
    attention_size: int = _flag('integer', 1000,
            "Hidden size n' of the alignment model (paper: 1000).", lower=1)
    maxout_size: int = _flag('integer', 500,
            "Number of maxout units l of the deep output (paper: 500).", lower=1)
    dropout: float = _flag('float', 0.0,
            "Dropout rate on embeddings and maxout features during training (paper: none).", lower=0.0, upper=0.95)
    annotation_dropout: float = _flag('float', 0.0,
            "Dropout rate on the encoder's outputs during training: RNNsearch's annotations h_j, "
            "RNNencdec's summary c (paper: none; nmtpytorch's Multi30k recipes: 0.5).", lower=0.0, upper=0.95)
    recurrent_dropout: float = _flag('float', 0.0,
            "Variational dropout of the GRU states in training (Gal & Ghahramani 2016; Nematus' "
            "dropout_hidden, Marian's dropout-rnn): one mask per sentence, the same at every step, where "
            "the state enters the recurrent products (paper: none).", lower=0.0, upper=0.95)
    layer_norm: bool = _flag('boolean', False,
            "Layer-normalised GRUs (Ba et al. 2016, as Nematus and Marian use them): the input, recurrent"
            " and context terms of the gates and of the candidate each normalised on their own, with a "
            "gain and a bias (paper: none).")
    tied_embeddings: str = _flag('enum', 'none',
            "Weight tying (Press & Wolf 2017; paper: none): target: the output layer is the transposed "
            "target embedding matrix (needs --maxout_size equal to --embedding_size); all: the source "
            "embeddings are that matrix too (needs --joint_vocabulary).", choices=['none', 'target', 'all'])
    label_smoothing: float = _flag('float', 0.0,
            "Label smoothing eps of the training loss: (1 - eps) NLL + eps x cross-entropy with the "
            "uniform distribution (paper: 0). Reported losses and perplexities stay the plain NLL.", lower=0.0, upper=0.5)

    # training
    model_dir: str | None = _flag('string', None,
            "Directory for vocabularies, resolved flags, checkpoints, TensorBoard logs and the training "
            "summary. Rerunning with the same directory resumes.")
    init_from: str | None = _flag('string', None,
            "Fine-tuning: start a new run from the weights of a trained model, a model directory or a "
            "preset's name or folder. Its model and vocabulary flags and its vocabularies are kept (new "
            "words become pieces, or [UNK] with words, counted in the log); data and training flags come "
            "from this command; the optimizer and the learning-rate schedule start afresh. Read only when"
            " --model_dir starts (a resume continues its own run).")
    init_checkpoint: str = _flag('string', '',
            "--init_from's weights: best, last, averaged or a checkpoint path (default: averaged if it "
            "has an averaged checkpoint, as a preset has, else best).")
    freeze: list[str] = _flag('list', [],
            "Parts of the model kept fixed while training (with --init_from): embeddings (with "
            "--tied_embeddings=all also the output layer's matrix), encoder.")
    optimizer: str = _flag('enum', 'adadelta',
            "Optimizer (paper: Adadelta).", choices=['adadelta', 'adam', 'sgd', 'rmsprop'])
    learning_rate: float | None = _flag('float', None,
            "Learning rate; default per optimizer: adadelta 1.0 (paper), adam 0.001, rmsprop 0.001, sgd "
            "0.1.", lower=0.0)
    warmup_steps: int = _flag('integer', 0,
            "Raise the learning rate linearly from 0 to --learning_rate over this many first updates (0: "
            "none, as in the paper).", lower=0)
    lr_schedule: str = _flag('enum', 'plateau',
            "Learning rate after the warm-up. plateau: --learning_rate, multiplied by --decay_factor when"
            " dev stops improving (paper: constant). linear / cosine: budgeted training (Li et al. 2020),"
            " the rate falls linearly / along a half cosine to --final_lr_fraction of --learning_rate "
            "exactly at the end of the budget, --max_steps or --max_hours (hours are turned into updates "
            "from the measured seconds per update, re-estimated at every update); needs one of them and "
            "--decay_factor=1.", choices=['plateau', 'linear', 'cosine'])
    final_lr_fraction: float = _flag('float', 0.0,
            "--lr_schedule=linear / cosine: the fraction of --learning_rate reached at the end of the "
            "budget.", lower=0.0, upper=1.0)
    adadelta_rho: float = _flag('float', 0.95,
            "Adadelta decay rate rho (paper: 0.95).")
    adadelta_epsilon: float = _flag('float', 1e-06,
            "Adadelta epsilon (paper: 1e-6).")
    clip_norm: float = _flag('float', 1.0,
            "Rescale the gradient when its global L2 norm exceeds this (paper: 1). 0 disables.", lower=0.0)
    max_epochs: int = _flag('integer', 10,
            "Stop after this many passes over the training data.", lower=1)
    max_steps: int = _flag('integer', 0,
            "Stop after this many updates in total (0: no limit).", lower=0)
    max_hours: float = _flag('float', 0.0,
            "Stop after this many hours of training, summed over resumed runs (0: no limit).", lower=0.0)
    checkpoint_every_steps: int = _flag('integer', 500,
            "Save a checkpoint every this many updates (and at the end of every epoch and of the run). A "
            "killed run loses at most this many updates.", lower=1)
    keep_checkpoints: int = _flag('integer', 3,
            "Number of recent checkpoints kept (the best ones by dev score are kept apart, see "
            "--keep_best_checkpoints).", lower=1)
    keep_best_checkpoints: int = _flag('integer', 1,
            "Number of checkpoints with the best dev scores kept in best/ (ranked in best/scores.json; "
            "more than one for averaging the best, --average_from=best).", lower=1)
    eval_every_steps: int = _flag('integer', 0,
            "Compute the dev loss every this many updates (0: at the end of every epoch).", lower=0)
    early_stopping_metric: str = _flag('enum', 'bleu',
            "Dev metric that selects the best checkpoint (best/), decays the learning rate and stops "
            "training early (bleu needs --dev_bleu).", choices=['bleu', 'loss'])
    dev_bleu: bool = _flag('boolean', True,
            "At every dev evaluation, also translate the dev set and log its BLEU (sacreBLEU, detokenized"
            " output against the raw reference) and attention heatmaps.")
    dev_bleu_beam_size: int = _flag('integer', 1,
            "Beam width for dev BLEU during training (1: greedy search).", lower=1)
    dev_bleu_sentences: int = _flag('integer', 0,
            "Translate only the first this many dev pairs for dev BLEU (0: all).", lower=0)
    attention_examples: int = _flag('integer', 4,
            "Dev sentences (the first ones) whose attention heatmaps go to TensorBoard at every "
            "evaluation.", lower=0)
    decay_factor: float = _flag('float', 1.0,
            "Multiply the learning rate by this after --decay_patience dev evaluations without "
            "improvement (1: constant learning rate, as in the paper).", lower=0.0, upper=1.0)
    decay_patience: int = _flag('integer', 2,
            "Dev evaluations without improvement before each learning-rate decay.", lower=1)
    patience: int = _flag('integer', 10,
            "Stop after this many dev evaluations without improvement (0: never stop early).", lower=0)
    log_every_steps: int = _flag('integer', 50,
            "Write training scalars to TensorBoard every this many updates.", lower=1)
    mixed_precision: str = _flag('enum', 'auto',
            "Keras dtype policy of training: auto (the default) is mixed_bfloat16 on a CPU with bfloat16 "
            "instructions (avx512_bf16 or amx_bf16) and no GPU, where it trained 1.3-1.5x faster with a "
            "dev-loss curve within 1.5 % of float32's, and float32 elsewhere, decided again at every "
            "start and logged; none is float32; mixed_bfloat16 / mixed_float16 compute in bfloat16 / "
            "float16 with float32 weights (mixed_float16 adds loss scaling; use it on GPUs without bf16)."
            " The weights and checkpoints are float32 either way. nmt_tf.export and nmt_tf.evaluate take "
            "it too, for the search (default there: float32, whatever the model was trained in; an export"
            " keeps it, and on a CPU without bfloat16 instructions a bfloat16 export runs emulated and "
            "slower).", choices=['none', 'auto', 'mixed_bfloat16', 'mixed_float16'])
    distribution: str = _flag('enum', 'none',
            "tf.distribute strategy of training: none (one device), mirrored (one process, a replica per "
            "GPU; per logical CPU device with --cpu_devices), multi_worker (one process per machine, the "
            "cluster in the TF_CONFIG environment variable). --batch_size is the global batch; "
            "docs/training.md, 'Training on several devices or machines'.", choices=['none', 'mirrored', 'multi_worker'])
    cpu_devices: int = _flag('integer', 0,
            "--distribution=mirrored on a machine without GPUs: split the CPU into this many logical "
            "devices, one replica each (0: as TensorFlow finds it). For trying distribution out; not "
            "faster.", lower=0)
    collective_timeout: int = _flag('integer', 0,
            "--distribution=multi_worker: seconds a gradient all-reduce may wait for the other workers "
            "before the job stops with an error (0: no limit; a worker that died is also detected by "
            "TensorFlow's coordination service).", lower=0)
    worker_input: str = _flag('enum', 'auto',
            "--distribution=multi_worker: what each worker reads. own_data: only its own part of the data"
            " (its prepared shards, or every N-th line of the text) and its replicas' batches of it; "
            "needs --batch_type=sentences. global_batches: the whole corpus, keeping its replicas' shares"
            " of every global batch, so the updates are those of one process (each worker reads and "
            "tokenizes everything). auto: own_data with sentence batches, global_batches with token "
            "batches.", choices=['auto', 'own_data', 'global_batches'])
    jit_compile: bool = _flag('boolean', False,
            "Compile the training step with XLA. Measured slower on CPU (see BUILD_NOTES.md); worth "
            "trying on GPU.")
    seed: int = _flag('integer', 1234,
            "Random seed for initialization, dropout and data order.")
    dry_run: bool = _flag('boolean', False,
            "Build the model from the flags alone (vocabulary sizes from --src_vocab_size / "
            "--tgt_vocab_size; no data read), print its summary and parameter count, and exit.")

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value, meta = getattr(self, field.name), field.metadata
            if meta["choices"] is not None and value not in meta["choices"]:
                raise ConfigError(f"--{field.name}={value!r}: choose one of {', '.join(meta['choices'])}")
            if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if (meta["lower"] is not None and value < meta["lower"]) or (
                    meta["upper"] is not None and value > meta["upper"]):
                bounds = " and ".join(f"{word} {bound}" for word, bound in (
                    ("at least", meta["lower"]), ("at most", meta["upper"])) if bound is not None)
                raise ConfigError(f"--{field.name}={value}: must be {bounds}")

    def replace(self, **overrides) -> "TrainingConfig":
        """A copy with `overrides`; an unknown name is a ConfigError."""
        unknown = sorted(set(overrides) - set(NAMES))
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(unknown)}")
        return dataclasses.replace(self, **overrides)

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in NAMES}


NAMES = tuple(field.name for field in dataclasses.fields(TrainingConfig))


def flag_name(field) -> str:
    """The command-line flag of a configuration field."""
    return field.metadata["name"] or field.name


MIN_SHORTLIST = 16   # the special tokens and a few more


@dataclasses.dataclass(frozen=True)
class SearchOptions:
    """How beam search runs (nmt_tf.search); the search flags of nmt_tf.export,
    evaluate and visualize are its fields (fixed in an export)."""

    beam_size: int = _flag("integer", 10, "Beam width (paper: 10); 1 runs greedy search.", lower=1)
    n_best: int = _flag(
        "integer", 1, "Hypotheses returned per sentence, best first (at most --beam_size; nmt_tf.translate: "
        "at most the n-best size fixed at export).", lower=1)
    length_penalty: str = _flag(
        "enum", "average", "How finished hypotheses are ranked: average: log p / length^alpha (the papers, "
        "alpha=1); gnmt: log p / ((5 + length) / 6)^alpha (Wu et al. 2016).", choices=["average", "gnmt"])
    length_alpha: float = _flag(
        "float", 1.0, "Exponent alpha of --length_penalty; 0 ranks by raw log-probability.", lower=0.0)
    max_length_ratio: float = _flag(
        "float", 3.0, "Outputs end after this many times the source length, [EOS] counted on both sides "
        "(reference implementation: 3).", lower=0.01)
    min_length_ratio: float = _flag(
        "float", 0.5, "[EOS] is forbidden before this fraction of the source length (reference "
        "implementation: 0.5).", lower=0.0)
    max_length: int = _flag("integer", 256, "Absolute cap on output tokens.", lower=1, name="max_output_length")
    suppress_unk: bool = _flag(
        "boolean", False, "Never generate [UNK] (how the 'no UNK' column of the paper's Table 1 was decoded).")
    shortlist_size: int = _flag(
        "integer", 0, "Search over at least this many candidate target tokens per batch instead of the whole "
        "target vocabulary (Jean et al. 2015): the special tokens, the --shortlist_per_word likeliest "
        "translations of every source token of the batch (all of them: the list grows past this size when "
        "they need more room), then the most frequent tokens; needs the model directory's lexical table "
        "(python -m nmt_tf.shortlist). Faster, and translations may differ (docs/translating.md). 0: the "
        "whole vocabulary.", lower=0)
    shortlist_per_word: int = _flag(
        "integer", 10, "With --shortlist_size: translations per source token taken into the shortlist (by "
        "IBM Model 1 probability).", lower=1)

    def __post_init__(self):
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {self.beam_size}")
        if not 1 <= self.n_best <= self.beam_size:
            raise ValueError(f"n_best must be between 1 and beam_size ({self.beam_size}), got {self.n_best}")
        if self.length_penalty not in ("average", "gnmt"):
            raise ValueError(f"length_penalty must be 'average' or 'gnmt', got {self.length_penalty!r}")
        if self.length_alpha < 0:   # the early stop of beam_search relies on a non-decreasing penalty
            raise ValueError(f"length_alpha must be >= 0, got {self.length_alpha}")
        if self.max_length_ratio <= 0 or self.max_length < 1:
            raise ValueError("max_length_ratio and max_length must be positive")
        if self.shortlist_size and self.shortlist_size < MIN_SHORTLIST:
            raise ValueError(f"shortlist_size must be 0 (no shortlist) or at least {MIN_SHORTLIST}, "
                             f"got {self.shortlist_size}")
        if self.shortlist_per_word < 1:
            raise ValueError(f"shortlist_per_word must be >= 1, got {self.shortlist_per_word}")

# Settings that define the model or its vocabularies: a run resumed in an
# existing model directory must keep them.
FROZEN = (
    "tokenizer", "sentencepiece_type", "joint_vocabulary", "sentencepiece_character_coverage",
    "sentencepiece_sample_size", "src_lang", "tgt_lang", "src_vocab_size", "tgt_vocab_size", "model", "encoder",
    "grconv_size", "embedding_size", "hidden_size", "attention_size", "maxout_size", "layer_norm", "tied_embeddings",
    "optimizer",
)
# Where a run runs, not what it trains: not stored in flags.json.
NOT_STORED = ("dry_run", "distribution", "cpu_devices", "collective_timeout", "worker_input")

DEFAULT_LEARNING_RATES = {"adadelta": 1.0, "adam": 1e-3, "rmsprop": 1e-3, "sgd": 0.1}


def learning_rate(config: TrainingConfig) -> float:
    """--learning_rate, or the default of --optimizer."""
    return config.learning_rate if config.learning_rate is not None else DEFAULT_LEARNING_RATES[config.optimizer]


def path(model_dir: str) -> str:
    """<model_dir>/flags.json."""
    return layout.path(model_dir, layout.FLAGS_JSON)


def save(config: TrainingConfig, model_dir: str) -> None:
    """Writes flags.json (for the tools) and flags.txt (a flagfile to rerun with)."""
    stored = {k: v for k, v in sorted(config.as_dict().items()) if k not in NOT_STORED}
    write_atomically(path(model_dir), json.dumps(stored, indent=2) + "\n")
    lines = []
    for name, value in stored.items():
        if value is None:
            continue
        if isinstance(value, bool):
            lines.append(f"--{name}" if value else f"--no{name}")
        elif isinstance(value, list):
            lines.append(f"--{name}={','.join(value)}")
        else:
            lines.append(f"--{name}={value}")
    write_atomically(layout.path(model_dir, layout.FLAGS_TXT), "".join(line + "\n" for line in lines))


def load(model_dir: str) -> TrainingConfig:
    """Reads `<model_dir>/flags.json` (written by nmt_tf.train) over the defaults;
    settings a newer nmt_tf added keep their defaults, ones it dropped are ignored."""
    stored_path = path(model_dir)
    if not os.path.exists(stored_path):
        raise FileNotFoundError(
            f"{stored_path} not found: --model_dir must be a directory written by nmt_tf.train")
    with open(stored_path, encoding="utf-8") as f:
        stored = json.load(f)
    return TrainingConfig(**{k: v for k, v in stored.items() if k in NAMES})
