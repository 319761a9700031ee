"""The configuration of a training job and of search: typed, with its defaults, checked, in one place.

`TrainingConfig` holds every setting of a run, flat as the command line
is, in three parts: `DataConfig` (corpora, tokenization, batching), the
chosen architecture's `ModelConfig` (nmt_tf.models: each architecture
declares its own, beside its registry entry) and `TrainerConfig`
(optimizer, schedule, budget, checkpoints, evaluation, devices).
`SearchOptions` holds how beam search runs (the search flags of export,
evaluate, visualize), `DecodingConfig` which weights a model directory
decodes with and how (evaluate), `ExportConfig` what nmt_tf.export fixes in
a SavedModel, `ServerConfig` how nmt_tf.serve serves a model. Their fields
are the single source of the defaults, the help texts and the limits
(nmt_tf.core.settings), and nmt_tf.flags turns
each field into the command-line flag of the same name (`--batch_size` is
`TrainingConfig.batch_size`). The library takes these objects and never
reads command-line flags, so it is usable from Python without them, and
importing it defines no flag:

    from nmt_tf import config
    from nmt_tf.training.job import train
    train(config.TrainingConfig(train_src="a.en", train_tgt="a.fr", model_dir="runs/a"))

A run stores its configuration in <model_dir>/config.json by part (`save`;
runs from before it have a flat flags.json, still read); `load` reads it
back over the defaults, so every tool needs only --model_dir. No absl and
no TensorFlow here.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from nmt_tf.core import model_dir as layout
from nmt_tf.core.files import write_atomically
from nmt_tf.core.settings import ConfigError, check_limits, default, flag_name, setting
from nmt_tf.data.tokenizers import TOKENIZERS
from nmt_tf.models import ARCHITECTURES, ModelConfig, names_of

# --lr_schedule's names: the paper's plateau, then the budgeted ones (nmt_tf.training.schedules defines them all).
LR_SCHEDULES = ("plateau", "linear", "cosine", "1-sqrt")

__all__ = ["ConfigError", "DataConfig", "TrainerConfig", "TrainingConfig", "SearchOptions", "DecodingConfig",
           "ExportConfig", "ServerConfig", "flag_name", "load",
           "save", "path", "learning_rate", "NAMES", "FROZEN", "NOT_STORED", "MIN_SHORTLIST"]


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """The corpora, their tokenization and vocabularies, and how they are batched."""

    train_src: str | None = setting('string', None,
            "Training source text: one sentence per line, plain or gzip; several files separated by commas "
            "are read one after another as one corpus (file names must not contain commas).")
    train_tgt: str | None = setting('string', None,
            "Training target text, line-aligned with --train_src (as many files, each as long as its "
            "source file).")
    dev_src: str | None = setting('string', None,
            "Development (validation) source text, for dev loss and early stopping; its batches are "
            "kept in memory after the first dev evaluation.")
    dev_tgt: str | None = setting('string', None,
            "Development target text, line-aligned with --dev_src.")
    src_lang: str = setting('string', 'en',
            "Source language code; selects the tokenizer's apostrophe and abbreviation rules (en, fr, de;"
            " others get generic rules).")
    tgt_lang: str = setting('string', 'fr',
            "Target language code (see --src_lang).")
    tokenizer: str = setting('enum', 'word',
            "word: the paper's Moses-like words with a shortlist of the most frequent words plus [UNK]. "
            "wordpiece: the same words cut into WordPiece sub-words (tensorflow-text "
            "FastWordpieceTokenizer, vocabulary learned by keras-hub compute_word_piece_vocabulary). "
            "sentencepiece: SentencePiece sub-words of the raw text (learned with the sentencepiece "
            "package, applied by tensorflow-text's SentencepieceTokenizer; see --sentencepiece_type, "
            "--joint_vocabulary).", choices=list(TOKENIZERS))
    sentencepiece_type: str = setting('enum', 'unigram',
            "SentencePiece model of --tokenizer=sentencepiece: unigram language model (Kudo 2018) or BPE "
            "(Sennrich et al. 2016).", choices=['unigram', 'bpe'])
    joint_vocabulary: bool = setting('boolean', False,
            "--tokenizer=sentencepiece: learn one vocabulary on source and target text together "
            "(--src_vocab_size pieces; --tgt_vocab_size must be equal), as BPE recipes often do; needed "
            "by --tied_embeddings=all.")
    sentencepiece_character_coverage: float = setting('float', 1.0,
            "Share of the training characters that get pieces of their own; the rest become [UNK] (1.0 "
            "for alphabetic scripts, 0.9995 is usual for Chinese or Japanese).", lower=0.9, upper=1.0)
    sentencepiece_sample_size: int = setting('integer', 1000000,
            "Sentences (a random sample of the training lines) SentencePiece learns from, per model.", lower=1)
    sentencepiece_alpha: float = setting('float', 0.0,
            "Subword regularisation with --tokenizer=sentencepiece (training only): every epoch cuts each "
            "training sentence anew into a sampled segmentation instead of its best one. unigram: a "
            "segmentation among the --sentencepiece_nbest_size best, with probability proportional to "
            "P^alpha (Kudo 2018: 0.1 with 64 best, 0.2-0.5 with all); bpe: each merge dropped with "
            "probability alpha (BPE-dropout, Provilkov et al. 2020: 0.1). The pairs used are decided on "
            "the best segmentation (--max_len), so every epoch has the same pairs. Dev evaluation, "
            "exports and translation use the best segmentation. Not with --prepared_shards. 0: off.",
            lower=0.0, upper=1.0)
    sentencepiece_nbest_size: int = setting('integer', 64,
            "--sentencepiece_alpha with a unigram model: sample among this many best segmentations (-1: "
            "all of them). 0 or 1 would not sample, for bpe either.", lower=-1)
    src_vocab_size: int = setting('integer', 30000,
            "Source vocabulary size, the special tokens [PAD] [UNK] [BOS] [EOS] included (paper: 30,000).", lower=5)
    tgt_vocab_size: int = setting('integer', 30000,
            "Target vocabulary size, special tokens included (paper: 30,000).", lower=5)
    max_len: int = setting('integer', 50,
            "Training pairs with more tokens than this on either side are skipped and counted (paper: 30 "
            "or 50 words). Tokens are words, or sub-words with --tokenizer=wordpiece / sentencepiece.", lower=1)
    batch_size: int = setting('integer', 80,
            "Batch size, in sentence pairs (--batch_type=sentences; paper: 80) or in padded tokens of the"
            " longer side (--batch_type=tokens).", lower=1)
    batch_type: str = setting('enum', 'sentences',
            "Unit of --batch_size.", choices=['sentences', 'tokens'])
    pool_size: int = setting('integer', 1600,
            "Pairs read, sorted by length and cut into batches together, as in the paper (1,600 pairs = "
            "20 batches of 80); larger pools give batches of more similar length.", lower=1)
    prepared_shards: int = setting('integer', 0,
            "Tokenize the training corpus once into this many TFRecord shards in <model_dir>/prepared/ "
            "(made at the first start, made again when the corpus files, the vocabularies or --max_len "
            "change) and read them every epoch instead of the text: for corpora of hundreds of millions "
            "of words. 0: tokenize the text in every epoch.", lower=0)
    shuffle_buffer: int = setting('integer', 200000,
            "Number of sentence pairs held in memory for shuffling the training stream; memory use does "
            "not grow with the corpus.", lower=1)

    def __post_init__(self):
        check_limits(self)


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    """How the model is trained: the run's folder, the optimizer and its
    schedule, the budget, checkpoints, evaluation, precision and devices;
    the defaults are the paper's (Adadelta rho = 0.95, eps = 1e-6, gradient
    norm clipped at 1)."""

    model_dir: str | None = setting('string', None,
            "Directory for vocabularies, resolved flags, checkpoints, TensorBoard logs and the training "
            "summary. Rerunning with the same directory resumes.")
    init_from: str | None = setting('string', None,
            "Fine-tuning: start a new run from the weights of a trained model, a model directory or a "
            "preset's name or folder. Its model and vocabulary flags and its vocabularies are kept (new "
            "words become pieces, or [UNK] with words, counted in the log); data and training flags come "
            "from this command; the optimizer and the learning-rate schedule start afresh. Read only when"
            " --model_dir starts (a resume continues its own run).")
    init_checkpoint: str = setting('string', '',
            "--init_from's weights: best, last, averaged or a checkpoint path (default: averaged if it "
            "has an averaged checkpoint, as a preset has, else best).")
    freeze: list[str] = setting('list', [],
            "Parts of the model kept fixed while training (with --init_from): embeddings (with "
            "--tied_embeddings=all also the output layer's matrix), encoder.")
    optimizer: str = setting('enum', 'adadelta',
            "Optimizer (paper: Adadelta).", choices=['adadelta', 'adam', 'sgd', 'rmsprop'])
    learning_rate: float | None = setting('float', None,
            "Learning rate; default per optimizer: adadelta 1.0 (paper), adam 0.001, rmsprop 0.001, sgd "
            "0.1.", lower=0.0)
    warmup_steps: int = setting('integer', 0,
            "Raise the learning rate linearly from 0 to --learning_rate over this many first updates (0: "
            "none, as in the paper).", lower=0)
    lr_schedule: str = setting('enum', 'plateau',
            "Learning rate after the warm-up. plateau: --learning_rate, multiplied by --decay_factor when"
            " dev stops improving (paper: constant). linear / cosine / 1-sqrt: budgeted training (Li et al."
            " 2020), the rate falls linearly / along a half cosine / as 1 - sqrt(progress) (Hägele et al. "
            "2024) to --final_lr_fraction of --learning_rate exactly at the end of the budget, --max_steps "
            "or --max_hours (hours are turned into updates from the measured seconds per update, "
            "re-estimated at every update); needs one of them and --decay_factor=1.",
            choices=list(LR_SCHEDULES))
    final_lr_fraction: float = setting('float', 0.0,
            "--lr_schedule=linear / cosine / 1-sqrt: the fraction of --learning_rate reached at the end of the "
            "budget.", lower=0.0, upper=1.0)
    lr_decay_fraction: float = setting('float', 1.0,
            "--lr_schedule=linear / cosine / 1-sqrt: the share of the budget (after the warm-up) over which the "
            "rate decays; before it the rate stays at --learning_rate (warm-up, stable, decay; e.g. 0.2 "
            "decays over the last fifth). 1: the decay starts right after the warm-up.", above=0.0, upper=1.0)
    adadelta_rho: float = setting('float', 0.95,
            "Adadelta decay rate rho (paper: 0.95).")
    adadelta_epsilon: float = setting('float', 1e-06,
            "Adadelta epsilon (paper: 1e-6).")
    clip_norm: float = setting('float', 1.0,
            "Rescale the gradient when its global L2 norm exceeds this (paper: 1). 0 disables.", lower=0.0)
    weight_decay: float = setting('float', 0.0,
            "Decoupled weight decay (Loshchilov & Hutter 2019, AdamW): before every update each weight "
            "matrix and embedding table w becomes w - learning rate * this * w (biases, layer-norm gains "
            "and other vectors are left alone), e.g. 0.01 with Adam; 0: none. Scaled by the current "
            "learning rate, so it follows the warm-up and schedule.", lower=0.0)
    ema_decay: float = setting('float', 0.0,
            "Keep an exponential moving average of the weights (Polyak averaging, Marian's "
            "--exponential-smoothing) with this decay per update, e.g. 0.9999; 0: none. The decay is "
            "min(this, (1 + t) / (10 + t)) at update t, so a short run's average forgets its start. Dev "
            "evaluations and best/ (what evaluate, translate, export and --average_checkpoints read) use "
            "the averaged weights; checkpoints/ keep both for resuming. Needs a dev set.", lower=0.0, upper=1.0)
    early_dropout_epochs: int = setting('integer', 0,
            "Late dropout (Liu et al. 2023): the first this many epochs train with every dropout rate "
            "(--dropout, --annotation_dropout, --recurrent_dropout, --source_word_dropout, "
            "--target_word_dropout) times --early_dropout_scale, the later ones with the full rates: a model "
            "learns faster with less dropout and overfits later with more. 0: the full rates from the start.",
            lower=0)
    early_dropout_scale: float = setting('float', 0.0,
            "--early_dropout_epochs: the factor on every dropout rate in those epochs (0: none, Liu et al.'s "
            "late dropout; e.g. 0.75 turns 0.4 into 0.3).", lower=0.0, upper=1.0)
    max_epochs: int = setting('integer', 10,
            "Stop after this many passes over the training data.", lower=1)
    max_steps: int = setting('integer', 0,
            "Stop after this many updates in total (0: no limit).", lower=0)
    max_hours: float = setting('float', 0.0,
            "Stop after this many hours of training, summed over resumed runs: the updates' own time, not dev "
            "evaluations, checkpoints or start-up (0: no limit).", lower=0.0)
    checkpoint_every_steps: int = setting('integer', 500,
            "Save a checkpoint every this many updates (and at the end of every epoch and of the run). A "
            "killed run loses at most this many updates.", lower=1)
    keep_checkpoints: int = setting('integer', 3,
            "Number of recent checkpoints kept (the best ones by dev score are kept apart, see "
            "--keep_best_checkpoints).", lower=1)
    keep_best_checkpoints: int = setting('integer', 1,
            "Number of checkpoints with the best dev scores kept in best/ (ranked in best/scores.json; "
            "more than one for averaging the best, --average_from=best).", lower=1)
    eval_every_steps: int = setting('integer', 0,
            "Compute the dev loss every this many updates (0: at the end of every epoch).", lower=0)
    early_stopping_metric: str = setting('enum', 'bleu',
            "Dev metric that selects the best checkpoint (best/), decays the learning rate and stops "
            "training early (bleu needs --dev_bleu).", choices=['bleu', 'loss'])
    dev_bleu: bool = setting('boolean', True,
            "At every dev evaluation, also translate the dev set and log its BLEU (sacreBLEU, detokenized"
            " output against the raw reference) and attention heatmaps.")
    dev_bleu_beam_size: int = setting('integer', 1,
            "Beam width for dev BLEU during training (1: greedy search).", lower=1)
    dev_bleu_sentences: int = setting('integer', 0,
            "Translate only the first this many dev pairs for dev BLEU (0: all).", lower=0)
    attention_examples: int = setting('integer', 4,
            "Dev sentences (the first ones) whose attention heatmaps go to TensorBoard at every "
            "evaluation.", lower=0)
    decay_factor: float = setting('float', 1.0,
            "Multiply the learning rate by this after --decay_patience dev evaluations without "
            "improvement (1: constant learning rate, as in the paper).", above=0.0, upper=1.0)
    decay_patience: int = setting('integer', 2,
            "Dev evaluations without improvement before each learning-rate decay.", lower=1)
    patience: int = setting('integer', 10,
            "Stop after this many dev evaluations without improvement (0: never stop early).", lower=0)
    log_every_steps: int = setting('integer', 50,
            "Write training scalars to TensorBoard every this many updates.", lower=1)
    mixed_precision: str = setting('enum', 'auto',
            "Keras dtype policy of training: auto (the default) is mixed_bfloat16 on a CPU with bfloat16 "
            "instructions (avx512_bf16 or amx_bf16) and no GPU, where it trained 1.3-1.5x faster with a "
            "dev-loss curve within 1.5 % of float32's, and float32 elsewhere, decided again at every "
            "start and logged; none is float32; mixed_bfloat16 / mixed_float16 compute in bfloat16 / "
            "float16 with float32 weights (mixed_float16 adds loss scaling; use it on GPUs without bf16)."
            " The weights and checkpoints are float32 either way. nmt_tf.export and nmt_tf.evaluate take "
            "it too, for the search (default there: float32, whatever the model was trained in; an export"
            " keeps it, and on a CPU without bfloat16 instructions a bfloat16 export runs emulated and "
            "slower).", choices=['none', 'auto', 'mixed_bfloat16', 'mixed_float16'])
    distribution: str = setting('enum', 'none',
            "tf.distribute strategy of training: none (one device), mirrored (one process, a replica per "
            "GPU; per logical CPU device with --cpu_devices), multi_worker (one process per machine, the "
            "cluster in the TF_CONFIG environment variable). --batch_size is the global batch; "
            "docs/training.md, 'Training on several devices or machines'.", choices=['none', 'mirrored', 'multi_worker'])
    cpu_devices: int = setting('integer', 0,
            "--distribution=mirrored on a machine without GPUs: split the CPU into this many logical "
            "devices, one replica each (0: as TensorFlow finds it). For trying distribution out; not "
            "faster.", lower=0)
    collective_timeout: int = setting('integer', 0,
            "--distribution=multi_worker: seconds a gradient all-reduce may wait for the other workers "
            "before the job stops with an error (0: no limit; a worker that died is also detected by "
            "TensorFlow's coordination service).", lower=0)
    heartbeat_timeout: int = setting('integer', 30,
            "--distribution=multi_worker: seconds TensorFlow's coordination service waits for a "
            "worker's heartbeat before it stops the job as one that lost a worker (TensorFlow's own "
            "default, 10, once stopped a sound job on a busy 2-core machine; a dead worker is found "
            "after about this long).", lower=1)
    worker_input: str = setting('enum', 'auto',
            "--distribution=multi_worker: what each worker reads. own_data: only its own part of the data"
            " (its prepared shards, or every N-th line of the text) and its replicas' batches of it; "
            "needs --batch_type=sentences. global_batches: the whole corpus, keeping its replicas' shares"
            " of every global batch, so the updates are those of one process (each worker reads and "
            "tokenizes everything). auto: own_data with sentence batches, global_batches with token "
            "batches.", choices=['auto', 'own_data', 'global_batches'])
    jit_compile: bool = setting('boolean', False,
            "Compile the training step with XLA. Measured slower on CPU (see BUILD_NOTES.md); worth "
            "trying on GPU.")
    seed: int = setting('integer', 1234,
            "Random seed for initialization, dropout and data order.")
    dry_run: bool = setting('boolean', False,
            "Build the model from the flags alone (vocabulary sizes from --src_vocab_size / "
            "--tgt_vocab_size; no data read), print its summary and parameter count, and exit.")

    def __post_init__(self):
        check_limits(self)


# Every architecture's configuration, each once (TrainingConfig has all their fields).
MODEL_CONFIGS = tuple(dict.fromkeys(architecture.config for architecture in ARCHITECTURES.values()))


@dataclasses.dataclass(frozen=True)
class TrainingConfig(DataConfig, *MODEL_CONFIGS, TrainerConfig):
    """Every setting of a training job, flat as the command line is: the
    fields of DataConfig, of every architecture's ModelConfig and of
    TrainerConfig (inherited), and `model`, the architecture. Its parts:
    `data()`, `model_config()` (the chosen architecture's settings only) and
    `trainer()`. Settings of other architectures than `model` are ignored
    (an architecture may refuse one that signals a mistake: --encoder=grconv
    with RNNsearch)."""

    model: str = setting('enum', 'rnnsearch',
            "Model architecture: rnnsearch (attention; Bahdanau et al. 2015) or rnnencdec (a fixed-length"
            " summary of the source; Cho et al. 2014a).", choices=list(ARCHITECTURES))

    def __post_init__(self):
        check_limits(self)
        self.model_config()

    def model_config(self) -> ModelConfig:
        """The chosen architecture's configuration (what nmt_tf.models.build_model builds)."""
        config_class = ARCHITECTURES[self.model].config
        own = names_of(config_class)
        model_config = _part(self, config_class)
        model_config.refuse({field.name: getattr(self, field.name) for field in _MODEL_FIELDS
                             if field.name not in own and getattr(self, field.name) != default(field)})
        return model_config

    def data(self) -> DataConfig:
        return _part(self, DataConfig)

    def trainer(self) -> TrainerConfig:
        return _part(self, TrainerConfig)

    def replace(self, **overrides) -> "TrainingConfig":
        """A copy with `overrides`; an unknown name is a ConfigError."""
        unknown = sorted(set(overrides) - set(NAMES))
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(unknown)}")
        return dataclasses.replace(self, **overrides)

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in NAMES}


