# vkc developer entry points. Both targets create/refresh .venv from pyproject.toml first.
#   make regen   compile every kernel for all 7 archs (CPU only) and run the drift check
#   make test    drift check + the CPU test suite (what CI runs)
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml CMakeLists.txt csrc/*.cpp 2>/dev/null | sha256sum | cut -c1-16)

.PHONY: regen verify test wheel clean

$(STAMP):
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	rm -f $(VENV)/.installed-*
	touch $@

regen: $(STAMP)
	$(BIN)/vkc regen --all
	$(BIN)/vkc verify

verify: $(STAMP)
	$(BIN)/vkc verify

test: $(STAMP)
	$(BIN)/vkc verify
	$(BIN)/python -m pytest -q

# Per-arch wheel: make wheel ARCH=sm_90a  (artifacts of that arch only + the native launcher)
wheel: $(STAMP)
	VKC_ARCHES=$(ARCH) $(BIN)/python -m pip wheel --no-deps -w dist .

clean:
	rm -rf build dist $(VENV)
