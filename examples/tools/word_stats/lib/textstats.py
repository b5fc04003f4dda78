"""Pure text statistics used by word_stats/main.py."""

import re
from collections import Counter

_WORD = re.compile(r"[\w']+", re.UNICODE)


def words_of(text: str) -> list[str]:
    """Lower-cased words of `text`."""
    return [w.lower() for w in _WORD.findall(text)]


def text_stats(text: str, top: int = 3) -> dict:
    """Word and character counts plus the `top` most frequent words."""
    words = words_of(text)
    counts = Counter(words)
    return {
        "words": len(words),
        "characters": len(text),
        "unique_words": len(counts),
        "top_words": [{"word": w, "count": c} for w, c in counts.most_common(top)],
    }
