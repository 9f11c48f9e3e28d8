# muster — `make demo` runs the bundled example, `make test` runs every check,
# `make docs` builds the documentation site into site/.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The web UI's third-party files, from npm (ui/package-lock.json), copied into the package:
VENDOR := src/muster/ui/static/vendor
ASSETS := $(VENDOR)/.built
BROWSER := $(VENV)/.browser
# The MLflow tracking server the export tests start (tests/test_mlflow_export.py): the full
# `mlflow`, whose Flask, SQLAlchemy and alembic pins stay out of the test venv, in its own.
# 3.17.2: mlflow 3.18.0 needs mlflow-tracing 3.18.0, which the index did not offer.
MLFLOW_VENV := .venv-mlflow
MLFLOW_STAMP := $(MLFLOW_VENV)/.installed

.PHONY: install demo test lint typecheck unit quick docs bench bench-ray bench-tune bench-tune-search bench-harness soak screenshots clean

install: $(STAMP) $(ASSETS) $(BROWSER) $(MLFLOW_STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,docs,examples,ray,mlflow]'
	touch $(STAMP)

$(MLFLOW_STAMP):
	$(PYTHON) -m venv $(MLFLOW_VENV)
	$(MLFLOW_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(MLFLOW_VENV)/bin/python -m pip install --quiet 'mlflow==3.17.2'
	touch $(MLFLOW_STAMP)

# Node 20 and npm build the UI's assets: exact versions from the lockfile, nothing committed.
$(ASSETS): ui/package.json ui/package-lock.json
	@command -v npm >/dev/null || { echo "npm (Node 20) is needed to build the web UI's assets"; exit 1; }
	npm ci --prefix ui --no-audit --no-fund --loglevel=error
	mkdir -p $(VENDOR)
	cp ui/node_modules/htmx.org/dist/htmx.min.js $(VENDOR)/
	cp ui/node_modules/uplot/dist/uPlot.iife.min.js ui/node_modules/uplot/dist/uPlot.min.css $(VENDOR)/
	cp ui/node_modules/htmx.org/LICENSE $(VENDOR)/htmx.LICENSE
	cp ui/node_modules/uplot/LICENSE $(VENDOR)/uPlot.LICENSE
	cp ui/node_modules/hermes-parallel-coordinates/dist/hermes.iife.js $(VENDOR)/
	cp ui/node_modules/hermes-parallel-coordinates/LICENSE $(VENDOR)/hermes.LICENSE
	touch $(ASSETS)

# The browser tests drive Debian's Chromium: installed here when we may (root with apt);
# elsewhere they skip with the reason (CI sets MUSTER_REQUIRE_BROWSER=1 and fails instead).
$(BROWSER):
	@if [ -x /usr/bin/chromium ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null \
	  || echo "could not install chromium: the browser tests will skip"; \
	else echo "no /usr/bin/chromium and no apt as root: the browser tests will skip"; fi
	touch $(BROWSER)

demo: install
	bash examples/demo.sh

lint: install
	$(BIN)/ruff check src tests benchmarks examples scripts

typecheck: install
	$(BIN)/mypy

# Two workers, a test module's tests on one of them (its shared server is made once): most
# tests wait on real processes, so two at a time nearly halve the suite on 2 cores.
unit: install
	$(BIN)/pytest -q -n 2 --dist loadscope --durations=25

quick: install  # the inner loop: every test that starts no server and no process
	$(BIN)/pytest -q -n 2 --dist loadscope -m "not lifecycle"

test: lint typecheck unit

# The site (mkdocs.yml): offline, strict (a broken link or anchor fails), into site/. The CLI
# and HTTP API references are generated as it builds (scripts/docs_hooks.py).
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

bench: install
	$(BIN)/python benchmarks/run.py

# muster on Ray against Ray Jobs and Ray Train (benchmarks/ray_launcher.py): they need
# ray[default,train], kept out of the test venv in one of their own. Root (a network namespace).
BENCH_RAY := .venv-bench-ray
bench-ray: install
	test -x $(BENCH_RAY)/bin/python || $(PYTHON) -m venv $(BENCH_RAY)
	$(BENCH_RAY)/bin/python -m pip install --quiet -e '.[examples]' 'ray[default,train]==2.60.0' pytest
	$(BENCH_RAY)/bin/python benchmarks/ray_launcher.py

# Trial throughput against Ray Tune (benchmarks/tune_peer.py), from the same venv. Root.
bench-tune: install
	test -x $(BENCH_RAY)/bin/python || $(PYTHON) -m venv $(BENCH_RAY)
	$(BENCH_RAY)/bin/python -m pip install --quiet -e '.[examples]' 'ray[default,train]==2.60.0' pytest
	$(BENCH_RAY)/bin/python benchmarks/tune_peer.py

# The search study against Ray Tune's ASHA, BOHB and random search (benchmarks/tune_search.py),
# from the same venv, with hpbandster for TuneBOHB. Root. It runs muster's arms first (seed 1,
# 32 trials of up to 32 epochs); MUSTER_RESULTS=benchmarks/out/search/results-....json reads
# them from a `benchmarks/search.py --study ... --searcher asha --searcher bohb` run instead.
bench-tune-search: install
	test -x $(BENCH_RAY)/bin/python || $(PYTHON) -m venv $(BENCH_RAY)
	$(BENCH_RAY)/bin/python -m pip install --quiet -e '.[examples]' 'ray[default,train]==2.60.0' pytest 'hpbandster==0.7.4' 'ConfigSpace==1.2.2'
	$(BENCH_RAY)/bin/python benchmarks/tune_search.py $(if $(MUSTER_RESULTS),--muster-results $(MUSTER_RESULTS),--run-muster)

# The harness against MLflow's log_metric and TensorBoard's add_scalar
# (benchmarks/harness_overhead.py): both kept out of the test venv, in one of their own.
BENCH_HARNESS := .venv-bench-harness
bench-harness: install
	test -x $(BENCH_HARNESS)/bin/python || $(PYTHON) -m venv $(BENCH_HARNESS)
	$(BENCH_HARNESS)/bin/python -m pip install --quiet -e '.[examples]' 'mlflow-skinny==3.18.0' 'tensorboard==2.21.0' pytest
	$(BENCH_HARNESS)/bin/python benchmarks/run.py --only harness_overhead

# The chaos soak (benchmarks/soak.py, issue 37): real experiments while a seeded schedule of
# faults fires, then every invariant checked; exits 1 if one fails. Root: it mounts a tmpfs.
# `make soak MINUTES=60 STORE=postgres` (the cluster on 127.0.0.1:5432 is restarted).
MINUTES ?= 5
STORE ?= sqlite
SEED ?= 1
soak: install
	$(BIN)/python benchmarks/soak.py --minutes $(MINUTES) --seed $(SEED) --store $(STORE)

screenshots: install  # docs/ui/*.png, from a real server running a real search
	$(BIN)/python scripts/screenshots.py

clean:
	rm -rf $(VENV) $(BENCH_RAY) $(BENCH_HARNESS) $(MLFLOW_VENV) .muster-demo .pytest_cache .mypy_cache .ruff_cache ui/node_modules $(VENDOR) site
