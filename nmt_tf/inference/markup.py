"""Inline markup carried through translation by the attention (issue 93, item 3).

`strip(line, "html")` takes the tags out of a line: the plain sentence to
translate, and each element with the source words it wraps (whole words:
a tag inside a word wraps the whole word). `restore(...)` puts them back
into the translation around the target words the model's soft alignment
(paper 000's alpha, summed over the pieces of each word) ties to those
source words:

- an element wraps the target words whose most attended source word is one
  of its words, from the first to the last of them (no such word: the one
  target word that attends most to its words);
- an element inside another stays inside it, and two elements that would
  cross are cut apart, so the output is always well-formed;
- an empty element (`<b></b>`) and a void or self-closing one (`<br>`,
  `<img/>`) goes before the target word that attends most to the source
  word it preceded (at the end when it ended the line).

Markup that does not parse as balanced elements (an end tag without its
start, an element left open) is translated as text, with a warning: never
dropped. Comments, doctypes and processing instructions are kept as void
elements; `<br>` and `<hr>` part the words around them, other tags do not
("<b>big</b>dog" is one word). Text is entity-decoded before translation and escaped again
after (`&`, `<`, `>`), attribute values are kept as written.

"html" knows HTML's void elements (`<br>` needs no end tag); "xml" does not
(only `<x/>` is void) and keeps the case of element names.
"""

from __future__ import annotations

import dataclasses
import html
import html.parser

import numpy as np

KINDS = ("html", "xml")
HTML_VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())
LINE_BREAKS = frozenset({"br", "hr"})
SPACE = "\u2581"         # SentencePiece's word boundary
DEFAULT_MIN_SHARE = 0.0   # restore's min_share (pipelines/multi30k_en_fr/markup.py compares others on val)


@dataclasses.dataclass
class Element:
    start: str                  # the start tag as written (or the whole void element / comment)
    end: str | None             # its end tag, None for a void element
    first: int                  # the first source word it wraps (a void one: the word it precedes)
    last: int                   # one past its last word (== first: empty or void)
    parent: int | None          # index of the element it is inside


@dataclasses.dataclass
class Marked:
    """A line with its markup taken out."""

    text: str                                   # what to translate
    elements: list[Element]
    warning: str | None = None                  # why the markup was left in the text


class _Parser(html.parser.HTMLParser):
    def __init__(self, kind: str):
        super().__init__(convert_charrefs=True)
        self.kind = kind
        self.text: list[str] = []
        self.length = 0
        self.items: list[dict] = []             # elements, in order of their start
        self.open: list[int] = []
        self.error: str | None = None

    def _add(self, start: str, name: str | None, void: bool):
        parent = self.open[-1] if self.open else None
        self.items.append({"start": start, "name": name, "begin": self.length, "end": self.length if void else None,
                           "void": void, "parent": parent})
        if not void:
            self.open.append(len(self.items) - 1)

    def handle_starttag(self, tag, attrs):
        raw = self.get_starttag_text()
        void = self.kind == "html" and tag in HTML_VOID
        self._add(raw, _name(raw), void)
        if void:
            self._breaks(tag)

    def handle_startendtag(self, tag, attrs):
        self._add(self.get_starttag_text(), None, True)
        self._breaks(tag)

    def _breaks(self, tag: str):
        """A line break or rule parts the words around it ("dog.<br>Two")."""
        if self.kind == "html" and tag in LINE_BREAKS:
            self.handle_data(" ")

    def handle_endtag(self, tag):
        if self.kind == "html" and tag in HTML_VOID:
            return                               # </br> and the like: nothing to close
        if not self.open or self.items[self.open[-1]]["name"].lower() != tag.lower():
            self.error = self.error or f"the end tag </{tag}> closes no open element"
            return
        self.items[self.open.pop()]["end"] = self.length

    def handle_data(self, data):
        self.text.append(data)
        self.length += len(data)

    def handle_comment(self, data):
        self._add(f"<!--{data}-->", None, True)

    def handle_decl(self, decl):
        self._add(f"<!{decl}>", None, True)

    def handle_pi(self, data):
        self._add(f"<?{data}>", None, True)

    def unknown_decl(self, data):
        self._add(f"<![{data}]>", None, True)


def _name(start_tag: str) -> str:
    """An element's name as written in its start tag."""
    body = start_tag[1:].lstrip()
    end = 0
    while end < len(body) and not (body[end].isspace() or body[end] in "/>"):
        end += 1
    return body[:end]


