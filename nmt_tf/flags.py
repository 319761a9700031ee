"""Command-line flags of the nmt_tf tools, each defined once.

Every CLI is ``python -m nmt_tf.<tool> [--flagfile=FILE] [--flag=value ...]``.
Flags are read left to right, so flags given after ``--flagfile`` override
the file's values. An unknown flag is an error (absl), and so is a flag of
another tool (`tool_flags` declares which of this module's flags a tool
takes; `start_cli` refuses the others, and the tool's --help lists them).

The training tool writes the resolved values of all flags below into
``<model_dir>/flags.json``; the other tools read them back from there, so
they need only ``--model_dir``. `Config` is that set of values as an object:
`default_config()` gives the defaults of the definitions below, which is also
what tests use.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from absl import app, flags, logging

from nmt_tf import model_dir as layout
from nmt_tf import startup
from nmt_tf.files import write_atomically
from nmt_tf.hardware import resolve_precision
from nmt_tf.models import ARCHITECTURES
from nmt_tf.tokenizers import TOKENIZERS

FLAGS = flags.FLAGS


def _help_exits_with_0(flag_class) -> None:
    """absl ends --help, --helpshort, --helpfull and --helpxml with exit code 1,
    as if help were an error; asked for, it is a success (0), as with argparse
    and GNU tools. Flag errors keep absl's 1."""
    parse = flag_class.parse

    def parse_then_succeed(self, arg):
        try:
            parse(self, arg)
        except SystemExit as e:
            raise SystemExit(0) from e

    flag_class.parse = parse_then_succeed


for _help_flag in (app.HelpFlag, app.HelpfullFlag, app.HelpXMLFlag):    # HelpshortFlag is a HelpFlag
    _help_exits_with_0(_help_flag)

# ---------------------------------------------------------------- data
flags.DEFINE_string("train_src", None, "Training source text: one sentence per line, plain or gzip.")
flags.DEFINE_string("train_tgt", None, "Training target text, line-aligned with --train_src.")
flags.DEFINE_string("dev_src", None, "Development (validation) source text, for dev loss and early stopping.")
flags.DEFINE_string("dev_tgt", None, "Development target text, line-aligned with --dev_src.")
flags.DEFINE_string("src_lang", "en", "Source language code; selects the tokenizer's apostrophe and abbreviation rules (en, fr, de; others get generic rules).")
flags.DEFINE_string("tgt_lang", "fr", "Target language code (see --src_lang).")
flags.DEFINE_enum("tokenizer", "word", list(TOKENIZERS),
                  "word: the paper's Moses-like words with a shortlist of the most frequent words plus [UNK]. "
                  "wordpiece: the same words cut into WordPiece sub-words (tensorflow-text FastWordpieceTokenizer, "
                  "vocabulary learned by keras-hub compute_word_piece_vocabulary). "
                  "sentencepiece: SentencePiece sub-words of the raw text (learned with the sentencepiece package, "
                  "applied by tensorflow-text's SentencepieceTokenizer; see --sentencepiece_type, --joint_vocabulary).")
flags.DEFINE_enum("sentencepiece_type", "unigram", ["unigram", "bpe"],
                  "SentencePiece model of --tokenizer=sentencepiece: unigram language model (Kudo 2018) or BPE "
                  "(Sennrich et al. 2016).")
flags.DEFINE_boolean("joint_vocabulary", False,
                     "--tokenizer=sentencepiece: learn one vocabulary on source and target text together "
                     "(--src_vocab_size pieces; --tgt_vocab_size must be equal), as BPE recipes often do; needed "
                     "by --tied_embeddings=all.")
flags.DEFINE_float("sentencepiece_character_coverage", 1.0,
                   "Share of the training characters that get pieces of their own; the rest become [UNK] "
                   "(1.0 for alphabetic scripts, 0.9995 is usual for Chinese or Japanese).",
                   lower_bound=0.9, upper_bound=1.0)