def _part(config: TrainingConfig, part_class):
    """The part of `config` that `part_class` (a part's dataclass) holds."""
    return part_class(**{name: getattr(config, name) for name in names_of(part_class)})


NAMES = tuple(field.name for field in dataclasses.fields(TrainingConfig))
# The fields of every architecture's configuration, each once.
_MODEL_FIELDS = tuple({field.name: field for config_class in MODEL_CONFIGS
                       for field in dataclasses.fields(config_class)}.values())
_MODEL_NAMES = frozenset(field.name for field in _MODEL_FIELDS)


MIN_SHORTLIST = 16   # the special tokens and a few more


@dataclasses.dataclass(frozen=True)
class SearchOptions:
    """How beam search runs (nmt_tf.inference.search); the search flags of nmt_tf.export,
    evaluate and visualize are its fields (fixed in an export)."""

    beam_size: int = setting("integer", 10, "Beam width (paper: 10); 1 runs greedy search.", lower=1)
    n_best: int = setting(
        "integer", 1, "Hypotheses returned per sentence, best first (at most --beam_size; nmt_tf.translate: "
        "at most the n-best size fixed at export).", lower=1)
    length_penalty: str = setting(
        "enum", "average", "How finished hypotheses are ranked: average: log p / length^alpha (the papers, "
        "alpha=1); gnmt: log p / ((5 + length) / 6)^alpha (Wu et al. 2016).", choices=["average", "gnmt"])
    length_alpha: float = setting(
        "float", 1.0, "Exponent alpha of --length_penalty; 0 ranks by raw log-probability.", lower=0.0)
    max_length_ratio: float = setting(
        "float", 3.0, "Outputs end after this many times the source length, [EOS] counted on both sides "
        "(reference implementation: 3).", lower=0.01)
    min_length_ratio: float = setting(
        "float", 0.5, "[EOS] is forbidden before this fraction of the source length (reference "
        "implementation: 0.5).", lower=0.0)
    max_length: int = setting("integer", 256, "Absolute cap on output tokens.", lower=1, name="max_output_length")
    suppress_unk: bool = setting(
        "boolean", False, "Never generate [UNK] (how the 'no UNK' column of the paper's Table 1 was decoded).")
    shortlist_size: int = setting(
        "integer", 0, "Search over at least this many candidate target tokens per batch instead of the whole "
        "target vocabulary (Jean et al. 2015): the special tokens, the --shortlist_per_word likeliest "
        "translations of every source token of the batch (all of them: the list grows past this size when "
        "they need more room), then the most frequent tokens; needs the model directory's lexical table "
        "(python -m nmt_tf.shortlist). Faster, and translations may differ (docs/translating.md). 0: the "
        "whole vocabulary.", lower=0)
    shortlist_per_word: int = setting(
        "integer", 10, "With --shortlist_size: translations per source token taken into the shortlist (by "
        "IBM Model 1 probability).", lower=1)
    term_placement: float = setting(
        "float", 2.0, "How strongly a required term given with its source words ('dog|||toutou', and every "
        "--glossary entry) is written where the attention is on them rather than appended: the weight of the "
        "placement costs in the beam's ranking (chosen on val; docs/translating.md, 'Placement'). 0: Post & "
        "Vilar's placement anywhere.", lower=0.0)

    def __post_init__(self):
        check_limits(self)      # the choices and bounds above (alpha >= 0: beam search's early stop needs it)
        if self.n_best > self.beam_size:
            raise ConfigError(f"--n_best={self.n_best}: must be at most --beam_size ({self.beam_size})")
        if self.shortlist_size and self.shortlist_size < MIN_SHORTLIST:
            raise ConfigError(f"--shortlist_size={self.shortlist_size}: must be 0 (no shortlist) or at least "
                              f"{MIN_SHORTLIST}")


PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")     # Keras dtype policies a search computes in


@dataclasses.dataclass(frozen=True)
class DecodingConfig:
    """How a model directory's weights become a translation graph: which
    weights, the search, the longest input, [UNK] replacement and the
    precision. nmt_tf.evaluate decodes a model directory with it, and
    nmt_tf.export fixes it in a SavedModel (`ExportConfig`). The fields that
    are settings are flags of those tools (`max_input_length` also of the
    tools that translate)."""

    search: SearchOptions = dataclasses.field(default_factory=SearchOptions)
    # A nmt_tf.core.checkpoints.WeightsChoice, or a --checkpoint value (best, last, averaged or a path).
    weights: Any = "best"
    # The Keras dtype policy the search computes in (PRECISIONS; nmt_tf.core.precision resolves --mixed_precision).
    precision: str = "float32"
    max_input_length: int = setting(
        "integer", 100, "Longer inputs are cut to this many tokens (the 'truncated' output says so); bounds the "
        "work one sentence can cause.", lower=1)
    replace_unk: bool = setting(
        "boolean", False, "Replace every generated [UNK] by the source word it attended to most (Luong et al. "
        "2015; Jean et al. 2015), or by its translation in --unk_dictionary; for word models. The target_tokens "
        "output keeps [UNK].")
    unk_dictionary: str | None = setting(
        "string", None, "With --replace_unk: a 'source<TAB>target' file; an attended source word found in it is "
        "replaced by its translation instead of being copied (an export keeps the file as an asset).")

    def __post_init__(self):
        check_limits(self)
        if not isinstance(self.search, SearchOptions):
            raise ConfigError(f"search: a SearchOptions, not {type(self.search).__name__}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision {self.precision!r}: choose one of {', '.join(PRECISIONS)}")
        if self.unk_dictionary and not self.replace_unk:
            raise ConfigError("--unk_dictionary goes with --replace_unk.")