def strip(line: str, kind: str = "html") -> Marked:
    """The plain text of `line` and its elements (see the module docstring)."""
    if kind not in KINDS:
        raise ValueError(f"markup {kind!r}: choose one of {', '.join(KINDS)}")
    if "<" not in line and "&" not in line:
        return Marked(line, [])
    parser = _Parser(kind)
    parser.feed(line)
    parser.close()
    if parser.rawdata:                           # an unfinished tag at the end ("a <b")
        parser.error = parser.error or f"an unfinished tag: {parser.rawdata[:40]!r}"
    if parser.open and not parser.error:
        parser.error = f"<{parser.items[parser.open[-1]]['name']}> is never closed"
    if parser.error:
        return Marked(line, [], f"markup left in the text: {parser.error}")
    text = "".join(parser.text)
    spans = _word_spans(text)           # offsets into `text`; the model gets it without outer spaces
    elements = []
    for item in parser.items:
        first, last = _covered(spans, item["begin"], item["end"], item["void"] or item["begin"] == item["end"])
        end = None if item["void"] else f"</{item['name']}>"
        elements.append(Element(item["start"], end, first, last, item["parent"]))
    return Marked(text.strip(), elements)


def _word_spans(text: str) -> list[tuple[int, int]]:
    spans, start = [], None
    for i, c in enumerate(text + " "):
        if c.isspace():
            if start is not None:
                spans.append((start, i))
                start = None
        elif start is None:
            start = i
    return spans


def _covered(spans, begin: int, end: int, empty: bool) -> tuple[int, int]:
    """The words [first, last) that characters [begin, end) touch (whole
    words); an empty range: the word it precedes, [i, i)."""
    if empty:
        i = next((k for k, (a, b) in enumerate(spans) if b > begin), len(spans))
        return i, i
    touched = [k for k, (a, b) in enumerate(spans) if a < end and b > begin]
    if not touched:                              # an element of spaces only
        i = next((k for k, (a, b) in enumerate(spans) if a >= end), len(spans))
        return i, i
    return touched[0], touched[-1] + 1


def words_of_tokens(tokens: list[str], continues_word=None) -> list[int]:
    """The index of the text word each token belongs to. SentencePiece
    pieces: "▁" begins a word, a lone "▁" (no text of its own) belongs to
    none; `continues_word(token)` decides for other tokenizers, by default
    told apart by their tokens (WordPiece's "##" continues a word; a word
    model's tokens are words). "[EOS]" and padding belong to none (-1)."""
    if continues_word is None and not any(token.startswith(SPACE) for token in tokens):
        continues_word = ((lambda token: token.startswith("##")) if any(token.startswith("##") for token in tokens)
                          else (lambda token: False))
    index, out, boundary = -1, [], True
    for token in tokens:
        if token in ("[EOS]", "[PAD]", "[BOS]", ""):
            out.append(-1)
            continue
        if continues_word is not None:
            index += 0 if index >= 0 and continues_word(token) else 1
            out.append(index)
            continue
        boundary = boundary or token.startswith(SPACE)
        if not token.lstrip(SPACE):
            out.append(-1)
            continue
        if boundary or index < 0:
            index += 1
        boundary = False
        out.append(index)
    return out


def word_alignment(alignment, source_words: list[int], target_words: list[int]) -> np.ndarray:
    """alpha summed over the pieces of each word: [target words, source words]."""
    alignment = np.asarray(alignment, np.float32)
    target = np.asarray(target_words[:alignment.shape[0]], int)
    source = np.asarray(source_words[:alignment.shape[1]], int)
    rows, cols = max(target_words, default=-1) + 1, max(source_words, default=-1) + 1
    # one-hot word memberships (-1: none) on both sides of alpha
    by_target = (np.arange(rows)[:, None] == target[None, :]).astype(np.float32)       # [rows, T]
    by_source = (source[:, None] == np.arange(cols)[None, :]).astype(np.float32)       # [S, cols]
    return by_target @ alignment[:len(target), :len(source)] @ by_source


