# berth — build, install, test.
#
#   make                      build binaries and units (release)
#   make install DESTDIR= PREFIX=
#   make check [HARNESS_JOBS=] [HARNESS_SUITES=]
#                             the whole test suite: lint, cargo tests,
#                             container scenarios (root: boots systemd),
#                             the fault-injection suite and a short soak
#   make check-faults         the fault-injection suite alone
#   make check-reproducible   the source package built twice per suite: same .debs
#   make soak [SOAK_FAULTS=]  the cluster soak: random faults, invariant checker
#   make demo                 a throwaway systemd container running the examples
#   make deb [DEB_VERSION=]   the Debian package, into $(BUILD_DIR)/deb/
#   make source-package       the Debian source package, into $(BUILD_DIR)/source/
#
# Directory variables follow the GNU conventions; the systemd ones default
# to what pkg-config's systemd.pc says (on Debian 12 that is /lib/...,
# whatever PREFIX is, because that is where that systemd looks).

PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
# berth-libvirt goes to $(LIBEXECDIR)/berth; berth looks for it there
# (beside its own PREFIX, or /usr/libexec, /usr/local/libexec).
LIBEXECDIR ?= $(PREFIX)/libexec
# WITH_LIBVIRT=no builds and installs berth without berth-libvirt (and
# without libvirt-dev): libvirt guests are then followed by virsh polls.
WITH_LIBVIRT ?= yes
DATADIR ?= $(PREFIX)/share
MANDIR ?= $(DATADIR)/man
PKG_CONFIG ?= pkg-config
systemd_var = $(or $(shell $(PKG_CONFIG) --variable=$(1) systemd 2>/dev/null),$(2))
SYSTEMD_SYSTEM_UNIT_DIR ?= $(call systemd_var,systemdsystemunitdir,$(PREFIX)/lib/systemd/system)
SYSTEMD_SYSTEM_GENERATOR_DIR ?= $(call systemd_var,systemdsystemgeneratordir,$(PREFIX)/lib/systemd/system-generators)
SYSTEMD_USER_UNIT_DIR ?= $(call systemd_var,systemduserunitdir,$(PREFIX)/lib/systemd/user)
SYSTEMD_USER_GENERATOR_DIR ?= $(call systemd_var,systemdusergeneratordir,$(PREFIX)/lib/systemd/user-generators)
SYSTEMD_CATALOG_DIR ?= $(call systemd_var,catalogdir,$(PREFIX)/lib/systemd/catalog)
SYSUSERS_DIR ?= $(call systemd_var,sysusersdir,$(PREFIX)/lib/sysusers.d)
TMPFILES_DIR ?= $(call systemd_var,tmpfilesdir,$(PREFIX)/lib/tmpfiles.d)
SYSTEMD_SYSTEM_PRESET_DIR ?= $(call systemd_var,systemdsystempresetdir,$(PREFIX)/lib/systemd/system-preset)
SYSTEMD_USER_PRESET_DIR ?= $(call systemd_var,systemduserpresetdir,$(PREFIX)/lib/systemd/user-preset)