@dataclasses.dataclass(frozen=True)
class ExportConfig(DecodingConfig):
    """What nmt_tf.export writes (nmt_tf.exporting.saved_model.export): the decoding it
    fixes in the SavedModel, and how a search step's matrices are stored."""

    freeze_step_weights: bool = setting(
        "boolean", True,
        "Store the matrices of a search step (the output layer in column blocks, fused and sliced decoder "
        "matrices) and the encoder GRUs' split recurrent matrices as variables of their own instead of building "
        "them from the model's weights on every request: one-sentence requests answer about a fifth faster, and "
        "the export takes about 60% more bytes (BUILD_NOTES.md, 'Serving latency').")
    freeze_token_products: bool = setting(
        "boolean", True,
        "With --freeze_step_weights: also store, for every target word y, the two products a search step takes "
        "of its embedding (the decoder GRU's input term W E y + b, layer-normalised with --layer_norm, and the "
        "readout's V_o E y + b_o), so that a step looks the previous words' terms up instead of multiplying: "
        "batched beam search about 6% and one-sentence requests about 3-5% faster, for target vocabulary x "
        "(3 x hidden_size + 2 x maxout_size - embedding_size) more values (the default Multi30k model: 151 "
        "instead of 82 MB; BUILD_NOTES.md, 'Decoding speed').")

    max_beam_size: int = setting(
        "integer", 0,
        "The widest beam a request of the translate_with_options signature may ask for (it chooses its "
        "beam_size, n_best and length_alpha; the export's --beam_size, --n_best and --length_alpha are its "
        "defaults). One search is built per width, so a wider bound makes the export take longer. 0: "
        "--beam_size.", lower=0)

    def __post_init__(self):
        super().__post_init__()
        if self.max_beam_size and self.max_beam_size < self.search.beam_size:
            raise ConfigError(f"--max_beam_size={self.max_beam_size}: must be 0 or at least --beam_size "
                              f"({self.search.beam_size})")
        if self.freeze_token_products and not self.freeze_step_weights:
            raise ConfigError("--freeze_token_products needs --freeze_step_weights (the products are stored "
                              "with the frozen step matrices).")


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """How nmt_tf.serve serves one model (nmt_tf.serving.server.start): the model and
    which of its versions, the ports and what they take, batching, TLS and
    threads. Its fields are nmt_tf.serve's flags; `model_name` and `preset`
    are also flags of the tools that send requests or use presets."""

    model_name: str = setting('string', 'nmt', "Model name in TF Serving requests (ModelSpec.name).")
    preset: str | None = setting('string', None,
            "A model shipped with nmt_tf, by name (python -m nmt_tf.presets --list; multi30k_en_fr: Multi30k "
            "English->French), or a preset folder: its SavedModel is built on first use and cached, then used as "
            "--saved_model would be.")
    model_base_path: str | None = setting('string', None,
            "Directory holding numbered versions: SavedModels (nmt_tf.export's --export_dir), or with "
            "--runtime=litert LiteRT model folders (nmt_tf.export --format=litert).")
    runtime: str = setting('enum', 'tensorflow',
            "What runs the model: tensorflow (a SavedModel: --saved_model, a server's versions, or --preset's) "
            "or litert (a LiteRT model folder written by nmt_tf.export --format=litert: --litert_model, a "
            "server's versions, or --preset's, built on first use; TensorFlow is not imported: docs/litert.md). "
            "nmt_tf.serve --runtime=litert answers serving_default only (no score, prefix or constrained "
            "signatures).", choices=["tensorflow", "litert"])
    litert_weights: str = setting('enum', 'int8',
            "With --runtime=litert and --preset: the storage of the LiteRT model's weights (int8: "
            "dynamic-range quantisation, the smallest and fastest on CPUs).", choices=["int8", "float16", "float32"])
    litert_threads: int = setting('integer', 1,
            "With --runtime=litert: CPU threads of each LiteRT interpreter. nmt_tf.serve runs one interpreter "
            "per request in flight, up to one per core.", lower=1)
    model_config_file: str | None = setting('string', None,
            "TF Serving's model config file (a ModelServerConfig text proto, as export/models.config) with one "
            "model: its name, base_path (relative: to the file's folder), model_version_policy and "
            "version_labels; instead of --model_name, --model_base_path and --model_version_policy.")
    model_version_policy: str = setting('string', 'latest',
            "Which versions under --model_base_path are served, as TF Serving's model_version_policy: latest "
            "(the highest), latest=N (the N highest), all, or specific=V1,V2,... A request without a version "
            "gets the highest served.")
    port: int = setting('integer', 8500, "gRPC port (TF Serving's default is 8500).")
    rest_api_port: int = setting('integer', 0,
            "Port of TF Serving's REST API (/v1/models/...), served besides gRPC; 0 (the default, as in TF "
            "Serving): no REST API. TF Serving's Docker image uses 8501.", lower=0)
    host: str = setting('string', '0.0.0.0', "Address to listen on.")
    ssl_config_file: str | None = setting('string', None,
            "TF Serving's SSLConfig text proto (server_key, server_cert, custom_ca: PEM text; client_verify): "
            "gRPC and the REST API (HTTPS) then take TLS connections only; client_verify requires client "
            "certificates signed by custom_ca. Without it both ports speak plain text, as TF Serving's do.")
    poll_seconds: float = setting('float', 2.0, "How often to look for a new version.", lower=0.1)
    threads: int = setting('integer', 8,
            "Concurrent requests served, by gRPC and by the REST API each (with --enable_batching at least "
            "max_batch_size x num_batch_threads, at most 512: requests waiting for their batch hold a thread "
            "but no CPU). Without batching, gRPC admits 4 x --threads calls, of which at most min(--threads, "
            "cores) decode at once, in turns taken client address by client address; one address holds at most "
            "3/4 of the admitted calls.", lower=1)
    enable_batching: bool = setting('boolean', False,
            "Join concurrent Predict requests of the same version, signature and outputs into one call of the "
            "signature and split the replies (TF Serving's flag; nmt_tf.serving.batching). Parameters from "
            "--batching_parameters_file, else TF Serving's defaults (max_batch_size 1000, batch_timeout_micros "
            "0, max_enqueued_batches 10, num_batch_threads one per core).")
    batching_parameters_file: str | None = setting('string', None,
            "TF Serving's BatchingParameters text proto (max_batch_size, batch_timeout_micros, "
            "max_enqueued_batches, num_batch_threads, allowed_batch_sizes, pad_variable_length_inputs, "
            "thread_pool_name), as in export/batching_parameters.txt; implies --enable_batching.")
    rest_max_connections: int = setting('integer', 64,
            "REST connections open at once (being read, waiting for a --threads worker, or answered); one more "
            "is answered 503 at once. A request is read whole before a worker takes it, so slow or idle clients "
            "hold only their connection, for at most 30 s of headers and 120 s of body.", lower=1)
    rest_max_connections_per_client: int = setting('integer', 16,
            "REST connections one client address may hold open at once (as --rest_max_connections counts "
            "them); one more from it is answered 503 at once, so that one client's idle, slow or stalled "
            "(TLS) connections leave room for others. Behind a reverse proxy every client has the proxy's "
            "address: set it to --rest_max_connections there.", lower=1)
    rest_allowed_hosts: list[str] = setting('list', [],
            "Host names the REST API and the page answer (the Host header without its port, e.g. "
            "localhost,127.0.0.1,mt.example.com); another Host is refused 403, which stops a site that points "
            "its name at this server (DNS rebinding). Empty (the default): any Host. Whatever the setting, a "
            "request other than GET from a page of another origin (a browser's Origin header that is not the "
            "Host) is refused 403.")
    max_message_mb: float = setting('float', 32.0,
            "Largest request or response message (gRPC) and largest REST request body, in MiB.", lower=0.01)
    max_batch_size: int = setting('integer', 1024, "Most sentences one request may carry.", lower=1)
    max_search_work: int = setting('integer', 64 * 10 * 256,
            "Most hypothesis-steps one translation request's search may take: its sentences x the beam size x "
            "the longest output the search may reach for them (min(max_length, max_length_ratio x source "
            "tokens), the export's limits; the source tokens counted before the search, the export's way). "
            "A request over it is refused with INVALID_ARGUMENT before any work. The default, 64 x 10 x 256, "
            "lets through the 64-line batches nmt_tf.translate --server sends at beam 10 however long the "
            "lines; a step of a large batch takes ~0.17 ms on the 2-core reference machine (BUILD_NOTES.md, "
            "'Bounded work').", lower=1)
    onednn: bool = setting('boolean', False,
            "Use TensorFlow's oneDNN CPU kernels (sets TF_ENABLE_ONEDNN_OPTS for this process). Off by "
            "default: on the 2-core reference machine one-sentence requests are faster with TensorFlow's Eigen "
            "kernels, batches of 64 faster with oneDNN (BUILD_NOTES.md, 'Serving latency').")
    intra_op_threads: int = setting('integer', 1,
            "Threads one TensorFlow op may use (intra-op parallelism; 0: TensorFlow's default, one per core). 1"
            " by default: one-sentence requests are fastest that way, the decoder's small matmuls losing more "
            "to splitting than they gain, while independent ops (the output layer's column blocks, the next "
            "step's state products) run side by side on the inter-op threads (BUILD_NOTES.md, 'Serving "
            "latency'). TF Serving's flag: --tensorflow_intra_op_parallelism.", lower=0)
    inter_op_threads: int = setting('integer', 0,
            "TensorFlow ops run at once (inter-op parallelism; 0: TensorFlow's default, one per core). TF "
            "Serving's flag: --tensorflow_inter_op_parallelism.", lower=0)

    def __post_init__(self):
        check_limits(self)
        if sum(bool(x) for x in (self.model_base_path, self.preset, self.model_config_file)) != 1:
            raise ConfigError("give one of --model_base_path, --preset (a model shipped with nmt_tf) or "
                              "--model_config_file.")


