# ferroccl: build, stage, install and test the drop-in libnccl.so.2.
#
#   make [all]                  cargo build (release) + stage build/lib, build/include
#   make header | check-header  regenerate include/nccl.h | fail if it is stale
#   make install PREFIX=<dir>   lib/, include/, share/ferroccl/fortran, lib/cmake, lib/pkgconfig
#   make test | test-c | test-fortran | test-mpi | test-packaging
#   make clean
#
# Options (command line or environment):
#   TLS_BACKEND=           no TLS (default; the library has no OpenSSL dependency)
#   TLS_BACKEND=OPENSSL3   cargo feature `openssl3` (needs OpenSSL >= 3.0 development files)
#   MPI=auto|0|1           cargo feature `mpi` (auto: on when $(MPICC) is on PATH)
#   IB=auto|0|1            cargo feature `ib`, the InfiniBand/RoCE transport (auto: on when
#                          pkg-config finds libibverbs and cmake is on PATH, which the
#                          ibverbs-sys build script needs, with libclang and libnl dev files)
#   CARGO_TARGET_DIR=<dir> cargo's target directory (default: ./target)
#   BUILDDIR=<dir>         staging directory (default: ./build)
#   CARGO_FLAGS=...        extra cargo arguments (e.g. --locked, --offline)
#
# The library is built with `cargo rustc --release --lib -- --print native-static-libs`, the
# same as `cargo build --release --lib` plus the list of native libraries that libnccl.a needs
# (written to $(BUILDDIR)/native-static-libs.txt, substituted into ferroccl.pc and the CMake
# package). Cargo replays that note when nothing changed, and decides what to rebuild: a
# feature change (TLS_BACKEND, MPI) rebuilds only the ferroccl crate.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := all
.DELETE_ON_ERROR:
.SUFFIXES:

CARGO       ?= cargo
CARGO_FLAGS ?=
PKG_CONFIG  ?= pkg-config
MPICC       ?= mpicc
MPIF90      ?= mpif90
MPIRUN      ?= mpirun
PREFIX      ?= /usr/local
DESTDIR     ?=
BUILDDIR    ?= $(CURDIR)/build
CARGO_TARGET_DIR ?= $(CURDIR)/target
override BUILDDIR := $(abspath $(BUILDDIR))
override CARGO_TARGET_DIR := $(abspath $(CARGO_TARGET_DIR))
export CARGO_TARGET_DIR

CARGO_OUT := $(CARGO_TARGET_DIR)/release
VERSION   := $(shell sed -n 's/^version *= *"\([^"]*\)".*/\1/p' $(CURDIR)/Cargo.toml | head -n 1)
# NCCL version advertised by the header (NCCL_MAJOR.NCCL_MINOR.NCCL_PATCH).
NCCL_HDR_VERSION = $(shell awk '$$2 == "NCCL_MAJOR" {a = $$3} $$2 == "NCCL_MINOR" {b = $$3} $$2 == "NCCL_PATCH" {c = $$3} \
                     END {if (a != "") print a "." b "." c}' $(CURDIR)/include/nccl.h 2>/dev/null)

# ---------------------------------------------------------------------- TLS_BACKEND
TLS_BACKEND ?=
ifeq ($(strip $(TLS_BACKEND)),)
  TLS_FEATURE :=
  WITH_TLS := 0
else ifeq ($(strip $(TLS_BACKEND)),OPENSSL3)
  TLS_FEATURE := openssl3
  WITH_TLS := 1
else
  $(error TLS_BACKEND must be empty or OPENSSL3, got '$(TLS_BACKEND)')
endif

# ---------------------------------------------------------------------- MPI
MPI ?= auto
ifeq ($(strip $(MPI)),auto)
  WITH_MPI := $(if $(shell command -v $(MPICC) 2>/dev/null),1,0)
else ifeq ($(strip $(MPI)),1)
  WITH_MPI := 1
else ifeq ($(strip $(MPI)),0)
  WITH_MPI := 0
else
  $(error MPI must be auto, 0 or 1, got '$(MPI)')
endif

