"""Futures symbols: product root, contract month and expiry, calendar spreads, and products named in a
file name.

Symbol forms read (case-insensitive, an optional leading ``/``, anything after a ``.`` or a space
that is not a NinjaTrader month ignored):

- dated contracts: ``ESZ3``, ``ESZ23``, ``ESZ2023`` (root, CME month code, 1/2/4-digit year),
  NinjaTrader's ``ES 12-23``, and the same with a venue suffix (``6EH4.XCME``);
- products without a month: Databento parent and continuous symbols (``ES.FUT``, ``ES.c.0``,
  ``ES.v.1``), a bare root (``ES``);
- anything else (``BTC-PERP``, ``EURUSD``) is its own product, with no expiry.

A one-digit year is the first year, at or after the year of the contract's first bar, that ends in
that digit (an outright cannot trade after it expires, and no listed contract is ten years out).
Calendar spreads are ``UD:`` user-defined instruments and ``A-B`` symbols whose first leg is a dated
contract (``ESH4-ESM4``); ``BTC-PERP`` is not a spread.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

MONTH_CODES = "FGHJKMNQUVXZ"  # January .. December
_DATED = re.compile(r"^(?P<root>[A-Z0-9]{1,5}?)(?P<month>[FGHJKMNQUVXZ])(?P<year>\d{4}|\d{1,2})$")
_NINJA = re.compile(r"^(?P<root>[A-Z0-9]{1,5}) (?P<month>\d{2})-(?P<year>\d{2})$")


@dataclass(frozen=True)
class Contract:
    """What a symbol says: ``root`` (the product), and for a dated contract its ``month`` (1-12) and
    ``year`` as written (``year_digits`` of them); ``month`` is 0 for products without one."""

    symbol: str
    root: str
    month: int = 0
    year: int = 0
    year_digits: int = 0

    @property
    def dated(self) -> bool:
        return self.month > 0

    def expiry_year(self, first_year: int) -> int:
        """The four-digit expiry year, given the calendar year of the contract's first bar."""
        if self.year_digits == 4:
            return self.year
        if self.year_digits == 2:
            y = 2000 + self.year
            return y if y >= first_year - 1 else y + 100
        y = first_year - first_year % 10 + self.year
        return y if y >= first_year else y + 10

    def expiry_key(self, first_year: int) -> int:
        """Months since year 0 of the expiry month (orders contracts of one product by expiry)."""
        return self.expiry_year(first_year) * 12 + self.month - 1


def parse_symbol(symbol: str) -> Contract:
    """Root, and month and year where the symbol names a dated contract."""
    text = str(symbol).strip().upper().lstrip("/")
    m = _NINJA.match(text)
    if m:
        month = int(m["month"])
        if 1 <= month <= 12:
            return Contract(str(symbol), m["root"], month, int(m["year"]), 2)
    head = text.split(".")[0].split(" ")[0] if text else ""
    m = _DATED.match(head)
    if m:
        return Contract(str(symbol), m["root"], MONTH_CODES.index(m["month"]) + 1, int(m["year"]), len(m["year"]))
    return Contract(str(symbol), head or text)


def is_spread(symbol: str) -> bool:
    """A calendar spread or other multi-leg instrument (never an outright)."""
    text = str(symbol).strip().upper()
    if text.startswith("UD:"):
        return True
    if "-" not in text:
        return False
    return parse_symbol(text.split("-")[0]).dated


def roots_in_name(name: str, known: set[str]) -> list[tuple[str, str]]:
    """Products a file name names, as ``(root, token)``: tokens (split on anything not a letter or a
    digit) that are a dated contract of a known root (``6EH4``), then tokens equal to a known root."""
    tokens = [t for t in re.split(r"[^A-Za-z0-9]+", name) if t]
    dated = [(c.root, t) for t in tokens for c in [parse_symbol(t)] if c.dated and c.root in known]
    bare = [(t.upper(), t) for t in tokens if t.upper() in known]
    seen, out = set(), []
    for root, token in dated + bare:
        if root not in seen:
            seen.add(root)
            out.append((root, token))
    return out
