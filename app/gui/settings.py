"""The app's saved settings, each read through one validating function.

The settings file is the user's to edit (and a crash or another version may leave odd
values in it): a value of the wrong type or out of range falls back to the setting's
default, with a note saying so, and is removed from the file, so the note comes once and
the next start is clean.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

from pagesim.app.gui.palette import THEMES
from PySide6.QtCore import QByteArray, QSettings

log = logging.getLogger("pagesim.settings")

SPEED_VALUES = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)  # the speed box's choices (actions.SPEEDS)
PROMPT_LEN_RANGE = (1, 100_000)  # the prompt spin box's range
MAX_RECENT = 8


class BadValue(ValueError):
    """A setting's value that cannot be used: the message says why."""


def _number(value) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise BadValue(f"not a number: {value!r}")
    try:
        number = float(value)
    except (ValueError, OverflowError):
        raise BadValue(f"not a number: {value!r}") from None
    return number


def _speed(value) -> float:
    speed = _number(value)
    if speed not in SPEED_VALUES:  # also NaN, inf, 1e-300: none is a choice of the speed box
        raise BadValue(f"not one of the speeds {', '.join(f'{s:g}' for s in SPEED_VALUES)}: {value!r}")
    return speed


def _prompt_len(value) -> int:
    number = _number(value)
    if not math.isfinite(number) or number != int(number):
        raise BadValue(f"not a whole number: {value!r}")
    low, high = PROMPT_LEN_RANGE
    if not low <= int(number) <= high:
        raise BadValue(f"outside {low}…{high}: {value!r}")
    return int(number)


def _flag(value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise BadValue(f"not true or false: {value!r}")


def _theme(value) -> str:
    if not isinstance(value, str) or value not in THEMES:
        raise BadValue(f"not one of {', '.join(THEMES)}: {value!r}")
    return value


def _bytes(value) -> QByteArray:
    if isinstance(value, QByteArray):
        return value
    if isinstance(value, bytes):
        return QByteArray(value)
    raise BadValue(f"not saved window data: {type(value).__name__}")


def _recent(value) -> list[str]:
    if isinstance(value, str):  # one entry comes back from an INI file as a plain string
        value = [value]
    if not isinstance(value, list | tuple) or not all(isinstance(p, str) and p for p in value):
        raise BadValue(f"not a list of file paths: {value!r}")
    return list(value)[:MAX_RECENT]


@dataclass(frozen=True)
class Setting:
    default: object
    parse: Callable[[object], object]


SETTINGS = {
    "theme": Setting("dark", _theme),
    "speed": Setting(1.0, _speed),
    "prompt_len": Setting(10, _prompt_len),
    "welcome_at_start": Setting(True, _flag),
    "recent": Setting([], _recent),
    "geometry": Setting(None, _bytes),
    "windowState": Setting(None, _bytes),
}


def _drop_undecodable(settings: QSettings, why: str, note: Callable[[str], None] | None) -> None:
    """Remove the saved keys whose values read as nothing (what an undecodable one reads as,
    once its error has been raised), each said to ``note`` and the log."""
    for key in settings.allKeys():
        if settings.value(key) is None:
            message = f"settings: ignored the saved {key} ({why})"
            log.warning(message)
            if note is not None:
                note(message)
            settings.remove(key)


def read_setting(settings: QSettings, key: str, note: Callable[[str], None] | None = None):
    """The value of setting ``key``, checked; its default when it is not set, or when the
    saved value cannot be used (then ``note`` is told, the log too, and the bad value is
    removed from the settings)."""
    spec = SETTINGS[key]
    try:
        raw = settings.value(key)
    except Exception as exc:  # a value Qt itself cannot decode
        # PySide raises it at the first read after the file loads, whichever key that reads
        # (a good theme was dropped for a broken windowState): read again, and drop the keys
        # that read as nothing, naming them.
        try:
            raw = settings.value(key)
        except Exception:
            raw, error = None, f"unreadable ({exc})"
        else:
            error = None
            _drop_undecodable(settings, f"unreadable ({exc})", note)
    else:
        error = None
    if raw is None and error is None:
        return spec.default
    try:
        if error is not None:
            raise BadValue(error)
        return spec.parse(raw)
    except BadValue as exc:
        message = f"settings: ignored the saved {key} ({exc}); using the default"
        log.warning(message)
        if note is not None:
            note(message)
        settings.remove(key)
        return spec.default
