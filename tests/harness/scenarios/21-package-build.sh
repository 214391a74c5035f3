#!/usr/bin/env bash
# harness-job: class=background minutes=8 timeout=40
# The source package (debian/make-source-package) built the way a Debian
# build daemon builds it: dpkg-buildpackage in a root made of the suite's
# own packages only (its Build-Depends, with rustc-web and cargo-web 1.96:
# tests/harness/lib.sh, build_build_base), as an unprivileged user, with
# no network.
#  1. the source and binary packages build; the build used Debian's
#     toolchain and the vendored crates;
#  2. the suite's own lintian finds no error or warning in the source or
#     binary packages; mandoc -Tlint finds nothing in the packaged pages;
#  3. the .debs go to $HARNESS_DIR/debs for scenario 13 (install,
#     upgrade, remove, purge), which runs after this;
#  4. with HARNESS_REPRODUCIBLE=1 (make check-reproducible), a second
#     build in another directory gives the same .debs byte for byte.
# CPU-bound for minutes: the class runs it under SCHED_IDLE, on what the
# other jobs leave of the CPU (tests/harness/schedule.py).
source "$(dirname "$0")/../lib.sh"
scenario_begin 21-package-build

# Scenario 13 installs what this leaves in $HARNESS_DIR/debs: nothing of
# an earlier run's.
rm -rf "$HARNESS_DIR/debs"
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.0f", b - a }'; }

# The source package: one per run for both suites (tests/harness/run
# names its directory, empty), made by whichever build comes first, here
# in the idle time rather than before the run; on its own, one of its own.
SOURCE=${HARNESS_SOURCE:-}
if [ -z "$SOURCE" ]; then
    SOURCE=$HARNESS_DIR/source
    rm -rf "$SOURCE"
fi
mkdir -p "$SOURCE"
exec {source_lock}>"$SOURCE.lock"
flock "$source_lock"
if [ ! -f "$SOURCE/.made" ]; then
    t=$(now)
    "$REPO/debian/make-source-package" "$SOURCE" >"$SOURCE.log" 2>&1 \
        || die "debian/make-source-package failed; see $SOURCE.log"
    touch "$SOURCE/.made"
    log "  measured: debian/make-source-package took $(since "$t") s"
