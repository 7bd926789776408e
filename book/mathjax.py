"""MathJax for the book, from the npm registry, so that its math renders with no network at all.

Sphinx loads MathJax from a CDN by default: offline (a laptop on a train, the course's test machines)
the formulas stay raw TeX and the browser logs an error. So the book carries its own copy: the
`mathjax` package as its authors publish it on npm, fetched once with npm's own client (`npm pack`:
one tarball, no install scripts), checked against the integrity hash pinned below, and unpacked into
build/book-cache/. Later builds reuse the cache and need no network.

Why npm and not PyPI: the MathJax team publishes MathJax on npm; on PyPI only third-party repackagings
exist, years old. Node's npm comes with the machines the course is built on; the book is for authors
and CI to build, learners read it.
"""

import base64
import hashlib
import shutil
import subprocess
import tarfile
from pathlib import Path

VERSION = "3.2.2"
# npm's integrity field for mathjax@3.2.2 (sha512 of the tarball)
INTEGRITY = "sha512-Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw=="
# What tex-chtml.js needs: itself, the TeX extensions it loads on demand, the CHTML fonts, the menu and
# its accessibility tools (the speech rule engine, sre/, loads only when a reader turns speech on).
PARTS = ["tex-chtml.js", "input/tex/extensions", "output/chtml", "ui", "a11y", "sre", "adaptors"]
CACHE = Path(__file__).resolve().parent.parent / "build" / "book-cache"


def _integrity(path):
    return "sha512-" + base64.b64encode(hashlib.sha512(path.read_bytes()).digest()).decode()


def static_folder():
    """A folder holding mathjax/ (give it to html_static_path); fetches and unpacks it the first time."""
    out = CACHE / f"mathjax-{VERSION}"
    if (out / "mathjax" / "tex-chtml.js").is_file():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    tgz = CACHE / f"mathjax-{VERSION}.tgz"
    if not tgz.is_file():
        if shutil.which("npm") is None:
            raise SystemExit("The book vendors MathJax from npm, and `npm` is missing: install Node.js "
                             "(Debian: apt-get install npm), or put mathjax-3.2.2.tgz in build/book-cache/.")
        subprocess.run(["npm", "pack", f"mathjax@{VERSION}", "--pack-destination", str(CACHE), "--silent"],
                       check=True, stdout=subprocess.DEVNULL)
    if _integrity(tgz) != INTEGRITY:
        tgz.unlink()
        raise SystemExit(f"mathjax-{VERSION}.tgz does not match its pinned integrity hash; removed it, try again")
    tmp = CACHE / f"mathjax-{VERSION}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(tgz) as tar:
        wanted = [m for m in tar.getmembers()
                  if m.name == "package/LICENSE" or any(m.name == f"package/es5/{p}" or m.name.startswith(f"package/es5/{p}/")
                                                        for p in PARTS)]
        tar.extractall(tmp, members=wanted, filter="data")
    (tmp / "mathjax").parent.mkdir(parents=True, exist_ok=True)
    (tmp / "package" / "es5").rename(tmp / "mathjax")
    (tmp / "package" / "LICENSE").rename(tmp / "mathjax" / "LICENSE")
    shutil.rmtree(tmp / "package")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
