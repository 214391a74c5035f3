# shellcheck shell=bash
# The container harness: boots a real systemd (Debian's, in systemd-nspawn)
# on a debootstrapped root with berth installed by `make install`, runs
# commands inside, powers it off and collects what it left behind.
#
# Facts this rests on: ../../shared/notes/real-systemd.md (outside the repo)
# and berth.units(7). Sourced by tests/harness/run, the scenarios and the demo.

set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SUITE=${HARNESS_SUITE:-bookworm}
# One directory per suite (installed roots, containers' files, results),
# so that both suites' scenarios run side by side.
HARNESS_ROOT=${HARNESS_ROOT:-$REPO/target/harness}
HARNESS_DIR=$HARNESS_ROOT/$SUITE
# Pristine roots made of Debian's packages alone (no berth in them): kept
# on the machine between runs, outside any checkout, and rebuilt when their
# recipe changes or a new week begins (the archive moves on).
HARNESS_CACHE=${HARNESS_CACHE:-/var/cache/berth-harness}
HARNESS_WEEK=${HARNESS_WEEK:-$(date -u +%G-W%V)}
# What the root needs beyond minbase: systemd as init, the bus, and what a
# user manager needs (pam_systemd, the user bus) for later user-mode tests.
INCLUDE=systemd,systemd-sysv,dbus,libpam-systemd,dbus-user-session
BASE_STAMP="$SUITE $INCLUDE $HARNESS_WEEK"
ROOTFS=$HARNESS_DIR/root
BOOT_TIMEOUT=${HARNESS_BOOT_TIMEOUT:-90}

log() { printf '%s\n' "$*" >&2; }
die() { log "harness: $*"; exit 1; }

# Every make and cargo of the harness in one build environment, so that
# the release build is compiled once (tests/harness/buildenv says why).
source "$REPO/tests/harness/buildenv"

# One harness run at a time per harness directory: the installed roots
# and the containers' directories there are the run's. Runs in other
# directories (the other suite, another checkout) go on beside it; each
# container has cgroups of its own (ct_boot). The lock is taken once per
# run: tests/harness/run takes it for every suite (harness_lock DIR) and
# names the directories it holds in BERTH_HARNESS_LOCKED, for the
# scenarios it starts. HARNESS_NO_LOCK=1: for what touches no root (a requirement check,
# the Debian packages).
harness_lock() {
    local dir=${1:-$HARNESS_DIR}
    case " ${BERTH_HARNESS_LOCKED:-} " in *" $dir "*) return 0 ;; esac
    [ "$(id -u)" = 0 ] || return 0
    flock_wait "$dir/.lock"
    export BERTH_HARNESS_LOCKED="${BERTH_HARNESS_LOCKED:-} $dir"
}
# flock_wait FILE: an exclusive lock on FILE, held until this shell exits;
# says so when it has to wait for it.
flock_wait() {
    local fd
    mkdir -p "$(dirname "$1")"
    exec {fd}>"$1"
    if ! flock -n "$fd"; then
        log "harness: another run holds $1; waiting for it"
        flock "$fd"
    fi
}
[ "${HARNESS_NO_LOCK:-}" = 1 ] || harness_lock