flags.DEFINE_integer("sentencepiece_sample_size", 1_000_000,
                     "Sentences (a random sample of the training lines) SentencePiece learns from, per model.",
                     lower_bound=1)
flags.DEFINE_integer("src_vocab_size", 30000, "Source vocabulary size, the special tokens [PAD] [UNK] [BOS] [EOS] included (paper: 30,000).", lower_bound=5)
flags.DEFINE_integer("tgt_vocab_size", 30000, "Target vocabulary size, special tokens included (paper: 30,000).", lower_bound=5)
flags.DEFINE_integer("max_len", 50, "Training pairs with more tokens than this on either side are skipped and counted (paper: 30 or 50 words). Tokens are words, or sub-words with --tokenizer=wordpiece / sentencepiece.", lower_bound=1)
flags.DEFINE_integer("batch_size", 80, "Batch size, in sentence pairs (--batch_type=sentences; paper: 80) or in padded tokens of the longer side (--batch_type=tokens).", lower_bound=1)
flags.DEFINE_enum("batch_type", "sentences", ["sentences", "tokens"], "Unit of --batch_size.")
flags.DEFINE_integer("pool_size", 1600, "Pairs read, sorted by length and cut into batches together, as in the paper (1,600 pairs = 20 batches of 80); larger pools give batches of more similar length.", lower_bound=1)
flags.DEFINE_integer("prepared_shards", 0,
                     "Tokenize the training corpus once into this many TFRecord shards in <model_dir>/prepared/ "
                     "(made at the first start, made again when the corpus files, the vocabularies or --max_len "
                     "change) and read them every epoch instead of the text: for corpora of hundreds of millions of "
                     "words. 0: tokenize the text in every epoch.", lower_bound=0)
flags.DEFINE_integer("shuffle_buffer", 200000, "Number of sentence pairs held in memory for shuffling the training stream; memory use does not grow with the corpus.", lower_bound=1)

# ---------------------------------------------------------------- model
flags.DEFINE_enum("model", "rnnsearch", list(ARCHITECTURES),
                  "Model architecture: rnnsearch (attention; Bahdanau et al. 2015) or rnnencdec (a fixed-length "
                  "summary of the source; Cho et al. 2014a).")
flags.DEFINE_enum("encoder", "rnn", ["rnn", "grconv"],
                  "Encoder of --model=rnnencdec: rnn (a GRU) or grconv (gated recursive convolution, Cho et al. "
                  "2014b). RNNsearch always uses its bidirectional GRU.")
flags.DEFINE_integer("grconv_size", 2000, "Node size of the grConv encoder (paper: 2,000).", lower_bound=1)
flags.DEFINE_integer("embedding_size", 620, "Word embedding size m (paper: 620).", lower_bound=1)
flags.DEFINE_integer("hidden_size", 1000, "GRU state size n, per encoder direction and in the decoder (paper: 1000).", lower_bound=1)
flags.DEFINE_integer("attention_size", 1000, "Hidden size n' of the alignment model (paper: 1000).", lower_bound=1)
flags.DEFINE_integer("maxout_size", 500, "Number of maxout units l of the deep output (paper: 500).", lower_bound=1)
flags.DEFINE_float("dropout", 0.0, "Dropout rate on embeddings and maxout features during training (paper: none).", lower_bound=0.0, upper_bound=0.95)
flags.DEFINE_float("annotation_dropout", 0.0,
                   "Dropout rate on the encoder's outputs during training: RNNsearch's annotations h_j, "
                   "RNNencdec's summary c (paper: none; nmtpytorch's Multi30k recipes: 0.5).",
                   lower_bound=0.0, upper_bound=0.95)
flags.DEFINE_float("recurrent_dropout", 0.0,
                   "Variational dropout of the GRU states in training (Gal & Ghahramani 2016; Nematus' dropout_hidden, "
                   "Marian's dropout-rnn): one mask per sentence, the same at every step, where the state enters "
                   "the recurrent products (paper: none).", lower_bound=0.0, upper_bound=0.95)
