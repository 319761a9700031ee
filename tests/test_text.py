"""In-graph tokenization, detokenization and vocabularies."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from conftest import UNICODE_SEPARATORS, read_multi30k
from nmt_tf.data import text


def words(sentence, lang):
    return [w.decode() for w in text.split_words(text.clean(tf.constant([sentence])), lang)[0].numpy()]


@pytest.mark.parametrize("lang,sentence,expected", [
    ("en", "Two young, White males are outside near many bushes.",
     "Two young , White males are outside near many bushes ."),
    ("en", "A man (in red) doesn't smile; John's dog: \"Rex\"!",
     "A man ( in red ) doesn 't smile ; John 's dog : \" Rex \" !"),
    ("en", "It costs 1,000 dollars, said Mr. Smith of the U.S. team...",
     "It costs 1,000 dollars , said Mr. Smith of the U.S. team ..."),
    ("fr", "Un homme en vert tient une guitare tandis qu'un autre homme l'observe.",
     "Un homme en vert tient une guitare tandis qu' un autre homme l' observe ."),
    ("fr", "Il dit : \"Bienvenue motards\".", "Il dit : \" Bienvenue motards \" ."),
    ("de", "Ein Mann, der vor einem „Open“-Schild steht.", "Ein Mann , der vor einem „ Open “ -Schild steht ."),
])
def test_moses_like_word_splitting(lang, sentence, expected):
    assert " ".join(words(sentence, lang)) == expected


def test_case_is_kept_and_hyphens_stay_inside_words():
    assert words("A T-shirt and an X-ray", "en") == ["A", "T-shirt", "and", "an", "X-ray"]


@pytest.mark.parametrize("lang,minimum", [("en", 0.997), ("fr", 0.998), ("de", 0.99)])
def test_detokenize_inverts_tokenize_on_multi30k(lang, minimum):
    """BLEU is computed on detokenized text against raw references: the round trip must hold."""
    lines = tf.constant(read_multi30k(f"train.{lang}.gz", 6000))
    cleaned = text.clean(lines)
    back = text.join_words(text.split_words(cleaned, lang), lang)
    rate = float(np.mean((back == cleaned).numpy()))
    assert rate >= minimum, rate


def test_clean_replaces_invalid_utf8_and_whitespace():
    raw = tf.constant([b"caf\xe9 \t au  lait\n", b"  ", b"ok"])
    assert text.has_invalid_utf8(raw).numpy().tolist() == [True, False, False]
    assert text.clean(raw).numpy().tolist() == ["caf\ufffd au lait".encode(), b"", b"ok"]


def test_every_unicode_separator_is_whitespace():
    """Zs (U+00A0, U+3000, ...), Zl (U+2028) and Zp (U+2029) separate words and
    a line of nothing else is empty, as for ASCII spaces."""
    assert len(UNICODE_SEPARATORS) >= 19 and {"\u00a0", "\u3000", "\u2028", "\u2029"} <= set(UNICODE_SEPARATORS)
    lines = [f"a{c}b" for c in UNICODE_SEPARATORS] + ["".join(UNICODE_SEPARATORS), "\u00a0", "\u3000\u2028"]
    cleaned = text.clean(tf.constant(lines)).numpy().tolist()
    assert cleaned == [b"a b"] * len(UNICODE_SEPARATORS) + [b"", b"", b""]


def test_shortlist_keeps_most_frequent_and_is_deterministic():
    counts = collections.Counter({"a": 5, "b": 5, "c": 3, "d": 1})
    assert text.shortlist(counts, 6) == list(text.SPECIAL_TOKENS) + ["a", "b"]
    # Words holding U+FFFD (invalid bytes) stay [UNK], however frequent.
    damaged = collections.Counter({"\ufffd": 9, "caf\ufffd": 8, "a": 1})
    assert text.shortlist(damaged, 10) == list(text.SPECIAL_TOKENS) + ["a"]
    with pytest.raises(ValueError, match="no room"):
        text.shortlist(counts, 4)


def test_word_tokenizer_encode_decode(tmp_path):
    vocab = list(text.SPECIAL_TOKENS) + ["Un", "homme", "l'", "observe", "."]
    path = str(tmp_path / "v.txt")
    text.write_vocabulary(vocab, path)
    tok = text.make_tokenizer(path, "word", "fr")
    ids = tok.encode(tf.constant(["Un homme l'observe.", "Un chat"])).to_list()
    assert ids == [[4, 5, 6, 7, 8], [4, text.UNK_ID]]
    padded = tf.constant([[4, 5, 6, 7, 8, 3, 0], [2, 4, 1, 3, 5, 5, 0]])
    assert tok.decode(padded).numpy().tolist() == ["Un homme l'observe.".encode(), b"Un [UNK]"]


def test_vocabulary_file_must_start_with_specials(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("a\nb\n")
    with pytest.raises(ValueError, match="not an nmt_tf vocabulary"):
        text.read_vocabulary(str(path))


def test_wordpiece_tokenizer_round_trip():
    lines = read_multi30k("train.fr.gz", 300)
    batches = tf.data.Dataset.from_tensor_slices(lines).batch(64).map(
        lambda l: text.split_words(text.clean(l), "fr"))
    vocab = text.wordpiece_vocabulary(batches, 400)
    assert vocab[:4] == list(text.SPECIAL_TOKENS) and 200 < len(vocab) <= 400
    tok = text.make_tokenizer(vocab, "wordpiece", "fr")
    sample = tf.constant(lines[:50])
    pieces = tok.tokenize(sample)
    assert any(p.startswith(b"##") for p in pieces.flat_values.numpy())
    ids = tok.encode(sample)
    assert int(tf.reduce_sum(tf.cast(ids.flat_values == text.UNK_ID, tf.int32))) == 0
    padded = ids.to_tensor()
    back = tok.decode(padded).numpy()
    assert np.mean(back == text.clean(sample).numpy()) > 0.95


def test_sentencepiece_in_the_graph_equals_the_sentencepiece_package_on_multi30k_val(tmp_path):
    """Learned with the sentencepiece package, applied by tensorflow-text: the same
    ids for every val sentence, and detokenization gives back the cleaned text."""
    import sentencepiece as spm

    lines = read_multi30k("val.fr.gz")
    cleaned = [c.decode() for c in text.clean(tf.constant(lines)).numpy()]
    for kind in ("unigram", "bpe"):
        model = text.learn_sentencepiece(cleaned, 600, kind)
        path = tmp_path / f"{kind}.model"
        path.write_bytes(model)
        vocab = text.sentencepiece_vocabulary(model)
        assert vocab[:4] == list(text.SPECIAL_TOKENS) and len(vocab) == 600
        tok = text.make_tokenizer(vocab, "sentencepiece", "fr", model_file=str(path))
        processor = spm.SentencePieceProcessor(model_proto=model)
        ids = tok.encode(tf.constant(lines)).to_list()
        assert ids == [processor.encode(c) for c in cleaned], kind
        back = [b.decode() for b in tok.decode(tf.ragged.constant(ids).to_tensor()).numpy()]
        assert back == cleaned, kind
    with pytest.raises(ValueError, match="does not hold the pieces"):
        text.make_tokenizer(vocab[:-1] + ["other"], "sentencepiece", "fr", model_file=str(path))


def test_sentencepiece_learns_no_piece_for_invalid_bytes():
    """U+FFFD (what invalid UTF-8 becomes) gets no piece, even when frequent: it stays [UNK]."""
    sentences = [f"caf\ufffd au lait {i % 7} \ufffd\ufffd" for i in range(300)]
    for kind in ("unigram", "bpe"):
        vocab = text.sentencepiece_vocabulary(text.learn_sentencepiece(sentences, 40, kind))
        assert not [p for p in vocab if text.REPLACEMENT_CHAR in p], kind


def test_the_model_input_convention():
    """x [EOS] for sources and labels, [BOS] y for the decoder's inputs; string tokens get "[EOS]"."""
    ids = tf.ragged.constant([[5, 6, 7], [], [8]], dtype=tf.int32)
    assert text.with_eos(ids).to_list() == [[5, 6, 7, text.EOS_ID], [text.EOS_ID], [8, text.EOS_ID]]
    assert text.with_bos(ids).to_list() == [[text.BOS_ID, 5, 6, 7], [text.BOS_ID], [text.BOS_ID, 8]]
    words = tf.ragged.constant([["a", "b"], []])
    assert text.with_eos(words).to_list() == [[b"a", b"b", b"[EOS]"], [b"[EOS]"]]


