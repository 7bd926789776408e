"""Where a notebook opens besides a local setup: Colab and Binder links, and the Colab cell.

One setting decides every link: the repository's address, `Repository` in pyproject.toml's
[project.urls]. From it `course build` writes two cells near the top of every lesson and solution
notebook (the exercise notebooks get them from the solutions), and the README's badges:

- `launch-links`, a markdown cell: this notebook in Colab and in Binder, and its partner (a lesson's
  exercise notebook, an exercise notebook's lesson);
- `colab-setup`, a code cell that does nothing outside Colab and in Colab installs the library from
  the same branch as the notebook (course_lib.course.colab says what else it does). It is tagged
  `nbval-skip`, so the tests never run it, and `remove-cell`, so the book leaves it out.

Both cells are found by their cell id, so running the command again rewrites them in place: run it
after adding a notebook or changing the address.
"""

import re
import tomllib
from urllib.parse import quote, urlparse

import nbformat

from course_lib import REPO_DIR, __version__
from course_lib.course import nbtools

BRANCH = "main"  # the branch the links open and the Colab cell installs from
LINKS_ID, SETUP_ID = "launch-links", "colab-setup"
KINDS = {"notebooks": "notebooks", "solutions": "exercises"}  # a folder -> where learners open its notebooks
README_BEGIN, README_END = "<!-- launch links: written by `course build` -->", "<!-- end of launch links -->"


