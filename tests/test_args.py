"""hetpipe_tf/_args.py: one enum parser, one bounded-number check."""

from __future__ import annotations

import enum

import pytest

from hetpipe_tf._args import check_int, check_number, parse_enum


class Mode(enum.Enum):
    WSP = "wsp"
    WSP_SPLIT = "wsp_split"
    ED_LOCAL = "ed_local"


@pytest.mark.parametrize("text,member", [
    ("wsp", Mode.WSP), ("WSP", Mode.WSP), (" wsp-split ", Mode.WSP_SPLIT),
    ("wsp_split", Mode.WSP_SPLIT), ("ED-LOCAL", Mode.ED_LOCAL), (Mode.WSP, Mode.WSP)])
def test_parse_enum_accepts_member_value_and_name_any_case_dash_or_underscore(text, member):
    assert parse_enum(Mode, text, arg="mode") is member


def test_parse_enum_refusal_names_the_argument_the_value_and_the_choices():
    class Bad(ValueError):
        pass
    with pytest.raises(Bad) as e:
        parse_enum(Mode, "hogwild", arg="mode", what="data-parallel mode", error=Bad)
    msg = str(e.value)
    assert "Unknown data-parallel mode" in msg and "mode='hogwild'" in msg
    assert "'wsp_split'" in msg and "Mode" in msg
    with pytest.raises(ValueError):
        parse_enum(Mode, 3, arg="mode")


def test_check_int_bounds_and_types():
    assert check_int("n_m", 2, minimum=1) == 2
    for bad in (0, -1, True, 1.0, "2", None):
        with pytest.raises(ValueError, match=r"n_m must be an integer >= 1\. Received: n_m="):
            check_int("n_m", bad, minimum=1)
    with pytest.raises(TypeError, match=r"in \[0, 3\]"):
        check_int("k", 4, minimum=0, maximum=3, error=TypeError)


def test_check_number_bounds():
    assert check_number("t", 5, minimum=0, exclusive_minimum=True) == 5.0
    for bad in (0, -1.0, float("nan"), True, "5"):
        with pytest.raises(ValueError, match=r"t must be a number > 0"):
            check_number("t", bad, minimum=0, exclusive_minimum=True)
