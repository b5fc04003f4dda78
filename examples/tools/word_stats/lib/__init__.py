"""Helper library of the word_stats tool."""
