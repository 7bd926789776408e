"""Files the lessons read besides the library: the benchmark scripts, their figures and reports.

A notebook may run far from the course's folder: copied alone into an empty folder, on a library that
pip installed from a wheel, in Colab. So it never opens a file by a path relative to itself, to the
current directory or to `REPO_DIR`; it asks this module, which looks in the installed package first
(`importlib.resources`: the wheel carries benchmarks/ as `course_lib/benchmarks`, see setup.py) and,
in a clone of the course, in its benchmarks/ folder.

    from course_lib.course.resources import benchmark_file
    print(benchmark_file("RESULTS.md").read_text())
"""

from importlib import resources

from course_lib import CHECKOUT, REPO_DIR


def benchmark_file(name):
    """benchmarks/<name> as a path-like object (it has `read_text()` and works with `open`)."""
    shipped = resources.files("course_lib").joinpath("benchmarks", name)
    if shipped.is_file():
        return shipped
    if CHECKOUT and (REPO_DIR / "benchmarks" / name).is_file():
        return REPO_DIR / "benchmarks" / name
    raise FileNotFoundError(
        f"benchmarks/{name} is not in the course's package ({resources.files('course_lib')}); "
        "is the name right, and was the wheel built with setup.py's package mapping?")
