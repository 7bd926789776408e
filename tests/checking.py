"""Helpers for proving checks honest: a check must fail on wrong code and pass on the reference."""

import contextlib
import io

import pytest

from course_lib.checks import CheckFailed


def expect_failure(check, *args, match=None, **kwargs):
    """Run a check on a wrong implementation; it must raise CheckFailed (whose text contains `match`)."""
    with pytest.raises(CheckFailed) as info:
        check(*args, **kwargs)
    if match is not None:
        assert match in str(info.value), f"the failure message lacks {match!r}:\n{info.value}"
    return str(info.value)


def expect_pass(check, *args, **kwargs):
    """Run a check on a correct implementation; it must pass and print its green line."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        check(*args, **kwargs)
    green = f"✔ {check.__name__} passed"
    assert green in out.getvalue(), f"the check printed no {green!r} line:\n{out.getvalue()}"
    return out.getvalue()