# ---------------------------------------------------------------------------
# Requirements: outside CI a missing requirement skips loudly; under
# CI=true it fails, so CI never counts a skip as a pass.
# ---------------------------------------------------------------------------
harness_missing() {
    local missing=()
    [ "$(id -u)" = 0 ] || missing+=("root")
    command -v systemd-nspawn >/dev/null || missing+=("systemd-nspawn (apt-get install systemd-container)")
    command -v debootstrap >/dev/null || missing+=("debootstrap (apt-get install debootstrap)")
    command -v python3 >/dev/null || missing+=("python3")
    if [ ${#missing[@]} -gt 0 ]; then
        printf '%s, ' "${missing[@]}" | sed 's/, $//'
    fi
}

# ---------------------------------------------------------------------------
# The root file system.
# ---------------------------------------------------------------------------
# apt_archive main|security: the host's Debian archive of that kind (the
# security one holds Debian 12's rustc-web 1.96), from its apt sources.
apt_archive() {
    local security=0 default=http://deb.debian.org/debian m
    [ "$1" != security ] || { security=1; default=$default-security; }
    m=$({ sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*\).*/\1/p' /etc/apt/sources.list.d/*.sources
        awk '$1 == "deb" { print $2 }' /etc/apt/sources.list; } 2>/dev/null \
        | awk -v s="$security" '(/security/ ? 1 : 0) == s { print; exit }' || true)
    printf '%s\n' "${m:-$default}"
}

# The cache holds pristine roots under names that carry a hash of their
# recipe (cache_dir NAME STAMP): an entry is built once, under a lock, and
# never changed or replaced while it may be read; a new recipe or a new
# week gets a new entry, and entries nobody used for two days go.
cache_dir() { printf '%s/%s-%s\n' "$HARNESS_CACHE" "$1" "$(printf '%s' "$2" | cksum | cut -d' ' -f1)"; }
# cache_build NAME DIR FUNCTION: FUNCTION builds DIR.tmp, unless DIR is
# there; then DIR.tmp becomes DIR.
cache_build() {
    local name=$1 dir=$2 build=$3 fd old
    if [ -f "$dir/.berth-harness" ]; then
        touch "$dir/.berth-harness"
        return 0
    fi
    mkdir -p "$HARNESS_CACHE" "$HARNESS_DIR"
    exec {fd}>"$HARNESS_CACHE/.lock-$name"
    flock "$fd"
    if [ ! -f "$dir/.berth-harness" ]; then
        rm -rf "$dir.tmp"
        "$build" "$dir.tmp" || { exec {fd}>&-; return 1; }
        date -u >"$dir.tmp/.berth-harness"
        mv "$dir.tmp" "$dir"
        for old in "$HARNESS_CACHE/$name"-*; do
            [[ "${old##*/}" =~ ^$name-[0-9]+$ ]] && [ "$old" != "$dir" ] && [ -f "$old/.berth-harness" ] || continue
            [ -z "$(find "$old/.berth-harness" -mmin -2880)" ] || continue
            rm -rf "$old" "$old-guest"
        done
    fi
    exec {fd}>&-
}

# A pristine debootstrapped root, in the cache.
BASE=$(cache_dir "base-$SUITE" "$BASE_STAMP")
harness_base() { cache_build "base-$SUITE" "$BASE" build_base; }
build_base() {
    log "harness: debootstrap $SUITE into $1 (about 40 s)"
    debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$1" "$(apt_archive main)" \
        >"$HARNESS_DIR/debootstrap.log" 2>&1 || die "debootstrap failed; see $HARNESS_DIR/debootstrap.log"
}

# apt_into ROOT LOG PACKAGE...: installs the packages into ROOT with its
# own apt (in a mount namespace: apt needs /proc; no service starts).
# APT_VERB=build-dep: PACKAGE is a source tree in ROOT whose
# debian/control's Build-Depends are installed.
apt_into() {
    local r=$1 log=$2
    shift 2
    unshare -m --propagation private sh -euc '
        r=$1; verb=$2; shift 2
        mount --bind "$r" "$r"
        mount -t proc proc "$r/proc"
        printf "#!/bin/sh\nexit 101\n" >"$r/usr/sbin/policy-rc.d"
        chmod 755 "$r/usr/sbin/policy-rc.d"
        chroot "$r" apt-get update -qq
        DEBIAN_FRONTEND=noninteractive chroot "$r" apt-get "$verb" -y -qq --no-install-recommends "$@"
        chroot "$r" apt-get clean
        rm "$r/usr/sbin/policy-rc.d"
    ' sh "$r" "${APT_VERB:-install}" "$@" >"$log" 2>&1 || die "apt-get ${APT_VERB:-install} $* failed; see $log"
}

# The package scenario's root: the base plus autopkgtest, whose null
# runner runs debian/tests against the installed package in the booted
# container.
PACKAGE_PACKAGES="autopkgtest"
PACKAGE_BASE=$(cache_dir "base-$SUITE-package" "$BASE_STAMP + $PACKAGE_PACKAGES v1")
harness_package_base() {
    harness_base
    cache_build "base-$SUITE-package" "$PACKAGE_BASE" build_package_base
}
build_package_base() {
    log "harness: $PACKAGE_PACKAGES into $1 (about 30 s)"
    cp -a "$BASE" "$1"
    # shellcheck disable=SC2086 # a list of package names
    apt_into "$1" "$HARNESS_DIR/package-$SUITE.log" $PACKAGE_PACKAGES
}

# The root the source package is built in (scenario 21): the base, the
# suite's security archive, build-essential, what debian/control's
# Build-Depends name (read from it, so a missing one fails the build
# there), lintian and mandoc, and a user to build as. A new
# debian/control makes a new root.
BUILD_PACKAGES="build-essential lintian mandoc"
BUILD_BASE=$(cache_dir "base-$SUITE-build" "$BASE_STAMP + $BUILD_PACKAGES + $(cksum <"$REPO/debian/control") v2")
BUILD_UID=2000
harness_build_base() {
    harness_base
    cache_build "base-$SUITE-build" "$BUILD_BASE" build_build_base
}
build_build_base() {
    local r=$1 security
    log "harness: berth's build dependencies into $r (about 2 min)"
    cp -a "$BASE" "$r"
    security=$(apt_archive security)
    printf 'deb %s %s-security main\n' "$security" "$SUITE" >"$r/etc/apt/sources.list.d/security.list"
    # shellcheck disable=SC2086 # a list of package names
    apt_into "$r" "$HARNESS_DIR/build-root-$SUITE.log" $BUILD_PACKAGES
    if [ "$SUITE" = bookworm ]; then
        # For Debian 12 the package is a backport, and backports' build
        # daemons resolve alternatives (systemd-dev is Debian 13's): all
        # of them, as apt-get build-dep does.
        install -d "$r/var/tmp/control/debian"
        cp "$REPO/debian/control" "$r/var/tmp/control/debian/"
        APT_VERB=build-dep apt_into "$r" "$HARNESS_DIR/build-deps-$SUITE.log" /var/tmp/control
        rm -rf "$r/var/tmp/control"
    else
        # Debian's own build daemons take the first alternative of each.
        APT_VERB=satisfy apt_into "$r" "$HARNESS_DIR/build-deps-$SUITE.log" \
            "$(first_alternatives "$REPO/debian/control")"
    fi
    chroot "$r" useradd --uid "$BUILD_UID" --create-home --shell /bin/bash builder
}

# first_alternatives CONTROL: CONTROL's Build-Depends, each relation's
# first alternative only.
first_alternatives() {
    python3 - "$1" <<'PY'
import sys
field, value = None, {}
for line in open(sys.argv[1], encoding="utf-8"):
    if line.startswith("#"):
        continue
    if not line.strip():
        break
    if line[0] in " \t" and field:
        value[field] += " " + line.strip()
    else:
        field, _, rest = line.partition(":")
        value[field] = rest.strip()
relations = [r.split("|")[0].strip() for r in value["Build-Depends"].split(",")]
print(", ".join(r for r in relations if r))
PY
}

# A fresh copy of the base with berth installed the way a packager would
# (make install DESTDIR=… PREFIX=/usr) and berth.target enabled, plus the
# harness's own test programs under /opt/berth-test. A run prepares it
# once (tests/harness/run exports HARNESS_PREPARED=1); a scenario started
# on its own prepares it itself.
harness_prepare() {
    harness_base
    harness_install "$BASE" "$ROOTFS"
}

# harness_install FROM TO: TO becomes a copy of the root FROM with berth
# and the harness's test programs and units installed.
harness_install() {
    local from=$1 to=$2
    log "harness: installing berth into $to"
    rm -rf "$to"
    cp -a "$from" "$to"
    make -s -C "$REPO" install DESTDIR="$to" PREFIX=/usr BUILD_DIR="$HARNESS_DIR/build" >/dev/null
    systemctl --root="$to" enable berth.target >/dev/null 2>&1 || die "systemctl --root enable berth.target failed"
    # What a package's trigger does, so that journalctl -x explains berth's records.
    journalctl --root="$to" --update-catalog || die "journalctl --update-catalog failed"
    install -d "$to/opt/berth-test"
    install -m755 "$REPO"/tests/harness/bin/* "$to/opt/berth-test/"
    # Existing services an admin runs (installed, not enabled), for the
    # `unit =` workloads of scenarios 20 and 24.
    install -m644 "$REPO"/tests/harness/units/*.service "$to/etc/systemd/system/"
    # Nothing but what a test asks for: no getty on the console.
    systemctl --root="$to" mask console-getty.service >/dev/null 2>&1 || true
}

# A root with rootful podman and a local image (busybox, no registry), for
# the container scenarios: the base plus podman, built once per recipe;
# then, like ROOTFS, a copy with berth installed. The quadlets of
# tests/harness/containers go to /etc/containers/systemd (trixie's podman
# 5 generates their units; bookworm's 4.3 has no quadlet).
PODMAN_ROOTFS=$HARNESS_DIR/root-podman
# What podman needs of nspawn here: bpf(2) through nspawn's seccomp filter
# (the device cgroup program) and CAP_NET_ADMIN (a container's own network
# namespace brings up lo, even with --network=none); and, on a host with
# the hybrid cgroup layout, a pure cgroup2 tree in the container
# (SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1), where the runtime can make its
# cgroups.
PODMAN_NSPAWN_OPTS=(--system-call-filter=bpf --capability=CAP_NET_ADMIN)
# bookworm's crun 1.8.1 cannot start a container under nspawn (it raises
# RLIMIT_MEMLOCK and is refused): runc there.
PODMAN_PACKAGES="podman busybox-static$([ "$SUITE" != bookworm ] || echo " runc")"
PODMAN_BASE=$(cache_dir "base-$SUITE-podman" "$BASE_STAMP + $PODMAN_PACKAGES, vfs, localhost/berth-test v1")
harness_podman_base() {
    harness_base
    cache_build "base-$SUITE-podman" "$PODMAN_BASE" build_podman_base
}
build_podman_base() {
    local r=$1 packages=$PODMAN_PACKAGES c=$REPO/tests/harness/containers
    log "harness: podman into $r (about 30 s)"
    cp -a "$BASE" "$r"
    install -d "$r/etc/containers/containers.conf.d" "$r/var/tmp/image/bin" "$r/var/tmp/image/out" \
        "$r/var/tmp/image/tmp"
    install -m644 "$c/storage.conf" "$r/etc/containers/storage.conf"
    install -m644 "$c/50-nspawn.conf" "$r/etc/containers/containers.conf.d/50-nspawn.conf"
    install -m755 "$c/graceful" "$r/var/tmp/image/bin/graceful"
    # In a mount namespace of its own: apt needs /proc; podman's import
    # needs / to be a mount point and /sys. No service starts in it.
    unshare -m --propagation private sh -euc '
        r=$1; packages=$2
        mount --bind "$r" "$r"
        mount -t proc proc "$r/proc"
        mount --rbind /sys "$r/sys"
        mount -t tmpfs tmpfs "$r/run"
        printf "#!/bin/sh\nexit 101\n" >"$r/usr/sbin/policy-rc.d"
        chmod 755 "$r/usr/sbin/policy-rc.d"
        chroot "$r" apt-get update -qq
        DEBIAN_FRONTEND=noninteractive chroot "$r" apt-get install -y -qq --no-install-recommends $packages
        chroot "$r" apt-get clean
        rm "$r/usr/sbin/policy-rc.d"
        cp "$r/bin/busybox" "$r/var/tmp/image/bin/busybox"
        for a in sh sleep cat echo; do ln -s busybox "$r/var/tmp/image/bin/$a"; done
        chmod 1777 "$r/var/tmp/image/tmp"
        tar -C "$r/var/tmp/image" --numeric-owner --owner=0 --group=0 -cf "$r/var/tmp/image.tar" .
        PODMAN_IGNORE_CGROUPSV1_WARNING=1 chroot "$r" podman import --quiet /var/tmp/image.tar \
            localhost/berth-test:latest
    ' sh "$r" "$packages" >"$HARNESS_DIR/podman-$SUITE.log" 2>&1 \
        || die "installing podman failed; see $HARNESS_DIR/podman-$SUITE.log"
    rm -rf "$r/var/tmp/image" "$r/var/tmp/image.tar"
}
harness_podman_root() {
    harness_podman_base
    harness_install "$PODMAN_BASE" "$PODMAN_ROOTFS"
    install -d "$PODMAN_ROOTFS/etc/containers/systemd"
    install -m644 "$REPO"/tests/harness/containers/*.service "$PODMAN_ROOTFS/etc/systemd/system/"
    install -m644 "$REPO"/tests/harness/containers/*.container "$PODMAN_ROOTFS/etc/containers/systemd/"
}

# A root with libvirt and QEMU (TCG: nested KVM does not work here) and
# machined, so that guests run in machine-qemu scopes; and a test guest
# built from the suite's own packages: the Debian cloud kernel and a
# busybox initramfs (tests/harness/guests), with an empty ext4 disk. Built
# once per recipe, like the bases. The guests' domains are defined in the
# root (/etc/libvirt/qemu) from tests/harness/guests/domain.xml, their
# files under /vm (a directory the scenario binds there). libvirt's
# translations and a German locale too: berth must read virsh the same
# in any language.
VIRT_PACKAGES="libvirt-daemon-system libvirt-daemon-driver-qemu libvirt-clients qemu-system-x86 systemd-container libvirt-l10n locales"
VIRT_LOCALE=de_DE.UTF-8
VIRT_BASE=$(cache_dir "base-$SUITE-libvirt" "$BASE_STAMP + $VIRT_PACKAGES + $VIRT_LOCALE; guest $(cat "$REPO/tests/harness/guests/init" "$REPO/tests/harness/guests/power-button" "$REPO/tests/harness/guests/agent" | cksum | cut -d' ' -f1) v1")
VIRT_ROOTFS=$HARNESS_DIR/root-libvirt
# The guest's kernel, initramfs and disk: built with the root, kept with it.
GUEST_DIR=$VIRT_BASE-guest
harness_libvirt_base() {
    harness_base
    cache_build "base-$SUITE-libvirt" "$VIRT_BASE" build_libvirt_base
}
build_libvirt_base() {
    local r=$1 packages=$VIRT_PACKAGES g=$REPO/tests/harness/guests
    log "harness: libvirt, QEMU and a test guest into $r (about a minute)"
    rm -rf "$GUEST_DIR" "$GUEST_DIR.tmp"
    cp -a "$BASE" "$r"
    unshare -m --propagation private sh -euc '
        r=$1; packages=$2
        mount --bind "$r" "$r"
        mount -t proc proc "$r/proc"
        printf "#!/bin/sh\nexit 101\n" >"$r/usr/sbin/policy-rc.d"
        chmod 755 "$r/usr/sbin/policy-rc.d"
        chroot "$r" apt-get update -qq
        DEBIAN_FRONTEND=noninteractive chroot "$r" apt-get install -y -qq --no-install-recommends $packages
        echo "$3 UTF-8" >>"$r/etc/locale.gen"
        chroot "$r" locale-gen
        # The guest: downloaded, not installed.
        kernel=$(chroot "$r" apt-cache depends linux-image-cloud-amd64 | awk "/Depends: linux-image-/ { print \$2; exit }")
        mkdir -p "$r/var/tmp/debs"
        chroot "$r" sh -c "cd /var/tmp/debs && apt-get download -q $kernel busybox-static"
        chroot "$r" apt-get clean
        rm "$r/usr/sbin/policy-rc.d"
    ' sh "$r" "$packages" "$VIRT_LOCALE" >"$HARNESS_DIR/libvirt-$SUITE.log" 2>&1 \
        || die "installing libvirt failed; see $HARNESS_DIR/libvirt-$SUITE.log"
    cat "$g/qemu.conf" >>"$r/etc/libvirt/qemu.conf"
    # No default network: it would make a bridge in the host's namespace.
    rm -f "$r/etc/libvirt/qemu/networks/autostart/default.xml"
    harness_guest "$r/var/tmp/debs" "$GUEST_DIR.tmp" >>"$HARNESS_DIR/libvirt-$SUITE.log" 2>&1 \
        || die "building the test guest failed; see $HARNESS_DIR/libvirt-$SUITE.log"
    rm -rf "$r/var/tmp/debs"
    mv "$GUEST_DIR.tmp" "$GUEST_DIR"
}
harness_libvirt_root() {
    harness_libvirt_base
    harness_install "$VIRT_BASE" "$VIRT_ROOTFS"
}

# guest_module NAME: kernel module NAME and those it depends on (each
# module's depends= field), uncompressed for busybox's modprobe, from the
# caller's $m (the kernel's modules directory) into its initramfs $i (of
# kernel $kver), with busybox $bb. Nothing for a module built in.
guest_module() {
    local f dep
    grep -q "/$1\.ko\$" "$m/modules.builtin" 2>/dev/null && return 0
    f=$(cd "$m" && find kernel -name "$1.ko" -o -name "$1.ko.xz" | head -n1)
    [ -n "$f" ] || { log "guest: no module $1"; return 1; }
    local dest=$i/lib/modules/$kver/${f%.xz}
    [ -e "$dest" ] && return 0
    mkdir -p "$(dirname "$dest")"
    case "$f" in
        *.xz) "$bb" unxz -c "$m/$f" >"$dest" ;;
        *) cp "$m/$f" "$dest" ;;
    esac
    for dep in $(grep -ao 'depends=[a-z0-9_,-]*' "$dest" | cut -d= -f2 | tr , ' '); do
        guest_module "$dep" || return 1
    done
}

# harness_guest DEBS OUT: OUT/vmlinuz, OUT/initrd.gz and OUT/disk.img (empty
# ext4, 64 MiB) from the kernel and busybox-static packages in DEBS.
harness_guest() {
    local debs=$1 out=$2 x
    x=$(mktemp -d)
    mkdir -p "$out"
    dpkg-deb -x "$debs"/linux-image-*.deb "$x/k"
    dpkg-deb -x "$debs"/busybox-static_*.deb "$x/b"
    # trixie's packages ship /usr/lib/modules and /usr/bin (merged /usr).
    local kver bb i=$x/initramfs mods=$x/k/lib/modules
    [ -d "$mods" ] || mods=$x/k/usr/lib/modules
    bb=$x/b/bin/busybox
    [ -e "$bb" ] || bb=$x/b/usr/bin/busybox
    kver=$(ls "$mods")
    cp "$x/k/boot/vmlinuz-$kver" "$out/vmlinuz"
    mkdir -p "$i"/{bin,dev,proc,sys,mnt,tmp,var/log,etc/acpi/PWRF,lib/modules/$kver}
    cp "$bb" "$i/bin/busybox"
    ln -s busybox "$i/bin/sh"
    # The modules the guest loads, with their dependencies.
    local m=$mods/$kver
    for mod in virtio_pci virtio_blk virtio_console button evdev; do guest_module "$mod" || return 1; done
    "$bb" depmod -b "$i" "$kver"
    install -m755 "$REPO/tests/harness/guests/init" "$i/init"
    install -m755 "$REPO/tests/harness/guests/power-button" "$i/etc/acpi/PWRF/00000080"
    install -m755 "$REPO/tests/harness/guests/agent" "$i/etc/agent"
    (cd "$i" && find . | sort | "$bb" cpio -o -H newc 2>/dev/null) | gzip -9 >"$out/initrd.gz"
    truncate -s 64M "$out/disk.img"
    mkfs.ext4 -q -L guest "$out/disk.img"
    rm -rf "$x"
}

# harness_define_guest NAME [CMDLINE]: a persistent domain NAME in the
# libvirt root, its disk /vm/NAME.img, its console log /vm/NAME.serial.
# agent=1 in CMDLINE gives it the guest agent's channel too.
harness_define_guest() {
    guest_xml "$@" >"$VIRT_ROOTFS/etc/libvirt/qemu/$1.xml"
}
# guest_files DIR: an empty DIR (bound as /vm) holding the guests' kernel
# and initramfs; their disks and console logs go there too.
guest_files() {
    rm -rf "$1"
    mkdir -p "$1"
    chmod 755 "$1"
    cp "$GUEST_DIR/vmlinuz" "$GUEST_DIR/initrd.gz" "$1/"
}
# guest_xml NAME [CMDLINE]: the domain's XML, for `virsh define`.
guest_xml() {
    local uuid channel=
    uuid=$(printf '%s' "$1" | md5sum | sed -E 's/^(.{8})(.{4})(.{4})(.{4})(.{12}).*/\1-\2-\3-\4-\5/')
    case " ${2:-} " in
        *" agent=1 "*) channel="<channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>" ;;
    esac
    sed "s|@NAME@|$1|g; s|@UUID@|$uuid|; s|@CMDLINE@|${2:-}|; s|@CHANNELS@|$channel|" "$REPO/tests/harness/guests/domain.xml"
}

