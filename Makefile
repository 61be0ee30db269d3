# The two commands of the README:
#   make demo   set up (virtual environment, install) and run the applier end to end on an embedded default
#   make test   set up, make sure MariaDB runs, lint, and run the whole test suite (the broker is started by the tests)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint services bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

# MariaDB runs on this kind of machine; start it when it does not answer (CI starts what it needs).
services:
	@mariadb-admin --host=127.0.0.1 --user=root ping >/dev/null 2>&1 || { \
	  echo "starting MariaDB"; \
	  start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd; \
	  for i in $$(seq 1 60); do mariadb-admin --host=127.0.0.1 --user=root ping >/dev/null 2>&1 && break; sleep 0.5; done; }

demo: $(BIN)/.installed services
	$(BIN)/applier demo

lint: $(BIN)/.installed
	$(BIN)/ruff check applier sqlgen checkpoint tests benchmarks

test: $(BIN)/.installed services lint
	$(BIN)/python -m pytest -q -p no:cacheprovider

bench: $(BIN)/.installed services
	$(BIN)/python benchmarks/decode.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
