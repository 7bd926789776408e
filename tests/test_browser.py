"""A learner's first minutes, in a real browser: JupyterLab opens chapter 00 with the workspace's
top in the file browser and nothing to save, Run All Cells works through the UI, and the graph
picture, the plots and the check's message appear. Then autosave writes the run lesson, the course
changes, and `course sync` brings the change into the learner's copy.

Needs Debian's `chromium` (driven by Playwright from PyPI; no browser download). Outside CI
the test is skipped, visibly, when chromium is missing; in CI it must run.
"""

import json
import os
import secrets
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request

import nbformat
import pytest

from course_lib import REPO_DIR, cli
from course_lib.learner import workspace as ws

pytestmark = pytest.mark.browser
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


AUTOSAVE_SECONDS = 2


@pytest.fixture
def lab(tmp_path, monkeypatch):
    """A JupyterLab server on 127.0.0.1 with token auth, started as `course lab` starts it (the same
    command line, kernels over local sockets), serving a workspace that `course sync` filled from a
    small copy of the course (the welcome lesson), with the library's source in course_lib/, the
    course's JupyterLab settings, and autosave every few seconds instead of two minutes."""
    course = tmp_path / "course"
    (course / "notebooks").mkdir(parents=True)
    shutil.copy(REPO_DIR / "notebooks/00_welcome.ipynb", course / "notebooks")
    root = tmp_path / "root"
    monkeypatch.setenv("COURSE_WORKSPACE", str(root))
    ws.sync(course)
    ws.mirror_library()
    cli.install_lab_settings()
    settings = tmp_path / "settings" / "@jupyterlab" / "docmanager-extension"
    settings.mkdir(parents=True)
    (settings / "plugin.jupyterlab-settings").write_text(json.dumps({"autosaveInterval": AUTOSAVE_SECONDS}))
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "ws")}
    argv = cli.lab_argv(root) + ["--no-browser", f"--ServerApp.port={port}", f"--IdentityProvider.token={token}"]
    server = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                assert server.poll() is None, server.stderr.read().decode()[-2000:]
                time.sleep(0.5)
        with pytest.raises(urllib.error.HTTPError):  # token authentication is on
            urllib.request.urlopen(f"{base}/api/status", timeout=5)
        yield base, token, course, root
    finally:
        for kernel in json.loads(urllib.request.urlopen(f"{base}/api/kernels?token={token}", timeout=5).read()):
            req = urllib.request.Request(f"{base}/api/kernels/{kernel['id']}?token={token}", method="DELETE")
            urllib.request.urlopen(req, timeout=10)
        server.terminate()
        server.wait(timeout=30)


def test_welcome_notebook_runs_in_jupyterlab(lab, in_ci, tmp_path):
    if CHROMIUM is None:
        if in_ci:
            pytest.fail("chromium is missing in CI; .ci/run installs it")
        pytest.skip("chromium is not installed (apt-get install chromium) so the browser test cannot run")
    from playwright.sync_api import sync_playwright

    base, token, course, root = lab
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        page = browser.new_page(viewport={"width": 1400, "height": 2400})
        try:
            _run_welcome(page, base, token)
            _autosave_then_sync(page, course, root)
        except Exception:
            shot = tmp_path / "failure.png"
            page.screenshot(path=str(shot), full_page=True)
            print(f"screenshot of the failure: {shot}")
            raise
        finally:
            browser.close()


def _kernel_idle(base, token):
    """True once the kernel is up and idle. A server still starting the kernel may answer 500 or
    be slow on a busy machine: that counts as not yet, and the caller polls again."""
    try:
        kernels = json.loads(urllib.request.urlopen(f"{base}/api/kernels?token={token}", timeout=30).read())
    except (urllib.error.URLError, TimeoutError):   # HTTPError is a URLError
        return False
    return bool(kernels) and all(k["execution_state"] == "idle" for k in kernels)


def _menu(page, menu, item):
    page.locator(".lm-MenuBar-itemLabel", has_text=menu).first.click()
    page.locator(".lm-Menu-itemLabel", has_text=item).first.click()


def _run_welcome(page, base, token):
    listing = json.loads(urllib.request.urlopen(f"{base}/api/contents/course_lib?token={token}", timeout=30).read())
    assert "autograd" in {item["name"] for item in listing["content"]}, "the library's source is not in the file browser"
    page.goto(f"{base}{cli.START_URL}&token={token}")  # where `course lab` opens
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90_000)
    deadline = time.time() + 90
    while not _kernel_idle(base, token):  # the server's word that the kernel is up
        assert time.time() < deadline, "the kernel did not start"
        time.sleep(0.5)
    names = page.locator(".jp-DirListing-itemText").all_inner_texts()
    assert "notebooks" in names and "course_lib" in names, f"the file browser is not at the workspace's top: {names}"
    time.sleep(2 * AUTOSAVE_SECONDS)
    assert page.locator(".jp-mod-dirty").count() == 0, "JupyterLab changed the lesson on opening it (unsaved changes)"
    _menu(page, "Edit", "Clear Outputs of All Cells")  # so that every output below is fresh
    assert page.locator(".jp-RenderedSVG img").count() == 0
    _menu(page, "Run", "Run All Cells")
    dialog = page.locator(".jp-Dialog button", has_text="Select")
    if dialog.count():  # a kernel prompt on a slow start: accept the course kernel
        dialog.first.click()
    page.wait_for_selector(".jp-RenderedSVG img", timeout=120_000)
    # The lesson's check demo fails on purpose (a forward difference), with the check's message.
    failed = page.locator(".jp-OutputArea-output", has_text="differs from the expected")
    failed.first.wait_for(timeout=60_000)
    assert page.locator(".jp-OutputArea-output", has_text="CheckFailed").count() >= 1, \
        "the failing-check demo should show CheckFailed, not a bare traceback"
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
    assert page.get_by_text("official Jupyter news").count() == 0, "JupyterLab asked about its news feed"
    images = page.locator(".jp-RenderedImage img")
    assert images.count() >= 1, "the moons scatter plot did not render"
    if os.environ.get("COURSE_SCREENSHOT"):
        page.screenshot(path=os.environ["COURSE_SCREENSHOT"], full_page=True)


def _autosave_then_sync(page, course, root):
    """The lesson was run (outputs changed) and autosaved: it is still the course's, so an update of
    the course reaches it, and the outputs of the cells the update did not touch stay the learner's."""
    lesson = root / "notebooks/00_welcome.ipynb"
    deadline = time.time() + 60
    while lesson.read_bytes() == (course / "notebooks/00_welcome.ipynb").read_bytes():
        assert time.time() < deadline, "autosave did not write the lesson"
        time.sleep(0.5)
    page.wait_for_timeout(3000 * AUTOSAVE_SECONDS)  # the last autosave after the run
    ran = nbformat.read(str(lesson), as_version=4)
    src = course / "notebooks/00_welcome.ipynb"
    src.write_text(src.read_text().replace("Welcome", "Welcome (updated)", 1))
    report = [what for what, _ in ws.sync(course)]
    assert report == ["updated"], f"course sync after opening and running the lesson: {report}"
    synced = nbformat.read(str(lesson), as_version=4)
    assert "Welcome (updated)" in "".join(c.source for c in synced.cells)
    kept = [c for c in synced.cells if c.cell_type == "code" and c.outputs]
    assert kept and [c.outputs for c in kept] == [c.outputs for c in ran.cells if c.cell_type == "code" and c.outputs]