def test_every_registered_tokenizer_is_a_tokenizer_and_a_flag_choice():
    from nmt_tf import flags
    from nmt_tf.data.tokenizers import TOKENIZERS, tokenizer_class

    assert flags.FLAGS["tokenizer"].parser.enum_values == list(TOKENIZERS)
    for name in TOKENIZERS:
        cls = tokenizer_class(name)
        assert issubclass(cls, text.Tokenizer) and cls.kind == name
    with pytest.raises(ValueError, match="unknown tokenizer 'bytes'; choose one of word, wordpiece, sentencepiece"):
        text.make_tokenizer(list(text.SPECIAL_TOKENS), "bytes")
    with pytest.raises(ValueError, match="the word tokenizer takes no model file"):
        text.make_tokenizer(list(text.SPECIAL_TOKENS), "word", model_file="x.model")


def test_which_tokens_continue_a_word(tmp_path):
    """What required terms need (a term must end where a word ends): WordPiece's "##"
    pieces and SentencePiece pieces without the word-start mark continue a word;
    special tokens and punctuation never do; word tokenizers have no table."""
    specials = list(text.SPECIAL_TOKENS)
    assert text.make_tokenizer(specials + ["chien", "s"], "word", "fr").word_continuation() is None
    wordpiece = text.make_tokenizer(specials + ["chien", "##s", "."], "wordpiece", "fr")
    assert wordpiece.word_continuation().tolist() == [False] * 4 + [False, True, False]
    model = text.learn_sentencepiece([f"le chien {i} des chiens, le chat." for i in range(200)], 30)
    path = tmp_path / "sp.model"
    path.write_bytes(model)
    pieces = text.sentencepiece_vocabulary(model)
    table = text.make_tokenizer(pieces, "sentencepiece", "fr", model_file=str(path)).word_continuation()
    expected = [i >= 4 and p[0].isalnum() for i, p in enumerate(pieces)]
    assert table.tolist() == expected and any(expected) and not all(expected[4:])
    assert not any(table[i] for i, p in enumerate(pieces) if p.startswith(text.SENTENCEPIECE_SPACE))
