"""The shared helpers: offline data, graph drawing, and the CUDA device choice."""

import subprocess
import sys

import numpy as np
import pytest

from course_lib import data, viz


def test_moons_are_seeded_and_balanced():
    X, y = data.make_moons(n=101, noise=0.1, seed=3)
    X2, _ = data.make_moons(n=101, noise=0.1, seed=3)
    assert X.shape == (101, 2) and y.shape == (101,) and set(y) == {0, 1}
    assert np.array_equal(X, X2) and not np.array_equal(X, data.make_moons(101, 0.1, seed=4)[0])
    assert abs(int(y.sum()) - 50) <= 1


def test_digits_split_is_fixed_and_disjoint():
    Xtr, Xte, ytr, yte = data.load_digits()
    assert Xtr.shape[1] == 64 and len(Xtr) + len(Xte) == 1797 and len(Xte) == 359
    assert Xtr.dtype == np.float32 and 0 <= Xtr.min() and Xtr.max() <= 1
    assert set(yte) == set(range(10))
    assert np.array_equal(Xte, data.load_digits()[1])
    rows = {r.tobytes() for r in Xtr}
    assert sum(r.tobytes() in rows for r in Xte) < 20  # only the few duplicate images of the data set


def test_text_corpus_defaults_to_pydoc_and_reads_files(tmp_path):
    text = data.load_text()
    assert len(text) > 400_000 and "for" in text
    train, val = data.split_text(text)
    assert len(train) == int(len(text) * 0.9) and train + val == text
    p = tmp_path / "t.txt"
    p.write_text("héllo wörld", encoding="utf-8")
    assert data.load_text(p) == "héllo wörld"


def test_draw_graph_builds_a_digraph():
    g = viz.draw_graph([{"id": 1, "label": "x", "kind": "input"}, {"id": 2, "label": "relu", "kind": "op"}],
                       [(1, 2, "in")], title="t")
    assert "relu" in g.source and "1 -> 2" in g.source and 'label=in' in g.source
    assert g.pipe(format="svg").startswith(b"<?xml")


def test_missing_dot_gives_install_commands(monkeypatch):
    monkeypatch.setattr(viz.shutil, "which", lambda name: None)
    with pytest.raises(viz.DotNotFound, match="apt-get install graphviz") as info:
        viz.draw_graph([{"id": 1, "label": "x"}], [])
    assert "brew install graphviz" in str(info.value) and "conda" in str(info.value)


def test_plot_curves_draws_every_series():
    import matplotlib

    matplotlib.use("Agg")
    ax = viz.plot_curves({"train": [3, 2, 1], "val": ([0, 2], [3, 1.5])})
    assert len(ax.lines) == 2 and ax.get_legend() is not None


def _python(code, **env):
    import os

    full = {k: v for k, v in os.environ.items() if k not in ("NUMBA_ENABLE_CUDASIM", "COURSE_DEVICE")}
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full)


def test_device_setup_picks_the_simulator_without_a_gpu():
    from course_lib import device

    if device.gpu_present():
        pytest.skip("this machine has a GPU")
    out = _python("from course_lib import device; device.setup()\n"
                  "from numba import cuda; import numba\n"
                  "print(numba.config.ENABLE_CUDASIM, cuda.is_available())")
    assert out.returncode == 0, out.stderr
    assert "CUDA simulator" in out.stdout and out.stdout.strip().endswith("1 True")


def test_device_setup_asks_for_a_restart_when_too_late():
    out = _python("from numba import cuda\nfrom course_lib import device\ndevice.setup()", COURSE_DEVICE="simulator")
    assert out.returncode != 0 and "RestartKernel" in out.stderr and "Restart the kernel" in out.stderr
