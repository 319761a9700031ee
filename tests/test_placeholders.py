"""Placeholders (nmt_tf.inference.placeholders): URLs, numbers and the like
masked before translation and put back verbatim, never dropped."""

import io

import numpy as np
import pytest

from nmt_tf.inference import placeholders
from nmt_tf.inference.translation import finish, prepare, translate_lines

LINE = "Meet me at 7:30 at www.example.com/a?b=1, or mail jo.ann@example.co.uk!"


def test_each_kind_is_found_whole_and_masked_in_order():
    line = "It costs $25.99 (about 25€), 7% more #tbt @bob_99 🙂👍🏽 see https://x.org/a_(b). Call 555-1234."
    protected = placeholders.protect(line)
    assert protected.items == ["$25.99", "25€", "7%", "#tbt", "@bob_99", "🙂👍🏽", "https://x.org/a_(b)", "555-1234"]
    assert protected.text == "It costs °1° (about °2°), °3° more °4° °5° °6° see °7°. Call °8°."
    # the words stay the words (inline markup's positions hold)
    assert len(protected.text.split()) == len(line.split())


@pytest.mark.parametrize("line", ["2 men stand in line.", "The 3rd floor.", "A 10-year-old boy.", "C'est #1."])
def test_lone_digits_ordinals_and_compounds_are_left_to_the_model(line):
    assert placeholders.protect(line).items == []


def test_kinds_can_be_chosen_or_turned_off():
    assert placeholders.protect(LINE, ("email",)).items == ["jo.ann@example.co.uk"]
    assert placeholders.parse_kinds("none") == ()
    assert placeholders.parse_kinds("all") == placeholders.KINDS
    assert placeholders.parse_kinds("url, number") == ("url", "number")
    with pytest.raises(ValueError, match="unknown kind 'phone'"):
        placeholders.parse_kinds("url,phone")


def test_a_line_holding_the_marks_is_left_unprotected_with_a_warning():
    protected = placeholders.protect("A dog °1° runs at 7:30, 20 °C.")
    assert protected.text == "A dog °1° runs at 7:30, 20 °C." and protected.items == []
    assert "nothing was protected" in protected.warning


def test_masks_written_once_are_replaced_and_extra_ones_removed():
    protected = placeholders.protect(LINE)
    text, warning = placeholders.restore(protected, "Rendez-vous à °1° sur ° 2 °, ou écrivez à °3° !")
    assert text == "Rendez-vous à 7:30 sur www.example.com/a?b=1, ou écrivez à jo.ann@example.co.uk !"
    assert warning is None
    # a mask written against the word before it gets the space the source had
    spaced = placeholders.protect("A photo in Paris 🙂 and Rome.")
    assert placeholders.restore(spaced, "Une photo à Paris°1° et Rome.")[0] == "Une photo à Paris 🙂 et Rome."
    assert placeholders.restore(placeholders.protect("It costs 5€."), "Il coûte °1°.")[0] == "Il coûte 5€."
    # an item of no letters or digits put back before the final punctuation keeps its own word
    assert placeholders.restore(spaced, "Une photo à Paris °1°.")[0] == "Une photo à Paris 🙂."
    text, warning = placeholders.restore(protected, "À °1° °1° sur °2° °9°, écrivez °3°.")
    assert text == "À 7:30 sur www.example.com/a?b=1, écrivez jo.ann@example.co.uk."
    assert warning is None


def test_a_lost_item_is_put_back_by_the_attention_or_at_the_end_never_dropped():
    protected = placeholders.protect("Meet at 7:30 or mail a@b.org.")
    assert protected.text == "Meet at °1° or mail °2°."
    source = ["▁Meet", "▁at", "▁", "°", "1", "°", "▁or", "▁mail", "▁", "°", "2", "°", ".", "[EOS]"]
    target = ["▁Rendez", "-", "vous", "▁à", "▁", "°", "1", "°", "▁ou", "▁écrivez", "▁vite", ".", "[EOS]"]
    links = [(0, 0), (1, 0), (2, 0), (3, 1), (4, 2), (5, 3), (6, 4), (7, 5), (8, 6), (9, 7), (10, 9), (11, 12),
             (12, 13)]
    alignment = np.full([len(target), len(source)], 0.01, np.float32)
    for t, s in links:
        alignment[t, s] = 1.0
    translation = "Rendez-vous à °1° ou écrivez vite."
    # "vite" attends to the mask's word: the e-mail address goes after it
    text, warning = placeholders.restore(protected, translation, source, target, alignment)
    assert text == "Rendez-vous à 7:30 ou écrivez vite a@b.org."
    assert "lost the placeholder of a@b.org" in warning and "by the attention" in warning
    # without an alignment: before the final punctuation
    text, warning = placeholders.restore(protected, "Rendez-vous à °1° ou écrivez.")
    assert text == "Rendez-vous à 7:30 ou écrivez a@b.org." and "at the end" in warning
    # a stray mark the model wrote is not left in the text
    assert placeholders.restore(protected, "À °1° ou ° °2°.")[0] == "À 7:30 ou a@b.org."