# ---------------------------------------------------------------------------
# Containers. One at a time per scenario; state in CT_* variables.
# ---------------------------------------------------------------------------
CT_PID=
CT_NSPAWN=

# ct_boot NAME CONFIG-DIR [KERNEL-ARG...]
# Boots the prepared root as an overlay (changes vanish at exit) with
#   /etc/berth        ← a copy of CONFIG-DIR, writable from the host as $CT_DIR/etc-berth
#   /out              ← $CT_DIR/out, for files that must survive power-off
#   /var/log/journal  ← $CT_DIR/journal, read afterwards with ct_journal
#   /var/lib/berth    ← $CT_DIR/state (records, freeze flags, last-drain.json);
#                       a scenario may define ct_seed to fill it before boot
# and waits until boot is done.
ct_boot() {
    local name=$1 config=$2
    shift 2
    CT_NAME=berth-$name-$$
    # Per scenario: scenarios run side by side, and several name a node n1.
    CT_DIR=$HARNESS_DIR/run/${SCENARIO:-adhoc}/$name
    # CT_KEEP_STATE=1 boots "the same host" again: state, config and
    # journal of the previous boot of NAME are kept.
    if [ "${CT_KEEP_STATE:-}" != 1 ]; then
        rm -rf "$CT_DIR"
    fi
    mkdir -p "$CT_DIR/out" "$CT_DIR/journal" "$CT_DIR/etc-berth" "$CT_DIR/state"
    chmod 1777 "$CT_DIR/out"
    if [ -n "$config" ] && [ "${CT_KEEP_STATE:-}" != 1 ]; then
        cp -a "$config/." "$CT_DIR/etc-berth/"
    fi
    # A scenario may seed state (e.g. freeze flags) before boot.
    if declare -F ct_seed >/dev/null; then ct_seed; fi
    local root=(-D "$ROOTFS" --volatile=overlay
        --bind="$CT_DIR/etc-berth:/etc/berth"
        --bind="$CT_DIR/journal:/var/log/journal"
        --bind="$CT_DIR/state:/var/lib/berth")
    # CT_ROOT=DIR boots DIR itself instead: writable, kept across power-off
    # (a host of its own, e.g. a copy of $BASE to install a package into),
    # with only /out bound; its /etc/berth, state and journal are its own.
    [ -z "${CT_ROOT:-}" ] || root=(-D "$CT_ROOT")
    # CT_NSPAWN_OPTS: more options for nspawn itself (podman's needs).
    root+=(${CT_NSPAWN_OPTS[@]+"${CT_NSPAWN_OPTS[@]}"})
    # Every container gets cgroups of its own: containers booted at once
    # from one cgroup (--keep-unit) tear down each other's cgroups.
    harness_stat boot
    (
        ct_cgroup_remove "$CT_NAME"
        ct_cgroup_enter "$CT_NAME"
        exec systemd-nspawn --quiet --register=no --keep-unit "${root[@]}" -b \
            --machine="$CT_NAME" \
            --bind="$CT_DIR/out:/out" \
            systemd.firstboot=off systemd.unit=multi-user.target "$@"
    ) </dev/null >"$CT_DIR/console.log" 2>&1 &
    CT_NSPAWN=$!
    local i
    # nspawn forks short-lived helpers first: wait for the child that is
    # systemd itself.
    local child
    for i in $(seq 100); do
        CT_PID=
        for child in $(pgrep -P "$CT_NSPAWN" || true); do
            if [ "$(cat "/proc/$child/comm" 2>/dev/null)" = systemd ]; then CT_PID=$child; fi
        done
        [ -n "$CT_PID" ] && break
        kill -0 "$CT_NSPAWN" 2>/dev/null || die "systemd-nspawn exited at once; see $CT_DIR/console.log"
        sleep 0.1
    done
    [ -n "$CT_PID" ] || die "no container PID 1 after 10 s"
    # is-system-running needs the manager up; retry until its socket answers.
    local state=
    for i in $(seq "$BOOT_TIMEOUT"); do
        state=$(timeout "$BOOT_TIMEOUT" nsenter -t "$CT_PID" -a systemctl is-system-running --wait 2>/dev/null || true)
        case "$state" in running | degraded) break ;; esac
        sleep 1
    done
    case "$state" in
        running | degraded) ;;
        *) die "container $CT_NAME did not finish booting (state '$state'); see $CT_DIR/console.log" ;;
    esac
}

