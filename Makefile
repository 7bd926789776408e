# The course's two commands:  `make lab` (set up and open JupyterLab)  and  `make test`.
PYTHON ?= python3
PIP_ARGS ?=   # extra pip options, e.g. --extra-index-url https://download.pytorch.org/whl/cpu (see README)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Fixed seed for the checks' random cases, so a test run is reproducible.
TEST_ENV := COURSE_CHECK_SEED=20261122 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
PYTEST := $(BIN)/python -m pytest -n 2 --dist loadfile \
          --nbval --nbval-kernel-name python3 --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout=300
# The learner's path: lessons and solved exercises run from a staged copy of work/, each in its own
# folder, on the course kernel (as `course lab` runs them), so a path that works only from the repo fails.
LEARNER := .learner-path

.PHONY: lab test test-fast sweep status check reset build setup clean-venv

lab: $(STAMP)
	$(BIN)/course lab

# Everything: the linter, course_lib unit tests, checks against wrong implementations, nbval over the
# lessons and solutions (staged as a learner's workspace), the inverted run over the exercises,
# and the browser test.
test: $(STAMP)
	$(BIN)/ruff check course_lib tests benchmarks
	$(BIN)/course build --check
	$(BIN)/course stage $(LEARNER)
	$(TEST_ENV) COURSE_WORKSPACE=$(CURDIR)/$(LEARNER) $(PYTEST) tests $(LEARNER)/notebooks $(LEARNER)/exercises $(PYTEST_ARGS)
	@echo "The checks against wrong implementations again, on other random cases (seed 7):"
	$(TEST_ENV) COURSE_CHECK_SEED=7 $(BIN)/python -m pytest -q -n 2 tests/test_ch0*_checks.py

# Unit tests only (no notebooks, no browser): a quick loop while writing course_lib.
test-fast: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -n 2 -m "not browser" tests --ignore=tests/test_notebooks.py $(PYTEST_ARGS)

# Opt-in: the slow tests: the checks against wrong implementations under 50 seeds (about 45 minutes
# on 2 cores), and chapter 11's checks at world sizes 2, 3 and 4 (references and more mistakes).
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
	$(BIN)/python -m pip install --quiet $(PIP_ARGS) -e '.[test]'
	$(BIN)/course setup
	touch $(STAMP)

clean-venv:
	rm -rf $(VENV)
