"""Inline markup through translation (nmt_tf.inference.markup): taken out,
put back by the attention, always well-formed; unbalanced markup stays text."""

import html.parser
import io
import json

import numpy as np
import pytest

from nmt_tf.inference import markup
from nmt_tf.inference.translation import translate_lines

SOURCE = ["▁A", "▁black", "▁dog", "▁runs", "▁in", "▁the", "▁sn", "ow", ".", "[EOS]"]
TARGET = ["▁Un", "▁chien", "▁noir", "▁court", "▁dans", "▁la", "▁neige", ".", "[EOS]"]
# target piece -> the source piece it attends to (the pieces of "snow." are three)
LINKS = [(0, 0), (1, 2), (2, 1), (3, 3), (4, 4), (5, 5), (6, 6), (7, 8), (8, 9)]
TRANSLATION = "Un chien noir court dans la neige."


def alignment(links=LINKS, rows=len(TARGET), cols=len(SOURCE)):
    a = np.full([rows, cols], 0.01, np.float32)
    for t, s in links:
        a[t, s] = 1.0
    return a / a.sum(1, keepdims=True)


def restored(line, kind="html", links=LINKS, translation=TRANSLATION, target=TARGET):
    marked = markup.strip(line, kind)
    assert marked.text.split() == "A black dog runs in the snow.".split()
    return markup.restore(marked, translation, SOURCE, target, alignment(links, len(target)))


