"""The course's book: the executed lessons as a static site, built by Sphinx with myst-nb (`make book`).

Nothing is executed: every page shows the outputs committed in notebooks/, which nbval checks in
`make test`. The pages are whatever notebooks/ holds (book/notebooks is a link to it), in chapter
order; the landing page and the setup page include the README's own sections, so the book and the
README never disagree. Math is typeset by a copy of MathJax that the book carries (mathjax.py): the
site makes no request to any other host.
"""

import re
import sys
import tomllib
from pathlib import Path

BOOK = Path(__file__).resolve().parent
sys.path.insert(0, str(BOOK))
import mathjax  # noqa: E402

PROJECT = tomllib.loads((BOOK.parent / "pyproject.toml").read_text(encoding="utf-8"))["project"]

project = "Deep learning systems, from scratch"
author = "the course's authors"
copyright = "the course's authors, MIT licence"
release = version = PROJECT["version"]

extensions = ["myst_nb"]
root_doc = "index"
exclude_patterns = ["_build", "exercises", "**/.ipynb_checkpoints"]

# The committed outputs are the book: never run a notebook here.
nb_execution_mode = "off"
# Widget outputs (tqdm bars) show their text: the widget manager would come from a CDN.
nb_ipywidgets_js = {}
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3

html_theme = "sphinx_book_theme"
html_title = project
html_favicon = "favicon.svg"   # else every browser asks for /favicon.ico, a 404 in the console
html_static_path = [str(mathjax.static_folder())]
mathjax_path = "mathjax/tex-chtml.js"
html_theme_options = {
    "repository_url": PROJECT["urls"]["Repository"],
    "repository_branch": "main",
    "path_to_docs": "",          # pages are notebooks/NN_topic.ipynb, as in the repository
    "use_repository_button": True,
    "use_download_button": True,
    "use_fullscreen_button": False,
    "show_toc_level": 2,
    "home_page_in_toc": False,
}
# Light or dark as the reader's system says (the theme logs a console error when this is unset).
html_context = {"default_mode": "auto"}
html_last_updated_fmt = None


# book/notebooks and book/exercises are links to the repository's folders. Sphinx resolves links
# between documents through the real paths, which lie outside the book, so the pages' links to one
# another are written as {doc} references, and the lessons' links to their exercise notebooks as
# downloads (MyST's `path:` links): the same Markdown reads right in JupyterLab and on GitHub.
_NOTEBOOK_LINK = re.compile(r"\[([^\]\n]+)\]\((?:\.\./)?(?:notebooks/)?(\d\d_[\w-]+)\.ipynb\)")


def _lesson_links(app, docname, source):
    if docname.startswith("notebooks/"):
        text = source[0].replace("](../exercises/", "](path:../exercises/")
        source[0] = _NOTEBOOK_LINK.sub(lambda m: f"{{doc}}`{m[1]} </notebooks/{m[2]}>`", text)


def _readme_links(app, relative_path, parent_docname, content):
    if relative_path.name == "README.md":
        content[0] = _NOTEBOOK_LINK.sub(lambda m: f"{{doc}}`{m[1]} </notebooks/{m[2]}>`", content[0])


def setup(app):
    app.connect("source-read", _lesson_links)
    app.connect("include-read", _readme_links)
