"""nmt_tf.score: phrase tables, n-best lists and pairs keep every field and their order."""

import gzip
import io
import math

import pytest

from conftest import run_cli
from nmt_tf.inference import scoring
from nmt_tf.inference.client import SignatureClient

PHRASES = [
    b"a man ||| un homme ||| 0.5 0.25 0.4 0.2 ||| 0-0 1-1 ||| 10 8 4",
    b"the dog &apos;s ||| le chien ||| 0.1 0.2 0.3 0.4 ||| 0-0 1-1 |||",
    b"broken line without fields",
    b"two dogs ||| deux chiens ||| 0.6 0.6 0.6 0.6",
]


@pytest.fixture(scope="module")
def scorer(exported):
    return scoring.pair_scorer(SignatureClient("score", saved_model=exported[2]))


def run_phrase_table(scorer, lines, **kw):
    out = io.BytesIO()
    malformed = scoring.Malformed("phrase table", strict=False, log=lambda m: None)
    scoring.score_phrase_table(lines, scoring.OrderedScorer(scorer, out, batch_size=2, unescape=True), malformed, **kw)
    return out.getvalue().split(b"\n")[:-1], malformed


def test_phrase_table_keeps_fields_and_order_and_appends_log_p(scorer):
    lines, malformed = run_phrase_table(scorer, PHRASES)
    assert len(lines) == 4 and malformed.lines == [3]
    assert lines[2] == PHRASES[2]
    want = scorer([b"a man", b"the dog 's", b"two dogs"], [b"un homme", b"le chien", b"deux chiens"])["log_prob"]
    for i, j in ((0, 0), (1, 1), (3, 2)):
        before, after = PHRASES[i].split(b" ||| "), lines[i].split(b" ||| ")
        assert len(after) == len(before)
        assert after[:2] == before[:2] and after[3:] == before[3:]
        old_scores, new_scores = before[2].split(), after[2].split()
        assert new_scores[:-1] == old_scores
        assert float(new_scores[-1]) == pytest.approx(float(want[j]), rel=1e-5)
    probs, _ = run_phrase_table(scorer, PHRASES[:1], phrase_score="prob")
    assert float(probs[0].split(b" ||| ")[2].split()[-1]) == pytest.approx(math.exp(float(want[0])), rel=1e-4)


def test_phrase_table_cli_streams_gzip_in_and_out(exported, tmp_path):
    src = tmp_path / "phrase-table.gz"
    with gzip.open(src, "wb") as f:
        f.write(b"\n".join(PHRASES * 30) + b"\n")
    out = tmp_path / "scored.gz"
    result = run_cli("-m", "nmt_tf.score", f"--saved_model={exported[2]}", f"--phrase_table={src}",
                     f"--output={out}", "--lines_per_batch=7")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = gzip.open(out, "rb").read().split(b"\n")[:-1]
    assert len(lines) == 120 and lines[2::4] == [PHRASES[2]] * 30
    assert "30 malformed phrase table lines copied unchanged" in result.stderr
    assert "line 3:" in result.stderr
    strict = run_cli("-m", "nmt_tf.score", f"--saved_model={exported[2]}", f"--phrase_table={src}",
                     f"--output={tmp_path / 'x'}", "--strict")
    assert strict.returncode == 1 and "phrase table line 3:" in strict.stderr


def test_nbest_rescoring_appends_a_feature_and_keeps_the_rest(scorer):
    sources = [b"A man runs .", b"Two dogs ."]
    nbest = [b"0 ||| un homme court . ||| LM0= -10.5 TM0= -2 ||| -12.5",
             b"0 ||| un homme . ||| LM0= -8 TM0= -3 ||| -11",
             b"7 ||| out of range ||| F= 1 ||| 1",
             b"1 ||| deux chiens . ||| LM0= -6 TM0= -1 ||| -7"]
    out = io.BytesIO()
    malformed = scoring.Malformed("n-best", strict=False, log=lambda m: None)
    scoring.score_nbest(nbest, sources, scoring.OrderedScorer(scorer, out, 64, True), malformed, "NMT")
    lines = out.getvalue().split(b"\n")[:-1]
    assert malformed.lines == [3] and lines[2] == nbest[2]
    want = scorer([sources[0], sources[0], sources[1]],
                  [b"un homme court .", b"un homme .", b"deux chiens ."])["log_prob"]
    for i, j in ((0, 0), (1, 1), (3, 2)):
        before, after = nbest[i].split(b" ||| "), lines[i].split(b" ||| ")
        assert after[0] == before[0] and after[1] == before[1] and after[3] == before[3]
        assert after[2].startswith(before[2] + b" NMT= ")
        assert float(after[2].split(b"NMT= ")[1]) == pytest.approx(float(want[j]), rel=1e-5)


