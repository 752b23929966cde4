# Two commands for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
# Pins this machine's torch for the commands below; pyproject.toml has ranges.
CONSTRAINTS := tools/constraints.txt

.PHONY: demo test venv bench-writer bench-ray bench-mix bench-checksums bench-scale bench-ingest bench-map bench-tokens bench-parse bench-remove bench-revisions bench-video bench-stats clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade --quiet pip

# torch is large: install once, reinstall only when pyproject.toml or the pins change.
# The demo needs shardkit with torch only; the tests add their frameworks,
# the benchmarks' peers and Ray on top (the full install covers the demo's).
$(DEMO_STAMP): pyproject.toml $(CONSTRAINTS) | $(PY)
	$(PY) -m pip install --quiet -e '.[torch]' -c $(CONSTRAINTS)
	touch $(DEMO_STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS) | $(PY)
	$(PY) -m pip install --quiet -e '.[torch,test,bench,ray,tables,media,show]' -c $(CONSTRAINTS)
	touch $(STAMP) $(DEMO_STAMP)

venv: $(STAMP)

demo: $(DEMO_STAMP)
	$(PY) tools/demo.py --workdir demo

# As root, the storage profiles' system tools (FUSE) and Chromium (for the
# browser test of `shardkit show` pages) are installed first, so their tests
# run rather than skip; best effort: without them they are skipped.
# The suite runs on TEST_WORKERS pytest-xdist processes, a test module to one
# process; the tests that start many processes (torchrun, Ray, Chromium, FUSE)
# all go to one of them (tests/conftest.py, HEAVY_TESTS). `make test
# TEST_WORKERS=0` runs it in one process; `.venv/bin/python -m pytest -p
# randomly` in a random order (the seed is printed; --randomly-seed=N repeats it).
TEST_WORKERS ?= 2
test: $(STAMP)
	-@[ "$$(id -u)" != 0 ] || bash bench/profiles/install_deps.sh $(PY) >/dev/null \
		|| echo "make test: the FUSE tools could not be installed; the FUSE profile test will be skipped"
	-@[ "$$(id -u)" != 0 ] || bash tools/install_chromium.sh >/dev/null \
		|| echo "make test: Chromium could not be installed; the browser test of shardkit show will be skipped"
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadscope

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

# Reader at scale (#22): open time, memory per process (USS, 8 workers),
# pickled size and first batch at 10^3..10^6 shards against webdataset, LitData
# and Mosaic; bench/results/scale.{json,md,png}. The peers get a venv of their
# own (.venv-scale, shardkit installed there too): Mosaic needs transformers<5,
# whose huggingface-hub<1 would break the `datasets` that `make test` uses.
# It keeps the torch pin and .venv's numpy (a pin file from pip freeze), so
# both sides run on the same ones. Synthetic datasets are cached in
# bench/work/scale (~3 GB of metadata and directory entries at 10^6 shards).
# Pass options with BENCH_SCALE_ARGS, e.g. BENCH_SCALE_ARGS=--quick.
SCALE_VENV := .venv-scale
$(SCALE_VENV)/.installed: pyproject.toml $(CONSTRAINTS) | $(STAMP)
	$(PYTHON) -m venv $(SCALE_VENV)
	$(PY) -m pip freeze | grep -i '^numpy==' > $(SCALE_VENV)/numpy-pin.txt
	$(SCALE_VENV)/bin/python -m pip install --quiet -e '.[torch,bench-scale]' -c $(CONSTRAINTS) -c $(SCALE_VENV)/numpy-pin.txt
	touch $@

bench-scale: $(SCALE_VENV)/.installed
	$(SCALE_VENV)/bin/python bench/bench_scale.py $(BENCH_SCALE_ARGS)

# From a table of URLs (#24): img2dataset against `shardkit write --resize`;
# bench/results/ingest.{json,md,png}. The URLs are served by
# bench/remote_emulation.sh (nginx; needs root, else a Python server stands in
# and the record says so). img2dataset pins pandas and webdataset below what
# .venv holds, so it gets a venv of its own (.venv-i2d).
I2D_VENV := .venv-i2d
$(I2D_VENV)/bin/img2dataset:
	$(PYTHON) -m venv $(I2D_VENV)
	$(I2D_VENV)/bin/python -m pip install --quiet img2dataset==1.47.0

