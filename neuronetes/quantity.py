"""Kubernetes resource quantities, parsed exactly.

Implements the grammar of ``k8s.io/apimachinery/pkg/api/resource.Quantity``::

    <quantity>        ::= <signedNumber><suffix>
    <signedNumber>    ::= <number> | <sign><number>
    <number>          ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
    <sign>            ::= "+" | "-"
    <suffix>          ::= <binarySI> | <decimalExponent> | <decimalSI>
    <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei
    <decimalSI>       ::= n | u | m | "" | k | M | G | T | P | E
    <decimalExponent> ::= "e" <signedInteger> | "E" <signedInteger>

Values are returned as :class:`fractions.Fraction`, so ``"0.1"`` is exactly one tenth and
``"16Gi"`` is exactly ``16 * 2**30``. Integer conversions round the way Kubernetes'
``Quantity.Value()`` / ``MilliValue()`` do: up, away from zero.

Differences from Kubernetes, on purpose: surrounding whitespace is tolerated (Kubernetes
refuses it), and precision is never lost (Kubernetes rounds anything finer than ``1n`` up
to nano units when it stores a quantity). :func:`format_quantity` does round up to ``1n``
so that what it prints is a quantity Kubernetes accepts.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Final, Literal

__all__ = [
    "BINARY_SUFFIXES",
    "DECIMAL_SUFFIXES",
    "QuantityError",
    "QuantityLike",
    "format_quantity",
    "parse_quantity",
    "to_bytes",
    "to_mib",
    "to_milli",
]

QuantityLike = str | int | float | Fraction
"""Anything :func:`parse_quantity` accepts."""

DECIMAL_SUFFIXES: Final[dict[str, int]] = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
"""Decimal SI suffix -> power of ten."""

BINARY_SUFFIXES: Final[dict[str, int]] = {
    "Ki": 10,
    "Mi": 20,
    "Gi": 30,
    "Ti": 40,
    "Pi": 50,
    "Ei": 60,
}
"""Binary SI suffix -> power of two."""

_MIB: Final = 1 << 20

# Longest accepted input and largest accepted exponent: far beyond any real resource,
# small enough that a hostile string cannot make us build a gigantic integer.
_MAX_LENGTH: Final = 128
_MAX_EXPONENT: Final = 100

_QUANTITY_RE: Final = re.compile(
    r"""
    (?P<sign>[+-])?
    (?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)
    (?:
        (?P<binary>Ki|Mi|Gi|Ti|Pi|Ei)
      | [eE](?P<exponent>[+-]?[0-9]+)
      | (?P<decimal>[numkMGTPE]?)
    )
    """,
    re.VERBOSE,
)


class QuantityError(ValueError):
    """A string (or number) is not a valid Kubernetes resource quantity."""


def _round_away_from_zero(value: Fraction) -> int:
    """Round to an integer away from zero, as ``Quantity.Value()`` does (ceil for values >= 0)."""
    return math.ceil(value) if value >= 0 else math.floor(value)


def _from_number(value: int | float | Fraction) -> Fraction:
    if isinstance(value, bool):
        raise QuantityError(f"invalid quantity {value!r}: a boolean is not a quantity")
    if isinstance(value, Fraction):
        return value
    if isinstance(value, int):
        return Fraction(value)
    if not math.isfinite(value):
        raise QuantityError(f"invalid quantity {value!r}: not a finite number")
    # repr() is the shortest decimal that round-trips, so 0.1 means one tenth, not the
    # binary double closest to it.
    return Fraction(repr(value))


def parse_quantity(s: QuantityLike) -> Fraction:
    """Parse a Kubernetes resource quantity exactly.

    >>> parse_quantity("500m")
    Fraction(1, 2)
    >>> parse_quantity("16Gi") == 16 * 2**30
    True
    >>> parse_quantity("2e3")
    Fraction(2000, 1)

    Numbers (``int``, ``float``, ``Fraction``) are accepted as already-parsed values; a float
    is taken at its shortest decimal representation (``0.1`` is exactly ``1/10``).

    Raises:
        QuantityError: ``s`` is not a quantity (empty, unknown suffix, junk, NaN, ...).
    """
    if not isinstance(s, str):
        if isinstance(s, int | float | Fraction):
            return _from_number(s)
        raise QuantityError(f"invalid quantity {s!r}: expected a string or a number, got {type(s).__name__}")

    text = s.strip()
    if not text:
        raise QuantityError("invalid quantity '': empty string")
    if len(text) > _MAX_LENGTH:
        raise QuantityError(f"invalid quantity {text[:20]!r}...: longer than {_MAX_LENGTH} characters")
    match = _QUANTITY_RE.fullmatch(text)
    if match is None:
        raise QuantityError(
            f"invalid quantity {s!r}: expected a number with an optional suffix "
            "(n, u, m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei, or an exponent like e3)"
        )

    number = match["number"]
    whole, _, frac = number.partition(".")
    value = Fraction(int((whole + frac) or "0"), 10 ** len(frac))
    if match["sign"] == "-":
        value = -value

    if match["binary"] is not None:
        return value * (1 << BINARY_SUFFIXES[match["binary"]])
    if match["exponent"] is not None:
        exponent = int(match["exponent"])
        if abs(exponent) > _MAX_EXPONENT:
            raise QuantityError(
                f"invalid quantity {s!r}: exponent {exponent} out of range (|e| <= {_MAX_EXPONENT})"
            )
    else:
        exponent = DECIMAL_SUFFIXES[match["decimal"]]
    return value * Fraction(10) ** exponent


def to_milli(q: QuantityLike) -> int:
    """Quantity in thousandths, rounded up away from zero (``Quantity.MilliValue()``).

    >>> to_milli("500m"), to_milli("1.5"), to_milli("1n")
    (500, 1500, 1)
    """
    return _round_away_from_zero(parse_quantity(q) * 1000)


def to_bytes(q: QuantityLike) -> int:
    """Quantity as a whole number (of bytes), rounded up away from zero (``Quantity.Value()``).

    >>> to_bytes("1Ki"), to_bytes("1k"), to_bytes("0.5")
    (1024, 1000, 1)
    """
    return _round_away_from_zero(parse_quantity(q))


def to_mib(q: QuantityLike) -> int:
    """Quantity of bytes in MiB, rounded up away from zero.

    >>> to_mib("16Gi"), to_mib("1"), to_mib("100M")
    (16384, 1, 96)
    """
    return _round_away_from_zero(parse_quantity(q) / _MIB)


def _format_decimal(value: Fraction) -> str:
    # Round away from zero to nano units (the finest suffix) first, as Kubernetes does.
    nanos = _round_away_from_zero(value * 10**9)
    if nanos == 0:
        return "0"
    sign = "-" if nanos < 0 else ""
    magnitude = abs(nanos)
    # Largest suffix that keeps the mantissa an integer.
    exponent = -9
    while exponent < 18 and magnitude % 1000 == 0:
        magnitude //= 1000
        exponent += 3
    suffix = next(name for name, power in DECIMAL_SUFFIXES.items() if power == exponent)
    return f"{sign}{magnitude}{suffix}"


def format_quantity(q: QuantityLike, style: Literal["decimal", "binary"] = "decimal") -> str:
    """Canonical Kubernetes spelling of a quantity.

    ``style="decimal"`` picks the largest decimal SI suffix with an integer mantissa
    (``1.5 -> "1500m"``, ``1000 -> "1k"``). ``style="binary"`` picks the largest binary
    suffix with an integer mantissa (``16 * 2**30 -> "16Gi"``) and, like Kubernetes, falls
    back to decimal for values that are not whole multiples of 1024 (or are fractional).
    Values finer than ``1n`` are rounded up (away from zero) to ``1n``.

    The output always parses back with :func:`parse_quantity`; for values that are
    whole multiples of ``1n`` it parses back to the same value.

    >>> format_quantity("0.5"), format_quantity(2000), format_quantity("16Gi", "binary")
    ('500m', '2k', '16Gi')
    """
    value = parse_quantity(q)
    if style not in ("decimal", "binary"):
        raise ValueError(f"unknown quantity style {style!r}: expected 'decimal' or 'binary'")
    if style == "binary" and value.denominator == 1 and value != 0 and value.numerator % 1024 == 0:
        magnitude = abs(value.numerator)
        power = 0
        while power < 60 and magnitude % 1024 == 0:
            magnitude //= 1024
            power += 10
        suffix = next(name for name, p in BINARY_SUFFIXES.items() if p == power)
        return f"{'-' if value < 0 else ''}{magnitude}{suffix}"
    return _format_decimal(value)