# ct_cgroup_enter NAME: moves this (sub)shell into cgroups of its own in
# the hierarchies systemd uses (name=systemd and the unified one).
CT_CGROUP_HIERARCHIES=(/sys/fs/cgroup/systemd /sys/fs/cgroup/unified /sys/fs/cgroup)
ct_cgroup_enter() {
    local h
    for h in "${CT_CGROUP_HIERARCHIES[@]}"; do
        [ -e "$h/cgroup.procs" ] || continue
        mkdir -p "$h/berth-harness-$1"
        echo "$BASHPID" >"$h/berth-harness-$1/cgroup.procs" || die "cannot move into $h/berth-harness-$1"
    done
}

# ct_cgroup_remove NAME: what is left of them once the container is gone.
ct_cgroup_remove() {
    local h
    for h in "${CT_CGROUP_HIERARCHIES[@]}"; do
        [ -d "$h/berth-harness-$1" ] || continue
        find "$h/berth-harness-$1" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    done
}

# Several containers at once ("nodes"), each in cgroups of its own:
#   node_boot NODE CONFIG-DIR [KERNEL-ARG...]   boots one (ct_boot NODE)
#   node_use NODE      makes it the one ct, ct_prop, ct_poweroff… act on
#   on NODE CMD...     runs CMD inside NODE
declare -A NODE_PID=() NODE_NSPAWN=() NODE_DIR=() NODE_NAME=()
node_boot() {
    local node=$1
    shift
    ct_boot "$node" "$@"
    NODE_PID[$node]=$CT_PID
    NODE_NSPAWN[$node]=$CT_NSPAWN
    NODE_DIR[$node]=$CT_DIR
    NODE_NAME[$node]=$CT_NAME
}
node_use() {
    CT_PID=${NODE_PID[$1]}
    CT_NSPAWN=${NODE_NSPAWN[$1]}
    CT_DIR=${NODE_DIR[$1]}
    CT_NAME=${NODE_NAME[$1]}
}
on() {
    local node=$1
    shift
    ct_exec "${NODE_NAME[$node]}" "${NODE_PID[$node]}" "$@"
}
nodes_cleanup() {
    local node
    for node in "${!NODE_NSPAWN[@]}"; do
        kill "${NODE_NSPAWN[$node]}" 2>/dev/null || true
    done
    for node in "${!NODE_NSPAWN[@]}"; do
        local i
        for i in $(seq 50); do kill -0 "${NODE_NSPAWN[$node]}" 2>/dev/null || break; sleep 0.2; done
        kill -9 "${NODE_NSPAWN[$node]}" 2>/dev/null || true
        ct_cgroup_remove "${NODE_NAME[$node]}"
    done
}