flags.DEFINE_boolean("layer_norm", False,
                     "Layer-normalised GRUs (Ba et al. 2016, as Nematus and Marian use them): the input, recurrent and "
                     "context terms of the gates and of the candidate each normalised on their own, with a gain and a "
                     "bias (paper: none).")
flags.DEFINE_enum("tied_embeddings", "none", ["none", "target", "all"],
                  "Weight tying (Press & Wolf 2017; paper: none): target: the output layer is the transposed "
                  "target embedding matrix (needs --maxout_size equal to --embedding_size); all: the source "
                  "embeddings are that matrix too (needs --joint_vocabulary).")
flags.DEFINE_float("label_smoothing", 0.0,
                   "Label smoothing eps of the training loss: (1 - eps) NLL + eps x cross-entropy with the uniform "
                   "distribution (paper: 0). Reported losses and perplexities stay the plain NLL.",
                   lower_bound=0.0, upper_bound=0.5)

# ---------------------------------------------------------------- training
flags.DEFINE_string("model_dir", None, "Directory for vocabularies, resolved flags, checkpoints, TensorBoard logs and the training summary. Rerunning with the same directory resumes.")
flags.DEFINE_string(
    "init_from", None,
    "Fine-tuning: start a new run from the weights of a trained model, a model directory or a preset's name or "
    "folder. Its model and vocabulary flags and its vocabularies are kept (new words become pieces, or [UNK] "
    "with words, counted in the log); data and training flags come from this command; the optimizer and the "
    "learning-rate schedule start afresh. Read only when --model_dir starts (a resume continues its own run).")
flags.DEFINE_string("init_checkpoint", "",
                    "--init_from's weights: best, last, averaged or a checkpoint path (default: averaged if it "
                    "has an averaged checkpoint, as a preset has, else best).")
flags.DEFINE_list("freeze", [], "Parts of the model kept fixed while training (with --init_from): embeddings "
                  "(with --tied_embeddings=all also the output layer's matrix), encoder.")
flags.DEFINE_enum("optimizer", "adadelta", ["adadelta", "adam", "sgd", "rmsprop"], "Optimizer (paper: Adadelta).")
flags.DEFINE_float("learning_rate", None, "Learning rate; default per optimizer: adadelta 1.0 (paper), adam 0.001, rmsprop 0.001, sgd 0.1.", lower_bound=0.0)
flags.DEFINE_integer("warmup_steps", 0,
                     "Raise the learning rate linearly from 0 to --learning_rate over this many first updates "
                     "(0: none, as in the paper).", lower_bound=0)
flags.DEFINE_enum("lr_schedule", "plateau", ["plateau", "linear", "cosine"],
                  "Learning rate after the warm-up. plateau: --learning_rate, multiplied by --decay_factor when dev "
                  "stops improving (paper: constant). linear / cosine: budgeted training (Li et al. 2020), the rate "
                  "falls linearly / along a half cosine to --final_lr_fraction of --learning_rate exactly at the end "
                  "of the budget, --max_steps or --max_hours (hours are turned into updates from the measured "
                  "seconds per update, re-estimated at every update); needs one of them and --decay_factor=1.")
flags.DEFINE_float("final_lr_fraction", 0.0,
                   "--lr_schedule=linear / cosine: the fraction of --learning_rate reached at the end of the budget.",
                   lower_bound=0.0, upper_bound=1.0)