class _WellFormed(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.stack, self.ok = [], True

    def handle_starttag(self, tag, attrs):
        if tag not in markup.HTML_VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        self.ok = self.ok and bool(self.stack) and self.stack.pop() == tag


def well_formed(text: str) -> bool:
    parser = _WellFormed()
    parser.feed(text)
    parser.close()
    return parser.ok and not parser.stack


def test_tags_go_around_the_target_words_aligned_to_their_words():
    text, warning = restored('A <b>black <i>dog</i></b> runs in the <a href="x?a=1&amp;b=2">snow</a>.')
    assert warning is None
    # "black dog" -> "chien noir" (the order swapped), <i> inside it on "chien"; the link on "neige."
    # (whole words: the period belongs to "snow."); the attribute as written
    assert text == 'Un <b><i>chien</i> noir</b> court dans la <a href="x?a=1&amp;b=2">neige.</a>'
    assert well_formed(text)


def test_min_share_keeps_only_the_words_mostly_attending_to_the_element():
    """An article attending half to its noun joins the noun's element at
    min_share 0 (its argmax is the noun), not at 0.6."""
    links = LINKS[:1] + [(1, 2), (2, 1)] + LINKS[3:]
    weights = alignment(links)
    weights[5] = 0.0
    weights[5, 5], weights[5, 6], weights[5, 7] = 0.4, 0.35, 0.25     # "la": 60 % on the pieces of "snow."
    marked = markup.strip("A black dog runs in the <b>snow.</b>", "html")
    assert markup.restore(marked, TRANSLATION, SOURCE, TARGET, weights)[0] == "Un chien noir court dans <b>la neige.</b>"
    assert markup.restore(marked, TRANSLATION, SOURCE, TARGET, weights, min_share=0.7)[0] == (
        "Un chien noir court dans la <b>neige.</b>")


def test_void_empty_and_comment_elements_stand_before_the_aligned_word():
    text, _ = restored("A black dog<br> runs in the <b></b>snow.<!-- end -->")
    assert text == "Un chien noir <br>court dans la <b></b>neige.<!-- end -->"
    text, _ = restored("A black dog runs <br/>in the snow.", kind="xml")       # no line breaks in XML
    assert text == "Un chien noir court <br/>dans la neige."


def test_a_line_break_parts_words_other_tags_do_not():
    assert markup.strip("snow.<br>Two men", "html").text.split() == ["snow.", "Two", "men"]
    assert markup.strip("a <b>big</b>dog", "html").text.split() == ["a", "bigdog"]
    assert markup.strip("a <b>big</b>dog", "html").elements[0].first == 1        # whole words


def test_crossing_placements_are_cut_apart_and_children_stay_inside():
    # <b> wraps "black", <i> wraps "dog": their targets "noir" and "chien" are neighbours, not crossing;
    # make "chien" attend to both black and dog so that <b> would cover "chien noir" and <i> "chien"
    links = LINKS[:1] + [(1, 1), (2, 1)] + LINKS[3:]
    text, _ = restored("A <b>black</b> <i>dog</i> runs in the snow.", links=links)
    assert well_formed(text)
    text, _ = restored("A <b>black <i>dog</i></b> runs in the <u>snow.</u>", links=[(t, 9 - s) for t, s in LINKS])
    assert well_formed(text) and text.count("<i>") == 1 and text.count("</u>") == 1


def test_xml_keeps_case_and_html_knows_void_elements():
    marked = markup.strip("A <Term id='1'>black dog</Term> runs in the snow.", "xml")
    assert [e.start for e in marked.elements] == ["<Term id='1'>"] and marked.elements[0].end == "</Term>"
    assert markup.strip("A black dog runs<img src=a.png> in the snow.", "html").elements[0].end is None
    assert markup.strip("A black dog runs<img src=a.png> in the snow.", "xml").warning is not None


@pytest.mark.parametrize("line", ["A <b>black dog runs in the snow.", "A black dog</b> runs in the snow.",
                                  "A <b>black <i>dog</b></i> runs in the snow."])
def test_unbalanced_markup_is_translated_as_text_with_a_warning(line):
    marked = markup.strip(line, "html")
    assert marked.text == line and marked.elements == [] and "markup left in the text" in marked.warning
    text, warning = markup.restore(marked, "Un chien <b>noir", SOURCE, TARGET, alignment())
    assert text == "Un chien <b>noir" and warning == marked.warning        # never dropped, not re-escaped


def test_text_is_entity_decoded_for_the_model_and_escaped_after():
    marked = markup.strip("Fish &amp; chips &lt;3 <b>now</b>", "html")
    assert marked.text == "Fish & chips <3 now"
    text, _ = markup.restore(marked, "Poisson & frites <3 maintenant", ["▁Fish", "▁&", "▁chips", "▁<", "3", "▁now",
                                                                        "[EOS]"],
                             ["▁Poisson", "▁&", "▁frites", "▁<", "3", "▁maintenant", "[EOS]"],
                             alignment([(0, 0), (1, 1), (2, 2), (3, 3), (4, 4), (5, 5), (6, 6)], 7, 7))
    assert text == "Poisson &amp; frites &lt;3 <b>maintenant</b>"


def test_words_the_model_did_not_see_are_placed_by_position_with_a_warning():
    marked = markup.strip("A <b>black</b> dog runs in the snow.", "html")
    text, warning = markup.restore(marked, TRANSLATION, SOURCE[:3] + ["[EOS]"], TARGET, alignment(
        [(t, min(s, 3)) for t, s in LINKS], cols=4))             # a source cut to its first three pieces
    assert "by word position" in warning and well_formed(text) and text.count("<b>") == 1


class _FakeClient:
    """A serving_default client answering TRANSLATION with LINKS' alignment for every line."""
    where = "fake"

    def has_output(self, name):
        return True

    def output_size(self, name, axis):
        return 1

    def __init__(self):
        self.seen = []

    def __call__(self, text):
        n = len(text)
        self.seen += list(text)
        pad = lambda tokens, width: [t.encode() for t in tokens] + [b""] * (width - len(tokens))  # noqa: E731
        return {"translation": np.array([TRANSLATION.encode()] * n, object),
                "truncated": np.zeros([n], bool), "score": np.full([n], -0.5, np.float32),
                "log_prob": np.full([n], -4.0, np.float32),
                "source_tokens": np.array([pad(SOURCE, 12)] * n, object),
                "target_tokens": np.array([pad(TARGET, 10)] * n, object),
                "alignment": np.stack([np.pad(alignment(), [(0, 1), (0, 2)])] * n)}


def test_translate_lines_with_markup_writes_the_tags_back_and_warns_per_line(capsys):
    out = io.StringIO()
    lines = [b"A <b>black dog</b> runs in the snow.", b"A <b>black dog runs in the snow.",
             b"A black dog runs in the <i>snow</i>."]
    client = _FakeClient()
    translate_lines(client, lines, out, 64, 1, False, False, markup="html")
    assert client.seen == [b"A black dog runs in the snow.", lines[1], b"A black dog runs in the snow."]
    assert out.getvalue().splitlines() == ["Un <b>chien noir</b> court dans la neige.", TRANSLATION,
                                           "Un chien noir court dans la <i>neige.</i>"]
    assert "warning: line 2: markup left in the text: <b> is never closed" in capsys.readouterr().err
    out = io.StringIO()
    translate_lines(_FakeClient(), lines[:1], out, 64, 1, True, False, markup="html")
    assert json.loads(out.getvalue())["translation"] == "Un <b>chien noir</b> court dans la neige."
