"""Kubernetes resource quantity parsing and formatting."""

from __future__ import annotations

import contextlib
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from neuronetes.quantity import (
    BINARY_SUFFIXES,
    DECIMAL_SUFFIXES,
    QuantityError,
    format_quantity,
    parse_quantity,
    to_bytes,
    to_mib,
    to_milli,
)

pytestmark = pytest.mark.unit

GI = 2**30


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("500m", Fraction(1, 2)),
        ("16Gi", 16 * GI),
        ("40Gi", 40 * GI),
        ("600Gi", 600 * GI),
        ("1.5", Fraction(3, 2)),
        ("2e3", 2000),
        ("2E3", 2000),
        ("1.5e-3", Fraction(3, 2000)),
        ("100M", 100_000_000),
        ("1k", 1000),
        ("1Ki", 1024),
        ("1Mi", 2**20),
        ("1Ti", 2**40),
        ("1Pi", 2**50),
        ("1Ei", 2**60),
        ("1E", 10**18),
        ("3P", 3 * 10**15),
        ("7T", 7 * 10**12),
        ("1G", 10**9),
        ("250u", Fraction(1, 4000)),
        ("5n", Fraction(5, 10**9)),
        ("0", 0),
        ("-0", 0),
        ("+1", 1),
        ("-1.5Gi", -3 * GI // 2),
        (".5", Fraction(1, 2)),
        ("5.", 5),
        ("0.1", Fraction(1, 10)),
        ("  2Gi ", 2 * GI),
        ("1e+2", 100),
    ],
)
def test_parse_valid(text: str, expected: Fraction | int) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [(3, Fraction(3)), (0.1, Fraction(1, 10)), (2.5, Fraction(5, 2)), (Fraction(1, 3), Fraction(1, 3))],
)
def test_parse_numbers(value: int | float | Fraction, expected: Fraction) -> None:
    assert parse_quantity(value) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "abc",
        "1.2.3",
        "Gi",
        "1gi",
        "1GI",
        "1KB",
        "1K",  # kilo is lower-case k
        "1 Gi",
        "--1",
        "+-1",
        "1e",
        "1e1.5",
        "1Gi1",
        ".",
        "-",
        "1x",
        "1e9999",
        "1" * 200,
        "1mi",
        "0x10",
        "1_000",
        "∞",
        "\u0661",  # ARABIC-INDIC DIGIT ONE: int() would take it, Kubernetes does not
    ],
)
def test_parse_invalid(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), True, None, [1], b"1"])
def test_parse_invalid_objects(value: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(value)  # type: ignore[arg-type]


def test_error_is_value_error_with_clear_message() -> None:
    with pytest.raises(ValueError, match=r"invalid quantity '12XB'.*suffix"):
        parse_quantity("12XB")


def test_to_milli_rounds_up_like_milli_value() -> None:
    assert to_milli("500m") == 500
    assert to_milli("1") == 1000
    assert to_milli("1.5") == 1500
    assert to_milli("1n") == 1  # rounded up
    assert to_milli("1001u") == 2
    assert to_milli("-1n") == -1  # away from zero, as Kubernetes does
    assert to_milli(2) == 2000


def test_to_bytes_and_mib() -> None:
    assert to_bytes("16Gi") == 16 * GI
    assert to_bytes("1k") == 1000
    assert to_bytes("0.5") == 1
    assert to_bytes("100M") == 100_000_000
    assert to_mib("16Gi") == 16 * 1024
    assert to_mib("40Gi") == 40 * 1024
    assert to_mib("600Gi") == 600 * 1024
    assert to_mib("100M") == 96  # 95.37 MiB, rounded up
    assert to_mib("1") == 1
    assert to_mib(0) == 0
    assert to_mib("1Mi") == 1


@pytest.mark.parametrize(
    ("value", "style", "expected"),
    [
        ("0.5", "decimal", "500m"),
        ("1.5", "decimal", "1500m"),
        (2000, "decimal", "2k"),
        ("100M", "decimal", "100M"),
        (0, "decimal", "0"),
        ("-2k", "decimal", "-2k"),
        ("16Gi", "binary", "16Gi"),
        ("16Gi", "decimal", "17179869184"),
        ("1536Mi", "binary", "1536Mi"),
        ("1Ei", "binary", "1Ei"),
        ("1024Ei", "binary", "1024Ei"),
        ("1000", "binary", "1k"),  # not a multiple of 1024: decimal, as Kubernetes does
        ("0.5", "binary", "500m"),
        ("-4Ki", "binary", "-4Ki"),
        ("1e3", "decimal", "1k"),
        ("1n", "decimal", "1n"),
        (Fraction(1, 3), "decimal", "333333334n"),  # finer than 1n: rounded up to nano units
        ("5e21", "decimal", "5000E"),
    ],
)
def test_format(value: str | int | Fraction, style: str, expected: str) -> None:
    assert format_quantity(value, style) == expected  # type: ignore[arg-type]


def test_format_rejects_unknown_style() -> None:
    with pytest.raises(ValueError, match="style"):
        format_quantity(1, "octal")  # type: ignore[arg-type]


_SUFFIXES = [*DECIMAL_SUFFIXES, *BINARY_SUFFIXES]


@given(
    mantissa=st.integers(min_value=-(10**12), max_value=10**12),
    suffix=st.sampled_from(_SUFFIXES),
)
def test_round_trip_integer_mantissa(mantissa: int, suffix: str) -> None:
    text = f"{mantissa}{suffix}"
    value = parse_quantity(text)
    for style in ("decimal", "binary"):
        assert parse_quantity(format_quantity(value, style)) == value


@given(nanos=st.integers(min_value=-(10**30), max_value=10**30))
def test_round_trip_nano_multiples(nanos: int) -> None:
    value = Fraction(nanos, 10**9)
    assert parse_quantity(format_quantity(value)) == value


@given(
    whole=st.integers(min_value=0, max_value=10**6),
    frac=st.text(alphabet="0123456789", min_size=1, max_size=9),
    suffix=st.sampled_from(_SUFFIXES),
    negative=st.booleans(),
)
def test_parse_decimal_is_exact(whole: int, frac: str, suffix: str, negative: bool) -> None:
    text = f"{'-' if negative else ''}{whole}.{frac}{suffix}"
    scale = (
        Fraction(2) ** BINARY_SUFFIXES[suffix]
        if suffix in BINARY_SUFFIXES
        else Fraction(10) ** DECIMAL_SUFFIXES[suffix]
    )
    expected = (whole + Fraction(int(frac), 10 ** len(frac))) * scale
    assert parse_quantity(text) == (-expected if negative else expected)


@given(value=st.fractions(max_denominator=10**6))
def test_format_output_always_parses_and_rounds_up(value: Fraction) -> None:
    formatted = parse_quantity(format_quantity(value))
    assert abs(formatted) >= abs(value)
    assert abs(formatted - value) < Fraction(1, 10**9)


@given(st.text(max_size=12))
def test_parse_never_raises_anything_but_quantity_error(text: str) -> None:
    with contextlib.suppress(QuantityError):
        parse_quantity(text)