bench-ingest: $(STAMP) $(I2D_VENV)/bin/img2dataset
	$(PY) bench/bench_ingest.py --img2dataset $(I2D_VENV)/bin/img2dataset $(BENCH_INGEST_ARGS)

# A user's own function inside the writer (#39): an image function (decode a
# ~500 KB photo, resize to 256 px, JPEG) and a text function (tokenize) run by
# shardkit, a hand-rolled Pool + webdataset.TarWriter writer, LitData's
# `optimize` and Ray Data's map + write_webdataset, at 1 and 2 workers;
# bench/results/map_writer.{json,md,png} (~40 min on 2 cores; root for the Ray
# cells, which run in a network namespace of their own, else they are skipped).
# LitData runs from a venv of its own (.venv-map) that keeps the torch pin and
# .venv's numpy, as .venv-scale does; shardkit is installed there too (-e).
# Pass options with BENCH_MAP_ARGS, e.g. BENCH_MAP_ARGS=--quick.
MAP_VENV := .venv-map
$(MAP_VENV)/.installed: pyproject.toml $(CONSTRAINTS) | $(STAMP)
	$(PYTHON) -m venv $(MAP_VENV)
	$(PY) -m pip freeze | grep -i '^numpy==' > $(MAP_VENV)/numpy-pin.txt
	$(MAP_VENV)/bin/python -m pip install --quiet -e '.[torch]' litdata -c $(CONSTRAINTS) -c $(MAP_VENV)/numpy-pin.txt
	touch $@

bench-map: $(STAMP) $(MAP_VENV)/.installed
	$(PY) bench/bench_map_writer.py --litdata-python $(MAP_VENV)/bin/python $(BENCH_MAP_ARGS)

# Token blocks (issue #40): shardkit's TokenBlocks against LitData's
# TokensLoader (from .venv-map, as bench-map) and packing in the loop, over a
# corpus of 5x10^7 tokens at block sizes 2,048 and 8,192 with 1 and 2
# workers; memory against corpus size; shuffle; bench/results/tokens.* (~15 min).
bench-tokens: $(STAMP) $(MAP_VENV)/.installed
	$(PY) bench/bench_tokens.py --litdata-python $(MAP_VENV)/bin/python $(BENCH_TOKENS_ARGS)

# Loader statistics on against off (issue #56): bench/results/stats.{json,md,png} (~1 min).
bench-stats: $(STAMP)
	$(PY) bench/bench_stats.py

# The indexed parser's one pass against the full parser alone, over small
# samples (captions, token documents): bench/results/parse.{json,md,png} (~2 min).
bench-parse: $(STAMP)
	$(PY) bench/bench_parse.py

# Removing samples without rewriting shards (issue #41): finding keys, the
# table revision at 5x10^9 samples (synthetic metadata), opening, and the
# reader's throughput with and without removals: bench/results/remove.* (~10 min).
bench-remove: $(STAMP)
	$(PY) bench/bench_remove.py

# Changing a dataset without copies (issue #54): the same new data appended
# to datasets of 5x10^3 and 5x10^5 shards (synthetic metadata), writer's and
# irregular names; extend against a rewrite (and LitData's, from .venv-map as
# bench-map), joined and projected reads, a 50% view against a copy, opening a
# 2% split of 5x10^9 samples: bench/results/revisions.{json,md,png} (~25 min).
bench-revisions: $(STAMP) $(MAP_VENV)/.installed
	$(PY) bench/bench_revisions.py $(BENCH_REVISIONS_ARGS)

# Video and audio clips (#43): clips per second and memory of one worker,
# shardkit's clip decoders against a full decode and decord (installed here
# where it has a wheel; its cells say so where not), audio clips against
# soundfile.read; bench/results/video.{json,md,png} (~12 min, the first run
# making its 720p videos).
bench-video: $(STAMP)
	-@$(PY) -c 'import decord' 2>/dev/null || $(PY) -m pip install --quiet 'decord>=0.6' \
		|| echo "bench-video: decord does not install here; its cells are left out"
	$(PY) bench/bench_video.py $(BENCH_VIDEO_ARGS)

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
