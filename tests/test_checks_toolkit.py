"""The checking toolkit: messages that say what differs, and progress records."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib import checks
from course_lib.checks import CheckFailed, assert_close, assert_equal, exercise
from course_lib.learner import progress


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3), seed=st.integers(0, 2**31 - 1))
def test_assert_close_names_the_first_bad_index(shape, seed):
    rng = np.random.default_rng(seed)
    expected = rng.uniform(-2, 2, size=shape)
    assert_close(expected.copy(), expected)  # equal arrays pass
    yours = expected.copy()
    index = tuple(int(rng.integers(0, s)) for s in shape)
    yours[index] += 0.5
    with pytest.raises(CheckFailed) as info:
        assert_close(yours, expected)
    assert f"first bad index {index}" in str(info.value)
    assert "1 of" in str(info.value)


def test_shape_mismatch_is_explained():
    with pytest.raises(CheckFailed, match=r"wrong shape: yours \(3, 2\), expected \(2, 3\)(.|\n)*transpose"):
        assert_close(np.arange(6.0).reshape(3, 2), np.arange(6.0).reshape(2, 3))


def test_none_and_nan_are_explained():
    with pytest.raises(CheckFailed, match="returned None"):
        assert_close(None, 1.0)
    with pytest.raises(CheckFailed, match="inf or nan"):
        assert_close(np.array([1.0, np.nan]), np.array([1.0, 2.0]))


def test_known_mistakes_give_their_hint():
    with pytest.raises(CheckFailed, match="hint: you doubled it"):
        assert_close(4.0, 2.0, mistakes={"you doubled it": 4.0, "you halved it": 1.0})


def test_torch_tensors_are_accepted():
    torch = pytest.importorskip("torch")
    assert_close(torch.tensor([1.0, 2.0], requires_grad=True) * 1, np.array([1.0, 2.0]))


def test_assert_equal():
    assert_equal((2, 3), (2, 3))
    with pytest.raises(CheckFailed, match="yours"):
        assert_equal([1, 2], [2, 1])


def test_exercise_wrapper_records_progress(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COURSE_PROGRESS_FILE", str(tmp_path / "p.json"))

    @exercise
    def demo(fn):
        assert_close(fn(3.0), 9.0)
        return "1 case"

    chapter = __name__.rsplit(".", 1)[-1]  # the chapter key is the last part of the check's module name
    assert demo.__module__ == __name__ and "demo" in checks.REGISTRY[chapter]
    demo(lambda x: x * x)
    assert "✔ demo passed" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="demo: .*differs"):
        demo(lambda x: x + x)
    with pytest.raises(CheckFailed, match="not implemented yet"):
        demo(lambda x: (_ for _ in ()).throw(NotImplementedError()))
    with pytest.raises(CheckFailed, match="your code raised ZeroDivisionError"):
        demo(lambda x: 1 / 0)
    saved = json.loads((tmp_path / "p.json").read_text())
    (record,) = saved.values()
    assert record["demo"]["passed"] is False


def test_failures_name_a_seed_that_replays(monkeypatch):
    monkeypatch.setenv("COURSE_CHECK_SEED", "123")

    @exercise
    def draws(fn):
        x = checks.rng().uniform()
        assert_close(fn(x), x)

    with pytest.raises(CheckFailed) as first:
        draws(lambda x: x + 1)
    with pytest.raises(CheckFailed) as second:
        draws(lambda x: x + 1)
    assert "COURSE_CHECK_SEED=123" in str(first.value)
    assert str(first.value) == str(second.value)


def test_progress_is_recorded_only_from_work_exercises(workspace, monkeypatch):
    monkeypatch.chdir(workspace.parent)
    progress.record("00", "x", True)
    assert progress.load() == {}
    (workspace / "exercises").mkdir(parents=True)
    monkeypatch.chdir(workspace / "exercises")
    progress.record("00", "x", True)
    assert progress.load()["00"]["x"]["passed"] is True
