# Every target bootstraps .venv itself, from a clean clone.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv test demo bench bench-fleet bench-udp fuzz lint fmt clean

venv: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) on PATH"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

lint: venv
	$(BIN)/ruff check swarm tests bench
	$(BIN)/ruff format --check swarm tests bench

fmt: venv
	$(BIN)/ruff format swarm tests bench
	$(BIN)/ruff check --fix swarm tests bench

test: venv lint
	$(BIN)/pytest -q -ra

demo: venv
	$(BIN)/swarm demo

bench: venv
	$(BIN)/python bench/s3get.py

bench-fleet: venv
	for s in origin-bound swarm-bound slow-uploads existing-seeders; do \
		$(BIN)/python bench/fleet.py --scenario $$s || exit 1; done

bench-udp: venv
	$(BIN)/python bench/udp.py

fuzz: venv
	SWARM_FUZZ=long $(BIN)/pytest -q tests/fuzz

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
