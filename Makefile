# Every target bootstraps .venv itself, from a clean clone.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
CREATED := $(VENV)/.created
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
DIST := dist
# Pythons `make test-pythons` runs the unit tests on (found on PATH or under ~/.pyenv).
TEST_PYTHONS ?= 3.12 3.13
# `make wheelhouse`: the wheel and its dependencies' binary wheels, for one Python/arch.
WHEELHOUSE_PYTHON ?= 3.12
WHEELHOUSE_ARCH ?= $(shell uname -m)
WHEELHOUSE := $(DIST)/wheelhouse-cp$(subst .,,$(WHEELHOUSE_PYTHON))-$(WHEELHOUSE_ARCH)

.PHONY: venv test demo dist wheelhouse test-pythons bench bench-fleet bench-startup bench-udp fuzz lint fmt clean

venv: $(STAMP)

$(CREATED):
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) on PATH"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	touch $(CREATED)

# The test extra holds the demo's too (its S3 server is the tests' S3 server).
$(STAMP): $(CREATED) setup.cfg pyproject.toml
	@# this project was the distribution `swarm` before it was `swarm-artifacts`
	$(BIN)/pip uninstall --quiet -y swarm 2>/dev/null || true
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP) $(DEMO_STAMP)

$(DEMO_STAMP): $(CREATED) setup.cfg pyproject.toml
	$(BIN)/pip install --quiet -e '.[demo]'
	touch $(DEMO_STAMP)

lint: venv
	$(BIN)/ruff check swarm tests bench
	$(BIN)/ruff format --check swarm tests bench
	$(BIN)/mypy

fmt: venv
	$(BIN)/ruff format swarm tests bench
	$(BIN)/ruff check --fix swarm tests bench

test: venv lint
	$(BIN)/pytest -q -ra

demo: $(DEMO_STAMP)
	$(BIN)/swarm demo

# The wheel a fleet installs (`swarm userdata --wheelhouse` takes a directory of these).
dist: $(CREATED)
	rm -rf $(DIST) build
	$(BIN)/pip wheel --quiet --no-deps --wheel-dir $(DIST) .
	@ls $(DIST)/*.whl

# What `swarm userdata --wheelhouse` installs from, for fleets without internet egress.
wheelhouse: dist
	$(BIN)/pip download --quiet --only-binary=:all: --implementation cp \
	  --python-version $(WHEELHOUSE_PYTHON) \
	  $(foreach p,manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014,--platform $(p)_$(WHEELHOUSE_ARCH)) \
	  --dest $(WHEELHOUSE) "$$(ls $(DIST)/swarm_artifacts-*.whl)"
	@echo "$(WHEELHOUSE): $$(ls $(WHEELHOUSE) | wc -l) wheels"

# The wheel installed, `swarm --help` run, and the unit tests, on each of TEST_PYTHONS.
test-pythons: dist
	@for v in $(TEST_PYTHONS); do \
	  py=""; for c in python$$v $(HOME)/.pyenv/versions/$$v.*/bin/python$$v; do \
	    if "$$c" -V >/dev/null 2>&1; then py=$$c; break; fi; done; \
	  [ -n "$$py" ] || { echo "python$$v not found (PATH or ~/.pyenv/versions)"; exit 1; }; \
	  echo "== $$("$$py" -V) ($$py)"; \
	  rm -rf build/venv-$$v && "$$py" -m venv build/venv-$$v || exit 1; \
	  build/venv-$$v/bin/pip install --quiet "$$(ls $(DIST)/*.whl)[test]" || exit 1; \
	  build/venv-$$v/bin/swarm --help >/dev/null && echo "swarm --help: ok" || exit 1; \
	  build/venv-$$v/bin/pytest -q -p no:cacheprovider tests/unit || exit 1; \
	done

bench: venv
	$(BIN)/python bench/s3get.py

bench-fleet: venv
	for s in origin-bound swarm-bound slow-uploads existing-seeders; do \
		$(BIN)/python bench/fleet.py --scenario $$s || exit 1; done

bench-startup: venv
	$(BIN)/python bench/startup.py

bench-udp: venv
	$(BIN)/python bench/udp.py

fuzz: venv
	SWARM_FUZZ=long $(BIN)/pytest -q tests/fuzz

clean:
	rm -rf $(VENV) build $(DIST) *.egg-info .pytest_cache .ruff_cache
