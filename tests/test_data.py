"""Corpus validation, statistics and the tf.data pipeline's invariants."""

import collections
import os

import numpy as np
import pytest
import tensorflow as tf

from conftest import read_multi30k, write_lines
from nmt_tf.config import TrainingConfig
from nmt_tf.data import pipeline as data
from nmt_tf.data import text


@pytest.fixture(scope="module")
def tokenizers(tiny_corpus, tmp_path_factory):
    model_dir = str(tmp_path_factory.mktemp("vocab"))
    config = TrainingConfig(train_src=tiny_corpus["train_src"], train_tgt=tiny_corpus["train_tgt"],
                                  src_vocab_size=60, tgt_vocab_size=60)
    src_tok, tgt_tok, stats = data.build_vocabularies(config, model_dir, log=lambda *a: None)
    return src_tok, tgt_tok, stats


def pair_key(src_tok, tgt_tok, source_ids, labels):
    """A hashable identity of a (source, target) pair from its ids."""
    s = tuple(int(i) for i in source_ids if i)
    t = tuple(int(i) for i in labels if i)
    return s, t


def epoch_pairs(ds):
    pairs, batches = [], []
    for x, y in ds:
        src, lab = x["source_ids"].numpy(), y.numpy()
        batches.append((src, x["target_ids"].numpy(), lab))
        pairs += [pair_key(None, None, s, l) for s, l in zip(src, lab)]
    return pairs, batches


def expected_pairs(corpus, src_tok, tgt_tok, max_len=50):
    out = []
    for s, t in corpus["pairs"]:
        si, ti = src_tok.encode(tf.constant([s])).to_list()[0], tgt_tok.encode(tf.constant([t])).to_list()[0]
        if 0 < len(si) <= max_len and 0 < len(ti) <= max_len:
            out.append((tuple(si + [text.EOS_ID]), tuple(ti + [text.EOS_ID])))
    return out


# ------------------------------------------------------------------ validation

def test_missing_file_is_one_clear_error(tmp_path, tiny_corpus):
    missing = str(tmp_path / "nope.en")
    with pytest.raises(data.CorpusError, match=r"nope\.en does not exist \(--train_src\)"):
        data.check_parallel(missing, tiny_corpus["train_tgt"], "train_src", "train_tgt")


def test_unequal_line_counts_name_both_files_and_counts(tmp_path):
    a = write_lines(tmp_path / "a.en", ["one", "two", "three"])
    b = write_lines(tmp_path / "b.fr.gz", ["un", "deux"], gz=True)
    with pytest.raises(data.CorpusError) as e:
        data.check_parallel(a, b, "train_src", "train_tgt")
    msg = str(e.value)
    assert "a.en" in msg and "3 lines" in msg and "b.fr.gz" in msg and "2 lines" in msg


def test_a_corpus_of_several_files_is_read_file_after_file(tmp_path):
    """--train_src=a,b: the files one after another (a last line without a
    newline stays a line), counted, streamed, fingerprinted and checked file
    by file; lists of different lengths or a shift inside are errors."""
    from nmt_tf.data import lexicon

    a = write_lines(tmp_path / "a.en", ["one", "two"])
    (tmp_path / "b.en").write_bytes(b"three")
    c = write_lines(tmp_path / "c.fr.gz", ["un", "deux"], gz=True)
    d = write_lines(tmp_path / "d.fr", ["trois"])
    src, tgt = f"{a},{tmp_path / 'b.en'}", f"{c},{d}"
    assert data.check_parallel(src, tgt, "train_src", "train_tgt") == 3
    assert [s.decode() for s, _ in data.parallel_lines(src, tgt).as_numpy_iterator()] == ["one", "two", "three"]
    assert [t.decode() for _, t in data.parallel_lines(src, tgt).as_numpy_iterator()] == ["un", "deux", "trois"]
    assert data.fingerprint(src) != data.fingerprint(a)
    with pytest.raises(data.CorpusError, match="names 2 files but --train_tgt 1"):
        data.check_parallel(src, c, "train_src", "train_tgt")
    with pytest.raises(data.CorpusError, match=r"a\.en \(--train_src\) has 2 lines but .*d\.fr \(--train_tgt\) has 1 lines"):
        data.check_parallel(src, f"{d},{c}", "train_src", "train_tgt")       # equal totals, shifted
    with pytest.raises(data.CorpusError, match=r"nope\.en does not exist \(--train_src\)"):
        data.check_parallel(f"{a},{tmp_path / 'nope.en'}", tgt, "train_src", "train_tgt")

    class Words:            # a tokenizer of whitespace words, ids by first sight
        def __init__(self):
            self.ids = {}

        def encode(self, lines):
            return tf.ragged.constant([[self.ids.setdefault(w, len(self.ids) + 4) for w in line.split()]
                                       for line in lines.numpy()])
    pairs, skipped = lexicon.encoded_pairs(src, tgt, Words(), Words(), max_len=None)
    assert len(pairs) == 3 and skipped == 0