# wait_for SECONDS COMMAND...: until COMMAND succeeds; fails after SECONDS
# of wall time (not a count of tries: under load a try takes longer). Polls
# every 0.1 s for the first 2 s, then backs off to at most 0.5 s, so that
# waits measured to the second stay accurate and long waits cost little.
wait_for() {
    local start=${EPOCHREALTIME//[!0-9]/} pause=100000 now
    local deadline=$((start + $1 * 1000000))
    while :; do
        "${@:2}" >/dev/null 2>&1 && return 0
        now=${EPOCHREALTIME//[!0-9]/}
        [ "$now" -lt "$deadline" ] || return 1
        if [ $((now - start)) -ge 2000000 ]; then
            pause=$((pause * 3 / 2))
            [ "$pause" -le 500000 ] || pause=500000
        fi
        sleep "$((pause / 1000000)).$(printf '%06d' $((pause % 1000000)))"
    done
}

# Runs a command inside the container.
ct() { ct_exec "$CT_NAME" "$CT_PID" "$@"; }

# ct_exec NAME PID COMMAND...: COMMAND in the container's namespaces and
# in its root cgroup. nsenter leaves a process in the caller's cgroup,
# which lies outside the container's own (it reads /../../init.scope
# there), and trixie's logind refuses such a caller (EUNATCH, "Protocol
# driver not attached", to loginctl enable-linger).
ct_exec() {
    local name=$1 pid=$2
    shift 2
    (
        for h in "${CT_CGROUP_HIERARCHIES[@]}"; do
            [ ! -e "$h/berth-harness-$name/cgroup.procs" ] \
                || echo "$BASHPID" >"$h/berth-harness-$name/cgroup.procs" 2>/dev/null || true
        done
        exec nsenter -t "$pid" -a "$@"
    )
}

# ct_prop UNIT PROPERTY: one property value.
ct_prop() { ct systemctl show -P "$2" "$1"; }

# ct_poweroff: a real shutdown transaction; waits until the container is gone.
ct_poweroff() {
    ct systemctl poweroff --no-block >/dev/null 2>&1 || true
    ct_wait_exit "${1:-120}"
}

ct_wait_exit() {
    local limit=$1
    harness_stat poweroff
    if wait_for "$limit" ct_gone; then
        wait "$CT_NSPAWN" 2>/dev/null || true
        CT_PID=
        ct_cgroup_remove "$CT_NAME"
        return 0
    fi
    die "container $CT_NAME still running ${limit} s after power-off"
}
ct_gone() { ! kill -0 "$CT_NSPAWN" 2>/dev/null; }

# The container's journal, from the host (works after power-off).
ct_journal() { journalctl --directory="$(find "$CT_DIR/journal" -mindepth 1 -maxdepth 1 -type d | head -n1)" --no-pager "$@"; }

ct_cleanup() {
    if [ -n "$CT_NSPAWN" ] && kill -0 "$CT_NSPAWN" 2>/dev/null; then
        kill "$CT_NSPAWN" 2>/dev/null || true
        wait_for 5 ct_gone || kill -9 "$CT_NSPAWN" 2>/dev/null || true
        wait_for 5 ct_gone || true
    fi
    [ -z "${CT_NAME:-}" ] || ct_cgroup_remove "$CT_NAME"
}

# harness_stat WHAT: counts a boot or a power-off in the job's figures
# (HARNESS_STATS, set by the scheduler).
harness_stat() { [ -z "${HARNESS_STATS:-}" ] || echo "$1" >>"$HARNESS_STATS"; }

# harness_allow_tasks N: the benchmarks at thousands of workloads need
# more tasks than a sandbox's pids cgroup may allow (this machine's is 15%
# of pid_max, 4915: the container's PID 1 failed to fork at ~4880 units).
# The limit of the cgroup this shell runs in (v1 or v2) is raised to N for
# the run and put back by harness_restore_tasks; a limit that cannot be
# written is reported, and the benchmark then fails where systemd does.
TASKS_FILE=
TASKS_BEFORE=
harness_allow_tasks() {
    local need=$1 path file now
    path=$(awk -F: '$2 == "pids" { print $3; exit }' /proc/self/cgroup)
    if [ -n "$path" ]; then
        file=/sys/fs/cgroup/pids$path/pids.max
    else
        path=$(awk -F: '$1 == "0" { print $3; exit }' /proc/self/cgroup)
        file=/sys/fs/cgroup$path/pids.max
    fi
    [ -f "$file" ] || return 0
    now=$(cat "$file")
    if [ "$now" != max ] && [ "$now" -lt "$need" ]; then
        if echo "$need" >"$file" 2>/dev/null; then
            TASKS_FILE=$file
            TASKS_BEFORE=$now
            log "harness: $file raised from $now to $need for this run"
        else
            log "harness: $file is $now, below the $need tasks this run needs, and cannot be raised"
        fi
    fi
}
harness_restore_tasks() {
    [ -z "$TASKS_FILE" ] || echo "$TASKS_BEFORE" >"$TASKS_FILE" 2>/dev/null || true
}

# ---------------------------------------------------------------------------
# Assertions. Each prints one line; the scenario's summary counts them.
# ---------------------------------------------------------------------------
PASSED=0
FAILED=0
ok() { PASSED=$((PASSED + 1)); printf '  ok    %s\n' "$1"; }
not_ok() {
    FAILED=$((FAILED + 1))
    printf '  FAIL  %s\n' "$1"
    [ -z "${2:-}" ] || printf '%s\n' "$2" | sed 's/^/        /'
}

# check DESCRIPTION COMMAND...: passes when COMMAND succeeds.
check() {
    local desc=$1 out
    shift
    if out=$("$@" 2>&1); then ok "$desc"; else not_ok "$desc" "$out"; fi
}

# check_eq DESCRIPTION EXPECTED ACTUAL
check_eq() {
    if [ "$2" = "$3" ]; then ok "$1"; else not_ok "$1" "expected: $2"$'\n'"actual:   $3"; fi
}

# check_contains DESCRIPTION NEEDLE HAYSTACK
check_contains() {
    case "$3" in
        *"$2"*) ok "$1" ;;
        *) not_ok "$1" "missing: $2"$'\n'"in: $3" ;;
    esac
}