flags.DEFINE_float("adadelta_rho", 0.95, "Adadelta decay rate rho (paper: 0.95).")
flags.DEFINE_float("adadelta_epsilon", 1e-6, "Adadelta epsilon (paper: 1e-6).")
flags.DEFINE_float("clip_norm", 1.0, "Rescale the gradient when its global L2 norm exceeds this (paper: 1). 0 disables.", lower_bound=0.0)
flags.DEFINE_integer("max_epochs", 10, "Stop after this many passes over the training data.", lower_bound=1)
flags.DEFINE_integer("max_steps", 0, "Stop after this many updates in total (0: no limit).", lower_bound=0)
flags.DEFINE_float("max_hours", 0.0, "Stop after this many hours of training, summed over resumed runs (0: no limit).", lower_bound=0.0)
flags.DEFINE_integer("checkpoint_every_steps", 500, "Save a checkpoint every this many updates (and at the end of every epoch and of the run). A killed run loses at most this many updates.", lower_bound=1)
flags.DEFINE_integer("keep_checkpoints", 3, "Number of recent checkpoints kept (the best ones by dev score are kept apart, see --keep_best_checkpoints).", lower_bound=1)
flags.DEFINE_integer("keep_best_checkpoints", 1, "Number of checkpoints with the best dev scores kept in best/ (ranked in best/scores.json; more than one for averaging the best, --average_from=best).", lower_bound=1)
flags.DEFINE_integer("eval_every_steps", 0, "Compute the dev loss every this many updates (0: at the end of every epoch).", lower_bound=0)
flags.DEFINE_enum("early_stopping_metric", "bleu", ["bleu", "loss"], "Dev metric that selects the best checkpoint (best/), decays the learning rate and stops training early (bleu needs --dev_bleu).")
flags.DEFINE_boolean("dev_bleu", True, "At every dev evaluation, also translate the dev set and log its BLEU (sacreBLEU, detokenized output against the raw reference) and attention heatmaps.")
flags.DEFINE_integer("dev_bleu_beam_size", 1, "Beam width for dev BLEU during training (1: greedy search).", lower_bound=1)
flags.DEFINE_integer("dev_bleu_sentences", 0, "Translate only the first this many dev pairs for dev BLEU (0: all).", lower_bound=0)
flags.DEFINE_integer("attention_examples", 4, "Dev sentences (the first ones) whose attention heatmaps go to TensorBoard at every evaluation.", lower_bound=0)
flags.DEFINE_float("decay_factor", 1.0, "Multiply the learning rate by this after --decay_patience dev evaluations without improvement (1: constant learning rate, as in the paper).", lower_bound=0.0, upper_bound=1.0)
flags.DEFINE_integer("decay_patience", 2, "Dev evaluations without improvement before each learning-rate decay.", lower_bound=1)
flags.DEFINE_integer("patience", 10, "Stop after this many dev evaluations without improvement (0: never stop early).", lower_bound=0)
flags.DEFINE_integer("log_every_steps", 50, "Write training scalars to TensorBoard every this many updates.", lower_bound=1)
flags.DEFINE_enum("mixed_precision", "auto", ["none", "auto", "mixed_bfloat16", "mixed_float16"],
                  "Keras dtype policy of training: auto (the default) is mixed_bfloat16 on a CPU with bfloat16 instructions (avx512_bf16 or amx_bf16) and no GPU, where it trained 1.3-1.5x faster with a dev-loss curve within 1.5 % of float32's, and float32 elsewhere, decided again at every start and logged; none is float32; mixed_bfloat16 / mixed_float16 compute in bfloat16 / float16 with float32 weights (mixed_float16 adds loss scaling; use it on GPUs without bf16). The weights and checkpoints are float32 either way. nmt_tf.export and nmt_tf.evaluate take it too, for the search (default there: float32, whatever the model was trained in; an export keeps it, and on a CPU without bfloat16 instructions a bfloat16 export runs emulated and slower).")
flags.DEFINE_enum("distribution", "none", ["none", "mirrored", "multi_worker"],
                  "tf.distribute strategy of training: none (one device), mirrored (one process, a replica per GPU; "
                  "per logical CPU device with --cpu_devices), multi_worker (one process per machine, the cluster in "
                  "the TF_CONFIG environment variable). --batch_size is the global batch; docs/training.md, "
                  "'Training on several devices or machines'.")