def restore(marked: Marked, translation: str, source_tokens: list[str], target_tokens: list[str], alignment,
            continues_word=None, min_share: float = DEFAULT_MIN_SHARE) -> tuple[str, str | None]:
    """The translation with the markup of `marked` put back (escaped for
    markup), and a warning or None. `min_share`: a target word joins an
    element only if at least this share of its attention is on the
    element's words (besides their holding its most attended one)."""
    words = translation.split()
    if not marked.elements:
        return (translation if marked.warning else _escape_words(words)), marked.warning
    source_count = len(marked.text.split())
    src_words = words_of_tokens(source_tokens, continues_word)
    tgt_words = words_of_tokens(target_tokens, continues_word)
    weights = word_alignment(alignment, src_words, tgt_words)
    warning = None
    if weights.shape != (len(words), source_count):
        # The model's words are not the text's (a source cut to the input limit, a tokenizer that
        # splits punctuation): place by relative position instead.
        warning = "the markup was placed by word position (the model's words are not the text's)"
        weights = _diagonal(len(words), source_count)
    return _render(words, marked.elements, _place(marked.elements, weights, len(words), min_share)), warning


def _diagonal(rows: int, cols: int) -> np.ndarray:
    out = np.zeros([rows, cols], np.float32)
    for t in range(rows):
        if cols:
            out[t, min(cols - 1, int((t + 0.5) * cols / rows))] = 1.0
    return out


def _place(elements: list[Element], weights: np.ndarray, count: int, min_share: float = 0.0) -> list[tuple[int, int]]:
    """Each element's target words [first, last), nested as in the source and never crossing."""
    best_source = weights.argmax(1) if weights.size else np.zeros([count], int)
    placed: list[tuple[int, int]] = []
    for element in elements:
        if element.first == element.last:                  # empty or void: before a word
            if weights.size and element.first < weights.shape[1]:
                at = int(weights[:, element.first].argmax())
            else:
                at = count
            span = (at, at)
        else:
            mass = weights[:, element.first:element.last].sum(1)          # each target word's on the element
            share = mass / np.maximum(weights.sum(1), 1e-9)
            inside = [t for t in range(count) if element.first <= best_source[t] < element.last
                      and share[t] >= min_share]
            if inside:
                span = (min(inside), max(inside) + 1)
            elif count and weights.size:
                t = int(mass.argmax())
                span = (t, t + 1)
            else:
                span = (count, count)
        if element.parent is not None:
            span = _within(span, placed[element.parent])
        for k, other in enumerate(placed):
            if not _is_ancestor(elements, k, len(placed)):
                span = _apart(span, other)
        placed.append(span)
    return placed


def _is_ancestor(elements: list[Element], k: int, index: int) -> bool:
    parent = elements[index].parent
    while parent is not None:
        if parent == k:
            return True
        parent = elements[parent].parent
    return False


def _within(span, outer) -> tuple[int, int]:
    a, b = max(span[0], outer[0]), min(span[1], outer[1])
    if a < b or (span[0] == span[1] and outer[0] <= span[0] <= outer[1]):
        return (a, b) if a < b else (span[0], span[0])
    return (outer[0], outer[0]) if span[0] < outer[0] else (outer[1], outer[1])


def _apart(span, other) -> tuple[int, int]:
    """`span` cut so that it and `other` (not its ancestor) are nested or disjoint."""
    a, b = span
    c, d = other
    if a == b:                                              # a point: inside `other` or not, never crossing
        return span
    if b <= c or d <= a or (c <= a and b <= d) or (a <= c and d <= b):
        return span
    left, right = (a, c), (d, b)                           # the parts of `span` outside `other`
    left_size, right_size = max(0, left[1] - left[0]), max(0, right[1] - right[0])
    if left_size == right_size == 0:
        return (a, a)
    return left if left_size >= right_size else right


def _render(words: list[str], elements: list[Element], spans: list[tuple[int, int]]) -> str:
    """The words (escaped) with each element's tags at its span's ends: at a
    boundary, the elements ending there close (innermost first), then the
    empty and void ones stand in document order, then those starting there
    open (outermost first)."""
    def at(p: int) -> tuple[str, str]:
        closes = sorted((k for k, (a, b) in enumerate(spans) if b == p and a < b), key=lambda k: (-spans[k][0], -k))
        points = [k for k, (a, b) in enumerate(spans) if a == b == p]
        opens = sorted((k for k, (a, b) in enumerate(spans) if a == p and a < b), key=lambda k: (-spans[k][1], k))
        before = "".join(elements[k].end for k in closes)
        after = "".join(elements[k].start + (elements[k].end or "") for k in points)
        return before, after + "".join(elements[k].start for k in opens)

    out = []
    for i, word in enumerate(words):
        closing, opening = at(i)
        out.append(closing + (" " if i else "") + opening + html.escape(word, quote=False))
    closing, opening = at(len(words))
    return "".join(out) + closing + opening


def _escape_words(words: list[str]) -> str:
    return " ".join(html.escape(w, quote=False) for w in words)
