"""Packaging details pyproject.toml cannot say: the wheel carries benchmarks/ as course_lib/benchmarks,
so that lessons read its figures and reports through importlib.resources wherever they run
(course_lib/course/resources.py). Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["course_lib", "course_lib.*"]) + ["course_lib.benchmarks"],
    package_dir={"course_lib.benchmarks": "benchmarks"},
)