flags.DEFINE_integer("cpu_devices", 0,
                     "--distribution=mirrored on a machine without GPUs: split the CPU into this many logical devices, "
                     "one replica each (0: as TensorFlow finds it). For trying distribution out; not faster.",
                     lower_bound=0)
flags.DEFINE_integer("collective_timeout", 0,
                     "--distribution=multi_worker: seconds a gradient all-reduce may wait for the other workers "
                     "before the job stops with an error (0: no limit; a worker that died is also detected by "
                     "TensorFlow's coordination service).", lower_bound=0)
flags.DEFINE_enum("worker_input", "auto", ["auto", "own_data", "global_batches"],
                  "--distribution=multi_worker: what each worker reads. own_data: only its own part of the data "
                  "(its prepared shards, or every N-th line of the text) and its replicas' batches of it; needs "
                  "--batch_type=sentences. global_batches: the whole corpus, keeping its replicas' shares of "
                  "every global batch, so the updates are those of one process (each worker reads and tokenizes "
                  "everything). auto: own_data with sentence batches, global_batches with token batches.")
flags.DEFINE_boolean("jit_compile", False, "Compile the training step with XLA. Measured slower on CPU (see BUILD_NOTES.md); worth trying on GPU.")
flags.DEFINE_integer("seed", 1234, "Random seed for initialization, dropout and data order.")
flags.DEFINE_boolean("dry_run", False, "Build the model from the flags alone (vocabulary sizes from --src_vocab_size / --tgt_vocab_size; no data read), print its summary and parameter count, and exit.")

# The flags above make up a training job's configuration (flags.json).
TRAINING_FLAGS = tuple(sorted(f.name for f in FLAGS.get_flags_for_module(__name__)))

# ---------------------------------------------------------------- search (export, translate, evaluate)
flags.DEFINE_integer("beam_size", 10, "Beam width (paper: 10); 1 runs greedy search.", lower_bound=1)
flags.DEFINE_integer("n_best", 1, "Hypotheses returned per sentence, best first (at most --beam_size; nmt_tf.translate: at most the n-best size fixed at export).", lower_bound=1)
flags.DEFINE_enum("length_penalty", "average", ["average", "gnmt"],
                  "How finished hypotheses are ranked: average: log p / length^alpha (the papers, alpha=1); "
                  "gnmt: log p / ((5 + length) / 6)^alpha (Wu et al. 2016).")
flags.DEFINE_float("length_alpha", 1.0, "Exponent alpha of --length_penalty; 0 ranks by raw log-probability.", lower_bound=0.0)
flags.DEFINE_float("max_length_ratio", 3.0, "Outputs end after this many times the source length, [EOS] counted on both sides (reference implementation: 3).", lower_bound=0.01)
flags.DEFINE_float("min_length_ratio", 0.5, "[EOS] is forbidden before this fraction of the source length (reference implementation: 0.5).", lower_bound=0.0)
flags.DEFINE_integer("max_output_length", 256, "Absolute cap on output tokens.", lower_bound=1)
flags.DEFINE_boolean("suppress_unk", False, "Never generate [UNK] (how the 'no UNK' column of the paper's Table 1 was decoded).")
flags.DEFINE_integer("shortlist_size", 0, "Search over at least this many candidate target tokens per batch instead of the whole target vocabulary (Jean et al. 2015): the special tokens, the --shortlist_per_word likeliest translations of every source token of the batch (all of them: the list grows past this size when they need more room), then the most frequent tokens; needs the model directory's lexical table (python -m nmt_tf.shortlist). Faster, and translations may differ (docs/translating.md). 0: the whole vocabulary.", lower_bound=0)
flags.DEFINE_integer("shortlist_per_word", 10, "With --shortlist_size: translations per source token taken into the shortlist (by IBM Model 1 probability).", lower_bound=1)

