"""The toolkit that every exercise check is written with.

A check is a function decorated with `@exercise` in `course_lib.checks.chNN`. It calls
the learner's code on fresh random inputs, compares with an independent oracle (numpy,
or PyTorch in float64) and raises `CheckFailed` with a message that says what differs:
the input, your result, the expected result, the first mismatching index, and a hint
when the result matches a known mistake. A check never only prints.

    from course_lib.checks import ch00 as check
    check.numerical_derivative(numerical_derivative)
"""

import functools
import os
import secrets

import numpy as np

from course_lib.learner import progress

GREEN, RED, RESET = "\033[32m", "\033[31m", "\033[0m"

REGISTRY = {}  # chapter "NN" -> exercise names, in definition order
_rng = None
_seed = None


class CheckFailed(AssertionError):
    """Your code gave a different answer than the reference. The message says how."""

    def _render_traceback_(self):
        """How IPython shows it: the message alone, since the checker's frames would only distract.
        When your own code raised, IPython falls back to the full traceback, which points into it."""
        if self.__cause__ is not None:
            raise NotImplementedError
        return [f"{RED}CheckFailed{RESET}: {self}"]


def rng():
    """The random generator of the check that is running (seeded per run; see `exercise`)."""
    return _rng if _rng is not None else np.random.default_rng(0)


def exercise(check):
    """Turn a check function into an exercise check.

    The wrapper draws a seed (COURSE_CHECK_SEED replays one), turns NotImplementedError and
    other exceptions from the learner's code into CheckFailed, records the result for
    `course status`, and prints one green line on success. The check may return a short
    detail string for that line, such as "20 random cases".
    """
    chapter = check.__module__.rsplit(".", 1)[-1].removeprefix("ch")
    REGISTRY.setdefault(chapter, [])
    if check.__name__ not in REGISTRY[chapter]:
        REGISTRY[chapter].append(check.__name__)

    @functools.wraps(check)
    def run(*args, **kwargs):
        __tracebackhide__ = True
        global _rng, _seed
        _seed = int(os.environ.get("COURSE_CHECK_SEED") or secrets.randbits(31))
        _rng = np.random.default_rng(_seed)
        replay = f"\n(random cases drawn with seed {_seed}; set COURSE_CHECK_SEED={_seed} to replay them)"
        try:
            detail = check(*args, **kwargs)
        except CheckFailed as e:
            progress.record(chapter, check.__name__, False, str(e))
            raise CheckFailed(f"{check.__name__}: {e}{replay}") from None
        except NotImplementedError:
            msg = "not implemented yet: replace the `raise NotImplementedError` line in the exercise cell with your code."
            progress.record(chapter, check.__name__, False, msg)
            raise CheckFailed(f"{check.__name__}: {msg}") from None
        except Exception as e:
            msg = f"your code raised {type(e).__name__}: {e}"
            progress.record(chapter, check.__name__, False, msg)
            raise CheckFailed(f"{check.__name__}: {msg}{replay}") from e
        finally:
            _rng = None
        progress.record(chapter, check.__name__, True)
        kept = _keep(chapter, check.__name__, args, kwargs) if progress.should_record() else ""
        print(f"{GREEN}✔ {check.__name__} passed{RESET}" + (f" ({detail})" if detail else "") + kept)

    run.is_exercise_check = True
    return run


def _keep(chapter, name, args, kwargs):
    """Save the passing code in work/yours/ for later chapters; return the words the pass line ends with
    (where it was kept and which chapters run it). The path is said relative to the workspace, so the
    line is the same wherever the notebook runs."""
    from course_lib.learner import answers

    try:
        path = answers.record(chapter, name, args, kwargs)
    except Exception as e:  # saving must never turn a pass into an error
        return f"\n(your code passed but could not be saved for later chapters: {type(e).__name__}: {e})"
    if path is None:
        return ""
    return f"; kept in work/yours/{path.name}{answers.used_by(chapter)}"


# ---- formatting ---------------------------------------------------------------------------