# check_lacks DESCRIPTION NEEDLE HAYSTACK
check_lacks() {
    case "$3" in
        *"$2"*) not_ok "$1" "unexpected: $2"$'\n'"in: $3" ;;
        *) ok "$1" ;;
    esac
}

# check_exposure UNIT BELOW [MANAGER_FLAG]: systemd-analyze security's
# overall exposure of UNIT, as the booted container's systemd rates it, is
# below BELOW (a figure like 3.05 for "at most 3.0": it prints one decimal).
# The figure goes into the check's description (the job's log).
check_exposure() {
    local unit=$1 below=$2 out level
    out=$(ct systemd-analyze security ${3:-} --no-pager "$unit" 2>&1 | tail -n 1)
    level=$(printf '%s
' "$out" | sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\) .*/\1/p')
    if [ -z "$level" ]; then
        not_ok "systemd-analyze security rates $unit" "no figure in: $out"
        return
    fi
    check "$unit: exposure $level, below $below (systemd $(ct systemctl --version | awk 'NR == 1 { print $2 }'))" \
        awk -v l="$level" -v b="$below" 'BEGIN { exit !(l < b) }'
}

# Scenario entry point: prepares the root when run on its own, and reports
# its counts (to $HARNESS_RESULTS when run by tests/harness/run).
scenario_begin() {
    SCENARIO=$1
    log "== scenario $SCENARIO"
    if [ -z "${HARNESS_PREPARED:-}" ]; then
        local missing
        missing=$(harness_missing)
        [ -z "$missing" ] || die "missing: $missing"
        harness_prepare
    fi
    trap scenario_end EXIT
}

scenario_end() {
    local rc=$?
    ct_cleanup
    nodes_cleanup
    if [ "$rc" -ne 0 ] && [ "$FAILED" -eq 0 ]; then
        FAILED=1
        printf '  FAIL  scenario aborted (exit %s)\n' "$rc"
    fi
    printf '%s: %s passed, %s failed\n' "$SCENARIO" "$PASSED" "$FAILED"
    [ -z "${HARNESS_RESULTS:-}" ] || printf '%s %s %s\n' "$SCENARIO" "$PASSED" "$FAILED" >>"$HARNESS_RESULTS"
    [ "$FAILED" -eq 0 ]
}