flags.DEFINE_boolean("replace_unk", False, "Replace every generated [UNK] by the source word it attended to most (Luong et al. 2015; Jean et al. 2015), or by its translation in --unk_dictionary; for word models. The target_tokens output keeps [UNK].")
flags.DEFINE_string("unk_dictionary", None, "With --replace_unk: a 'source<TAB>target' file; an attended source word found in it is replaced by its translation instead of being copied (an export keeps the file as an asset).")

SEARCH_FLAGS = tuple(sorted(set(f.name for f in FLAGS.get_flags_for_module(__name__)) - set(TRAINING_FLAGS)))

# ---------------------------------------------------------------- using a trained model (export, translate, evaluate, visualize, serve)
flags.DEFINE_string("model_name", "nmt", "Model name in TF Serving requests (ModelSpec.name).")
flags.DEFINE_string("saved_model", None, "A SavedModel version directory written by nmt_tf.export (instead of --model_dir).")
flags.DEFINE_string("preset", None, "A model shipped with nmt_tf, by name (python -m nmt_tf.presets --list; multi30k_en_fr: Multi30k English->French), or a preset folder: its SavedModel is built on first use and cached, then used as --saved_model would be.")
flags.DEFINE_string("checkpoint", "best", "Weights to use from --model_dir: best (by the dev metric; falls back to last), last, averaged (written by nmt_tf.average), or a checkpoint path.")
flags.DEFINE_integer("average_checkpoints", 1, "Use the mean of the weights of this many checkpoints of --model_dir, taken from --average_from, instead of --checkpoint (1: no averaging).", lower_bound=1)
flags.DEFINE_multi_string("ensemble", None, "Further model directories decoded together with --model_dir as one ensemble: their log-probabilities are averaged at every search step (nmt_tf.export puts the ensemble into one SavedModel). Repeat the flag for each; the models must share their vocabularies.")
flags.DEFINE_enum("average_from", "best", ["best", "last"], "Checkpoints that --average_checkpoints averages: best (by dev score, best/; train with --keep_best_checkpoints) or last (checkpoints/; --keep_checkpoints).")
flags.DEFINE_integer("max_input_length", 100, "Longer inputs are cut to this many tokens (the 'truncated' output says so); bounds the work one sentence can cause.", lower_bound=1)
flags.DEFINE_integer("lines_per_batch", 64, "Sentences translated (or pairs scored) together.", lower_bound=1)
flags.DEFINE_integer("sort_window", 1000, "nmt_tf.translate and nmt_tf.score: lines (pairs) read ahead and sent shortest first, in batches of --lines_per_batch, then written in input order: less padding and fewer steps per batch (at most --lines_per_batch: batches in input order, each written as soon as it is done).", lower_bound=1)
flags.DEFINE_integer("parallel_batches", 2, "nmt_tf.translate and nmt_tf.score: batches sent at once, as requests in flight with --server or signature calls on as many threads with --saved_model (two keep both cores of a small machine busy while one batch's search waits on its step's chain of small ops).", lower_bound=1)
flags.DEFINE_string("server", None, "HOST:PORT of a TF Serving-compatible gRPC server (the official tensorflow_model_server or nmt_tf.serve), instead of --saved_model.")
flags.DEFINE_float("timeout", 120.0, "Seconds to wait for one request to --server.", lower_bound=0.1)
flags.DEFINE_string("input", None, "Input sentences, one per line (plain or gzip); default stdin.")
flags.DEFINE_string("output", None, "Output file; default stdout.")

# Which weights of a model directory a tool uses (nmt_tf.checkpoints.WeightsChoice).
WEIGHTS_FLAGS = ("checkpoint", "average_checkpoints", "average_from")
# Search settings that nmt_tf.export fixes in the SavedModel (--n_best may be lowered at run time).
FIXED_AT_EXPORT = tuple(name for name in SEARCH_FLAGS if name != "n_best") + ("max_input_length", "mixed_precision")

