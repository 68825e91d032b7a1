# pysoftmax — builds libsoftmax.so for the GPU platform found, and runs the tests and the benchmark.
#
#   make                 the library for this machine's platform, copied into pysoftmax/
#   make test            Python dependencies (only those that do not import), the library, pytest
#   make bench           the main job: python3 -m pysoftmax bench
#   make gate            benchmark regression gate against this GPU's stored baseline
#   make amd             cross-compile check for AMD targets (Debian's hipcc, no GPU needed)
#   make sanitize        compute-sanitizer memcheck/racecheck/synccheck over every kernel family
#
# Overridable: HIP_PLATFORM=nvidia|amd, GPU_ARCHS (nvidia: "80 90"; amd: "gfx90a gfx942 ..."),
# FAST_MATH=1 (opt-in), NVCC, HIPCC, PYTHON.

PYTHON      ?= python3
BENCH_ARGS  ?= --json bench.json --plot bench.png
NVCC        ?= nvcc
HIPCC       ?= hipcc
VERSION     := $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' pysoftmax/_version.py)

# ROCm's own hipcc (under /opt/rocm) means an AMD machine; otherwise nvcc means NVIDIA.
ifeq ($(origin HIP_PLATFORM),undefined)
  ifneq ($(wildcard /opt/rocm/bin/hipcc),)
    HIP_PLATFORM := amd
  else ifneq ($(shell command -v $(NVCC) 2>/dev/null),)
    HIP_PLATFORM := nvidia
  else ifneq ($(shell command -v $(HIPCC) 2>/dev/null),)
    HIP_PLATFORM := amd
  else
    HIP_PLATFORM := none
  endif
endif

SOURCES := hip/capi.cu hip/forward.cu hip/backward.cu
BUILD   := build/$(HIP_PLATFORM)
OBJECTS := $(SOURCES:hip/%.cu=$(BUILD)/%.o)
LIB     := $(BUILD)/libsoftmax.so
DEFINES := -DSOFTMAX_VERSION='"$(VERSION)"'

ifeq ($(HIP_PLATFORM),nvidia)
  GPU_ARCHS ?= 80 90
  COMPILER  := $(NVCC)
  # Machine code for each listed architecture, and PTX of the newest so later GPUs can JIT it.
  ARCH_FLAGS := $(foreach a,$(GPU_ARCHS),-gencode=arch=compute_$(a),code=sm_$(a)) \
                -gencode=arch=compute_$(lastword $(GPU_ARCHS)),code=compute_$(lastword $(GPU_ARCHS))
  CXXFLAGS  ?= -O3 -std=c++17 -lineinfo -Xcompiler -fPIC,-Wall --expt-relaxed-constexpr
  DEPFLAGS  := -MMD -MP
  LDFLAGS   ?= -shared
  ifeq ($(FAST_MATH),1)
    CXXFLAGS += -use_fast_math
  endif
  ARCH_NAMES := $(foreach a,$(GPU_ARCHS),sm_$(a))
else ifeq ($(HIP_PLATFORM),amd)
  # Debian's hipcc is ROCm 5.2, which knows no gfx942/gfx1100; newer ROCm gets them by default.
  HIP_MAJOR := $(shell $(HIPCC) --version 2>/dev/null | sed -n 's/^HIP version: \([0-9]*\)\..*/\1/p')
  ifeq ($(HIP_MAJOR),5)
    GPU_ARCHS ?= gfx90a gfx940 gfx1030
  else
    GPU_ARCHS ?= gfx90a gfx942 gfx1030 gfx1100
  endif
  COMPILER  := HIP_PLATFORM=amd $(HIPCC)
  ARCH_FLAGS := $(foreach a,$(GPU_ARCHS),--offload-arch=$(a))
  CXXFLAGS  ?= -O3 -std=c++17 -fPIC -Wall -x hip
  DEPFLAGS  := -MMD -MP
  LDFLAGS   ?= -shared -fPIC
  ifeq ($(FAST_MATH),1)
    CXXFLAGS += -ffast-math
  endif
  ARCH_NAMES := $(GPU_ARCHS)
else ifneq ($(HIP_PLATFORM),none)
  $(error HIP_PLATFORM='$(HIP_PLATFORM)': expected nvidia or amd)
endif

comma := ,
space := $() $()
DEFINES += -DSOFTMAX_ARCHS='"$(subst $(space),$(comma),$(strip $(ARCH_NAMES)))"'

.PHONY: all lib deps test bench gate baseline amd sanitize tune clean
all: lib

ifeq ($(HIP_PLATFORM),none)
lib:
	$(error no GPU compiler found: install the CUDA toolkit (nvcc) or ROCm (hipcc), or set HIP_PLATFORM)
else
lib: pysoftmax/libsoftmax.so
endif

pysoftmax/libsoftmax.so: $(LIB)
	cp $< $@

$(LIB): $(OBJECTS)
	$(COMPILER) $(ARCH_FLAGS) $(LDFLAGS) -o $@ $^

$(BUILD)/%.o: hip/%.cu Makefile | $(BUILD)
	$(COMPILER) $(CXXFLAGS) $(DEPFLAGS) $(ARCH_FLAGS) $(DEFINES) -c $< -o $@

$(BUILD):
	mkdir -p $@

-include $(OBJECTS:.o=.d)

deps:
	$(PYTHON) tools/deps.py --platform $(HIP_PLATFORM)

test: deps lib
	$(PYTHON) -m pytest

bench: deps lib
	$(PYTHON) -m pysoftmax bench $(BENCH_ARGS)

gate: deps lib
	$(PYTHON) -m pysoftmax gate

baseline: deps lib
	$(PYTHON) -m pysoftmax gate --save

# Cross-compile for AMD targets: proves the wave64 and wave32 paths keep compiling.
amd:
	$(MAKE) HIP_PLATFORM=amd $(if $(AMD_ARCHS),GPU_ARCHS="$(AMD_ARCHS)") build/amd/libsoftmax.so

sanitize: deps lib
	$(PYTHON) tools/sanitize.py

tune: deps lib
	$(PYTHON) tools/tune.py

clean:
	rm -rf build pysoftmax/libsoftmax.so