def fmt(x, precision=5):
    """A short, readable repr of a number, an array or a tensor."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    if isinstance(x, np.ndarray) and x.ndim == 0:
        x = x.item()
    if isinstance(x, np.ndarray):
        with np.printoptions(precision=precision, threshold=24, edgeitems=3, linewidth=90):
            s = np.array2string(x, separator=", ")
        return f"{s} (shape {x.shape})" if x.ndim > 0 else s
    if isinstance(x, float):
        return f"{x:.{precision + 3}g}"
    s = repr(x)
    return s if len(s) <= 300 else s[:300] + "..."


def below(value, bound):
    """A printed error that reads the same on every CPU: "below 1e-12" when it is, else the value.

    Rounding noise such as 2.8e-17 differs from one CPU to the next (vector width, BLAS kernels), so
    a notebook prints the bound it meets, never the noise itself."""
    value = abs(float(value))
    return f"below {bound:.0e}" if value < bound else f"{value:.1e} (above {bound:.0e})"


def _as_array(x, what):
    if x is None:
        raise CheckFailed(f"{what}: your code returned None. Did you forget a `return`?")
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    try:
        return np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise CheckFailed(f"{what}: expected a number or an array, got {type(x).__name__}: {fmt(x)}") from None


def _report(lines, inputs, hint):
    if inputs:
        lines[1:1] = [f"  input {k}: {fmt(v)}" for k, v in inputs.items()]
    if hint:
        lines.append(f"  hint: {hint}")
    return "\n".join(lines)


def _mistake_hint(yours, mistakes, rtol, atol):
    """The hint of the first known mistake whose output equals yours, if any."""
    for hint, wrong in (mistakes or {}).items():
        try:
            w = _as_array(wrong, "")
            if w.shape == yours.shape and np.allclose(yours, w, rtol=rtol, atol=atol, equal_nan=True):
                return hint
        except Exception:
            continue
    return None


# ---- comparisons --------------------------------------------------------------------------

def assert_close(yours, expected, what="result", rtol=1e-6, atol=1e-9, inputs=None, hint=None,
                 mistakes=None):
    """Fail unless `yours` equals `expected` elementwise within tolerance.

    inputs:   {name: value} shown in the message so the case can be reproduced.
    hint:     a sentence shown on any failure.
    mistakes: {hint: wrong_output}; if yours matches a wrong output, that hint is shown.
    """
    __tracebackhide__ = True
    y = _as_array(yours, what)
    e = _as_array(expected, what)
    if y.shape != e.shape:
        if y.size == e.size:
            hint = hint or "same number of elements: a reshape, a transpose or a missing keepdim?"
        raise CheckFailed(_report([f"{what} has the wrong shape: yours {y.shape}, expected {e.shape}."],
                                  inputs, _mistake_hint(y, mistakes, rtol, atol) or hint))
    good = np.isclose(y, e, rtol=rtol, atol=atol, equal_nan=False)
    if good.all():
        return
    bad = np.argwhere(~good)
    first = tuple(int(i) for i in bad[0]) if y.ndim else ()
    lines = [f"{what} differs from the expected value."]
    if y.ndim:
        lines += [f"  first bad index {first}: yours {fmt(float(y[first]))}, expected {fmt(float(e[first]))}",
                  f"  {len(bad)} of {y.size} elements differ"]
    lines += [f"  yours:    {fmt(y)}", f"  expected: {fmt(e)}"]
    if not np.isfinite(y).all():
        hint = hint or "your result has inf or nan: an overflow, a log of 0, or a division by 0?"
    raise CheckFailed(_report(lines, inputs, _mistake_hint(y, mistakes, rtol, atol) or hint))


def assert_equal(yours, expected, what="result", inputs=None, hint=None):
    """Fail unless `yours == expected` exactly (for ints, shapes, lists, strings)."""
    __tracebackhide__ = True
    same = yours == expected
    if isinstance(same, np.ndarray):
        same = np.shape(yours) == np.shape(expected) and bool(same.all())
    if not same:
        raise CheckFailed(_report([f"{what} differs from the expected value.", f"  yours:    {fmt(yours)}",
                                   f"  expected: {fmt(expected)}"], inputs, hint))


def require(condition, message, hint=None):
    """Fail with `message` (and a hint) unless the condition holds."""
    __tracebackhide__ = True
    if not condition:
        raise CheckFailed(message + (f"\n  hint: {hint}" if hint else ""))


# ---- random cases -------------------------------------------------------------------------

def random_shape(ndim, low=1, high=9):
    """A random shape, each size drawn uniformly from low..high: odd and even sizes alike, so a
    kernel or a formula that silently assumes square, even or block-sized inputs gets caught."""
    return tuple(int(s) for s in rng().integers(low, high + 1, size=ndim))


def random_array(shape, low=-2.0, high=2.0):
    """Uniform random float64 values: never all ones, never zeros by construction."""
    return rng().uniform(low, high, size=shape)