# Flags whose values define the model or its vocabularies: a run resumed in
# an existing --model_dir must keep them.
FROZEN_FLAGS = (
    "tokenizer", "sentencepiece_type", "joint_vocabulary", "sentencepiece_character_coverage",
    "sentencepiece_sample_size", "src_lang", "tgt_lang", "src_vocab_size", "tgt_vocab_size", "model", "encoder",
    "grconv_size", "embedding_size", "hidden_size", "attention_size", "maxout_size", "layer_norm", "tied_embeddings",
    "optimizer",
)
# Flags that are stored in flags.json (everything above but the per-run ones).
_NOT_STORED = ("dry_run", "distribution", "cpu_devices", "collective_timeout", "worker_input")   # where a run runs, not what it trains


def tool_flags(module_name: str, names) -> frozenset:
    """Declares which flags of this module a tool (`module_name`, its
    __name__) uses, besides the flags it defines itself; returns them for
    `start_cli`. For the tool being run they become key flags of the main
    module, so that its --help lists them (absl's --help shows only the main
    module's key flags; --helpfull shows every flag of every module)."""
    names = frozenset(names)
    if module_name == "__main__":
        for name in sorted(names):
            FLAGS.register_key_flag_for_module(sys.argv[0], FLAGS[name])
    return names


def foreign_flags(accepts: frozenset) -> list[str]:
    """Flags given on the command line (or in a flagfile) that belong to
    other nmt_tf tools: defined in an nmt_tf module other than the main one
    and not in `accepts`."""
    return sorted(flag.name for module, module_flags in FLAGS.flags_by_module_dict().items()
                  if module.startswith("nmt_tf.") and module != sys.argv[0]
                  for flag in module_flags if flag.present and flag.name not in accepts)


def fixed_at_export_given() -> list[str]:
    """The search and weights flags given, for a tool run on a SavedModel
    (where they were fixed by nmt_tf.export and would be ignored)."""
    return sorted(name for name in FIXED_AT_EXPORT + WEIGHTS_FLAGS if FLAGS[name].present)


def search_precision(log=print) -> str:
    """The Keras dtype policy nmt_tf.export / nmt_tf.evaluate build a model
    with: float32 unless --mixed_precision is given (auto: from this CPU,
    nmt_tf.hardware.resolve_precision, and `log` says what it chose)."""
    if not FLAGS["mixed_precision"].present:
        return "float32"
    policy, why = resolve_precision(FLAGS.mixed_precision)
    if FLAGS.mixed_precision == "auto":
        log(why + ".")
    return policy


FIXED_AT_EXPORT_REASON = "fixed when the SavedModel was exported: export again with it (nmt_tf.export)"


