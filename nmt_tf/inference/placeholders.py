"""Placeholders: URLs, e-mail addresses, numbers, hashtags, @handles and
emoji carried through translation verbatim (issue 93, item 2).

`protect(line, kinds)` replaces each such item with a mask, `°1°`, `°2°`,
... in order; the model translates the masked sentence (a model trained
with masks present copies them: pipelines/multi30k_en_fr/placeholders.py
makes such training pairs), and `restore(...)` puts each item back where
the model wrote its mask:

- a mask written once is replaced by its item; a mask written again, or
  one the line did not have, is removed;
- a mask the model lost is placed by the attention (paper 000's alpha,
  summed over the pieces of each word): after the target word that attends
  most to the mask's source word, with a warning; without an alignment it
  is appended at the end, with a warning. An item is never dropped.

Items hold no spaces, so a masked line has the words of the original (inline
markup's word positions stay valid: nmt_tf.inference.markup). A currency
sign or percent written against a number is part of it ("$25.99", "25€",
"7%", "7:30"); one written apart ("25 €") is left to the model, and so is a
lone digit ("2 men": the captions' translations spell it, "Deux hommes"). A line that
holds the mask's mark ° outside an item is translated unprotected, with a warning.
"""

from __future__ import annotations

import dataclasses
import re


from nmt_tf.inference.markup import word_alignment, words_of_tokens

KINDS = ("url", "email", "handle", "hashtag", "number", "emoji")
# The mask's marks: a character the model's vocabulary has (a mark it cannot read would be [UNK]: ⦅ and
# ⦆ are, in the shipped model) and that text rarely holds outside numbers, which are masked themselves.
OPEN = CLOSE = "\u00b0"              # °: "°1°"
_TRAIL = ".,;:!?'\")]}"               # punctuation that ends a sentence rather than a URL
_END = ".!?…"

_EMOJI_CHAR = ("\U0001F000-\U0001FAFF\u2600-\u27BF\u2B00-\u2BFF\u2300-\u23FF\u3030\u303D\u3297\u3299"
               "\u00A9\u00AE\u203C\u2049\u2122\u2139\u2194-\u21AA\u24C2\u25AA-\u25FE")
_EMOJI_JOIN = "\u200D\uFE0F\uFE0E\u20E3\U0001F3FB-\U0001F3FF\U000E0020-\U000E007F"
_PATTERNS = {
    "url": r"(?:https?://|ftp://|www\.)[^\s<>\"]+",
    "email": r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+",
    "handle": r"(?<![\w@])@\w{1,30}",
    "hashtag": r"(?<![\w&#])#\w*[^\W\d_]\w*",
    # 25.99, 1,000, 7:30, 10h30, 2026-12-05, $25.99, 25€, 7%, 20°C, 7pm, 5km; not 3rd or 10-year (letters follow)
    "number": r"(?<![\w.])[$€£¥₹]?[+-]?\d+(?:[.,:/-]\d+)*(?:h\d\d)?"
              r"(?:%|°[CF]?|[$€£¥₹]|(?:am|pm|h|k|km|kg|cm|mm|ml)\b)?(?![^\W_]|-[^\W\d_])",
    "emoji": rf"[{_EMOJI_CHAR}][{_EMOJI_CHAR}{_EMOJI_JOIN}]*",
}
_MASK = re.compile(r"( ?)" + OPEN + r" ?(\d+) ?" + CLOSE)
_STRAY = re.compile(OPEN + r"\d*" + CLOSE + "?")


@dataclasses.dataclass
class Protected:
    """A line with its items masked."""

    text: str                       # what to translate: the line with °1°, °2°, ... for its items
    items: list[str]                # item k is mask °k+1°
    warning: str | None = None      # why nothing was protected
    apart: list[bool] = dataclasses.field(default_factory=list)    # item k had a space before it


def parse_kinds(value) -> tuple[str, ...]:
    """--protect's value ("all", "none", or kinds separated by commas) as a tuple of kinds."""
    if value is None or value == "all":
        return KINDS
    names = [value] if isinstance(value, str) else list(value)
    names = [n.strip() for name in names for n in name.split(",") if n.strip()]
    if names in ([], ["none"]):
        return ()
    unknown = [n for n in names if n not in KINDS]
    if unknown:
        raise ValueError(f"protect: unknown kind {unknown[0]!r}; choose from {', '.join(KINDS)}, all or none")
    return tuple(k for k in KINDS if k in names)


def mask(k: int) -> str:
    """The mask of the k-th item (1-based)."""
    return f"{OPEN}{k}{CLOSE}"


