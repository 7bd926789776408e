# The course's two commands:  `make lab` (set up and open JupyterLab)  and  `make test`.
PYTHON ?= python3
PIP_ARGS ?=   # extra pip options, e.g. --extra-index-url https://download.pytorch.org/whl/cpu (see README)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Fixed seed for the checks' random cases, so a test run is reproducible.
TEST_ENV := COURSE_CHECK_SEED=20261122 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
# Two workers; tests/conftest.py hands a chapter's test files and notebooks to one worker as one unit,
# the longest units first (tests/worker_groups.py).
PYTEST := $(BIN)/python -m pytest -n 2 --dist loadfile \
          --nbval --nbval-kernel-name python3 --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout=300
# The learner's path: lessons and solved exercises run from a staged copy of work/, each in its own
# folder, on the course kernel (as `course lab` runs them), so a path that works only from the repo fails.
LEARNER := .learner-path

.PHONY: lab test test-fast test-book test-package book sweep status check reset build setup clean-venv

lab: $(STAMP)
	$(BIN)/course lab

# Everything: the linter, course_lib unit tests, checks against wrong implementations, nbval over the
# lessons and solutions (staged as a learner's workspace), the inverted run over the exercises,
# and the browser test.
test: $(STAMP)
	$(BIN)/ruff check course_lib tests benchmarks
	$(BIN)/course build --check
	$(BIN)/course stage $(LEARNER)
	$(TEST_ENV) COURSE_WORKSPACE=$(CURDIR)/$(LEARNER) $(PYTEST) -m "not book and not package" tests $(LEARNER)/notebooks $(LEARNER)/exercises $(PYTEST_ARGS)

# Unit tests only (no notebooks, no browser): a quick loop while writing course_lib.
test-fast: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -n 2 -m "not browser and not package" tests --ignore=tests/test_notebooks.py $(PYTEST_ARGS)

# The book: the executed lessons as a static site in build/book/html (Sphinx and myst-nb; nothing is
# re-executed). Its packages are the optional group `book` of pyproject.toml; MathJax comes from npm once.
BOOK_STAMP := $(VENV)/.book-installed
book: $(BOOK_STAMP)
	$(BIN)/sphinx-build -q -W --keep-going -b html -d build/book/doctrees book build/book/html
	@echo "The book: build/book/html/index.html"

# The book built afresh and read in headless Chromium: every page loads offline with no console error,
# its figures and math render, no internal link is broken (about a minute; CI runs it after `make test`).
test-book: $(BOOK_STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -q -m book tests/test_book.py $(PYTEST_ARGS)

# The course as a package: the library built as a wheel, installed (not editable) where no clone is, runs
# a lesson and a solved exercise notebook copied alone into an empty folder (CI runs it after `make test`).
test-package: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -q -m package tests/test_wheel.py $(PYTEST_ARGS)

$(BOOK_STAMP): pyproject.toml | $(STAMP)
	$(BIN)/python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["book"]))' > $(VENV)/book-requirements.txt
	$(BIN)/python -m pip install --quiet $(PIP_ARGS) -r $(VENV)/book-requirements.txt
	touch $(BOOK_STAMP)

# Opt-in, and longer than `make test`: the slow tests: the checks against wrong implementations under 50
# seeds, chapter 11's checks at world sizes 2, 3 and 4 (references and more mistakes), and every lesson and
# solution rerun as another learner's machine computes them, with 4 and 1 Numba threads.
sweep: $(STAMP)
	$(BIN)/python -m pytest -q --slow -m slow tests

status: $(STAMP)
	$(BIN)/course status

check: $(STAMP)
	$(BIN)/course check $(CH)

reset: $(STAMP)
	$(BIN)/course reset $(CH)

build: $(STAMP)
	$(BIN)/course build

setup: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "The course needs Python 3.11 or newer; run: make PYTHON=python3.11 ...")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-compile $(PIP_ARGS) -e '.[test]'
	@# the packages' bytecode, compiled on every core (pip compiles one file at a time); as with pip, a file
	@# written for a newer Python (torch's tests of 3.12 syntax) is left uncompiled
	$(BIN)/python -c 'import compileall, sys; compileall.compile_dir(sys.prefix + "/lib", quiet=2, workers=0)'
	$(BIN)/course setup
	touch $(STAMP)

clean-venv:
	rm -rf $(VENV)
