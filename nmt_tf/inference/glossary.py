"""A terminology glossary: which target terms a source sentence requires.

A glossary file has one "source term<TAB>target term" entry per line (UTF-8;
the format of --unk_dictionary, checked the same way: a malformed or
repeated entry, or a line break other than a line feed inside an entry, is
one error naming its line; the check and the reading are one function). Wherever a source term occurs
in a sentence as whole words (case-sensitive; not inside a longer word; the
longest entry wins where entries overlap), its target term becomes a
required term of that sentence's translation (`nmt_tf.translate
--glossary`, the translate_constrained signature's required_terms).
"""

from __future__ import annotations

import re

from nmt_tf.inference.translation_graph import read_dictionary


class Glossary:
    def __init__(self, path: str):
        self.entries = read_dictionary(path, flag="glossary")
        alternatives = "|".join(re.escape(term) for term in sorted(self.entries, key=len, reverse=True))
        self._pattern = re.compile(rf"(?<!\w)(?:{alternatives})(?!\w)") if self.entries else None

    def __len__(self) -> int:
        return len(self.entries)

    def terms(self, sentence: str) -> list[str]:
        """The target terms of the source terms in `sentence`, each once, in order of appearance."""
        if self._pattern is None:
            return []
        found = (self.entries[m.group(0)] for m in self._pattern.finditer(sentence))
        return list(dict.fromkeys(found))