fi
flock -u "$source_lock"
dsc=$(cd "$SOURCE" && ls ./*.dsc)
dsc=${dsc#./}
version=$(sed -n 's/^Version: //p' "$SOURCE/$dsc")
version=${version#*:} # file names carry no epoch
upstream=${version%-*}
arch=$(dpkg --print-architecture)
check "the source package has its two upstream tarballs" \
    test -f "$SOURCE/berth_$upstream.orig.tar.xz" -a -f "$SOURCE/berth_$upstream.orig-vendor.tar.xz"
prebuilt=$(tar -tJf "$SOURCE/berth_$upstream.orig-vendor.tar.xz" | grep -E '\.(a|lib|o|obj|dll|exe|so|dylib)$' || true)
check_eq "... and its vendored crates no prebuilt object" "" "$prebuilt"

harness_build_base
WORK=$HARNESS_DIR/package-build
rm -rf "$WORK"
# Two directories of different depth: the second build must not depend on
# where the first one was unpacked.
mkdir -p "$WORK/a" "$WORK/b/second/tree"
cp "$SOURCE"/* "$WORK/a/"
cp "$SOURCE"/* "$WORK/b/second/tree/"
chown -R "$BUILD_UID:$BUILD_UID" "$WORK"

# in_build_root DIR SCRIPT: SCRIPT (bash) as the build user in DIR (under
# /build), in the build root: a throwaway overlay, no network. What SCRIPT
# prints, on stdout and stderr, is the output; nspawn's own messages go to
# $WORK/nspawn.log.
in_build_root() {
    (
        name=berth-build-$SUITE-$$
        ct_cgroup_remove "$name"
        ct_cgroup_enter "$name"
        # With the cpu controller on (cgroup v2), the kernel shares the
        # CPU between cgroups before SCHED_IDLE counts inside one: this
        # cgroup is marked idle too (Linux 5.15), or weighs the least.
        for h in "${CT_CGROUP_HIERARCHIES[@]}"; do
            g=$h/berth-harness-$name
            if [ -w "$g/cpu.idle" ]; then echo 1 >"$g/cpu.idle" || true
            elif [ -w "$g/cpu.weight" ]; then echo 1 >"$g/cpu.weight" || true; fi
        done
        exec systemd-nspawn --quiet --register=no --keep-unit --as-pid2 --console=pipe \
            -D "$BUILD_BASE" --volatile=overlay --private-network \
            --machine="$name" --bind="$WORK:/build" --user=builder --chdir="/build/$1" \
            --setenv=LC_ALL=C.UTF-8 --setenv=DEB_BUILD_OPTIONS=parallel=2 \
            --setenv=DPKG_COLORS=never --setenv=CARGO_TERM_COLOR=never \
            bash -euo pipefail -c "exec 2>&1; $2" 2>>"$WORK/nspawn.log"
    ) </dev/null
}

# --- 1. the first build -------------------------------------------------------
check_eq "the build root has no network (only lo)" "lo" "$(in_build_root a 'ls /sys/class/net | xargs')"
toolchain=$(in_build_root a 'printf "%s %s; %s\n" "$(dpkg -S "$(command -v rustc)" | cut -d: -f1)" "$(rustc --version | cut -d" " -f2)" "$(dpkg -S "$(command -v cargo)" | cut -d: -f1)"')
check_eq "its rustc and cargo are Debian's rustc-web and cargo-web ($toolchain)" "rustc-web cargo-web" \
    "$(printf '%s\n' "$toolchain" | sed -E 's/^([^ ]+) [^;]+; (.*)$/\1 \2/')"

t=$(now)
out=$(in_build_root a "dpkg-source -x $dsc berth-$upstream >/dev/null && cd berth-$upstream && dpkg-buildpackage -us -uc" 2>&1) && rc=0 || rc=$?
first_s=$(since "$t")
printf '%s\n' "$out" >"$WORK/build-a.log"
check_eq "dpkg-buildpackage -us -uc (source and binaries) exits 0 in $first_s s" "0" \
    "$rc$([ "$rc" = 0 ] || printf '\n%s' "$(printf '%s\n' "$out" | tail -n 40)")"
log "  measured: the first build (source and binaries) took $first_s s"
debs=$(cd "$WORK/a" && LC_ALL=C ls -- *.deb 2>/dev/null | xargs) || true
check_eq "it made berth and berth-libvirt" "berth-libvirt_${version}_$arch.deb berth_${version}_$arch.deb" "$debs"
[ -n "$debs" ] || die "no package built; see $WORK/build-a.log"

# --- 2. lintian, mandoc -------------------------------------------------------
changes=berth_${version}_$arch.changes
out=$(in_build_root a "lintian --fail-on error,warning $changes" 2>&1) && rc=0 || rc=$?
printf '%s\n' "$out" >"$WORK/lintian.log"
lintian_version=$(in_build_root a 'lintian --version | cut -d" " -f2')
check_eq "lintian $lintian_version ($SUITE) finds no error or warning in the source and binary packages" "0:" \
    "$rc:$out"
# Uncompressed first: Debian 13's mandoc reads no gzip.
pages=$(in_build_root a 'rm -rf pages && mkdir pages && for d in *.deb; do dpkg-deb -x "$d" pages; done && gunzip pages/usr/share/man/man*/*.gz && ls pages/usr/share/man/man*/* | wc -l')
out=$(in_build_root a 'mandoc -Tlint -W warning pages/usr/share/man/man*/*') && rc=0 || rc=$?
check_eq "mandoc -Tlint finds nothing in the $pages packaged man pages" "0:" "$rc:$out"
check_eq "... one for each page in man/" "$(find "$REPO/man" -name '*.scd' | wc -l)" "$pages"

# --- 3. the packages, for scenario 13 ------------------------------------------
mkdir -p "$HARNESS_DIR/debs"
for deb in $debs; do cp "$WORK/a/$deb" "$HARNESS_DIR/debs/"; done
# Which source they were built from: scenario 13 refuses others.
sha256sum <"$SOURCE/$dsc" | cut -d' ' -f1 >"$HARNESS_DIR/debs/source.sha256"

# --- 4. a second build (HARNESS_REPRODUCIBLE=1: make check-reproducible) ------
# Another full build of the same source: not in `make check`, whose budget
# it does not fit (about 7 CPU-minutes per suite).
if [ "${HARNESS_REPRODUCIBLE:-}" = 1 ]; then
    t=$(now)
    out=$(in_build_root b/second/tree "dpkg-source -x $dsc berth-$upstream >/dev/null && cd berth-$upstream && dpkg-buildpackage -us -uc -b" 2>&1) && rc=0 || rc=$?
    second_s=$(since "$t")
    printf '%s\n' "$out" >"$WORK/build-b.log"
    check_eq "a second build in another directory exits 0 in $second_s s" "0" \
        "$rc$([ "$rc" = 0 ] || printf '\n%s' "$(printf '%s\n' "$out" | tail -n 40)")"
    log "  measured: the second build (binaries) took $second_s s"
    for deb in $debs; do
        a=$(sha256sum <"$WORK/a/$deb" | cut -d' ' -f1)
        b=$(sha256sum <"$WORK/b/second/tree/$deb" 2>/dev/null | cut -d' ' -f1) || b="(not built)"
        check_eq "$deb is the same byte for byte (sha256 ${a:0:16}…)" "$a" "$b"
    done
fi

# The trees are large (cargo's target): only the logs stay.
find "$WORK" -mindepth 1 -maxdepth 4 -type d -name "berth-$upstream" -exec rm -rf {} +
