"""Dollars as people and programs read them: one rounding for the text and the JSON.

Four significant digits, never fewer than two decimals: ``$0.0145`` is not ``$0.01``, so an
estimate of $0.0145 next to a --max-cost of $0.01 shows why it was refused; a $0.001 budget is
``$0.001``; a bill of $1,234.56 keeps its cents. ``usd_number`` is the same amount as the number
a ``--json`` document carries, so the two never disagree.

Two amounts a message compares are printed by ``usd_apart``, with the digits that tell them
apart, and compared by ``over`` on the same rounding (twelve significant digits: below that a
difference is a float's noise), so a refusal never reads "$0.0136 is over $0.0136". A table's
column of amounts is printed by ``usd_column``: one number of decimals for every row.
"""

from __future__ import annotations

import math

DIGITS = 4   # significant
COMPARED = 12   # significant digits two compared amounts are told apart by, at most


def _decimals(amount: float, digits: int = DIGITS) -> int:
    if amount == 0 or not math.isfinite(amount):
        return 2
    return max(2, digits - 1 - math.floor(math.log10(abs(amount))))


def _fixed(amount: float, decimals: int) -> str:
    text = f"{abs(amount):.{decimals}f}"
    return f"{'-' if round(amount, decimals) < 0 else ''}${text}"


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


def over(amount: float, limit: float) -> bool:
    """Whether ``amount`` is above ``limit`` at the rounding ``usd_apart`` prints them with."""
    decimals = max(_decimals(amount, COMPARED), _decimals(limit, COMPARED))
    return round(amount, decimals) > round(limit, decimals)


def usd_apart(amount: float, other: float) -> tuple[str, str]:
    """Two amounts one message compares: each as ``usd`` prints it, unless that prints them
    alike while they differ; then both with the decimals that tell them apart ('$0.013604' and
    '$0.013600'), up to twelve significant digits."""
    first, second = usd(amount), usd(other)
    if first != second:
        return first, second
    start = max(_decimals(amount), _decimals(other))
    for decimals in range(start, max(_decimals(amount, COMPARED), _decimals(other, COMPARED)) + 1):
        if _fixed(amount, decimals) != _fixed(other, decimals):
            return _fixed(amount, decimals), _fixed(other, decimals)
    return first, second


def usd_column(amounts: list[float]) -> list[str]:
    """Amounts printed one under another, by one rule: every row with the decimals that give the
    smallest amount other than zero four significant digits (at least the cents), so the points
    line up and no row is printed finer than another."""
    decimals = max((_decimals(a) for a in amounts if a), default=2)
    return [_fixed(a, decimals) for a in amounts]