def repository(repo=REPO_DIR):
    """(owner, name) of the GitHub repository named in pyproject.toml."""
    project = tomllib.loads((repo / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    url = project.get("urls", {}).get("Repository", "")
    parts = urlparse(url)
    path = parts.path.strip("/").removesuffix(".git").split("/")
    if parts.netloc != "github.com" or len(path) != 2:
        raise ValueError(f"pyproject.toml's [project.urls] Repository must be https://github.com/OWNER/NAME "
                         f"(Colab and Binder open notebooks from GitHub); it is {url!r}")
    return path[0], path[1]


def colab_url(path, repo=REPO_DIR):
    owner, name = repository(repo)
    return f"https://colab.research.google.com/github/{owner}/{name}/blob/{BRANCH}/{path}"


def binder_url(path, repo=REPO_DIR):
    """Binder builds environment.yml, runs postBuild (`course setup`: the kernel and work/), and opens the
    learner's copy in work/, where passing checks are kept as on a local setup."""
    owner, name = repository(repo)
    return f"https://mybinder.org/v2/gh/{owner}/{name}/{BRANCH}?labpath={quote('work/' + path, safe='')}"


def install_requirement(repo=REPO_DIR):
    """What the Colab cell pip-installs: the library from the branch's source archive."""
    owner, name = repository(repo)
    return f"course_lib @ https://github.com/{owner}/{name}/archive/refs/heads/{BRANCH}.zip"


def learner_path(path, repo=REPO_DIR):
    """The path learners open: solutions/NN_x.ipynb is opened as exercises/NN_x.ipynb."""
    rel = path.resolve().relative_to(repo.resolve())
    return f"{KINDS.get(rel.parts[0], rel.parts[0])}/{rel.name}"


def partner(path, repo=REPO_DIR):
    """The lesson of an exercise notebook, or the exercise notebook of a lesson (same chapter number)."""
    other = "exercises" if path.parent.name == "notebooks" else "notebooks"
    found = sorted((repo / other).glob(f"{path.name[:2]}_*.ipynb"))
    return f"{other}/{found[0].name}" if found else None


def links_text(path, repo=REPO_DIR):
    here = learner_path(path, repo)
    what = "this lesson" if here.startswith("notebooks/") else "these exercises"
    text = (f"**Run {what}** [in Colab]({colab_url(here, repo)}) (a free GPU: *Runtime > Change runtime type*), "
            f"[in Binder]({binder_url(here, repo)}), or on your machine with `make lab`.")
    other = partner(repo / here, repo)
    if other:
        label = "Its exercises" if other.startswith("exercises/") else "The lesson"
        text += f" {label}: [{other.split('/')[1]}](../{other}) ([in Colab]({colab_url(other, repo)}))."
    return text


def setup_source(repo=REPO_DIR):
    return (
        "# In Colab only (elsewhere this cell does nothing): install the course's library (it says how long it took).\n"
        "import subprocess, sys\n"
        "if \"google.colab\" in sys.modules:\n"
        "    subprocess.run([sys.executable, \"-m\", \"pip\", \"install\", \"-q\", \"--no-deps\",\n"
        f"                    \"{install_requirement(repo)}\"], check=True)\n"
        "    from course_lib.course import colab\n"
        f"    colab.setup(\"{__version__}\")"
    )


def _cells(path, repo):
    links = nbformat.v4.new_markdown_cell(links_text(path, repo))
    links.id, links.metadata["tags"] = LINKS_ID, [LINKS_ID]
    setup = nbformat.v4.new_code_cell(setup_source(repo))
    setup.id, setup.metadata["tags"] = SETUP_ID, [SETUP_ID, "nbval-skip", "remove-cell"]
    return links, setup


def with_launch_cells(nb, path, repo=REPO_DIR):
    """The notebook with its two cells up to date: rewritten where they are, else inserted after the
    first cell when it is the title (markdown), else at the top."""
    links, setup = _cells(path, repo)
    nb = nbformat.from_dict(nb)
    ids = [c.get("id") for c in nb.cells]
    if LINKS_ID in ids and SETUP_ID in ids:
        # what a run left in the cell (`course execute` runs it: outside Colab it prints nothing) stays
        old = nb.cells[ids.index(SETUP_ID)]
        setup.execution_count, setup.outputs = old.get("execution_count"), old.get("outputs", [])
        nb.cells[ids.index(LINKS_ID)], nb.cells[ids.index(SETUP_ID)] = links, setup
        return nb
    nb.cells = [c for c in nb.cells if c.get("id") not in (LINKS_ID, SETUP_ID)]
    at = 1 if nb.cells and nb.cells[0].cell_type == "markdown" else 0
    nb.cells[at:at] = [links, setup]
    return nb


def readme_block(repo=REPO_DIR):
    """The README's first lines after the title: badges, then the ways into the course."""
    project = tomllib.loads((repo / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    book = project.get("urls", {}).get("Documentation")
    first = sorted((repo / "notebooks").glob("00_*.ipynb"))
    start = f"notebooks/{first[0].name}" if first else "notebooks"
    colab, binder = colab_url(start, repo), binder_url(start, repo)
    badges = [f"[![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab})",
              f"[![Launch Binder](https://mybinder.org/badge_logo.svg)]({binder})"]
    lines = []
    if book:
        badges.insert(0, f"[![Read the book](https://img.shields.io/badge/read-the%20book-blue)]({book})")
        lines.append(f"- **Read** every lesson, executed, with its figures, in [the book]({book}) (`make book` builds it).")
    lines += [
        f"- **Run in Colab**, nothing to install: [chapter 00]({colab}); every notebook links to its own. "
        "*Runtime > Change runtime type* lends a GPU, on which chapters 07, 08 and 10 run their CUDA kernels. "
        "Your work lives in the notebook: *File > Save a copy in Drive*.",
        f"- **Run in Binder**, nothing to install: [the course in JupyterLab]({binder}), on a CPU, "
        "for as long as the session lasts.",
        "- **Run on your machine** with the two commands below: your work is kept in `work/`, and `course status` follows it.",
    ]
    return " ".join(badges) + "\n\n" + "\n".join(lines)


def _readme_text(text, repo):
    block = f"{README_BEGIN}\n{readme_block(repo)}\n{README_END}"
    pattern = re.compile(re.escape(README_BEGIN) + r".*?" + re.escape(README_END), re.S)
    return pattern.sub(lambda _: block, text) if pattern.search(text) else text


def update(check_only=False, repo=REPO_DIR):
    """Bring the launch cells of notebooks/ and solutions/ (and the README's badges, between their
    markers) up to date. With check_only, write nothing. Returns the paths that were (or would be) changed."""
    stale = []
    for folder in KINDS:
        for path in sorted((repo / folder).glob("[0-9][0-9]_*.ipynb")):
            text = path.read_text(encoding="utf-8")
            new = nbtools.dumps(with_launch_cells(nbtools.read(path), path, repo))
            if new != text:
                stale.append(path)
                if not check_only:
                    path.write_text(new, encoding="utf-8")
    readme = repo / "README.md"
    if readme.exists():
        text = readme.read_text(encoding="utf-8")
        new = _readme_text(text, repo)
        if new != text:
            stale.append(readme)
            if not check_only:
                readme.write_text(new, encoding="utf-8")
    return stale