# Settings that define the model or its vocabularies: a run resumed in an
# existing model directory must keep them.
FROZEN = (
    "tokenizer", "sentencepiece_type", "joint_vocabulary", "sentencepiece_character_coverage",
    "sentencepiece_sample_size", "src_lang", "tgt_lang", "src_vocab_size", "tgt_vocab_size", "model", "encoder",
    "encoder_layers", "decoder", "decoder_transition_depth", "grconv_size", "embedding_size", "hidden_size",
    "attention_size", "maxout_size", "layer_norm", "tied_embeddings", "optimizer",
)
# Where a run runs, not what it trains: not stored in config.json.
NOT_STORED = ("dry_run", "distribution", "cpu_devices", "collective_timeout", "heartbeat_timeout", "worker_input")

DEFAULT_LEARNING_RATES = {"adadelta": 1.0, "adam": 1e-3, "rmsprop": 1e-3, "sgd": 0.1}


def learning_rate(config: TrainingConfig) -> float:
    """--learning_rate, or the default of --optimizer."""
    return config.learning_rate if config.learning_rate is not None else DEFAULT_LEARNING_RATES[config.optimizer]


def path(model_dir: str) -> str:
    """The stored configuration of a run: <model_dir>/config.json, or the
    flags.json of a run from before config.json (nmt_tf < 2026-11-27) when
    only that exists."""
    stored = layout.path(model_dir, layout.CONFIG_JSON)
    before = layout.path(model_dir, layout.FLAGS_JSON)
    return before if os.path.exists(before) and not os.path.exists(stored) else stored


