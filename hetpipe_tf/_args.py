"""Argument checks shared by every module: enum names and bounded numbers.

One rule for every option the user spells as a string (an Enum member, its value or its
name, any case, "-" and "_" alike) and one message shape for every refused value
("what is wrong. Received: name=value; how to fix"), so that `placement="ed-local"` and
`data_parallel="wsp-split"` parse alike. Pure Python: importable from every subpackage.
"""

from __future__ import annotations

import enum
import numbers
from typing import TypeVar

__all__ = ["parse_enum", "check_int", "check_number"]

E = TypeVar("E", bound=enum.Enum)


def _key(text: str) -> str:
    return text.strip().lower().replace("-", "_")


def parse_enum(enum_cls: type[E], value: object, *, arg: str, what: str | None = None,
               error: type[Exception] = ValueError, hint: str = "") -> E:
    """The member of `enum_cls` that `value` names: a member, its value or its name.

    Strings match case-insensitively with "-" and "_" alike. Anything else raises `error`
    naming `arg` and the accepted values.
    """
    if isinstance(value, enum_cls):
        return value
    if isinstance(value, str):
        key = _key(value)
        for member in enum_cls:
            names = {_key(member.name)}
            if isinstance(member.value, str):
                names.add(_key(member.value))
            if key in names:
                return member
    choices = [m.value if isinstance(m.value, str) else m.name.lower() for m in enum_cls]
    what = what or f"{arg} value"
    tail = f"; {hint}" if hint else ""
    raise error(f"Unknown {what}. Received: {arg}={value!r}; pass one of {choices} or a "
                f"{enum_cls.__name__}{tail}.")


def check_int(arg: str, value: object, *, minimum: int | None = None,
              maximum: int | None = None, error: type[Exception] = ValueError,
              hint: str = "") -> int:
    """`value` as an int within [minimum, maximum]; bools and floats are refused."""
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if ok and minimum is not None and value < minimum:
        ok = False
    if ok and maximum is not None and value > maximum:
        ok = False
    if not ok:
        raise error(f"{arg} must be {_bounds('an integer', minimum, maximum)}. Received: "
                    f"{arg}={value!r}" + (f"; {hint}." if hint else "."))
    return int(value)


def check_number(arg: str, value: object, *, minimum: float | None = None,
                 maximum: float | None = None, exclusive_minimum: bool = False,
                 error: type[Exception] = ValueError, hint: str = "") -> float:
    """`value` as a float within the bounds (`exclusive_minimum`: strictly above)."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if ok and value != value:   # NaN
        ok = False
    if ok and minimum is not None and (value <= minimum if exclusive_minimum
                                       else value < minimum):
        ok = False
    if ok and maximum is not None and value > maximum:
        ok = False
    if not ok:
        low = "> " if exclusive_minimum else ">= "
        bounds = "a number" + (f" {low}{minimum}" if minimum is not None else "") + (
            f" and <= {maximum}" if maximum is not None else "")
        raise error(f"{arg} must be {bounds}. Received: {arg}={value!r}"
                    + (f"; {hint}." if hint else "."))
    return float(value)


def _bounds(kind: str, minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f"{kind} in [{minimum}, {maximum}]"
    if minimum is not None:
        return f"{kind} >= {minimum}"
    if maximum is not None:
        return f"{kind} <= {maximum}"
    return kind
