"""Dollars as people and programs read them: one rounding for the text and the JSON.

Four significant digits, never fewer than two decimals: ``$0.0145`` is not ``$0.01``, so an
estimate of $0.0145 next to a --max-cost of $0.01 shows why it was refused; a $0.001 budget is
``$0.001``; a bill of $1,234.56 keeps its cents. ``usd_number`` is the same amount as the number
a ``--json`` document carries, so the two never disagree.
"""

from __future__ import annotations

import math

DIGITS = 4   # significant


def _decimals(amount: float) -> int:
    if amount == 0 or not math.isfinite(amount):
        return 2
    return max(2, DIGITS - 1 - math.floor(math.log10(abs(amount))))


def usd_number(amount: float) -> float:
    """``amount`` rounded as ``usd`` shows it."""
    return round(float(amount), _decimals(amount))


def usd(amount: float) -> str:
    """'$0.0145', '$1.03', '$0.00', '-$0.25': four significant digits, at least the cents."""
    rounded = usd_number(amount)
    text = f"{abs(rounded):.{_decimals(amount)}f}"
    whole, _, cents = text.partition(".")
    cents = cents[:2] + cents[2:].rstrip("0")
    return f"{'-' if rounded < 0 else ''}${whole}.{cents}"
