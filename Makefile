# The two commands of the README:
#   make demo   set up (virtual environment, install) and run the applier end to end on an embedded default
#   make test   set up, make sure MariaDB runs, lint, and run the whole test suite (the broker is started by the tests)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint services tools bench clean test-deploy test-systemd

# The demo needs the embedded broker only; the tests also need Spark, linters and schema tools.
# Installing compiles the hot loops (setup.py): a changed .pyx or .pxd reinstalls.
COMPILED := setup.py $(wildcard applier/*/*.pyx applier/*/*.pxd sqlgen/*.pyx)

$(BIN)/.installed-demo: pyproject.toml $(COMPILED)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[demo]'
	touch $@

$(BIN)/.installed-test: pyproject.toml $(COMPILED)
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

# Programs the operations tests run (tests/unit/test_ops_systemd.py, tests/integration/test_ops_tls.py,
# tests/unit/test_ops_alerts.py): systemd-analyze (systemd), openssl, mariadb-install-db/mariadbd
# (mariadb-server), promtool (prometheus). Installed with apt-get when missing, so a fresh machine gets
# them from `make test`.
tools:
	@missing=""; \
	command -v systemd-analyze >/dev/null 2>&1 || missing="$$missing systemd"; \
	command -v promtool >/dev/null 2>&1 || missing="$$missing prometheus"; \
	command -v openssl >/dev/null 2>&1 || missing="$$missing openssl"; \
	command -v mariadb-install-db >/dev/null 2>&1 || missing="$$missing mariadb-server"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

demo: $(BIN)/.installed-demo services
	$(BIN)/applier demo

lint: $(BIN)/.installed-test
	$(BIN)/ruff check applier sqlgen checkpoint tests benchmarks

test: $(BIN)/.installed-test tools services lint
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=25

# The deployments under real engines, apart from `make test` (root, a few minutes): .ci/run runs them.
test-deploy: test-systemd

# The unit under a real systemd (tests/deploy/test_systemd.py): a Debian rootfs made by mmdebstrap and
# booted by systemd-nspawn, cached under /var/cache/ticdc-applier-tests/systemd. Both programs are
# installed with apt-get when missing.
test-systemd: $(BIN)/.installed-test services
	@missing=""; \
	command -v systemd-nspawn >/dev/null 2>&1 || missing="$$missing systemd-container"; \
	command -v mmdebstrap >/dev/null 2>&1 || missing="$$missing mmdebstrap"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	$(BIN)/python -m pytest -q -s -p no:cacheprovider --tb=short tests/deploy/test_systemd.py

bench: $(BIN)/.installed-test services
	$(BIN)/python benchmarks/decode.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache applier/codec/*.so