CARGO ?= cargo
CARGO_FLAGS ?= --locked
BUILD_DIR ?= build
TARGET_DIR := $(shell $(CARGO) metadata --format-version 1 --no-deps 2>/dev/null | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
ifeq ($(TARGET_DIR),)
TARGET_DIR := target
endif
RELEASE_DIR := $(TARGET_DIR)/release

MAN_PAGES := $(patsubst man/%.scd,%,$(wildcard man/*.scd))
SCDOC ?= scdoc

UNITS := berth.target berth.slice berth-drain.service berth-autostart.service berth-daemon.service berth-fence-watch.service berth@.service

INSTALL ?= install

.PHONY: all build units man completions install uninstall deb source-package check-reproducible deps lint check check-no-cluster check-faults soak demo bench clean FORCE
all: build units man completions

# berth, then berth-libvirt (libvirt-helper/, which links libvirt:
# libvirt-dev at build time).
build:
	$(CARGO) build --release $(CARGO_FLAGS)
ifeq ($(WITH_LIBVIRT),yes)
	$(CARGO) build --release $(CARGO_FLAGS) -p berth-libvirt
endif

# Units name the binary by absolute path. One template per unit serves the
# system and the user manager; the built binary fills them (the same code
# `berth install` uses), so make and install cannot disagree. Rendered
# every time: cheap, and never stale after a change of BINDIR.
units: build
	rm -rf $(BUILD_DIR)/units
	$(RELEASE_DIR)/berth render-units --bindir $(BINDIR) $(BUILD_DIR)/units/system
	$(RELEASE_DIR)/berth --user render-units --bindir $(BINDIR) $(BUILD_DIR)/units/user

# Man pages: scdoc sources in man/NAME.SECTION.scd.
man: $(addprefix $(BUILD_DIR)/man/,$(MAN_PAGES))

$(BUILD_DIR)/man/%: man/%.scd
	@mkdir -p $(@D)
	$(SCDOC) < $< > $@.tmp && mv $@.tmp $@

# Shell completions, generated from the CLI definition by the built binary.
completions: build
	@mkdir -p $(BUILD_DIR)/completions
	$(RELEASE_DIR)/berth completions bash > $(BUILD_DIR)/completions/berth
	$(RELEASE_DIR)/berth completions zsh > $(BUILD_DIR)/completions/_berth
	$(RELEASE_DIR)/berth completions fish > $(BUILD_DIR)/completions/berth.fish

install: all
	$(INSTALL) -Dm755 $(RELEASE_DIR)/berth $(DESTDIR)$(BINDIR)/berth
	$(INSTALL) -Dm755 $(RELEASE_DIR)/berth-generator $(DESTDIR)$(SYSTEMD_SYSTEM_GENERATOR_DIR)/berth-generator
ifeq ($(WITH_LIBVIRT),yes)
	$(INSTALL) -Dm755 $(RELEASE_DIR)/berth-libvirt $(DESTDIR)$(LIBEXECDIR)/berth/berth-libvirt
endif
	$(INSTALL) -d $(DESTDIR)$(SYSTEMD_SYSTEM_UNIT_DIR) $(DESTDIR)$(SYSTEMD_USER_UNIT_DIR) $(DESTDIR)$(SYSTEMD_USER_GENERATOR_DIR)
	$(INSTALL) -m644 $(addprefix $(BUILD_DIR)/units/system/,$(UNITS)) $(DESTDIR)$(SYSTEMD_SYSTEM_UNIT_DIR)/
	$(INSTALL) -m644 $(addprefix $(BUILD_DIR)/units/user/,$(UNITS)) $(DESTDIR)$(SYSTEMD_USER_UNIT_DIR)/
	# The same generator serves user managers (systemd reads user
	# generators only from system directories); it tells them apart by
	# $$SYSTEMD_SCOPE, or by the directory it is run from.
	ln -sf $(SYSTEMD_SYSTEM_GENERATOR_DIR)/berth-generator $(DESTDIR)$(SYSTEMD_USER_GENERATOR_DIR)/berth-generator
	$(INSTALL) -Dm644 catalog/berth.catalog $(DESTDIR)$(SYSTEMD_CATALOG_DIR)/berth.catalog
	$(INSTALL) -Dm644 units/berth.sysusers $(DESTDIR)$(SYSUSERS_DIR)/berth.conf
	$(INSTALL) -Dm644 units/berth.tmpfiles $(DESTDIR)$(TMPFILES_DIR)/berth.conf
	$(INSTALL) -Dm644 units/berth.preset $(DESTDIR)$(SYSTEMD_SYSTEM_PRESET_DIR)/90-berth.preset
	$(INSTALL) -Dm644 units/berth.preset $(DESTDIR)$(SYSTEMD_USER_PRESET_DIR)/90-berth.preset
	$(INSTALL) -Dm644 $(BUILD_DIR)/completions/berth $(DESTDIR)$(DATADIR)/bash-completion/completions/berth
	$(INSTALL) -Dm644 $(BUILD_DIR)/completions/_berth $(DESTDIR)$(DATADIR)/zsh/vendor-completions/_berth
	$(INSTALL) -Dm644 $(BUILD_DIR)/completions/berth.fish $(DESTDIR)$(DATADIR)/fish/vendor_completions.d/berth.fish
	for page in $(MAN_PAGES); do \
		$(INSTALL) -Dm644 $(BUILD_DIR)/man/$$page $(DESTDIR)$(MANDIR)/man$${page##*.}/$$page || exit 1; \
	done

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/berth $(DESTDIR)$(SYSTEMD_SYSTEM_GENERATOR_DIR)/berth-generator
	rm -f $(DESTDIR)$(LIBEXECDIR)/berth/berth-libvirt
	-rmdir $(DESTDIR)$(LIBEXECDIR)/berth 2>/dev/null
	rm -f $(addprefix $(DESTDIR)$(SYSTEMD_SYSTEM_UNIT_DIR)/,$(UNITS)) $(addprefix $(DESTDIR)$(SYSTEMD_USER_UNIT_DIR)/,$(UNITS))
	rm -f $(DESTDIR)$(SYSTEMD_USER_GENERATOR_DIR)/berth-generator
	rm -f $(DESTDIR)$(SYSTEMD_CATALOG_DIR)/berth.catalog
	rm -f $(DESTDIR)$(SYSUSERS_DIR)/berth.conf $(DESTDIR)$(TMPFILES_DIR)/berth.conf
	rm -f $(DESTDIR)$(SYSTEMD_SYSTEM_PRESET_DIR)/90-berth.preset $(DESTDIR)$(SYSTEMD_USER_PRESET_DIR)/90-berth.preset
	rm -f $(DESTDIR)$(DATADIR)/bash-completion/completions/berth $(DESTDIR)$(DATADIR)/zsh/vendor-completions/_berth $(DESTDIR)$(DATADIR)/fish/vendor_completions.d/berth.fish
	for page in $(MAN_PAGES); do rm -f $(DESTDIR)$(MANDIR)/man$${page##*.}/$$page; done

# The Debian package (debian/), built with this Makefile: debian/rules runs
# `make all` and `make install DESTDIR=debian/berth PREFIX=/usr` and packages
# whatever that installs. debian/rules is run directly rather than through
# dpkg-buildpackage, which writes into the checkout's parent directory and
# would insist on Debian's cargo; the .deb lands in $(DEB_DIR) instead.
# `debian/rules clean` before and after: dh skips steps its logs say ran,
# and the checkout is left as it was.
# Generated units etc. go to their own $(BUILD_DIR)/debian, as their paths
# are /usr's. The crates are fetched first: the package build itself runs
# offline. DEB_VERSION=0.1.0-2 builds the same tree as another version
# without editing debian/changelog (a rebuild reuses cargo's build).
DEB_DIR ?= $(BUILD_DIR)/deb
DEB_VERSION ?=
deb:
	$(CARGO) fetch $(CARGO_FLAGS)
	debian/rules clean
	env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL \
		BERTH_BUILD_DIR='$(abspath $(BUILD_DIR))/debian' \
		BERTH_DEB_DIR='$(abspath $(DEB_DIR))' \
		BERTH_DEB_VERSION='$(DEB_VERSION)' \
		debian/rules binary
	debian/rules clean

# What a distribution builds (debian/make-source-package says how): the
# .dsc, the debian tarball and two upstream tarballs, the crates vendored.
source-package:
	debian/make-source-package $(BUILD_DIR)/source

# The source package built twice on each suite (scenario 21 with
# HARNESS_REPRODUCIBLE=1): the .debs must be the same byte for byte. Two
# more full builds: not part of `make check`.
check-reproducible: deps
	HARNESS_SUITES='$(HARNESS_SUITES)' HARNESS_REPRODUCIBLE=1 tests/harness/run 21-package-build

# berth without cluster mode (cargo's default feature `cluster` off): no
# etcd-client, tonic or prost in its tree, and a build that never runs
# protoc (PROTOC points nowhere: a build that needed it would fail). Its
# lints and the tests whose outcome depends on the feature; verify.rs
# checks both variants of the golden trees in the default build.
NO_CLUSTER = PROTOC=/nonexistent/protoc $(CARGO)
NO_CLUSTER_FLAGS = --no-default-features -p berth $(CARGO_FLAGS)
check-no-cluster:
	tree=$$($(CARGO) tree $(NO_CLUSTER_FLAGS) -e normal) || exit 1; \
	if printf '%s\n' "$$tree" | grep -E ' (tonic|prost|etcd-client) v'; then \
		echo "check-no-cluster: the tree above holds a cluster crate" >&2; exit 1; fi
	$(NO_CLUSTER) clippy $(NO_CLUSTER_FLAGS) --all-targets -- -D warnings
	$(NO_CLUSTER) test $(NO_CLUSTER_FLAGS) --lib --test exit_codes --test generator_golden \
		--test hostile_paths --test broken_pipe --test escaper_systemd --test guest_watcher

# Debian packages the build and the suite need (a no-op when present).
deps:
	tests/harness/deps

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets $(CARGO_FLAGS) -- -D warnings
	for page in $(MAN_PAGES); do mandoc -Tlint -W warning $(BUILD_DIR)/man/$$page || exit 1; done

# The whole suite (tests/harness/check): lint, unit, golden, verify and
# escaper tests, then the container scenarios against a real systemd on
# Debian 12's systemd 252 and Debian 13's systemd 257 (they differ where
# berth must care, e.g. a user manager's %S), the fault-injection suite
# (tests/harness/faults: daemon kills under churn, a drain against a
# stalled bus, an API flood) and a short cluster soak (SOAK_FAULTS faults
# per suite, default 13: one of each kind), all side by side: HARNESS_JOBS at once (default
# 4). One release build serves the whole run; a phase table ends it.
# `make check-faults` runs the fault suite alone; `tests/harness/run NAME`
# runs one scenario.
HARNESS_SUITES ?= bookworm trixie
HARNESS_JOBS ?= 4
SOAK_FAULTS ?=
check:
	HARNESS_SUITES='$(HARNESS_SUITES)' HARNESS_JOBS='$(HARNESS_JOBS)' SOAK_FAULTS='$(or $(SOAK_FAULTS),13)' \
		tests/harness/check

# No `make all` first: tests/harness/run builds through `make install`, in
# the harness's build environment (tests/harness/buildenv).
check-faults: deps
	HARNESS_SUITES='$(HARNESS_SUITES)' HARNESS_JOBS='$(HARNESS_JOBS)' HARNESS_SETS=faults tests/harness/run

# The cluster soak (tests/harness/soak): three booted nodes, a real etcd,
# five HA workloads, SOAK_FAULTS random faults (daemon kills and stops,
# partitions, relay and etcd restarts, power-offs, root kills and
# freezes, latency spikes, deleted owner keys, drains by hand, failed
# starts) and an invariant checker sampling every root's cgroups and the
# owner keys. About 25 min per suite at 100 faults (the default here);
# `make check` runs a short one (13: one of each kind). The suites run
# side by side. SOAK_SEED=N repeats a run's faults.
soak: deps
	python3 tests/harness/soak/test_invariants.py
	HARNESS_SUITES='$(HARNESS_SUITES)' HARNESS_SETS=soak SOAK_FAULTS='$(or $(SOAK_FAULTS),100)' tests/harness/run

demo: deps
	tests/harness/demo

# Prints the figures the issues ask for; not part of `make check`.
bench: all
	bench/generator.sh
	bench/helpers.sh
	bench/daemon.sh
	bench/adoption-scale.sh
	bench/add-burst.sh
	bench/libvirt-drain.sh
	bench/libvirt-events.sh
	bench/metrics.sh
	bench/cluster-takeover.sh
	bench/cluster-scale.sh
	bench/cluster-watchdog.sh

clean:
	$(CARGO) clean
	rm -rf $(BUILD_DIR)
