"""Numbers as the Replication pages write them: with thousands separators (``1,234,567``)."""

from __future__ import annotations


def thousands(value: object, decimals: int = 0, missing: str = "—") -> str:
    """``value`` with a comma between thousands and ``decimals`` decimals (``1,234.5``);
    ``missing`` for None or anything that is not a number. Negative zero shows as 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return missing
    if isinstance(value, int) and not decimals:
        return f"{value:,}"
    text = f"{value:,.{decimals}f}"
    return text[1:] if text.startswith("-") and not text.strip("-0.,") else text
