# meshrun - one Makefile for the whole tree.
#
#   make            build every binary into build/
#   make run        build, then run the embedded default job (meshrun local)
#   make test       lint + unit/integration tests + test-k8s, then the same tests under
#                   ASan+UBSan, then bounded fuzzing
#   make asan       the sanitizer build only (build/asan)
#   make test-gpu   CUDA kernels vs their CPU twins, NCCL collectives, the parity
#                   matrix on the GPUs (skipped without a GPU)
#   make bench-gpu  GPT-2 124M/350M tokens/s and MFU on the GPUs (skipped without one)
#   make lint       cppcheck, shellcheck, yamllint, the rooms' include order
#                   (scripts/layers.sh)
#   make install    the binaries into $(DESTDIR)$(PREFIX)/bin (the images use it)
#   make image      build the images (Docker or Buildah), or print how
#   make test-k8s   the Kubernetes packaging tests (part of make test)
#   make test-pods  pods as hosts: jobs across network namespaces (scripts/pods.sh;
#                   root; part of make test, where it runs with the other tests)
#   make bench      every benchmark (bench-rdzv, bench-healthz, ..., bench-pipeline)
#   make clean
#
# Sources are found by wildcard: a new .c file in common/, controller/,
# agent/, runtime/ or cli/ is built without touching this file; a new
# tests/<part>/test_<module>.c becomes its own Criterion binary.
# CUDA (nvcc, cuBLAS, NCCL) is detected under $(CUDA_HOME) and reported.

BUILD      ?= build
SAN        ?=
CC         ?= cc
ifeq ($(origin CC),default)
CC         := cc
endif

CPPFLAGS   += -D_GNU_SOURCE -Icommon -Icontroller -Iagent -Iruntime -Icli \
              -I/usr/include/x86_64-linux-gnu/openblas-pthread
CFLAGS     ?= -O2 -g
CFLAGS     += -std=c11 -Wall -Wextra -Werror -pthread -MMD -MP
LDLIBS     += -lmicrohttpd -lgnutls -lcurl -ljansson -lpcre2-8 -lopenblas -lm -lpthread

ifeq ($(SAN),1)
CC         := clang
CXX        := clang++
CFLAGS     := -O1 -g -std=c11 -Wall -Wextra -Werror -pthread -MMD -MP \
              -fsanitize=address,undefined -fno-omit-frame-pointer \
              -fno-sanitize-recover=undefined
LDFLAGS    += -fsanitize=address,undefined
# tests run a shorter matrix under the sanitizers (tests/parity, test_chaos)
CPPFLAGS   += -DMR_SANITIZED
endif
ifeq ($(FUZZ),1)
CC         := clang
CFLAGS     := -O1 -g -std=c11 -Wall -Wextra -Werror -pthread -MMD -MP \
              -fsanitize=address,undefined,fuzzer-no-link -fno-omit-frame-pointer
SAN        := 1
endif

# ---- CUDA detection -------------------------------------------------------
CUDA_HOME  ?= /usr/local/cuda
NVCC       := $(wildcard $(CUDA_HOME)/bin/nvcc)
HAVE_NCCL  := $(wildcard $(CUDA_HOME)/include/nccl.h)
ifneq ($(NVCC),)
ifneq ($(SAN),1)
CUDA_ON    := 1
endif
endif

