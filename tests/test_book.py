"""The book (`make book`), built from the committed lessons and read in a real browser.

Sphinx builds the site with warnings as errors (a link to a missing page, a broken include), into a
temporary folder, from whatever notebooks/ holds. Then headless Chromium opens the landing page,
the setup page and every chapter page from a server on 127.0.0.1, with every request to another
host refused, as on a machine with no network, and each page must show:

- no console error or warning, no failed request, no request that left 127.0.0.1;
- every figure the lesson's outputs hold (plots, graphviz drawings), loaded;
- its math typeset by the book's own MathJax (no formula left as raw TeX);
- internal links that all lead to a page (and to the anchor they name), including the lesson's
  exercise notebook, which downloads; and a Colab link to the lesson itself.

Not part of `make test` (it needs the book's packages and about a minute): `make test-book` runs it,
and CI runs that after `make test`. Needs Debian's `chromium`; skipped visibly without it or without
the `[book]` packages, except in CI, where it fails instead.
"""

import contextlib
import functools
import http.server
import json
import re
import shutil
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from course_lib import REPO_DIR
from course_lib.course import links as launch

pytestmark = [pytest.mark.book, pytest.mark.browser]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
LESSONS = sorted((REPO_DIR / "notebooks").glob("[0-9][0-9]_*.ipynb"))
FIGURE_MIMES = ("image/png", "image/svg+xml", "image/jpeg")


def _require(in_ci, what, missing):
    if missing:
        if in_ci:
            pytest.fail(f"{what} is missing in CI (.ci/run installs it)")
        pytest.skip(f"{what} is not installed, so the book cannot be tested")


@pytest.fixture(scope="module")
def site(tmp_path_factory, in_ci):
    """The book, built as `make book` builds it, served on 127.0.0.1."""
    try:
        import myst_nb  # noqa: F401
        import sphinx_book_theme  # noqa: F401
    except ImportError:
        _require(in_ci, "the book's packages (pip install -e '.[book]')", True)
    _require(in_ci, "npm (for MathJax, on a first build)", shutil.which("npm") is None
             and not (REPO_DIR / "build/book-cache").is_dir())
    out = tmp_path_factory.mktemp("book")
    build = subprocess.run([sys.executable, "-m", "sphinx", "-q", "-W", "--keep-going", "-b", "html",
                            "-d", str(out / "doctrees"), str(REPO_DIR / "book"), str(out / "html")],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, f"the book did not build cleanly:\n{build.stderr[-4000:]}"
    with _serve(out / "html") as base:
        yield out / "html", base


@contextlib.contextmanager
def _serve(folder):
    """A static file server for `folder` on 127.0.0.1; yields its base URL."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def _figures(nb_path):
    """How many figures the lesson's outputs hold, in the cells the book shows."""
    nb = json.loads(nb_path.read_text(encoding="utf-8"))
    count = 0
    for cell in nb["cells"]:
        tags = cell.get("metadata", {}).get("tags", [])
        if cell["cell_type"] != "code" or {"remove-cell", "remove-output"} & set(tags):
            continue
        count += sum(1 for o in cell.get("outputs", []) if any(m in o.get("data", {}) for m in FIGURE_MIMES))
    return count


def _has_math(nb_path):
    nb = json.loads(nb_path.read_text(encoding="utf-8"))
    return any(re.search(r"\$[^$\n]+\$", "".join(c["source"])) for c in nb["cells"] if c["cell_type"] == "markdown")


def test_every_lesson_is_a_page_reached_from_the_chapter_map(site):
    html, _ = site
    index = (html / "index.html").read_text(encoding="utf-8")
    for lesson in LESSONS:
        assert (html / "notebooks" / f"{lesson.stem}.html").is_file(), f"no page for {lesson.name}"
        assert f'href="notebooks/{lesson.stem}.html' in index, (
            f"the landing page (the README's chapter map) has no link to {lesson.name}: add its row to README.md")


@pytest.fixture(scope="module")
def browser(in_ci):
    _require(in_ci, "chromium", CHROMIUM is None)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        yield b
        b.close()


class _Links:
    """Internal link targets, each fetched once: path -> the page's ids, or None when it is missing."""

    def __init__(self, base):
        self.base, self.seen = base, {}

    def ids(self, path):
        if path not in self.seen:
            try:
                body = urllib.request.urlopen(self.base + path, timeout=30).read()
                self.seen[path] = set(re.findall(rb'\bid="([^"]+)"', body)) if path.endswith(".html") else set()
            except OSError:
                self.seen[path] = None
        return self.seen[path]


@pytest.fixture(scope="module")
def links(site):
    return _Links(site[1])


def _open(browser, url):
    """The page loaded offline-style, with every console message, failed request and off-host request."""
    page = browser.new_page(viewport={"width": 1300, "height": 1200})
    problems = []
    host = urllib.parse.urlsplit(url).netloc

    def route(r):
        if urllib.parse.urlsplit(r.request.url).netloc == host:
            r.continue_()
        else:
            problems.append(f"request to another host: {r.request.url}")
            r.abort()

    page.route("**/*", route)
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"failed request: {r.url}"))
    page.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
    page.goto(url, wait_until="load")
    page.evaluate("() => window.MathJax && MathJax.startup ? MathJax.startup.promise : null")
    page.wait_for_load_state("networkidle")
    return page, problems


