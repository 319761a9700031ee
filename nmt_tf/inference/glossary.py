"""A terminology glossary: which target terms a source sentence requires.

A glossary file has one "source term<TAB>target term" entry per line (UTF-8;
the format of --unk_dictionary, checked the same way: a malformed or
repeated entry, or a line break other than a line feed inside an entry, is
one error naming its line; the check and the reading are one function). Wherever a source term occurs
in a sentence as whole words (case-sensitive, or with `ignore_case` in any
case; not inside a longer word; the longest entry wins where entries
overlap), its target term becomes a required term of that sentence's
translation (`nmt_tf.translate --glossary [--glossary_ignore_case]`, the
translate_constrained signature's required_terms), given with its source
term ("source|||target") so that the search places it where the source term
is translated (SearchOptions.term_placement).
"""

from __future__ import annotations

import re

from nmt_tf.inference.translation_graph import TERM_SOURCE_SEPARATOR, read_dictionary


class Glossary:
    def __init__(self, path: str, ignore_case: bool = False):
        self.entries = read_dictionary(path, flag="glossary")
        self.ignore_case = ignore_case
        # Matched text -> target term: the entries, or with ignore_case their lower-cased source terms
        # (as re.IGNORECASE compares); two entries that are one term without case are an error.
        self._targets = dict(self.entries)
        if ignore_case:
            self._targets, first = {}, {}
            for source, target in self.entries.items():         # in the file's order
                key = source.lower()
                if key in first:
                    raise ValueError(f"{path}: the entries {first[key]!r} and {source!r} are one term when case is "
                                     "ignored (--glossary_ignore_case); keep one of them")
                first[key], self._targets[key] = source, target
        alternatives = "|".join(re.escape(term) for term in sorted(self.entries, key=len, reverse=True))
        flags = re.IGNORECASE if ignore_case else 0
        self._pattern = re.compile(rf"(?<!\w)(?:{alternatives})(?!\w)", flags) if self.entries else None

    def __len__(self) -> int:
        return len(self.entries)

    def terms(self, sentence: str) -> list[str]:
        """The target terms of the source terms in `sentence`, each once, in order of appearance."""
        return list(dict.fromkeys(target for _, target in self.matches(sentence)))

    def matches(self, sentence: str) -> list[tuple[str, str]]:
        """(source term as written in `sentence`, target term) of every match, in order."""
        if self._pattern is None:
            return []
        return [(m.group(0), self._targets[m.group(0).lower() if self.ignore_case else m.group(0)])
                for m in self._pattern.finditer(sentence)]

    def required_terms(self, sentence: str, sourced: bool = True) -> list[str]:
        """The terms of `sentence` as translate_constrained takes them, each
        target once with its first source match: "source|||target", so that
        the search writes it where its source term is translated (the
        target alone where not `sourced`: an export older than nmt_tf 0.4)."""
        first = {}
        for source, target in self.matches(sentence):
            first.setdefault(target, source)
        return [sourced_term(source, target) if sourced else target for target, source in first.items()]


def reads_term_sources(metadata: dict | None) -> bool:
    """Whether an export reads "source|||target" terms, by its nmt_tf.json
    (`metadata`; None or {}: not known, taken as yes)."""
    return not metadata or "term_placement" in (metadata.get("search") or {})


def sourced_term(source: str, target: str) -> str:
    """A required term with the source term it translates, as the graph reads it."""
    for part in (source, target):
        if TERM_SOURCE_SEPARATOR in part or any(c in part for c in "\t\r\n"):
            raise ValueError(f"a term holds {TERM_SOURCE_SEPARATOR!r}, a tab or a line break: {part[:60]!r}")
    return f"{source}{TERM_SOURCE_SEPARATOR}{target}"


def target_of(term: str) -> str:
    """The target side of a required term ("source|||target" or "target")."""
    return term.split(TERM_SOURCE_SEPARATOR, 1)[-1].strip()