def stored_sections(config: TrainingConfig) -> dict[str, dict[str, Any]]:
    """What config.json holds: {"data": ..., "model": ..., "trainer": ...},
    each {flag name: value}; "model" has `model` (the architecture) and that
    architecture's settings only; where the run runs (NOT_STORED) is left out."""
    model = {"model": config.model, **dataclasses.asdict(config.model_config())}
    sections = {"data": dataclasses.asdict(config.data()), "model": model,
                "trainer": dataclasses.asdict(config.trainer())}
    return {name: {k: v for k, v in section.items() if k not in NOT_STORED} for name, section in sections.items()}


# config.json's layout: 1 since nmt_tf 0.2.0 (the sections data, model, trainer and this number); a file
# without the number is one of 0.1.0, read the same way. A newer number is refused with the fix named.
CONFIG_FORMAT = 1


def save(config: TrainingConfig, model_dir: str) -> None:
    """Writes config.json (for the tools) and flags.txt (a flagfile to rerun with)."""
    sections = stored_sections(config)
    write_atomically(layout.path(model_dir, layout.CONFIG_JSON),
                     json.dumps({"format_version": CONFIG_FORMAT, **sections}, indent=2) + "\n")
    lines = []
    for name, value in sorted(item for section in sections.values() for item in section.items()):
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
    """Reads a run's stored configuration (`path`: config.json, or an older
    run's flat flags.json) over the defaults; settings a newer nmt_tf added
    keep their defaults, ones it dropped are ignored, and so are an older
    flags.json's settings of architectures other than the run's (they had
    no effect)."""
    stored_path = path(model_dir)
    if not os.path.exists(stored_path):
        raise FileNotFoundError(
            f"{stored_path} not found: --model_dir must be a directory written by nmt_tf.train")
    damaged = lambda e: ConfigError(f"{stored_path} is damaged ({type(e).__name__}: {e}): the model directory's "
                                    "settings cannot be read; restore the file from a copy of the run")
    try:
        with open(stored_path, encoding="utf-8") as f:
            stored = json.load(f)
    except ValueError as e:          # JSONDecodeError, UnicodeDecodeError
        raise damaged(e) from None
    version = stored.pop("format_version", 0) if isinstance(stored, dict) else 0
    if not isinstance(version, int) or version > CONFIG_FORMAT:
        raise ConfigError(f"{stored_path} has format_version {version!r}: it was written by a newer nmt_tf (this "
                          f"one reads up to {CONFIG_FORMAT}); upgrade nmt_tf to use this run")
    try:
        if os.path.basename(stored_path) == layout.CONFIG_JSON:
            stored = {k: v for section in stored.values() for k, v in section.items()}
        if not isinstance(stored, dict):
            raise ValueError("not a JSON object")
    except (ValueError, AttributeError, TypeError) as e:      # a wrong shape
        raise damaged(e) from None
    own = names_of(ARCHITECTURES[stored.get("model", TrainingConfig.model)].config)
    stored = {k: v for k, v in stored.items() if k in own or k not in _MODEL_NAMES}
    return TrainingConfig(**{k: v for k, v in stored.items() if k in NAMES})