def find(line: str, kinds=KINDS) -> list[tuple[int, int]]:
    """The [start, end) character spans of the items of `kinds` in `line`,
    in order, not overlapping (an earlier start wins, then a longer match)."""
    found = []
    for kind in kinds:
        for m in re.finditer(_PATTERNS[kind], line):
            start, end = m.span()
            if kind == "url":
                while end > start and line[end - 1] in _TRAIL and not (line[end - 1] == ")" and "(" in line[start:end]):
                    end -= 1
            if kind == "number" and end - start == 1:
                continue                  # "2 men": the model writes "Deux hommes", as the captions do
            if end > start and any(c.isdigit() or c.isalpha() or not c.isascii() for c in line[start:end]):
                found.append((start, end))
    spans, last = [], -1
    for start, end in sorted(found, key=lambda s: (s[0], -s[1])):
        if start >= last:
            spans.append((start, end))
            last = end
    return spans


def protect(line: str, kinds=KINDS) -> Protected:
    """`line` with its items of `kinds` replaced by masks (see the module docstring)."""
    if not kinds:
        return Protected(line, [])
    spans = find(line, kinds)
    outside = "".join(line[a:b] for a, b in zip([0] + [e for _, e in spans], [s for s, _ in spans] + [len(line)]))
    if OPEN in outside or CLOSE in outside:
        return Protected(line, [], f"the line holds {OPEN}, the placeholders' mark: nothing was protected")
    if not spans:
        return Protected(line, [])
    out, items, apart, at = [], [], [], 0
    for start, end in spans:
        out.append(line[at:start])
        items.append(line[start:end])
        apart.append(start > 0 and line[start - 1].isspace())
        out.append(mask(len(items)))
        at = end
    out.append(line[at:])
    return Protected("".join(out), items, apart=apart)


def restore(protected: Protected, translation: str, source_tokens=None, target_tokens=None, alignment=None,
            continues_word=None, escape=None) -> tuple[str, str | None]:
    """`translation` with the items of `protected` in place of their masks,
    and a warning or None (see the module docstring). A lost mask is placed
    by `alignment` ([target tokens, source tokens], with the tokens) when
    given, else at the end. `escape` (e.g. html.escape, for a translation
    that holds markup) is applied to each item put back."""
    if not protected.items:
        return translation, None
    items = [escape(item) if escape else item for item in protected.items]
    seen: set[int] = set()

    def put(m: re.Match) -> str:
        k = int(m.group(2))
        if 1 <= k <= len(items) and k not in seen:
            seen.add(k)
            # a mask written against the word before it, where the source had a space: "Paris °2°", not "Paris°2°"
            glued = not m.group(1) and m.start() > 0 and m.string[m.start() - 1].isalnum()
            space = " " if glued and k - 1 < len(protected.apart) and protected.apart[k - 1] else ""
            return m.group(1) + space + items[k - 1]
        return ""                     # written again, or never given: removed with the space before it

    # masks written with spaces inside ("° 1 °") made whole first, so that each is in one word
    model_words = _MASK.sub(lambda m: m.group(1) + mask(int(m.group(2))), translation).split()
    words, index = [], []             # what is kept of each model word; the model word each kept word is
    for i, word in enumerate(model_words):
        before = len(seen)
        word = _STRAY.sub("", _MASK.sub(put, word))
        removed_only = len(seen) == before and OPEN in model_words[i]      # a mask dropped, no item put back
        if word and words and removed_only and not any(c.isalnum() for c in word):
            words[-1] += word         # "écrivez °3°." with °3° removed: "écrivez."
        elif word:
            words.append(word)
            index.append(i)
    lost = [k for k in range(1, len(items) + 1) if k not in seen]
    if not lost:
        return " ".join(words), None
    after = _places(protected, model_words, lost, source_tokens, target_tokens, alignment, continues_word)
    inserts = sorted(((len(words) if after is None else sum(1 for i in index if i <= after[k]), k) for k in lost),
                     reverse=True)    # after the kept word at or before the attended model word
    for at, k in inserts:
        last = words[-1].rstrip(_END) if words else ""
        if at == len(words) and words and last != words[-1]:     # at the end: before the final punctuation
            if last:
                words[-1:] = [last, items[k - 1] + words[-1][len(last):]]
            else:
                words.insert(at - 1, items[k - 1])
        else:
            words.insert(at, items[k - 1])
    names = ", ".join(protected.items[k - 1][:40] for k in lost)
    how = "by the attention" if after is not None else "at the end"
    return " ".join(words), f"the model lost the placeholder of {names}; it was put back {how}"


def _places(protected: Protected, model_words: list[str], lost: list[int], source_tokens, target_tokens,
            alignment, continues_word) -> dict[int, int] | None:
    """For each lost mask k, the index of the model's target word that
    attends most to the source word holding °k°; None without an alignment
    that matches the words."""
    if source_tokens is None or target_tokens is None or alignment is None or not model_words:
        return None
    source_words = protected.text.split()
    weights = word_alignment(alignment, words_of_tokens(list(source_tokens), continues_word),
                             words_of_tokens(list(target_tokens), continues_word))
    if weights.shape != (len(model_words), len(source_words)):
        return None
    places = {}
    for k in lost:
        column = next((i for i, w in enumerate(source_words) if mask(k) in w), None)
        if column is None:
            return None
        places[k] = int(weights[:, column].argmax())
    return places