def _check_links(page, url, links):
    """Every link within the site leads to a file, and to the anchor it names."""
    bad = []
    base = urllib.parse.urlsplit(url)
    for href in set(page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)")):
        parts = urllib.parse.urlsplit(href)
        if parts.netloc != base.netloc:
            continue
        path = parts.path + ("index.html" if parts.path.endswith("/") else "")
        ids = links.ids(path)
        if ids is None:
            bad.append(f"{href}: no such file")
        elif parts.fragment and parts.fragment.encode() not in ids:
            bad.append(f"{href}: no anchor #{parts.fragment}")
    return bad


@pytest.mark.parametrize("page_path", ["index.html", "setup.html"])
def test_front_pages(site, browser, links, page_path):
    _, base = site
    page, problems = _open(browser, f"{base}/{page_path}")
    try:
        problems += _check_links(page, page.url, links)
        assert not problems, f"{page_path}:\n" + "\n".join(problems)
    finally:
        page.close()


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_chapter_page(site, browser, links, lesson):
    html, base = site
    page, problems = _open(browser, f"{base}/notebooks/{lesson.stem}.html")
    try:
        problems += _check_links(page, page.url, links)
        assert not problems, f"{lesson.name}:\n" + "\n".join(problems)
        # every figure of the lesson's outputs is on the page, and loaded
        figures = page.eval_on_selector_all(
            "article img", "els => els.map(e => [e.getAttribute('src'), e.complete && e.naturalWidth > 0])")
        outputs = [f for f in figures if "_images/" in (f[0] or "")]
        assert len(outputs) >= _figures(lesson), (
            f"{lesson.name}: {_figures(lesson)} figures in the notebook's outputs, {len(outputs)} on the page")
        broken = [src for src, ok in figures if not ok]
        assert not broken, f"{lesson.name}: images that did not load: {broken}"
        # math: every formula typeset, none left as TeX, no MathJax error
        math = page.evaluate("""() => {
            const all = [...document.querySelectorAll('article .math')];
            return [all.length, all.filter(e => !e.querySelector('mjx-container')).length,
                    document.querySelectorAll('mjx-merror').length];
        }""")
        if _has_math(lesson):
            assert math[0] > 0, f"{lesson.name}: its markdown has math, and the page none"
        assert math[1] == 0, f"{lesson.name}: {math[1]} of {math[0]} formulas were not typeset"
        assert math[2] == 0, f"{lesson.name}: MathJax could not typeset {math[2]} formulas"
        # the exercise notebook downloads from the page, and the lesson opens in Colab
        partner = launch.partner(lesson)
        if partner:
            hrefs = page.eval_on_selector_all("a.download", "els => els.map(e => e.getAttribute('href'))")
            assert any(h.endswith(Path(partner).name) for h in hrefs), f"{lesson.name}: no download link to {partner}"
        colab = launch.colab_url(f"notebooks/{lesson.name}")
        assert page.locator(f'a[href="{colab}"]').count() >= 1, f"{lesson.name}: no link that opens it in Colab"
    finally:
        page.close()


def test_the_page_checks_see_what_they_look_for(browser, tmp_path):
    """A page with each fault the chapter pages are checked for: every one is reported."""
    (tmp_path / "ok.html").write_text('<html><body><p id="here">here</p></body></html>')
    (tmp_path / "bad.html").write_text("""<html><head><link rel="icon" href="data:,"></head><body>
        <a href="ok.html#here">fine</a> <a href="ok.html#nowhere">no anchor</a> <a href="missing.html">no page</a>
        <img src="https://cdn.example.org/figure.png"> <img src="gone.png">
        <script>console.error("boom")</script></body></html>""")
    with _serve(tmp_path) as base:
        page, problems = _open(browser, f"{base}/bad.html")
        problems += _check_links(page, page.url, _Links(base))
        page.close()
    found = "\n".join(problems)
    for fault in ["request to another host: https://cdn.example.org/figure.png", "HTTP 404", "console error: boom",
                  "missing.html: no such file", "no anchor #nowhere"]:
        assert fault in found, f"not reported: {fault}\n{found}"
    assert "ok.html#here" not in found