# ---------------------------------------------------------------------- IB
IB ?= auto
ifeq ($(strip $(IB)),auto)
  WITH_IB := $(if $(and $(shell $(PKG_CONFIG) --exists libibverbs 2>/dev/null && echo y),$(shell command -v cmake 2>/dev/null)),1,0)
else ifeq ($(strip $(IB)),1)
  WITH_IB := 1
else ifeq ($(strip $(IB)),0)
  WITH_IB := 0
else
  $(error IB must be auto, 0 or 1, got '$(IB)')
endif

empty :=
space := $(empty) $(empty)
comma := ,
FEATURES := $(strip $(TLS_FEATURE) $(if $(filter 1,$(WITH_MPI)),mpi) $(if $(filter 1,$(WITH_IB)),ib))
FEATURES_CSV := $(subst $(space),$(comma),$(FEATURES))
CARGO_FEATURE_ARGS := $(if $(FEATURES),--features $(FEATURES_CSV))
# MPICC reaches cargo (rsmpi's build script) only when the user set it, as in the CMake build,
# so both builds give cargo the same environment and share one fresh target dir.
CARGO_ENV := $(if $(filter environment command,$(firstword $(origin MPICC))),MPICC=$(MPICC) )

# ---------------------------------------------------------------------- Fortran
# The module is compiled with the MPI Fortran compiler when MPI is on (mpi_f08 specific of
# ferroccl_comm_init_mpi), else (or without $(MPIF90)) with plain $(FC_PLAIN) and
# -DFERROCCL_NO_MPI_F08. No Fortran compiler at all: no module (install skips it).
FC_PLAIN ?= gfortran
FFLAGS   ?= -O2
HAVE_MPIF90 := $(if $(shell command -v $(MPIF90) 2>/dev/null),1,0)
ifeq ($(WITH_MPI)$(HAVE_MPIF90),11)
  FORTRAN_FC   := $(MPIF90)
  FORTRAN_DEFS :=
else
  FORTRAN_FC   := $(if $(shell command -v $(FC_PLAIN) 2>/dev/null),$(FC_PLAIN))
  FORTRAN_DEFS := -DFERROCCL_NO_MPI_F08
endif
FORTRAN_DIR   := $(BUILDDIR)/fortran
FORTRAN_STAMP := $(FORTRAN_DIR)/ferroccl.mod

# ---------------------------------------------------------------------- MPI tests/examples
# MPI_EXAMPLES: programs run by `make test-mpi` under `mpirun -np N` for each N in MPI_NP
# (NCCL_SOCKET_IFNAME defaults to lo there, as in .cargo/config.toml)
# (default: every examples/c/*.c and examples/fortran/*.f90). An entry is an executable path;
# $(BUILDDIR)/examples/c/NAME and $(BUILDDIR)/examples/fortran/NAME are built from
# examples/c/NAME.c and examples/fortran/NAME.f90 by the rules below; `cargo:NAME` builds and
# runs the Rust example NAME (cargo build --release --example NAME).
MPI_NP        ?= 2 4
MPI_TIMEOUT   ?= 60
MPIRUN_FLAGS  ?= --oversubscribe
MPI_TEST_PROGRAMS := $(BUILDDIR)/tests/comm_init_mpi_c $(BUILDDIR)/tests/recreate_mpi_c \
                     $(if $(filter $(MPIF90),$(FORTRAN_FC)),$(BUILDDIR)/tests/comm_init_mpi_f90 $(BUILDDIR)/tests/comm_init_mpi_f08)
