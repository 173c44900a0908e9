# Two entry points: `make demo` (set up + run the main job) and `make test` (set up + run the tests).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fbt-installed
DEV_STAMP := $(VENV)/.fbt-dev-installed

.PHONY: setup demo test docs reference-report saelens-check clean

# Python writes the byte-code of the modules a run imports (torch, transformers, sklearn, ...) on
# first import; with PYTHONDONTWRITEBYTECODE set every run re-compiles them (import torch: ~6 s
# instead of ~2.4 s on these hosts).
unexport PYTHONDONTWRITEBYTECODE

setup: $(STAMP)

# torch is installed first, pinned to the CPU build that lies on local disk on these machines;
# an unpinned torch can pull a multi-GB CUDA build. The package itself only asks for a range.
# The demo needs the package only; the tests add the dev extras (pytest, the HF oracle, triton, ...).
# The package and its extras go in with uv (installed by pip into the venv): it resolves and fetches
# in parallel and byte-compiles nothing, 32 s against pip's 130 s for both steps from cold caches
# with the same packages at the same versions (BENCHMARKS.md, "make test"). Where uv cannot be had,
# pip installs them (--no-compile: Python compiles the modules a run imports when it imports them).
INSTALL = $(PY) -m pip install -q --no-compile uv && $(VENV)/bin/uv pip install -q --python $(PY)
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q --no-compile torch==2.13.0
	$(INSTALL) -e . || $(PY) -m pip install -q --no-compile -e .
	touch $(STAMP)

$(DEV_STAMP): $(STAMP)
	$(INSTALL) -e ".[dev]" || $(PY) -m pip install -q --no-compile -e ".[dev]"
	touch $(DEV_STAMP)

# The main job: the tiny study on the shipped reference models (datasets, probes, interventions,
# attribution/DAS/lens, figures, report) in its lighter demo form; without --demo it is the full study
# (what reports/tiny/ holds), and `fbt-probe reproduce --train` retrains the models.
demo: setup
	$(VENV)/bin/fbt-probe reproduce --preset tiny --demo --out runs/demo

# Regenerate the committed reference report of the tiny preset (report.md + PNG figures, no binaries).
reference-report: setup
	$(VENV)/bin/fbt-probe reproduce --preset tiny --out runs/reference
	mkdir -p reports/tiny/figures  # the hidden-decoding and schedule figures beside them come from README commands
	cp runs/reference/report.md reports/tiny/report.md
	cp runs/reference/figures/*.png reports/tiny/figures/

# Two worker processes (pytest-xdist), each pinned to one BLAS thread (tests/conftest.py), the slow
# tests scheduled first so that they do not form the tail: about half the serial wall time on 2 cores.
# --dist worksteal: a worker that runs out takes tests queued on the other (602 s -> 560 s of pytest,
# BENCHMARKS.md).
test: $(DEV_STAMP)
	$(PY) -m pytest -m "not gpu" -q -n 2 --dist worksteal

# The manual (docs/, mkdocs.yml) rendered with MkDocs Material into build/site/; --strict fails on
# any warning (a broken link, a docstring mkdocstrings cannot render). The notebooks (docs/notebooks/)
# run on the way, about a minute of CPU; a cell that raises fails the build.
docs: $(DEV_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) build *.egg-info

# SAELens opens our SAE folders and encodes as we do, we open folders SAELens wrote and encode as it
# does, and the error term under a latent edit agrees (tests/saelens_oracle.py). SAELens pins
# transformer-lens < 4, so it lives in its own venv (.venv-saelens, torch from the same local build).
saelens-check: $(DEV_STAMP)
	test -x .venv-saelens/bin/python || python3 -m venv .venv-saelens
	.venv-saelens/bin/python -c "import sae_lens" 2>/dev/null || (.venv-saelens/bin/pip install -q --no-compile torch==2.13.0 && .venv-saelens/bin/pip install -q --no-compile sae-lens==6.54.12)
	$(PY) tests/saelens_oracle.py write runs/saelens-check
	.venv-saelens/bin/python tests/saelens_oracle.py check runs/saelens-check
	$(PY) tests/saelens_oracle.py read runs/saelens-check