def start_cli(argv: list[str], verbose: bool = False, accepts: frozenset | None = None,
              reasons: dict[str, str] | None = None) -> None:
    """Common start of every nmt_tf CLI's main: no stray arguments, no flags
    of other tools (with `accepts`, from `tool_flags`; `reasons` says why a
    flag is refused, by name: one error line, exit code 1), quiet TF logs,
    and TensorFlow's first import without its start-up noise (nmt_tf.startup)."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if accepts is not None:
        foreign = foreign_flags(accepts)
        if foreign:
            tool = os.path.splitext(os.path.basename(sys.argv[0]))[0]
            reasons = reasons or {}
            why = "; ".join(f"--{name}: {reasons[name]}" for name in foreign if name in reasons)
            print(
                f"error: {', '.join('--' + n for n in foreign)}: not {'a flag' if len(foreign) == 1 else 'flags'} of "
                f"nmt_tf.{tool}, which would ignore {'it' if len(foreign) == 1 else 'them'}"
                f"{f' ({why})' if why else ''}. `python -m nmt_tf.{tool} --help` lists its flags.", file=sys.stderr)
            raise SystemExit(EXIT_USER_ERROR)
    # TensorFlow's Python INFO lines (checkpoint saver, ...) unless asked for.
    logging.set_verbosity(logging.INFO if verbose else logging.WARNING)
    startup.quiet_tensorflow_import()


EXIT_USER_ERROR = 1


def user_error(error, code: int = EXIT_USER_ERROR) -> int:
    """How every nmt_tf CLI reports a problem it can name (a missing file, a
    bad flag combination, bad input): one line `error: ...` on standard error,
    no traceback; returns the exit code for main to return (1 unless the tool
    documents another for this case)."""
    print(f"error: {error}", file=sys.stderr)
    return code


def nmt_flag_names() -> list[str]:
    """Names of the training flags (those stored in flags.json)."""
    return list(TRAINING_FLAGS)


DEFAULT_LEARNING_RATES = {"adadelta": 1.0, "adam": 1e-3, "rmsprop": 1e-3, "sgd": 0.1}


def learning_rate(config) -> float:
    """--learning_rate, or the default of --optimizer."""
    return config.learning_rate if config.learning_rate is not None else DEFAULT_LEARNING_RATES[config.optimizer]


def weights_choice():
    """`nmt_tf.checkpoints.WeightsChoice` from --checkpoint, --average_checkpoints and --average_from."""
    from nmt_tf.checkpoints import WeightsChoice

    return WeightsChoice(FLAGS.checkpoint, FLAGS.average_checkpoints, FLAGS.average_from)


def search_options():
    """`nmt_tf.search.SearchOptions` from the parsed search flags."""
    from nmt_tf.search import SearchOptions

    return SearchOptions(
        beam_size=FLAGS.beam_size, n_best=FLAGS.n_best, length_penalty=FLAGS.length_penalty,
        length_alpha=FLAGS.length_alpha, max_length_ratio=FLAGS.max_length_ratio,
        min_length_ratio=FLAGS.min_length_ratio, max_length=FLAGS.max_output_length,
        suppress_unk=FLAGS.suppress_unk, shortlist_size=FLAGS.shortlist_size,
        shortlist_per_word=FLAGS.shortlist_per_word)


class Config(dict):
    """Flag values by name, readable as attributes (``config.batch_size``)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"no flag named {name!r}") from None

    def replace(self, **overrides) -> "Config":
        unknown = sorted(set(overrides) - set(self))
        if unknown:
            raise ValueError(f"unknown flag(s): {', '.join(unknown)}")
        return Config({**self, **overrides})


def default_config(**overrides) -> Config:
    """The flag defaults of this module, with `overrides` applied."""
    return Config({name: FLAGS[name].default for name in nmt_flag_names()}).replace(**overrides)


def config_from_flags() -> Config:
    """The parsed command-line values of this module's flags."""
    return Config({name: FLAGS[name].value for name in nmt_flag_names()})


def explicitly_set() -> set[str]:
    """Names of this module's flags given on the command line or in a flagfile."""
    return {name for name in nmt_flag_names() if FLAGS[name].present}


def flags_path(model_dir: str) -> str:
    return layout.path(model_dir, layout.FLAGS_JSON)


def save_config(config: Config, model_dir: str) -> None:
    """Writes flags.json (for the tools) and flags.txt (a flagfile to rerun with)."""
    stored = {k: v for k, v in sorted(config.items()) if k not in _NOT_STORED}
    path = flags_path(model_dir)
    write_atomically(path, json.dumps(stored, indent=2) + "\n")
    lines = []
    for name, value in stored.items():
        if value is None:
            continue
        if isinstance(value, bool):
            lines.append(f"--{name}" if value else f"--no{name}")
        else:
            lines.append(f"--{name}={value}")
    write_atomically(layout.path(model_dir, layout.FLAGS_TXT), "".join(line + "\n" for line in lines))


def load_config(model_dir: str) -> Config:
    """Reads `<model_dir>/flags.json` (written by nmt_tf.train) over the defaults."""
    path = flags_path(model_dir)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path} not found: --model_dir must be a directory written by nmt_tf.train")
    with open(path, encoding="utf-8") as f:
        stored = json.load(f)
    config = default_config()
    config.update({k: v for k, v in stored.items() if k in config})
    return config