# ---- sources -----------------------------------------------------------------
common_src     := $(wildcard common/*.c)
controller_src := $(filter-out controller/main.c,$(shell find controller -name '*.c' | sort))
agent_src      := $(filter-out agent/main.c,$(wildcard agent/*.c))
runtime_src    := $(shell find runtime -name '*.c' 2>/dev/null | sort)
# The CUDA side - the cuda device, its table and the NCCL communicator -
# is not in libmeshrun.a: it is meshrun-cuda.so (below), loaded on first use
# (runtime/plugin/cuda_entry.h), or linked in by the emulation and GPU tests.
plugin_c       := runtime/device/cuda.c runtime/plugin/cuda_entry.c \
                  $(if $(HAVE_NCCL),runtime/comm/nccl.c,)
runtime_src    := $(filter-out runtime/device/cuda.c runtime/plugin/cuda_entry.c \
                  runtime/comm/nccl.c,$(runtime_src))
cli_src        := $(filter-out cli/main.c,$(wildcard cli/*.c))

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
comma := ,

LIBS := $(BUILD)/libmrcli.a $(BUILD)/libmragent.a $(BUILD)/libmrcontroller.a \
        $(BUILD)/libmeshrun.a $(BUILD)/libmrcommon.a

BINS := $(BUILD)/meshrun-controller
ifneq ($(wildcard agent/main.c),)
BINS += $(BUILD)/meshrun-agent
endif
ifneq ($(wildcard cli/main.c),)
BINS += $(BUILD)/meshrun
endif

test_src  := $(sort $(filter-out tests/gpu/%,$(wildcard tests/*/test_*.c)))
test_bins := $(patsubst tests/%.c,$(BUILD)/tests/%,$(test_src))
test_helpers := $(wildcard tests/support/*.c)
fuzz_src  := $(sort $(wildcard tests/fuzz/fuzz_*.c))
fuzz_bins := $(patsubst tests/fuzz/%.c,$(BUILD)/fuzzers/%,$(fuzz_src))
bench_src := $(filter-out bench/comm_mpi.c,$(wildcard bench/*.c))
bench_bins := $(patsubst bench/%.c,$(BUILD)/bench/%,$(bench_src))

# ---- CUDA backend: runtime/cuda/*.cu and tests/gpu (only when CUDA_ON) -------
# runtime/cuda/*.cu -> $(BUILD)/libmeshrun_cuda.a (nvcc, sm_80 + sm_90);
# tests/gpu/test_*.c link it with cudart + cuBLAS(Lt) and are part of
# `make tests` (they skip at run time without a device). `make test-gpu`
# builds and runs only them. Without CUDA (or SAN=1) none of this exists.
NVCCFLAGS  ?= -O3
NVCC_ARCH  := -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
cuda_src   := $(sort $(wildcard runtime/cuda/*.cu))
CUDA_LIB   := $(BUILD)/libmeshrun_cuda.a
CUDA_LDLIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 \
               -lcublasLt -lcublas -lcudart -lstdc++
# tests/gpu files that only make sense against the emulation (below)
emul_only  := tests/gpu/test_cuda_emul.c tests/gpu/test_cuda_parallel.c \
              tests/gpu/test_bench_gpu.c tests/gpu/test_offload.c
gpu_test_bins := $(patsubst tests/%.c,$(BUILD)/tests/%,$(filter-out $(emul_only),\
                 $(sort $(wildcard tests/gpu/test_*.c))))
ifeq ($(CUDA_ON),1)
test_bins  += $(gpu_test_bins)
endif

# ptxas reports each kernel's registers and spills (-Xptxas -v): a kernel
# that spills fails the build (scripts/ptxas-check.sh names it).
$(BUILD)/obj/%.cu.o: %.cu | deps
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_ARCH) $(NVCCFLAGS) -std=c++17 -Icommon -Iruntime \
		-Xcompiler -Wall,-Wextra,-fPIC -Werror all-warnings -Xptxas -v -MMD -MP -c -o $@ $< \
		2> $@.ptxas || { cat $@.ptxas >&2; rm -f $@; exit 1; }
	@scripts/ptxas-check.sh $@.ptxas || { rm -f $@; exit 1; }

$(CUDA_LIB): $(patsubst %.cu,$(BUILD)/obj/%.cu.o,$(cuda_src))

# meshrun-cuda.so: the kernels, the cuda device, its table and NCCL, with
# cuBLAS(Lt), cudart and NCCL; position-independent objects under obj/pic.
# Its references to the core (errors, log, ledger, MoE helpers) resolve
# against the program that loads it: every program is linked with
# -rdynamic and keeps the core symbols the plugin names (plugin_needs;
# the plugin's link fails naming any it names that the list lacks).
CUDA_PLUGIN  := $(BUILD)/meshrun-cuda.so
plugin_obj   := $(patsubst %.c,$(BUILD)/obj/pic/%.o,$(plugin_c))
plugin_needs := mr__log mr__log_level mr__now_ms mr__op_free mr_comm_dtype_size \
                mr_dev_peak_flops mr_err_name mr_errf mr_log_q mr_mem_count mr_mem_uncount \
                mr_moe_aux mr_moe_ws_bind
ifeq ($(CUDA_ON),1)
CPPFLAGS   += -DMR_HAVE_CUDA
LDFLAGS    += -rdynamic $(patsubst %,-Wl$(comma)--undefined=%,$(plugin_needs))
endif

$(BUILD)/obj/pic/%.o: %.c | deps
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -I$(CUDA_HOME)/include $(if $(HAVE_NCCL),-DMR_HAVE_NCCL,) $(CFLAGS) \
		-fPIC -c -o $@ $<

$(CUDA_PLUGIN): $(plugin_obj) $(CUDA_LIB)
	$(CC) -shared $(CFLAGS) -o $@ -Wl,--whole-archive $(CUDA_LIB) -Wl,--no-whole-archive \
		$(plugin_obj) $(CUDA_LDLIBS) $(if $(HAVE_NCCL),-lnccl,)
	@for s in $$(nm -u --format=posix $@ | awk '$$1 ~ /^mr_|^mr__/ {print $$1}'); do \
		case " $(plugin_needs) " in *" $$s "*) ;; \
		*) echo "$@ names $$s: add it to plugin_needs in the Makefile" >&2; \
		   rm -f $@; exit 1;; esac; done

# the GPU tests link the CUDA side in (they call the kernels directly)
$(BUILD)/tests/gpu/%: CPPFLAGS += -I$(CUDA_HOME)/include
$(BUILD)/tests/gpu/%: tests/gpu/%.c $(CUDA_LIB) $(plugin_obj) $(call obj,$(test_helpers)) $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -Itests/support $(CFLAGS) $(LDFLAGS) -o $@ $< $(plugin_obj) \
		$(call obj,$(test_helpers)) $(CUDA_LIB) $(LIBS) -lcriterion $(LDLIBS) $(CUDA_LDLIBS) \
		$(if $(HAVE_NCCL),-lnccl,)

# The device layer's cuda backend (runtime/device/cuda.c) is host C over
# mr_cuda.h, and tests/gpu/cuda_emul.c implements mr_cuda.h with the CPU
# twins (bf16 rounding where the device rounds): test_device_cuda (every
# table op, cuda vs cpu), test_cuda_model (the model trained on cuda vs
# cpu) and test_cuda_graphs (CUDA graphs vs eager) are built a second
# time against the emulation, with -DMR_CUDA_EMUL (tight tolerances), in
# every build - with or without CUDA, sanitizers included. The emul_only
# ones exist only here: test_cuda_emul checks the emulation itself (its
# tagged device pointers fault on host access),
# test_cuda_parallel runs ranks on several emulated GPUs, test_offload the
# offloaded optimizer step against the device's. test_reference
# (the PyTorch reference) runs on the emulated cuda device too.
emul_dev_tests := $(BUILD)/tests/gpu-emul/test_device_cuda $(BUILD)/tests/gpu-emul/test_cuda_model \
                  $(BUILD)/tests/gpu-emul/test_generate_cuda \
                  $(BUILD)/tests/gpu-emul/test_cuda_graphs \
                  $(patsubst tests/gpu/%.c,$(BUILD)/tests/gpu-emul/%,$(emul_only))
test_bins  += $(emul_dev_tests)

$(emul_dev_tests): $(BUILD)/tests/gpu-emul/%: tests/gpu/%.c tests/gpu/cuda_emul.c \
		tests/gpu/cuda_emul.h runtime/device/cuda.c runtime/plugin/cuda_entry.c \
		tests/gpu/gpu_harness.h \
		$(call obj,$(test_helpers)) $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -DMR_CUDA_EMUL -Itests/support $(CFLAGS) $(LDFLAGS) -o $@ $< \
		tests/gpu/cuda_emul.c runtime/device/cuda.c runtime/plugin/cuda_entry.c \
		$(call obj,$(test_helpers)) $(LIBS) \
		-lcriterion $(LDLIBS)

# runtime tests built a second time on the emulated device, each with
# its switch: tests/model/test_reference (the PyTorch reference on cuda),
# tests/plan/test_plan_ledger (the planner's bf16 model states),
# tests/model/test_recompute (recomputation in bf16 on the device)
emul_runtime := $(BUILD)/tests/gpu-emul/test_reference $(BUILD)/tests/gpu-emul/test_plan_ledger \
                $(BUILD)/tests/gpu-emul/test_recompute
test_bins  += $(emul_runtime)
$(BUILD)/tests/gpu-emul/test_recompute: EMUL_SWITCH := -DRECOMPUTE_CUDA_EMUL
$(BUILD)/tests/gpu-emul/test_recompute: EMUL_SRC := tests/model/test_recompute.c
$(BUILD)/tests/gpu-emul/test_recompute: tests/model/test_recompute.c tests/plan/plan_jobs.h
$(BUILD)/tests/gpu-emul/test_reference: EMUL_SWITCH := -DREF_CUDA_EMUL
$(BUILD)/tests/gpu-emul/test_reference: EMUL_SRC := tests/model/test_reference.c
$(BUILD)/tests/gpu-emul/test_plan_ledger: EMUL_SWITCH := -DLEDGER_CUDA_EMUL
$(BUILD)/tests/gpu-emul/test_plan_ledger: EMUL_SRC := tests/plan/test_plan_ledger.c
$(BUILD)/tests/gpu-emul/test_reference: tests/model/test_reference.c
$(BUILD)/tests/gpu-emul/test_plan_ledger: tests/plan/test_plan_ledger.c
$(emul_runtime): $(BUILD)/tests/gpu-emul/%: tests/gpu/cuda_emul.c tests/gpu/cuda_emul.h \
		runtime/device/cuda.c runtime/plugin/cuda_entry.c $(call obj,$(test_helpers)) $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(EMUL_SWITCH) -Itests/support $(CFLAGS) $(LDFLAGS) -o $@ $(EMUL_SRC) \
		tests/gpu/cuda_emul.c runtime/device/cuda.c runtime/plugin/cuda_entry.c \
		$(call obj,$(test_helpers)) $(LIBS) \
		-lcriterion $(LDLIBS)

# The whole stack on the emulated device: meshrun, meshrun-agent and
# meshrun-controller under $(BUILD)/emul, linked with tests/gpu/cuda_emul.c
# instead of the CUDA kernels, so `meshrun local` jobs with "device":
# "cuda" run on any machine (the parity matrix on the emulated device,
# tests/gpu-emul/test_parity_*). The emulated CUDA side's table
# (cuda_entry.c, without NCCL) is linked in, so device.c opens it in every
# build, sanitizers included.
EMUL_DIR   := $(BUILD)/emul
emul_link  := $(BUILD)/obj/emul/cuda_emul.o $(BUILD)/obj/emul/device_cuda.o \
              $(BUILD)/obj/emul/cuda_entry.o
EMUL_BINS  := $(EMUL_DIR)/meshrun $(EMUL_DIR)/meshrun-agent $(EMUL_DIR)/meshrun-controller \
              $(EMUL_DIR)/bench-gpu
EMUL_LIBS  := $(filter-out $(CUDA_LIB),$(LIBS))

$(BUILD)/obj/emul/cuda_emul.o: tests/gpu/cuda_emul.c | deps
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<
$(BUILD)/obj/emul/device_cuda.o: runtime/device/cuda.c | deps
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<
$(BUILD)/obj/emul/cuda_entry.o: runtime/plugin/cuda_entry.c | deps
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<
$(EMUL_DIR)/meshrun: $(call obj,cli/main.c) $(emul_link) $(EMUL_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $(CFLAGS) -o $@ $^ $(LDLIBS)
$(EMUL_DIR)/meshrun-agent: $(call obj,agent/main.c) $(emul_link) $(EMUL_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $(CFLAGS) -o $@ $^ $(LDLIBS)
$(EMUL_DIR)/meshrun-controller: $(call obj,controller/main.c) $(emul_link) $(EMUL_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $(CFLAGS) -o $@ $^ $(LDLIBS)
# bench/gpu on the emulated GPUs (tests/gpu-emul/test_bench_gpu runs it tiny)
$(EMUL_DIR)/bench-gpu: bench/gpu.c $(emul_link) $(EMUL_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -DMR_HAVE_CUDA $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)
$(BUILD)/tests/gpu-emul/test_bench_gpu: $(EMUL_DIR)/bench-gpu

# tests/parity's matrix with the parallel runs on the emulated cuda device:
# fp32 against the cpu single-rank run, bf16 against the emulated
# single-rank bf16 run (the tolerances are in test_parity.c). Not in the
# sanitizer build: tests/parity runs the same jobs there on the cpu, and
# test_device_cuda / test_cuda_model the cuda device's host code.
emul_parity := $(BUILD)/tests/gpu-emul/test_parity_fp32 $(BUILD)/tests/gpu-emul/test_parity_bf16
ifneq ($(SAN),1)
test_bins   += $(emul_parity)
endif

$(emul_parity): $(BUILD)/tests/gpu-emul/test_parity_%: tests/parity/test_parity.c \
		$(call obj,$(test_helpers)) $(LIBS) $(EMUL_BINS) $(BINS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -DPARITY_EMUL_PRECISION='"$*"' -Itests/support $(CFLAGS) $(LDFLAGS) \
		-o $@ $< $(call obj,$(test_helpers)) $(LIBS) -lcriterion $(LDLIBS)

# ... and on the machine's real GPUs (make test-gpu; skipped without one):
# each configuration against the single rank on the same GPU and precision.
ifeq ($(CUDA_ON),1)
gpu_parity  := $(BUILD)/tests/gpu/test_parity_fp32 $(BUILD)/tests/gpu/test_parity_bf16
gpu_test_bins += $(gpu_parity)
test_bins   += $(gpu_parity)

$(gpu_parity): $(BUILD)/tests/gpu/test_parity_%: tests/parity/test_parity.c \
		$(call obj,$(test_helpers)) $(LIBS) $(BINS) $(CUDA_PLUGIN)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -DPARITY_GPU_PRECISION='"$*"' -Itests/support $(CFLAGS) $(LDFLAGS) \
		-o $@ $< $(call obj,$(test_helpers)) $(LIBS) -lcriterion $(LDLIBS)
endif

.PHONY: test-gpu
ifeq ($(CUDA_ON),1)
test-gpu: $(gpu_test_bins) $(CUDA_PLUGIN)
	@for t in $(gpu_test_bins); do echo "test-gpu: $$t"; $$t --jobs 1 --verbose || exit 1; done
	@echo "test-gpu: ok (tests marked SKIP need a CUDA device)"
else
test-gpu:
	@echo "test-gpu: CUDA not found under $(CUDA_HOME) (or sanitizer build) - skipped"
endif

.PHONY: all deps run test test-unit asan lint fuzz fuzzers bench bench-rdzv bench-healthz bench-comm tsan-comm clean tests cuda-info install image test-k8s test-pods
.DEFAULT_GOAL := all
# keep object files of test helpers (otherwise deleted as intermediates)
.SECONDARY:

all: deps cuda-info $(BINS) $(if $(CUDA_ON),$(CUDA_PLUGIN),)

# DEPS=build checks only the build packages (the image build, Dockerfile)
deps:
	@scripts/deps.sh $(DEPS)

cuda-info:
ifeq ($(CUDA_ON),1)
	@echo "build: CUDA found: $(NVCC)$(if $(HAVE_NCCL), + NCCL,) - GPU backends compiled"
else
	@echo "build: CUDA not found under $(CUDA_HOME) (or sanitizer build) - GPU backends skipped"
endif

# deps first: a parallel build on a fresh machine needs the headers
$(BUILD)/obj/%.o: %.c | deps
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

# sqrtf without errno, so the AdamW update loop vectorises (same values)
$(BUILD)/obj/runtime/optim/adamw.o: CFLAGS += -fno-math-errno

$(BUILD)/libmrcommon.a: $(call obj,$(common_src))
$(BUILD)/libmrcontroller.a: $(call obj,$(controller_src))
$(BUILD)/libmragent.a: $(call obj,$(agent_src))
$(BUILD)/libmeshrun.a: $(call obj,$(runtime_src))
$(BUILD)/libmrcli.a: $(call obj,$(cli_src))
$(BUILD)/%.a:
	@mkdir -p $(dir $@)
	@rm -f $@
	$(AR) rcs $@ $^

$(BUILD)/meshrun-controller: $(call obj,controller/main.c) $(LIBS)
	$(CC) $(LDFLAGS) $(CFLAGS) -o $@ $^ $(LDLIBS)
$(BUILD)/meshrun-agent: $(call obj,agent/main.c) $(LIBS)
	$(CC) $(LDFLAGS) $(CFLAGS) -o $@ $^ $(LDLIBS)
$(BUILD)/meshrun: $(call obj,cli/main.c) $(LIBS)
	$(CC) $(LDFLAGS) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(call obj,$(test_helpers)) $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -Itests/support $(CFLAGS) $(LDFLAGS) -o $@ $< \
		$(call obj,$(test_helpers)) $(LIBS) -lcriterion $(LDLIBS)

$(BUILD)/bench/%: bench/%.c $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $< $(LIBS) $(LDLIBS)

# benchmarks are built with the tests, so a change that breaks one fails `make test`;
# so is the emulated stack, which tests/agent's "device": "cuda" jobs run (in
# every build: the sanitizer build has no emulated parity matrix to pull it in)
tests: $(BINS) $(if $(CUDA_ON),$(CUDA_PLUGIN),) $(test_bins) $(bench_bins) $(EMUL_BINS)

$(BUILD)/fuzzers/%: tests/fuzz/%.c $(LIBS) | deps
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -fsanitize=fuzzer -o $@ $< $(LIBS) $(LDLIBS)

fuzzers: $(fuzz_bins)

# ---- the two commands ------------------------------------------------------
run: all
	scripts/run.sh $(BUILD)

# the builds inside use every core (a plain `make test` would build serially)
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)

test: deps lint
	$(MAKE) --no-print-directory -j$(JOBS) tests
	scripts/test.sh $(BUILD)
	$(MAKE) --no-print-directory test-k8s
	$(MAKE) --no-print-directory -j$(JOBS) asan
	scripts/test.sh $(BUILD)/asan
	$(MAKE) --no-print-directory -j$(JOBS) fuzz

test-unit: tests
	scripts/test.sh $(BUILD)

asan:
	$(MAKE) --no-print-directory BUILD=$(BUILD)/asan SAN=1 tests

# ---- quality -----------------------------------------------------------------
lint: deps
	cppcheck --quiet --error-exitcode=1 --std=c11 --inline-suppr --library=tests/criterion.cfg \
		--enable=warning,portability --suppress=missingIncludeSystem \
		-Icommon -Icontroller -Iagent -Iruntime -Icli \
		common controller agent runtime cli bench tests
	shellcheck scripts/*.sh bench/*.sh .ci/run
	scripts/layers.sh
	scripts/layers.sh --doc docs/ARCHITECTURE.md
	yamllint -s deploy charts/meshrun/Chart.yaml charts/meshrun/values.yaml \
		charts/meshrun/ci charts/meshrun/files tests/k8s/rejected tests/k8s/rejected-values \
		tests/k8s/alerts_test.yaml .yamllint.yaml

# ---- packaging -----------------------------------------------------------------
# The images (Dockerfile: CUDA; Dockerfile.cpu: Debian 12) build with
# `make DEPS=build install` inside; VERSION tags them and the chart's
# appVersion and the manifests' image tags name the same (scripts/test-k8s.sh
# checks). IMAGE_REPO is the registry prefix to push to.
VERSION    ?= 0.1.0
PREFIX     ?= /usr/local
DESTDIR    ?=
IMAGE_REPO ?= meshrun
# docker with a reachable engine, else buildah, else none (print only)
IMAGE_TOOL ?= $(shell if docker info >/dev/null 2>&1; then echo docker; \
	elif command -v buildah >/dev/null 2>&1; then echo buildah; fi)
REVISION   := $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)

install: all
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 0755 $(BINS) $(DESTDIR)$(PREFIX)/bin/
ifeq ($(CUDA_ON),1)
	install -d $(DESTDIR)$(PREFIX)/lib/meshrun
	install -m 0755 $(CUDA_PLUGIN) $(DESTDIR)$(PREFIX)/lib/meshrun/
endif

image_cmds = \
  "-f Dockerfile --target agent -t $(IMAGE_REPO)/meshrun-agent:$(VERSION)" \
  "-f Dockerfile --target controller -t $(IMAGE_REPO)/meshrun-controller:$(VERSION)" \
  "-f Dockerfile.cpu --target agent -t $(IMAGE_REPO)/meshrun-agent:$(VERSION)-cpu" \
  "-f Dockerfile.cpu --target controller -t $(IMAGE_REPO)/meshrun-controller:$(VERSION)-cpu"

image:
	@for a in $(image_cmds); do \
		cmd="$(or $(IMAGE_TOOL),docker) build --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) $$a ."; \
		echo "$$cmd"; \
		$(if $(IMAGE_TOOL),$$cmd || exit 1;,:;) \
	done
	@$(if $(IMAGE_TOOL),:,echo "image: no docker or buildah here: run the commands above where one is (buildah build takes the same arguments), then push to your registry")

test-pods: all $(BUILD)/tests/pods/test_pods
	@rm -f $(BUILD)/pods-summary.txt
	MESHRUN_BUILD=$(abspath $(BUILD)) MESHRUN_PODS_SUMMARY=$(abspath $(BUILD))/pods-summary.txt \
		$(BUILD)/tests/pods/test_pods --jobs 1 --verbose
	@scripts/pods-summary.sh $(BUILD)/pods-summary.txt

test-k8s: all
	scripts/deps.sh k8s
	scripts/test-k8s.sh $(BUILD)

fuzz: deps
	$(MAKE) --no-print-directory BUILD=$(BUILD)/fuzz FUZZ=1 fuzzers
	scripts/fuzz.sh $(BUILD)/fuzz

# ---- benchmarks ----------------------------------------------------------------
bench: bench-rdzv bench-healthz bench-comm bench-train bench-parallel bench-pipeline bench-cp-ep \
       bench-ckpt bench-memory

bench-rdzv: all $(BUILD)/bench/rdzv
	scripts/deps.sh bench
	scripts/bench-rdzv.sh $(BUILD)

bench-healthz: all
	scripts/deps.sh bench
	scripts/bench-healthz.sh $(BUILD)

# comm: meshrun host backend vs OpenMPI (bench/comm_mpi.c needs mpicc)
bench-comm: $(BUILD)/bench/comm
	scripts/deps.sh bench
	scripts/bench-comm.sh $(BUILD)

# ThreadSanitizer run of the host comm backend (clang -fsanitize=thread)
tsan-comm:
	scripts/tsan-comm.sh $(BUILD)

# ---- runtime training throughput vs PyTorch (bench/train.sh) ----------------
.PHONY: bench-train
bench-train: $(BUILD)/bench/train $(BUILD)/bench/sgemm_peak
	bench/train.sh $(BUILD)

# ---- activation recomputation: ledger, planner, tokens/s (bench/memory.sh) ----
.PHONY: bench-memory
bench-memory: $(BUILD)/bench/memory
	scripts/deps.sh bench
	bench/memory.sh $(BUILD)

# ---- GPT-2 124M/350M on the GPUs present, MFU (bench/gpu.c), and PyTorch ----
# (bench/gpu_torch.py) on the same shapes. Prints the ratios, then
# `gpu tokens_per_s=<x> mfu=<y>`; says "skipped" where there is no GPU.
.PHONY: bench-gpu
bench-gpu: $(BUILD)/bench/gpu $(BINS) $(if $(CUDA_ON),$(CUDA_PLUGIN),)
	bench/gpu.sh $(BUILD)

# ---- data/tensor-parallel scaling vs PyTorch DDP (bench/parallel.sh) --------
.PHONY: bench-parallel
bench-parallel: $(BUILD)/bench/parallel
	bench/parallel.sh $(BUILD)

# ---- pipeline bubble, activations, throughput vs one rank (bench/pipeline.c) -
# pp 2 and 4, m 4/8/16, each schedule; PIPELINE_QUICK=1 for a smoke run.
.PHONY: bench-pipeline
bench-pipeline: $(BUILD)/bench/pipeline
	$(BUILD)/bench/pipeline

# ---- context parallel memory, expert all-to-all share (bench/cp_ep.c) -------
# Prints `cp_ep act_ratio_cp2=<x> a2a_share_ep2=<y>` (CP_EP_QUICK=1: T 2048).
.PHONY: bench-cp-ep
bench-cp-ep: $(BUILD)/bench/cp_ep
	$(BUILD)/bench/cp_ep

# What a checkpoint costs a training step, background against blocking
# (bench/ckpt.c). Prints `ckpt async_share=<a> blocking_share=<b>`.
.PHONY: bench-ckpt
bench-ckpt: $(BUILD)/bench/ckpt
	$(BUILD)/bench/ckpt

# ---- PyTorch reference for the runtime (tests/reference/gen_reference.py) ----
.PHONY: reference
reference: $(LIBS)
	@mkdir -p $(BUILD)/reference
	$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $(BUILD)/reference/mkweights \
		tests/reference/mkweights.c $(LIBS) $(LDLIBS)
	/usr/bin/python3 tests/reference/gen_reference.py $(BUILD)/reference/mkweights \
		tests/reference

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