MPI_EXAMPLES  ?= $(patsubst examples/c/%.c,$(BUILDDIR)/examples/c/%,$(sort $(wildcard examples/c/*.c))) \
                 $(if $(filter $(MPIF90),$(FORTRAN_FC)),$(patsubst examples/fortran/%.f90,$(BUILDDIR)/examples/fortran/%,$(sort $(wildcard examples/fortran/*.f90))))
RPATH_FLAGS   := -Wl,-rpath,$(BUILDDIR)/lib

.PHONY: all src.build check-tls check-mpi check-ib header check-header fortran install uninstall \
        test test-c test-fortran test-mpi test-packaging clean distclean print-config FORCE

all: src.build

print-config:
	@echo "VERSION=$(VERSION) TLS_BACKEND=$(TLS_BACKEND) MPI=$(MPI) (WITH_MPI=$(WITH_MPI)) IB=$(IB) (WITH_IB=$(WITH_IB))"
	@echo "FEATURES=$(FEATURES_CSV) CARGO_TARGET_DIR=$(CARGO_TARGET_DIR) BUILDDIR=$(BUILDDIR)"
	@echo "FORTRAN_FC=$(FORTRAN_FC) FORTRAN_DEFS=$(FORTRAN_DEFS)"

check-tls:
ifeq ($(WITH_TLS),1)
	@if ! $(PKG_CONFIG) --atleast-version=3.0 openssl 2>/dev/null; then \
	  echo "error: TLS_BACKEND=OPENSSL3 needs the OpenSSL 3 development files" \
	       "(pkg-config openssl >= 3.0; found: $$($(PKG_CONFIG) --modversion openssl 2>/dev/null || echo none))." >&2; \
	  echo "       On Debian/Ubuntu: apt-get install libssl-dev pkg-config; or build with TLS_BACKEND= (no TLS)." >&2; \
	  exit 1; \
	fi
endif

check-mpi:
ifeq ($(WITH_MPI),1)
	@command -v $(MPICC) >/dev/null 2>&1 || { \
	  echo "error: MPI=$(MPI) needs $(MPICC) on PATH (apt-get install libopenmpi-dev openmpi-bin), or build with MPI=0." >&2; \
	  exit 1; }
endif

check-ib:
ifeq ($(WITH_IB),1)
	@$(PKG_CONFIG) --exists libibverbs 2>/dev/null || { \
	  echo "error: IB=$(IB) needs libibverbs (pkg-config libibverbs; apt-get install libibverbs-dev cmake libclang1-14 libclang-common-14-dev libnl-3-dev libnl-route-3-dev), or build with IB=0." >&2; \
	  exit 1; }
endif

src.build: check-tls check-mpi check-ib
	@test -f include/nccl.h || { echo "error: include/nccl.h is missing: run 'make header'" >&2; exit 1; }
	@mkdir -p $(BUILDDIR)/lib $(BUILDDIR)/include
	$(CARGO_ENV)$(CARGO) rustc --release --lib --manifest-path $(CURDIR)/Cargo.toml \
	  $(CARGO_FEATURE_ARGS) $(CARGO_FLAGS) -- --print native-static-libs 2>&1 | tee $(BUILDDIR)/cargo-build.log
	@libs=$$(sed -n 's/^note: native-static-libs: *//p' $(BUILDDIR)/cargo-build.log | tail -n 1); \
	 test -n "$$libs" || { echo "error: cargo printed no native-static-libs note" >&2; exit 1; }; \
	 echo "$$libs" > $(BUILDDIR)/native-static-libs.txt
	@cp -f $(CARGO_OUT)/libferroccl.so $(BUILDDIR)/lib/libferroccl.so
	@ln -sfn libferroccl.so $(BUILDDIR)/lib/libnccl.so.2
	@ln -sfn libnccl.so.2 $(BUILDDIR)/lib/libnccl.so
	@cp -f $(CARGO_OUT)/libferroccl.a $(BUILDDIR)/lib/libferroccl.a
	@ln -sfn libferroccl.a $(BUILDDIR)/lib/libnccl.a
	@cp -f include/nccl.h $(BUILDDIR)/include/nccl.h
	@{ echo "FERROCCL_VERSION='$(VERSION)'"; \
	   echo "FERROCCL_TLS_BACKEND='$(strip $(TLS_BACKEND))'"; \
	   echo "FERROCCL_WITH_TLS=$(WITH_TLS)"; \
	   echo "FERROCCL_WITH_MPI=$(WITH_MPI)"; \
	   echo "FERROCCL_WITH_IB=$(WITH_IB)"; \
	   echo "FERROCCL_FEATURES='$(FEATURES_CSV)'"; \
	   echo "FERROCCL_NATIVE_STATIC_LIBS='$$(cat $(BUILDDIR)/native-static-libs.txt)'"; \
	   echo "FERROCCL_BUILT_BY=make"; } > $(BUILDDIR)/ferroccl-build.env
	@echo "staged $(BUILDDIR)/lib and $(BUILDDIR)/include (features: $(or $(FEATURES_CSV),none))"

# ---------------------------------------------------------------------- header
header:
	$(CARGO) run --profile quick -q -p gen-header $(CARGO_FLAGS) -- $(CURDIR)/include/nccl.h
	@echo "regenerated include/nccl.h"

check-header:
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	 $(CARGO) run --profile quick -q -p gen-header $(CARGO_FLAGS) -- "$$tmp/nccl.h"; \
	 if [ ! -f include/nccl.h ]; then echo "include/nccl.h is missing: run 'make header' and commit it" >&2; exit 1; fi; \
	 if diff -u include/nccl.h "$$tmp/nccl.h"; then echo "include/nccl.h is up to date"; \
	 else echo "include/nccl.h is stale: run 'make header' and commit it" >&2; exit 1; fi

# ---------------------------------------------------------------------- Fortran module
# Rebuilt when the source or the compiler/flags change ($(FORTRAN_DIR)/flags).
fortran: $(if $(FORTRAN_FC),$(FORTRAN_STAMP))
	@$(if $(FORTRAN_FC),true,echo "no Fortran compiler ($(if $(filter 1,$(WITH_MPI)),$(MPIF90),$(FC_PLAIN))): Fortran module not built")

$(FORTRAN_DIR)/flags: FORCE
	@mkdir -p $(@D)
	@echo '$(FORTRAN_FC) $(FFLAGS) $(FORTRAN_DEFS)' | cmp -s - $@ || echo '$(FORTRAN_FC) $(FFLAGS) $(FORTRAN_DEFS)' > $@

$(FORTRAN_STAMP): fortran/ferroccl.F90 $(FORTRAN_DIR)/flags
	@mkdir -p $(FORTRAN_DIR) $(BUILDDIR)/lib
	cd $(FORTRAN_DIR) && $(FORTRAN_FC) $(FFLAGS) $(FORTRAN_DEFS) -J . -c $(CURDIR)/fortran/ferroccl.F90 -o ferroccl.o
	rm -f $(BUILDDIR)/lib/libferroccl_fortran.a
	ar rcs $(BUILDDIR)/lib/libferroccl_fortran.a $(FORTRAN_DIR)/ferroccl.o
	@touch $@

# ---------------------------------------------------------------------- install
# Same tree as `cmake --install` (tests/packaging/test-cmake.sh compares them).
INSTALL_ROOT := $(DESTDIR)$(PREFIX)

install: src.build fortran
	@test -n "$(PREFIX)" || { echo "error: PREFIX is empty" >&2; exit 1; }
	install -d $(INSTALL_ROOT)/lib $(INSTALL_ROOT)/include $(INSTALL_ROOT)/lib/cmake/ferroccl \
	  $(INSTALL_ROOT)/lib/pkgconfig $(INSTALL_ROOT)/share/ferroccl/fortran
	install -m 755 $(BUILDDIR)/lib/libferroccl.so $(INSTALL_ROOT)/lib/libferroccl.so
	ln -sfn libferroccl.so $(INSTALL_ROOT)/lib/libnccl.so.2
	ln -sfn libnccl.so.2 $(INSTALL_ROOT)/lib/libnccl.so
	install -m 644 $(BUILDDIR)/lib/libferroccl.a $(INSTALL_ROOT)/lib/libferroccl.a
	ln -sfn libferroccl.a $(INSTALL_ROOT)/lib/libnccl.a
	install -m 644 $(BUILDDIR)/include/nccl.h $(INSTALL_ROOT)/include/nccl.h
	install -m 644 fortran/ferroccl.F90 $(INSTALL_ROOT)/share/ferroccl/fortran/ferroccl.F90
ifneq ($(FORTRAN_FC),)
	install -m 644 $(FORTRAN_DIR)/ferroccl.mod $(INSTALL_ROOT)/include/ferroccl.mod
	install -m 644 $(BUILDDIR)/lib/libferroccl_fortran.a $(INSTALL_ROOT)/lib/libferroccl_fortran.a
endif
	@libs=$$(cat $(BUILDDIR)/native-static-libs.txt); \
	 cmake_libs=$$(for l in $$libs; do echo "$${l#-l}"; done | paste -sd';' -); \
	 mpi_dirs=""; \
	 if [ "$(WITH_MPI)" = 1 ]; then mpi_dirs=$$($(MPICC) -showme:link 2>/dev/null | tr ' ' '\n' | grep '^-L' | paste -sd' ' - || true); fi; \
	 pc_private=$$(echo $$mpi_dirs $$libs); \
	 has_mod=$(if $(FORTRAN_FC),ON,OFF); \
	 subst() { sed -e "s|@FERROCCL_VERSION@|$(VERSION)|g" \
	   -e "s|@FERROCCL_NCCL_VERSION@|$(NCCL_HDR_VERSION)|g" \
	   -e "s|@FERROCCL_TLS_BACKEND@|$(strip $(TLS_BACKEND))|g" \
	   -e "s|@FERROCCL_WITH_TLS@|$(if $(filter 1,$(WITH_TLS)),ON,OFF)|g" \
	   -e "s|@FERROCCL_WITH_MPI@|$(if $(filter 1,$(WITH_MPI)),ON,OFF)|g" \
	   -e "s|@FERROCCL_WITH_TLS_01@|$(WITH_TLS)|g" \
	   -e "s|@FERROCCL_WITH_MPI_01@|$(WITH_MPI)|g" \
	   -e "s|@FERROCCL_HAVE_FORTRAN_MOD@|$$has_mod|g" \
	   -e "s|@FERROCCL_NATIVE_STATIC_LIBS@|$$cmake_libs|g" \
	   -e "s|@FERROCCL_PC_LIBS_PRIVATE@|$$pc_private|g" \
	   -e "s|@FERROCCL_PREFIX@|$(PREFIX)|g" "$$1"; }; \
	 subst cmake/ferrocclConfig.cmake.in > $(INSTALL_ROOT)/lib/cmake/ferroccl/ferrocclConfig.cmake; \
	 subst cmake/ferrocclConfigVersion.cmake.in > $(INSTALL_ROOT)/lib/cmake/ferroccl/ferrocclConfigVersion.cmake; \
	 subst cmake/ferroccl.pc.in > $(INSTALL_ROOT)/lib/pkgconfig/ferroccl.pc
	@echo "installed ferroccl $(VERSION) into $(INSTALL_ROOT)"

uninstall:
	rm -f $(INSTALL_ROOT)/lib/libferroccl.so $(INSTALL_ROOT)/lib/libnccl.so.2 $(INSTALL_ROOT)/lib/libnccl.so \
	  $(INSTALL_ROOT)/lib/libferroccl.a $(INSTALL_ROOT)/lib/libnccl.a $(INSTALL_ROOT)/lib/libferroccl_fortran.a \
	  $(INSTALL_ROOT)/include/nccl.h $(INSTALL_ROOT)/include/ferroccl.mod \
	  $(INSTALL_ROOT)/lib/pkgconfig/ferroccl.pc
	rm -rf $(INSTALL_ROOT)/lib/cmake/ferroccl $(INSTALL_ROOT)/share/ferroccl

# ---------------------------------------------------------------------- tests
# Environment for the scripts under tests/packaging/.
TEST_ENV = FERROCCL_BUILDDIR=$(BUILDDIR) FERROCCL_SRCDIR=$(CURDIR) CARGO="$(CARGO)" \
           CARGO_TARGET_DIR=$(CARGO_TARGET_DIR) MAKE="$(MAKE)" MPICC=$(MPICC) MPIF90=$(MPIF90) \
           MPIRUN=$(MPIRUN) FERROCCL_MPI=$(MPI) TLS_BACKEND=$(strip $(TLS_BACKEND))

test:
	$(CARGO_ENV)$(CARGO) test --profile quick $(CARGO_FEATURE_ARGS) $(CARGO_FLAGS)

test-c: src.build
	$(TEST_ENV) tests/packaging/test-c.sh

test-fortran: src.build fortran
	$(TEST_ENV) tests/packaging/test-fortran.sh

test-packaging: src.build fortran
	$(TEST_ENV) tests/packaging/run-all.sh

$(BUILDDIR)/tests/comm_init_mpi_c: tests/c/comm_init_mpi.c src.build
	@mkdir -p $(@D)
	$(MPICC) -O1 -Wall -I$(BUILDDIR)/include $< -o $@ -L$(BUILDDIR)/lib -lnccl $(RPATH_FLAGS)

$(BUILDDIR)/tests/recreate_mpi_c: tests/c/recreate_mpi.c src.build
	@mkdir -p $(@D)
	$(MPICC) -O1 -Wall -I$(BUILDDIR)/include $< -o $@ -L$(BUILDDIR)/lib -lnccl $(RPATH_FLAGS)

$(BUILDDIR)/tests/comm_init_mpi_f90: tests/fortran/comm_init_mpi.f90 $(FORTRAN_STAMP) src.build
	@mkdir -p $(@D)/f90 && cd $(@D)/f90 && $(MPIF90) -I$(FORTRAN_DIR) $(CURDIR)/$< -o $@ \
	  -L$(BUILDDIR)/lib -lferroccl_fortran -lnccl $(RPATH_FLAGS)

$(BUILDDIR)/tests/comm_init_mpi_f08: tests/fortran/comm_init_mpi_f08.f90 $(FORTRAN_STAMP) src.build
	@mkdir -p $(@D)/f08 && cd $(@D)/f08 && $(MPIF90) -I$(FORTRAN_DIR) $(CURDIR)/$< -o $@ \
	  -L$(BUILDDIR)/lib -lferroccl_fortran -lnccl $(RPATH_FLAGS)

$(BUILDDIR)/examples/c/%: examples/c/%.c src.build
	@mkdir -p $(@D)
	$(MPICC) -O2 -Wall -I$(BUILDDIR)/include $< -o $@ -L$(BUILDDIR)/lib -lnccl $(RPATH_FLAGS)

$(BUILDDIR)/examples/fortran/%: examples/fortran/%.f90 $(FORTRAN_STAMP) src.build
	@mkdir -p $(@D)/obj-$* && cd $(@D)/obj-$* && $(MPIF90) -O2 -I$(FORTRAN_DIR) $(CURDIR)/$< -o $@ \
	  -L$(BUILDDIR)/lib -lferroccl_fortran -lnccl $(RPATH_FLAGS)

MPI_RUN_LIST := $(MPI_TEST_PROGRAMS) $(MPI_EXAMPLES)

test-mpi: src.build $(filter-out cargo:%,$(MPI_RUN_LIST))
ifneq ($(WITH_MPI),1)
	@echo "test-mpi: built without MPI (MPI=$(MPI)); nothing to run"; exit 1
else
	@if [ "$$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi; \
	 export NCCL_SOCKET_IFNAME=$${NCCL_SOCKET_IFNAME:-lo}; \
	 pass=0; fail=0; failed=""; \
	 for ex in $(MPI_RUN_LIST); do \
	   case "$$ex" in \
	     cargo:*) name=$${ex#cargo:}; \
	       $(CARGO_ENV)$(CARGO) build --release -q --example "$$name" $(CARGO_FEATURE_ARGS) $(CARGO_FLAGS); \
	       exe=$(CARGO_OUT)/examples/$$name ;; \
	     *) exe=$$ex ;; \
	   esac; \
	   for np in $(MPI_NP); do \
	     log=$$(mktemp); \
	     if timeout $(MPI_TIMEOUT) $(MPIRUN) -np $$np $(MPIRUN_FLAGS) "$$exe" >"$$log" 2>&1; then \
	       pass=$$((pass+1)); echo "PASS mpirun -np $$np $$(basename $$exe)"; \
	     else \
	       rc=$$?; fail=$$((fail+1)); failed="$$failed $$(basename $$exe)@np$$np"; \
	       echo "FAIL mpirun -np $$np $$(basename $$exe) (exit $$rc):"; sed 's/^/    /' "$$log" | tail -n 40; \
	     fi; \
	     rm -f "$$log"; \
	   done; \
	 done; \
	 echo "$$pass passed, $$fail failed$${failed:+ (failed:$$failed)}"; \
	 test $$fail -eq 0
endif

# ---------------------------------------------------------------------- clean
clean:
	rm -rf $(BUILDDIR)
	$(CARGO) clean

distclean: clean
	rm -rf $(CURDIR)/build-cmake

FORCE:
