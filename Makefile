# Two commands for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Pins this machine's torch for the commands below; pyproject.toml has ranges.
CONSTRAINTS := tools/constraints.txt

.PHONY: demo test venv bench-writer bench-ray bench-mix bench-checksums clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade --quiet pip

# torch is large: install once, reinstall only when pyproject.toml or the pins change.
$(STAMP): pyproject.toml $(CONSTRAINTS) | $(PY)
	$(PY) -m pip install --quiet -e '.[torch,test,bench,ray]' -c $(CONSTRAINTS)
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) tools/demo.py --workdir demo

test: $(STAMP)
	$(PY) -m pytest -q

bench-writer: $(STAMP)
	$(PY) bench/bench_writer.py

# Ray engine and Ray Data read/write against their peers (root: Ray runs in a
# network namespace of its own); bench/results/ray.{json,md,png}.
bench-ray: $(STAMP)
	$(PY) bench/bench_ray.py

# Per-sample CRC-32 (#21): its share of a write and the reader with
# verify_checksums against without; bench/results/checksums.{json,md,png} (~1 min).
bench-checksums: $(STAMP)
	$(PY) bench/bench_checksums.py

# Weighted mixing: per-batch mixing error and throughput against webdataset's
# RandomMix and one dataset; bench/results/mix.{json,md,png} (~4 min).
bench-mix: $(STAMP)
	$(PY) bench/bench_mix.py

clean:
	rm -rf demo bench/work .pytest_cache

# Benchmark suite with emulated storage (needs root: loop devices, blkio
# cgroups, FUSE). `bench` writes bench/results/*.json, bench/RESULTS.md and
# plots (~20 min); `bench-quick` a reduced set in bench/work/results-quick (< 5 min).
.PHONY: bench bench-quick bench-deps
bench-deps: $(STAMP)
	bash bench/profiles/install_deps.sh $(PY)

bench: bench-deps
	$(PY) -m bench.harness

bench-quick: bench-deps
	$(PY) -m bench.harness --quick