def test_line_count_handles_missing_final_newline_and_gzip(tmp_path):
    p = tmp_path / "x.txt"
    p.write_bytes(b"a\nb\nc")
    assert data.count_lines(str(p)) == 3
    g = write_lines(tmp_path / "x.gz", ["a", "b"], gz=True)
    assert data.is_gzip(g) and data.count_lines(g) == 2


def test_damaged_gzip_is_a_corpus_error(tmp_path):
    g = write_lines(tmp_path / "x.gz", ["a"] * 1000, gz=True)
    raw = open(g, "rb").read()
    with open(g, "wb") as f:
        f.write(raw[:len(raw) // 2])
    with pytest.raises(data.CorpusError, match="could not be read"):
        data.count_lines(g)


def test_scan_counts_skipped_and_repaired_lines(tmp_path):
    src = [b"A good line .", b"", b"   ", b"caf\xe9 ok", b"one two three four five six", b"fine", b"good"]
    tgt = [b"Une bonne ligne .", b"vide", b"x", b"ok", b"un", b"   ", "\u00a0\u3000\u2028".encode()]
    s = write_lines(tmp_path / "s.txt", [l.decode("latin-1") for l in src], encoding="latin-1")
    t = write_lines(tmp_path / "t.txt", [l.decode() for l in tgt])
    stats, src_counts, _ = data.scan_corpus(s, t, data.word_splitter("en"), data.word_splitter("fr"),
                                            max_len=5, count_tokens=True)
    # "A good line ." is Latin-1 ASCII; "café" was written in Latin-1: invalid UTF-8.
    assert stats.lines == 7
    assert stats.skipped_empty == 4            # src empty (2x), tgt whitespace-only (ASCII 1x, Unicode 1x)
    assert stats.skipped_too_long == 1         # six source words > 5
    assert stats.invalid_utf8_lines == 1
    assert stats.pairs == 2
    # U+FFFD is a symbol, so the word splitter cuts it off as its own token.
    assert src_counts["caf"] == 1 and src_counts["\ufffd"] == 1 and "six" not in src_counts


def test_empty_after_filtering_is_an_error(tmp_path, tiny_config):
    s = write_lines(tmp_path / "s.txt", ["a b c d e f g h", ""])
    t = write_lines(tmp_path / "t.txt", ["x", "y"])
    config = tiny_config(train_src=s, train_tgt=t, max_len=3)
    with pytest.raises(data.CorpusError, match="No usable sentence pair"):
        data.build_vocabularies(config, str(tmp_path), log=lambda *a: None)


# ------------------------------------------------------------------ pipeline

def test_every_valid_pair_appears_exactly_once_per_epoch(tiny_corpus, tokenizers):
    src_tok, tgt_tok, stats = tokenizers
    ds = data.make_dataset(tiny_corpus["train_src"], tiny_corpus["train_tgt"], src_tok, tgt_tok,
                           max_len=50, batch_size=6, shuffle=True, shuffle_buffer=7, seed=3)
    got, batches = epoch_pairs(ds)
    assert collections.Counter(got) == collections.Counter(expected_pairs(tiny_corpus, src_tok, tgt_tok))
    assert len(batches) == data.batches_per_epoch(stats, 6, "sentences", 1600)
    assert [len(b[0]) for b in batches].count(6) == 6            # 40 pairs: 6 full batches and one of 4


def test_batches_are_shifted_targets_and_padded(tiny_corpus, tokenizers):
    src_tok, tgt_tok, _ = tokenizers
    ds = data.make_dataset(tiny_corpus["train_src"], tiny_corpus["train_tgt"], src_tok, tgt_tok,
                           max_len=50, batch_size=5)
    for x, y in ds:
        tin, lab = x["target_ids"].numpy(), y.numpy()
        assert np.all(tin[:, 0] == text.BOS_ID)
        for row_in, row_out in zip(tin, lab):
            n = int(np.sum(row_out > 0))
            assert row_out[n - 1] == text.EOS_ID
            np.testing.assert_array_equal(row_in[1:n], row_out[:n - 1])
        assert x["source_ids"].dtype == tf.int32


def lengths_of(batch):
    src, tin, _ = batch
    return np.maximum((src > 0).sum(1), (tin > 0).sum(1))


def test_a_pool_is_sorted_by_length_and_cut_into_full_batches(tiny_corpus, tokenizers):
    """The paper's scheme: within a pool, batches cover disjoint, increasing length ranges."""
    src_tok, tgt_tok, stats = tokenizers
    ds = data.make_dataset(tiny_corpus["train_src"], tiny_corpus["train_tgt"], src_tok, tgt_tok,
                           max_len=50, batch_size=4, pool_size=40, shuffle=True, seed=1)
    _, batches = epoch_pairs(ds)
    assert [len(b[0]) for b in batches] == [4] * 10
    ranges = sorted((lengths_of(b).min(), lengths_of(b).max()) for b in batches)
    for (_, high), (low, _) in zip(ranges, ranges[1:]):
        assert high <= low, ranges
    assert len(batches) == data.batches_per_epoch(stats, 4, "sentences", 40)
    # Two pools of 20 pairs, each cut into batches of 8: 8 + 8 + 4 twice.
    ds = data.make_dataset(tiny_corpus["train_src"], tiny_corpus["train_tgt"], src_tok, tgt_tok,
                           max_len=50, batch_size=8, pool_size=20, shuffle=True, seed=2)
    sizes = [len(b[0]) for b in epoch_pairs(ds)[1]]
    assert sorted(sizes) == [4, 4, 8, 8, 8, 8] and data.batches_per_epoch(stats, 8, "sentences", 20) == 6


def test_token_batches_stay_under_the_budget(tiny_corpus, tokenizers):
    src_tok, tgt_tok, stats = tokenizers
    ds = data.make_dataset(tiny_corpus["train_src"], tiny_corpus["train_tgt"], src_tok, tgt_tok,
                           max_len=50, batch_size=60, batch_type="tokens")
    pairs, batches = epoch_pairs(ds)
    assert len(pairs) == stats.pairs
    for b in batches:
        assert len(b[0]) * lengths_of(b).max() <= 60 or len(b[0]) == 1
    assert data.batches_per_epoch(stats, 60, "tokens", 1600) is None


def test_order_depends_only_on_seed_and_epoch_and_skip_resumes_it(tiny_corpus, tokenizers):
    src_tok, tgt_tok, _ = tokenizers

    def order(epoch, skip=0, seed=5):
        ds = data.make_dataset(tiny_corpus["train_src"], tiny_corpus["train_tgt"], src_tok, tgt_tok,
                               max_len=50, batch_size=4, shuffle=True, shuffle_buffer=10, seed=seed,
                               epoch=epoch, skip_batches=skip)
        return [b[0].tolist() for b in epoch_pairs(ds)[1]]

    assert order(0) == order(0)
    assert order(0) != order(1)
    assert order(0, skip=3) == order(0)[3:]


def test_an_epoch_given_a_shared_encoder_gets_the_batches_it_gets_with_its_own(tiny_corpus, tokenizers):
    src_tok, tgt_tok, _ = tokenizers
    shared = data.PairEncoder(src_tok, tgt_tok, max_len=50)

    def epoch(number, **kw):
        ds = data.make_dataset(tiny_corpus["train_src"], tiny_corpus["train_tgt"], src_tok, tgt_tok, max_len=50,
                               batch_size=4, shuffle=True, shuffle_buffer=10, seed=5, epoch=number, **kw)
        return [[a.tolist() for a in b] for b in epoch_pairs(ds)[1]]

    for number in (0, 1):
        assert epoch(number, encoder=shared) == epoch(number)
    with pytest.raises(ValueError, match="other tokenizers, max_len or sampling"):
        epoch(0, encoder=data.PairEncoder(src_tok, tgt_tok, max_len=20))
    with pytest.raises(ValueError, match="other tokenizers, max_len or sampling"):
        epoch(0, encoder=data.PairEncoder(tgt_tok, src_tok, max_len=50))


def test_input_context_shards_are_disjoint_and_complete_and_counted(tiny_corpus, tokenizers):
    """Each of 3 input pipelines reads its own lines; the statistics pass
    counts the pairs each one gets (what sets a worker's steps per epoch)."""
    src_tok, tgt_tok, _ = tokenizers
    max_len = 12
    stats = data.scan_corpus(tiny_corpus["train_src"], tiny_corpus["train_tgt"], src_tok.tokenize,
                             tgt_tok.tokenize, max_len, pipelines=3)[0]
    assert stats.skipped_too_long > 0 and sum(stats.pipeline_pairs) == stats.pairs
    shards = []
    for i in range(3):
        ctx = tf.distribute.InputContext(num_input_pipelines=3, input_pipeline_id=i, num_replicas_in_sync=3)
        ds = data.make_dataset(tiny_corpus["train_src"], tiny_corpus["train_tgt"], src_tok, tgt_tok,
                               max_len=max_len, batch_size=6, input_context=ctx)
        pairs, batches = epoch_pairs(ds)
        assert max(b[0].shape[0] for b in batches) <= 2      # per-replica batch
        shards.append(pairs)
    assert [len(pairs) for pairs in shards] == stats.pipeline_pairs
    assert not set(shards[0]) & set(shards[1]) and not set(shards[1]) & set(shards[2])
    assert not set(shards[0]) & set(shards[2])
    assert collections.Counter(shards[0] + shards[1] + shards[2]) == collections.Counter(
        expected_pairs(tiny_corpus, src_tok, tgt_tok, max_len=max_len))


def test_length_filter_matches_statistics(tmp_path, tokenizers):
    src_tok, tgt_tok, _ = tokenizers
    en, fr = read_multi30k("val.en.gz", 200), read_multi30k("val.fr.gz", 200)
    s, t = write_lines(tmp_path / "s", en), write_lines(tmp_path / "t", fr)
    stats = data.corpus_stats(s, t, src_tok, tgt_tok, max_len=12)
    assert stats.skipped_too_long > 0
    n = sum(int(x["source_ids"].shape[0]) for x, _ in data.make_dataset(
        s, t, src_tok, tgt_tok, max_len=12, batch_size=16))
    assert n == stats.pairs == 200 - stats.skipped_too_long - stats.skipped_empty


def _texts(tokenizer, rows):
    return [t.decode() for t in tokenizer.decode(rows).numpy()]


def test_subword_sampling_cuts_the_same_pairs_anew_every_epoch(tmp_path):
    """--sentencepiece_alpha: the pairs (as text), their number and the batches per
    epoch are those of the best segmentation, max_len included; their pieces are
    sampled, and differ between two reads of the dataset. Not with prepared shards."""
    s = write_lines(tmp_path / "s", read_multi30k("val.en.gz", 300))
    t = write_lines(tmp_path / "t", read_multi30k("val.fr.gz", 300))
    config = TrainingConfig(train_src=s, train_tgt=t, tokenizer="sentencepiece", joint_vocabulary=True,
                            src_vocab_size=400, tgt_vocab_size=400, max_len=14)
    src_tok, tgt_tok, _ = data.build_vocabularies(config, str(tmp_path), log=lambda *a: None)
    stats = data.corpus_stats(s, t, src_tok, tgt_tok, max_len=14)
    assert stats.skipped_too_long > 0

    def read(sampling):
        rows = [(x["source_ids"], y) for x, y in data.make_dataset(
            s, t, src_tok, tgt_tok, max_len=14, batch_size=16, shuffle=True, seed=5, sampling=sampling)]
        texts = collections.Counter(pair for x, y in rows for pair in zip(_texts(src_tok, x), _texts(tgt_tok, y)))
        ids = [pair_key(None, None, a, b) for x, y in rows for a, b in zip(x.numpy(), y.numpy())]
        return len(rows), texts, ids

    best = read(None)
    first, second = read((0.2, -1)), read((0.2, -1))
    assert first[0] == second[0] == best[0] == data.batches_per_epoch(stats, 16, "sentences", 1600)
    assert sum(best[1].values()) == stats.pairs
    assert first[1] == second[1] == best[1]                      # the same pairs of text
    assert first[2] != second[2] and first[2] != best[2]         # cut differently
    assert sum(map(len, sum(first[2], ()))) > sum(map(len, sum(best[2], ())))   # into more pieces
    with pytest.raises(ValueError, match="cannot read prepared shards"):
        data.make_dataset(s, t, src_tok, tgt_tok, max_len=14, batch_size=16, prepared=str(tmp_path),
                          sampling=(0.1, 64))


@pytest.mark.parametrize("settings,message", [
    (dict(tokenizer="word"), "needs --tokenizer=sentencepiece"),
    (dict(tokenizer="sentencepiece", prepared_shards=2), "cannot be used with --prepared_shards"),
    (dict(tokenizer="sentencepiece", sentencepiece_nbest_size=1), "--sentencepiece_nbest_size=1 leaves nothing"),
])
def test_subword_sampling_refuses_what_cannot_sample(settings, message):
    from nmt_tf.training import job as training

    with pytest.raises(training.TrainingError, match=message):
        training.check_config(TrainingConfig(train_src="s", train_tgt="t", sentencepiece_alpha=0.1, **settings))
    with pytest.raises(ValueError, match="the word tokenizer cannot sample"):
        text.make_tokenizer(list(text.SPECIAL_TOKENS), "word").sampler(0.1, 64)


class TokenCountingNll:
    """Stands in for a model in DevEvaluator: the "NLL" of a batch is its
    number of target tokens."""

    def batch_nll(self, x, y, training=False):
        tokens = tf.reduce_sum(tf.cast(y > 0, tf.float32))
        return tokens, tokens, tf.cast(tf.shape(y)[0], tf.float32)


def test_dev_evaluations_after_the_first_read_the_batches_from_memory(tmp_path, tiny_corpus, tokenizers):
    from nmt_tf.training import callbacks

    src_tok, tgt_tok, _ = tokenizers
    src = write_lines(tmp_path / "dev.en", read_multi30k("val.en.gz", 30))
    tgt = write_lines(tmp_path / "dev.fr", read_multi30k("val.fr.gz", 30))
    dev = data.make_dataset(src, tgt, src_tok, tgt_tok, max_len=50, batch_size=8)
    evaluator = callbacks.DevEvaluator(TokenCountingNll(), dev)
    first = evaluator()
    assert first["sentences"] == 30 and first["tokens"] > 30 and first["nll_per_token"] == 1.0
    os.remove(src)
    os.remove(tgt)
    assert evaluator() == first      # the files are gone: the batches came from memory


def test_corpus_stats_are_cached_by_file_identity(tmp_path, tiny_corpus, tokenizers):
    src_tok, tgt_tok, _ = tokenizers
    cache = str(tmp_path / "stats.json")
    first = data.corpus_stats(tiny_corpus["train_src"], tiny_corpus["train_tgt"], src_tok, tgt_tok, 50, cache)
    assert os.path.exists(cache)
    again = data.corpus_stats(tiny_corpus["train_src"], tiny_corpus["train_tgt"], src_tok, tgt_tok, 50, cache)
    assert again == first
    other = data.corpus_stats(tiny_corpus["train_src"], tiny_corpus["train_tgt"], src_tok, tgt_tok, 5, cache)
    assert other.max_len == 5 and other.pairs < first.pairs


# ------------------------------------------------------------------ prepared shards
@pytest.fixture(scope="module")
def prepared(tiny_corpus, tokenizers, tmp_path_factory):
    src_tok, tgt_tok, _ = tokenizers
    path = str(tmp_path_factory.mktemp("prepared") / "prepared")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(data, "_TOKENIZE_BATCH", 6)           # blocks of 6 pairs: 7 blocks over 3 shards
        manifest = data.write_prepared_shards(tiny_corpus["train_src"], tiny_corpus["train_tgt"], src_tok,
                                              tgt_tok, path, max_len=50, shards=3, log=lambda *a: None)
    return path, manifest


def prepared_dataset(tiny_corpus, tokenizers, prepared_dir, **kw):
    src_tok, tgt_tok, _ = tokenizers
    return data.make_dataset(tiny_corpus["train_src"], tiny_corpus["train_tgt"], src_tok, tgt_tok, max_len=50,
                             prepared=prepared_dir, **kw)


def test_prepared_shards_hold_the_pairs_the_text_pipeline_makes(tiny_corpus, tokenizers, prepared):
    src_tok, tgt_tok, stats = tokenizers
    path, manifest = prepared
    assert manifest["pairs"] == stats.pairs == 40 and len(manifest["shards"]) == 3
    blocks = [sum(1 for _ in tf.data.TFRecordDataset(os.path.join(path, n))) for n in manifest["shards"]]
    assert blocks == [3, 2, 2] and manifest["blocks"] == 7      # round robin
    assert not os.path.exists(path + ".partial")
    got, batches = epoch_pairs(prepared_dataset(tiny_corpus, tokenizers, path, batch_size=6, shuffle=True,
                                                shuffle_buffer=7, seed=3))
    text_pairs, text_batches = epoch_pairs(data.make_dataset(
        tiny_corpus["train_src"], tiny_corpus["train_tgt"], src_tok, tgt_tok, max_len=50, batch_size=6))
    assert collections.Counter(got) == collections.Counter(text_pairs)
    assert len(batches) == len(text_batches) == data.batches_per_epoch(stats, 6, "sentences", 1600)
    for source, target, labels in batches:                     # the model's rows: [BOS] y / y [EOS]
        assert (target[:, 0] == text.BOS_ID).all()
        words = target[:, 1:] > 0
        np.testing.assert_array_equal(target[:, 1:][words], labels[:, :-1][words])
        assert ((labels == text.EOS_ID).sum(axis=1) == 1).all() and (source == text.EOS_ID).sum() == len(source)


def test_prepared_order_depends_only_on_seed_and_epoch(tiny_corpus, tokenizers, prepared):
    def order(epoch, skip=0):
        ds = prepared_dataset(tiny_corpus, tokenizers, prepared[0], batch_size=4, shuffle=True,
                              shuffle_buffer=10, seed=5, epoch=epoch, skip_batches=skip)
        return [b[0].tolist() for b in epoch_pairs(ds)[1]]

    assert order(0) == order(0)
    assert order(0) != order(1)
    assert order(0, skip=3) == order(0)[3:]


def test_prepared_key_changes_with_the_corpus_vocabularies_and_max_len(tiny_corpus, tokenizers, tmp_path):
    src_tok, tgt_tok, _ = tokenizers
    key = data.prepared_key(tiny_corpus["train_src"], tiny_corpus["train_tgt"], src_tok, tgt_tok, 50)
    assert key == data.prepared_key(tiny_corpus["train_src"], tiny_corpus["train_tgt"], src_tok, tgt_tok, 50)
    assert key != data.prepared_key(tiny_corpus["train_src"], tiny_corpus["train_tgt"], src_tok, tgt_tok, 20)
    assert key != data.prepared_key(tiny_corpus["train_src"], tiny_corpus["train_tgt"], tgt_tok, src_tok, 50)
    other = write_lines(tmp_path / "other.en", read_multi30k("train.en.gz", 40))
    assert key != data.prepared_key(other, tiny_corpus["train_tgt"], src_tok, tgt_tok, 50)
    with pytest.raises(data.CorpusError, match="holds no prepared shards"):
        next(iter(prepared_dataset(tiny_corpus, tokenizers, str(tmp_path / "none"), batch_size=4)))


def test_a_full_disk_while_preparing_shards_is_one_error_and_leaves_nothing(tiny_corpus, tokenizers, tmp_path,
                                                                             monkeypatch):
    import errno

    from nmt_tf.core.files import WriteFailed

    src_tok, tgt_tok, _ = tokenizers

    class FullDisk:
        def __init__(self, path):
            pass

        def write(self, record):
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self):
            pass

    monkeypatch.setattr(tf.io, "TFRecordWriter", FullDisk)
    path = str(tmp_path / "prepared")
    with pytest.raises(WriteFailed, match="No space left on device.*partial shards were removed"):
        data.write_prepared_shards(tiny_corpus["train_src"], tiny_corpus["train_tgt"], src_tok, tgt_tok, path,
                                   max_len=50, shards=2, log=lambda *a: None)
    assert not os.path.exists(path) and not os.path.exists(path + ".partial")


def test_steps_per_epoch_of_own_data_count_each_workers_share_and_local_replicas():
    manifest = {"shard_pairs": [10, 10, 10, 3]}       # worker 0: shards 0, 2 (20 pairs); worker 1: 1, 3 (13)
    pairs = data.prepared_pipeline_pairs(manifest, 2)
    assert pairs == [20, 13]
    two_workers = tf.distribute.InputContext(num_input_pipelines=2, num_replicas_in_sync=2)
    # per-replica batches of 2 from pools of 8: 20 pairs -> 4 + 4 + 2 = 10; 13 -> 4 + 3 = 7
    assert data.pipeline_batches_per_epoch(pairs, 4, "sentences", 8, two_workers) == 7
    two_gpus_each = tf.distribute.InputContext(num_input_pipelines=2, num_replicas_in_sync=4)
    # a step takes one batch per local replica: 7 batches feed 3 steps of 2 replicas
    assert data.pipeline_batches_per_epoch(pairs, 8, "sentences", 8, two_gpus_each) == 3
    assert data.pipeline_batches_per_epoch(pairs, 8, "tokens", 8, two_workers) is None