def test_pairs_to_tsv(scorer, tmp_path):
    out = io.BytesIO()
    malformed = scoring.Malformed("pair", strict=False, log=lambda m: None)
    pairs = [(1, b"A man .", b"Un homme .", b""), (2, b"bad line", None, b"bad line"), (3, b"", b"", b"")]
    scoring.score_pairs(pairs, scoring.OrderedScorer(scorer, out, 64, False), malformed)
    lines = out.getvalue().split(b"\n")[:-1]
    assert len(lines) == 3 and lines[1] == b"bad line" and malformed.lines == [2]
    fields = lines[0].split(b"\t")
    assert fields[:2] == [b"A man .", b"Un homme ."] and len(fields) == 5
    r = scorer([b"A man ."], [b"Un homme ."])
    assert float(fields[2]) == pytest.approx(float(r["log_prob"][0]), rel=1e-5)
    assert int(fields[4]) == int(r["target_length"][0])
    assert lines[2].split(b"\t")[4] == b"1"            # an empty target is just [EOS]


def test_unequal_pair_files_are_an_error(exported, tmp_path):
    (tmp_path / "s").write_text("a\nb\n")
    (tmp_path / "t").write_text("a\n")
    result = run_cli("-m", "nmt_tf.score", f"--saved_model={exported[2]}", f"--source={tmp_path / 's'}",
                     f"--target={tmp_path / 't'}", f"--output={tmp_path / 'o'}")
    assert result.returncode == 1 and "different numbers of lines" in result.stderr


@pytest.mark.parametrize("parallel_batches", [1, 2])
@pytest.mark.parametrize("sort_window", [1, 7, 100])
def test_pairs_are_scored_in_batches_by_length_and_written_in_order(sort_window, parallel_batches):
    """--sort_window pairs are scored in batches of similar length (target,
    then source words), --parallel_batches at once; lines that pass through
    and scored lines come out in input order."""
    sent = []

    def fake(sources, targets):            # log p = -(target words) - (source words) / 10
        sent.append(list(targets))
        return {"log_prob": [-len(t.split()) - len(s.split()) / 10 for s, t in zip(sources, targets)]}

    lines = [line if line == b"broken" else line + b" ||| 0.5" for line in (
        b"a b ||| x y z", b"c ||| w", b"broken", b"d e f ||| u v", b"g ||| p q r s t", b"h i ||| o",
        b"j ||| n m", b"k l m n ||| k l m n o p", b"o ||| q")]
    out = io.BytesIO()
    malformed = scoring.Malformed("phrase table", strict=False, log=lambda m: None)
    ordered = scoring.OrderedScorer(fake, out, batch_size=3, unescape=False, sort_window=sort_window,
                                    parallel_batches=parallel_batches)
    scoring.score_phrase_table(lines, ordered, malformed)
    written = out.getvalue().split(b"\n")[:-1]
    assert len(written) == len(lines) and written[2] == b"broken" and malformed.lines == [3]
    for line, got in zip(lines, written):
        if b"|||" in line:
            source, target, _ = line.split(b" ||| ")
            assert float(got.split(b" ||| ")[2].split()[-1]) == pytest.approx(
                -len(target.split()) - len(source.split()) / 10)
    pairs = [line.split(b" ||| ")[:2] for line in lines if b"|||" in line]
    window = max(sort_window, 3)
    expected = []
    for start in range(0, len(pairs), window):
        chunk = pairs[start:start + window]
        if window > 3:
            chunk = sorted(chunk, key=lambda p: (len(p[1].split()), len(p[0].split())))
        expected += [[t for _, t in chunk[i:i + 3]] for i in range(0, len(chunk), 3)]
    assert (sent if parallel_batches == 1 else sorted(sent)) == (expected if parallel_batches == 1
                                                                 else sorted(expected))


def test_score_files_from_python_without_flags(tmp_path):
    """The library entry of nmt_tf.score: one input in, every line out in
    order with the score added (gzip by the output's name), the pairs
    counted; the input kinds it cannot take are one ScoreError."""
    fake = lambda sources, targets: {"log_prob": [-float(len(t.split())) for t in targets],
                                     "log_prob_per_token": [-1.0] * len(targets),
                                     "target_length": [len(t.split()) + 1 for t in targets]}
    (tmp_path / "pairs.tsv").write_bytes(b"a b\tx y z\nno tab here\nc\tw\n")
    warnings = []
    scored = scoring.score_files(fake, tsv=str(tmp_path / "pairs.tsv"), output=str(tmp_path / "out.tsv.gz"),
                                 batch_size=2, log=warnings.append)
    assert scored == 2 and len(warnings) == 2        # the malformed line, then the count
    assert gzip.open(tmp_path / "out.tsv.gz").read().split(b"\n")[:-1] == [
        b"a b\tx y z\t-3\t-1\t4", b"no tab here", b"c\tw\t-1\t-1\t2"]
    with pytest.raises(scoring.ScoreError, match="give one of --phrase_table"):
        scoring.score_files(fake, source=str(tmp_path / "pairs.tsv"))
    with pytest.raises(scoring.ScoreError, match="--nbest needs --source"):
        scoring.score_files(fake, nbest=str(tmp_path / "pairs.tsv"))
    with pytest.raises(scoring.ScoreError, match="pair line 2: expected 'source<TAB>target'"):
        scoring.score_files(fake, tsv=str(tmp_path / "pairs.tsv"), output=str(tmp_path / "x"), strict=True)