def test_with_markup_the_items_are_escaped_and_the_tags_kept():
    prepared = prepare("Read <b>a&amp;b.org</b> at https://x.org/?a=1&b=2 now.", "html", placeholders.KINDS)
    assert prepared.text == "Read a&b.org at °1° now."
    source = ["▁Read", "▁a", "&", "b", ".", "org", "▁at", "▁", "°", "1", "°", "▁now", ".", "[EOS]"]
    target = ["▁Lisez", "▁a", "&", "b", ".", "org", "▁à", "▁", "°", "1", "°", "▁maintenant", ".", "[EOS]"]
    alignment = np.eye(len(target), len(source), dtype=np.float32)
    text, markup_warning, placeholder_warning = finish(prepared, "Lisez a&b.org à °1° maintenant.", source,
                                                       target, alignment)
    assert text == "Lisez <b>a&amp;b.org</b> à https://x.org/?a=1&amp;b=2 maintenant."
    assert markup_warning is None and placeholder_warning is None


class _EchoClient:
    """Stands in for a signature: translates by copying, masks included, but drops °2°."""

    where = "echo"

    def __init__(self):
        self.seen, self.calls, self.outputs = [], [], ["translation", "truncated"]

    def has_output(self, name):
        return True

    def output_size(self, name, default):
        return 1

    def __call__(self, text):
        self.seen += list(text)
        aligned = "alignment" in self.outputs
        self.calls.append(aligned)
        out = [t.decode().replace(" °2°", "") for t in text]
        n = len(out)
        tokens = [["▁" + w for w in t.split()] + ["[EOS]"] for t in out]
        sources = [["▁" + w for w in t.decode().split()] + ["[EOS]"] for t in text]
        width_t, width_s = max(map(len, tokens)), max(map(len, sources))
        plain = {"translation": np.array([t.encode() for t in out], object), "truncated": np.zeros([n], bool)}
        if not aligned:
            return plain
        return {**plain, "source_tokens": np.array([s + [""] * (width_s - len(s)) for s in sources], object),
                "target_tokens": np.array([t + [""] * (width_t - len(t)) for t in tokens], object),
                "alignment": np.zeros([n, width_t, width_s], np.float32)}


def test_translate_lines_protects_by_default_kinds_and_warns_per_line(capsys):
    lines = [b"Call me at 7:30 on 2026-12-05.", b"No items here.", b"See www.a.org and 10h30 now."]
    out = io.StringIO()
    client = _EchoClient()
    translate_lines(client, lines, out, 64, 1, False, False, protect=placeholders.KINDS)
    # a batch that holds items asks for the tokens and the alignment too
    assert client.calls == [True] and client.outputs == ["translation", "truncated"]
    assert client.seen == ["Call me at °1° on °2°.".encode(), b"No items here.",
                           "See °1° and °2° now.".encode()]
    # the echo drops every °2° and attends to nothing (all weights 0: the first word is the most attended),
    # so the lost item is put back after the first word, with a warning
    assert out.getvalue().splitlines() == ["Call 2026-12-05 me at 7:30 on.", "No items here.",
                                           "See 10h30 www.a.org and now."]
    err = capsys.readouterr().err
    assert "warning: line 1: the model lost the placeholder of 2026-12-05" in err
    assert "warning: line 3: the model lost the placeholder of 10h30" in err
    out = io.StringIO()
    client = _EchoClient()
    translate_lines(client, lines[:1], out, 64, 1, False, False, protect=("url",))
    assert out.getvalue() == "Call me at 7:30 on 2026-12-05.\n"
    assert client.calls == [False]          # no items in the batch: the plain outputs only
