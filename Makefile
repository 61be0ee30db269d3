# The two commands of the README:
#   make demo   set up (virtual environment, install) and run the applier end to end on an embedded default
#   make test   set up, make sure MariaDB runs, lint, and run the whole test suite (the broker is started by the tests)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint services tools bench clean test-deploy test-systemd container-tools test-container wheel-check

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

# The real container test (tests/deploy/test_container.py, not part of `make test`): docker/Dockerfile
# built with buildah on a stand-in base made with mmdebstrap, run with rootful podman against this
# machine's MariaDB. Needs root; podman, buildah, runc and mmdebstrap are installed when missing.
container-tools:
	@missing=""; \
	for tool in podman buildah runc mmdebstrap; do command -v $$tool >/dev/null 2>&1 || missing="$$missing $$tool"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing uidmap fuse-overlayfs (with what they recommend, as the tests were proven with)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing uidmap fuse-overlayfs; \
	fi

test-container: $(BIN)/.installed-test services container-tools
	$(BIN)/python -m pytest -q -s -p no:cacheprovider --tb=short --durations=0 tests/deploy/test_container.py

demo: $(BIN)/.installed-demo services
	$(BIN)/applier demo

lint: $(BIN)/.installed-test
	$(BIN)/ruff check applier sqlgen checkpoint tests benchmarks

# The suite runs on TEST_WORKERS workers (pytest-xdist): most tests wait on the broker, the database or
# a daemon they started, not on the CPU. Each test has its own schemas, topics and ports; a module that
# must stay on one worker (one private server for its tests) says so with pytest.mark.xdist_group.
TEST_WORKERS ?= 4

test: $(BIN)/.installed-test tools services lint
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup --durations=25

# The deployments under real engines, apart from `make test` (root, a few minutes): .ci/run runs them.
test-deploy: test-systemd test-container

# The unit under a real systemd (tests/deploy/test_systemd.py): a Debian rootfs made by mmdebstrap and
# booted by systemd-nspawn, cached under /var/cache/ticdc-applier-tests/systemd. Both programs are
# installed with apt-get when missing.
test-systemd: $(BIN)/.installed-test services
	@missing=""; \
	command -v systemd-nspawn >/dev/null 2>&1 || missing="$$missing systemd-container"; \
	command -v mmdebstrap >/dev/null 2>&1 || missing="$$missing mmdebstrap"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing (with what they recommend, as the test was proven with)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	$(BIN)/python -m pytest -q -s -p no:cacheprovider --tb=short tests/deploy/test_systemd.py

bench: $(BIN)/.installed-test services
	$(BIN)/python benchmarks/decode.py

# The wheel the container and the systemd install build, checked the way they use it: built from
# the sources alone (pip wheel --no-deps), installed into a fresh virtual environment outside the
# checkout with the extras the catch-up image installs, every compiled module imported from there
# (the catch-up's readers need Arrow: the spark extra) and the command run.
WHEEL_DIR := build/wheel-check
COMPILED_MODULES := applier.codec._fastpath applier.catchup._batch_builder sqlgen._bind sqlgen._plan

wheel-check:
	rm -rf $(WHEEL_DIR) build/lib.* build/bdist.*  # files a previous build left would go into the wheel
	$(PYTHON) -m pip wheel --quiet --no-deps --wheel-dir $(WHEEL_DIR)/dist .
	$(PYTHON) -m venv $(WHEEL_DIR)/venv
	$(WHEEL_DIR)/venv/bin/python -m pip install --quiet "$$(ls $(WHEEL_DIR)/dist/ticdc_applier-*.whl)[spark,s3]"
	cd $(WHEEL_DIR) && venv/bin/python -c 'import importlib, sys; \
	  mods = [importlib.import_module(m) for m in sys.argv[1:]]; \
	  bad = [m.__name__ for m in mods if not m.__file__.endswith(".so") or "/site-packages/" not in m.__file__]; \
	  sys.exit(f"not compiled or not installed: {bad}" if bad else 0)' $(COMPILED_MODULES)
	cd $(WHEEL_DIR) && venv/bin/applier --version

# Every compiled module and the C Cython generated, wherever a build left them (in place or under build/).
clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
	find applier sqlgen checkpoint \( -name '*.so' -o -name '*.c' -o -name '*.html' \) -type f -delete
