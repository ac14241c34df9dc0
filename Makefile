# aotpack: `make demo` sets everything up and runs the main job on a bundled sample;
# `make test` runs the test suite. Both work on a fresh Debian machine (root or sudo
# for the system libraries of the native runtime).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SYSTEM_PACKAGES := g++ cmake make pkg-config libarchive-dev libzstd-dev nlohmann-json3-dev libssl-dev libcpp-httplib-dev python3-dev
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
TORCH_CMAKE = $(shell $(PY) -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')

.PHONY: demo test runtime venv sysdeps bench clean fuzz

demo: runtime
	$(PY) benchmarks/demo.py samples/transformer_block.py --topn 3

test: runtime
	$(PY) -m pytest -q tests

# aotpack side by side with eager, AOTInductor, ONNX Runtime and OpenVINO at 1 and 2 threads;
# regenerates docs/performance.md and docs/performance.png (benchmarks/peers.py). One child
# build at a time (~11 min here): parallel builds contend, and PGO then prefers 1-thread tilings.
bench: runtime
	$(PY) -m pip install -q --no-build-isolation torch==2.13.0 -e '.[bench]'
	mkdir -p build
	$(PY) benchmarks/peers.py --topn 3 --build-jobs 1 --markdown docs/performance.md --chart docs/performance.png --json build/peers.json

# The whole hostile corpus (~600 archives made from a real build of samples/mlp.py) against
# the runtime and `aotpack verify`: no crash, hang, leak or disagreement (tests/hostile_corpus.py).
fuzz: runtime
	$(PY) -m aotpack -q build samples/mlp.py -o build/fuzz
	PYTHONPATH=tests $(PY) tests/hostile_corpus.py build/fuzz/mlp-0.1.0.aotpack

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip 'setuptools>=70.1'
	$(PY) -m pip install -q torch==2.13.0
	# editable: the runtime builds into native/build (target runtime), not into the package
	$(PY) -m pip install -q --no-build-isolation -e '.[test]'
	touch $@

sysdeps:
	@missing=$$(for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq $$missing; \
	fi

runtime: venv sysdeps
	cmake -S native -B native/build -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$(TORCH_CMAKE)" \
	  -DPython3_EXECUTABLE="$(abspath $(PY))" -DAOTPACK_REQUIRE_PYTHON_BINDING=ON -DAOTPACK_REQUIRE_SERVER=ON >/dev/null
	cmake --build native/build -j2

clean:
	rm -rf native/build dist .pytest_cache
