# pipesim: `make demo` runs the main job, `make test` runs the tests. Both set up .venv first.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
OUT ?= out

.PHONY: demo test lint wheel browser-deps clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	@# torch: the CPU build unless this machine has CUDA (never a multi-GB CUDA wheel on a CPU box)
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
	    $(BIN)/pip install "torch>=2.5,<3"; \
	elif $(BIN)/pip install torch==2.13.0 --dry-run --report $(VENV)/torch-plan.json >/dev/null 2>&1 \
	        && grep -q '"2.13.0+cpu"' $(VENV)/torch-plan.json; then \
	    $(BIN)/pip install torch==2.13.0; \
	else \
	    $(BIN)/pip install "torch>=2.5,<3" --index-url https://download.pytorch.org/whl/cpu; \
	fi
	@# dask (about 7 s to install): the planner's --cluster dask:// tests run for real; ray (240 MB, a head node
	@# per test run) stays out of the test set-up, its tests skip unless `pip install -e ".[ray]"`
	$(BIN)/pip install -e ".[dev,png,dask]"
	touch $(STAMP)

demo: $(STAMP)
	mkdir -p $(OUT)
	@# measure this machine first (~10 s): local-cpu's model at this machine's speed, its precision printed
	$(BIN)/pipesim calibrate --quick --rescale local-cpu -o $(OUT)/local-cpu.toml
	$(BIN)/pipesim schedule 1f1b --stages 2 --microbatches 8
	$(BIN)/pipesim simulate 1f1b --stages 2 --microbatches 8 --model mlp --hidden 1024 --layers 8 --batch 64 \
	    --hardware $(OUT)/local-cpu.toml --trace $(OUT)/simulated.json --json $(OUT)/simulated-result.json
	$(BIN)/pipesim run 1f1b --nproc 2 --microbatches 8 --model mlp --hidden 1024 --layers 8 --batch 64 \
	    --steps 4 --trace $(OUT)/measured.json --json $(OUT)/measured-result.json
	$(BIN)/pipesim plot $(OUT)/simulated.json $(OUT)/measured.json -o $(OUT)/timeline.html
	@echo "open $(OUT)/timeline.html"

browser-deps:
	@# Debian's Chromium + ChromeDriver for the real-browser test (needs root; skipped otherwise)
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) \
	    || echo "chromium not installed: browser and PNG tests will be skipped"; }

test: $(STAMP) browser-deps
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .

wheel: $(STAMP)
	$(BIN)/python -m build --wheel --outdir dist .

clean:
	rm -rf $(VENV) dist build $(OUT) .pytest_cache
