"""The one definition of "an integer" that user input must meet (bools are not integers,
though Python's ``isinstance(True, int)`` says they are)."""

from __future__ import annotations


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_count(value: object, minimum: int = 1) -> bool:
    """An integer ≥ ``minimum``."""
    return is_int(value) and value >= minimum


def all_ints(values) -> bool:
    """Every value an integer (exact type: a bool is not a token id; the fast test for long lists)."""
    return all(type(v) is int for v in values)


def utf8_error(text: str) -> int | None:
    """Where ``text`` stops being UTF-8 (a surrogate standing for bytes a terminal could not
    decode, as Python passes them on in ``sys.argv``), or None when all of it is."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def is_port_text(text: str) -> bool:
    """``text`` names a TCP port, 1 to 65535, in ASCII digits ('²' and '٣' are digits to
    str.isdigit, but not to int() or to ZeroMQ)."""
    return text.isascii() and text.isdigit() and 0 < int(text) < 65536
