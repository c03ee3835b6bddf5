"""How the console shows text it did not write: every control, format and bidi character made visible.

Jinja2's autoescaping makes markup inert (``<script>`` shows as text). It does not stop a right-to-left
override (U+202E) or an isolate from reordering what follows it on screen, so that ``alice‮evil`` reads as
another name: :func:`shown` replaces each such character with its code point in brackets before escaping.
The console's template environment applies it to every value it prints, and the live feed to every value it
sends, so nothing reaches the page unshown.
"""

from __future__ import annotations

import unicodedata
from typing import Final

#: Unicode categories shown as code points: controls, format characters (bidi embeddings, overrides,
#: isolates and marks, zero-width characters), surrogates, line and paragraph separators.
HIDDEN_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
#: Longest text printed; longer text is cut with an ellipsis (the input bounds make this rare).
MAX_SHOWN: Final = 300


def shown(value: object, *, limit: int = MAX_SHOWN) -> str:
    """``value`` as text with hidden characters made visible and at most ``limit`` characters.

    >>> shown("bob\\u202eevil")
    'bob⟨U+202E⟩evil'
    >>> shown("<script>")  # markup is left to the autoescaper
    '<script>'
    """
    text = value if isinstance(value, str) else str(value)
    if len(text) > limit:
        text = text[:limit] + "…"
    if text.isprintable():
        return text
    return "".join(f"⟨U+{ord(c):04X}⟩" if unicodedata.category(c) in HIDDEN_CATEGORIES else c for c in text)
