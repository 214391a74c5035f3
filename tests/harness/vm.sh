# Sourced by the watchdog scenario after lib.sh and etcd.sh: a node that
# is a QEMU guest (TCG: nested KVM does not work here) booting the suite's
# prepared root with systemd and berth, with an emulated i6300esb watchdog.
# A watchdog device is only ever opened inside such a guest: the host and
# its containers share one kernel, and a reset would take the machine
# running the tests down with it.
#
# The guest's kernel is Debian's generic one (Debian 12's cloud kernel has
# no i6300esb driver), booted directly with a busybox initramfs
# (tests/harness/vm/init) that mounts the root image, copies berth's
# config from a host share, and hands over to systemd. Its network is
# QEMU's user networking: the host's loopback, where etcd and the relays
# listen, is 10.0.2.2 there. Commands run in it through an agent on a
# virtio serial port (vm_run), and the workloads' logs come back on
# another, through tests/harness/vm/bridge: serial ports, unlike 9p,
# work again after a suspend to RAM. QMP gives the host's view (vm_qmp,
# and every event with the host's time in $VM_DIR/events.log).
# shellcheck shell=bash

command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 is needed (make deps installs qemu-system-x86)"
VM_MODULES="virtio_pci virtio_blk virtio_net virtio_console i6300esb 9pnet_virtio 9p ext4 crc32c_generic"
VM_BASE=$(cache_dir "vm-$SUITE" "$BASE_STAMP; $VM_MODULES; $(cksum <"$REPO/tests/harness/vm/init" | cut -d' ' -f1) v1")

# The guest's kernel and initramfs, built once per suite from its own
# packages (downloaded into a throwaway copy of the base, not installed).
harness_vm_kernel() {
    harness_base
    cache_build "vm-$SUITE" "$VM_BASE" build_vm_kernel
}
build_vm_kernel() {
    local out=$1 r
    log "harness: the watchdog guest's kernel and initramfs into $out (about a minute)"
    r=$(mktemp -d "$HARNESS_DIR/vm-kernel.XXXXXX")
    cp -a "$BASE" "$r/root"
    unshare -m --propagation private sh -euc '
        r=$1
        mount --bind "$r" "$r"
        mount -t proc proc "$r/proc"
        chroot "$r" apt-get update -qq
        kernel=$(chroot "$r" apt-cache depends linux-image-amd64 | awk "/Depends: linux-image-/ { print \$2; exit }")
        mkdir -p "$r/var/tmp/debs"
        chroot "$r" sh -c "cd /var/tmp/debs && apt-get download -q $kernel busybox-static"
    ' sh "$r/root" >"$HARNESS_DIR/vm-kernel-$SUITE.log" 2>&1 \
        || die "downloading the guest's kernel failed; see $HARNESS_DIR/vm-kernel-$SUITE.log"
    vm_initramfs "$r/root/var/tmp/debs" "$out" >>"$HARNESS_DIR/vm-kernel-$SUITE.log" 2>&1 \
        || die "building the guest's initramfs failed; see $HARNESS_DIR/vm-kernel-$SUITE.log"
    rm -rf "$r"
}

# vm_initramfs DEBS OUT: OUT/vmlinuz and OUT/initrd.gz from the kernel and
# busybox-static packages in DEBS.
vm_initramfs() {
    local debs=$1 out=$2 x kver bb i m mod mods
    x=$(mktemp -d)
    mkdir -p "$out"
    dpkg-deb -x "$debs"/linux-image-*.deb "$x/k"
    dpkg-deb -x "$debs"/busybox-static_*.deb "$x/b"
    mods=$x/k/lib/modules
    [ -d "$mods" ] || mods=$x/k/usr/lib/modules
    bb=$x/b/bin/busybox
    [ -e "$bb" ] || bb=$x/b/usr/bin/busybox
    kver=$(ls "$mods")
    cp "$x/k/boot/vmlinuz-$kver" "$out/vmlinuz"
    i=$x/initramfs
    mkdir -p "$i"/{bin,dev,proc,sys,newroot,etc,lib/modules/$kver}
    cp "$bb" "$i/bin/busybox"
    ln -s busybox "$i/bin/sh"
    m=$mods/$kver
    : >"$i/etc/modules-to-load"
    for mod in $VM_MODULES; do
        # crc32c may be built in under another name: optional.
        if guest_module "$mod"; then
            echo "$mod" >>"$i/etc/modules-to-load"
        elif [ "$mod" != crc32c_generic ]; then
            return 1
        fi
    done
    "$bb" depmod -b "$i" "$kver"
    install -m755 "$REPO/tests/harness/vm/init" "$i/init"
    (cd "$i" && find . | sort | "$bb" cpio -o -H newc 2>/dev/null) | gzip -9 >"$out/initrd.gz"
    rm -rf "$x"
}

# vm_image: the guest's root disk, an ext4 image of the prepared root
# ($ROOTFS, berth installed), made for this run; QEMU opens it as a
# snapshot, so the image itself stays as made.
VM_IMAGE=$HARNESS_DIR/vm-root.img
vm_image() {
    local lock
    exec {lock}>"$VM_IMAGE.lock"
    flock "$lock"
    if [ ! -f "$VM_IMAGE" ] || [ "$ROOTFS" -nt "$VM_IMAGE" ] || [ -n "$(find "$ROOTFS/usr/bin/berth" -newer "$VM_IMAGE")" ]; then
        rm -f "$VM_IMAGE.tmp"
        truncate -s 2G "$VM_IMAGE.tmp"
        mkfs.ext4 -q -L vmroot -d "$ROOTFS" "$VM_IMAGE.tmp" || die "mkfs.ext4 -d $ROOTFS failed"
        mv "$VM_IMAGE.tmp" "$VM_IMAGE"
    fi
    exec {lock}>&-
}

VM_PID=
VM_EVENTS_PID=
VM_BRIDGE_PID=
VM_DIR=
# vm_boot NAME CONFIG-DIR [KERNEL-ARG...]: boots the guest NAME with a
# copy of CONFIG-DIR as its /etc/berth (copied again at each boot, from
# $VM_DIR/boot/berth); waits until its system is up and the agent
# answers. Its console goes to $VM_DIR/console.log (with the journal's
# warnings: what a reset cuts short never reaches the journal's file),
# QMP events to events.log, the lines of its /out/db.log to
# $VM_DIR/out/db.log as they land.
vm_boot() {
    local name=$1 config=$2
    shift 2
    harness_vm_kernel
    vm_image
    VM_DIR=$HARNESS_DIR/run/${SCENARIO:-adhoc}/$name
    rm -rf "$VM_DIR"
    mkdir -p "$VM_DIR/boot/berth" "$VM_DIR/out" "$VM_DIR/ctl"
    cp -a "$config/." "$VM_DIR/boot/berth/"
    install -m755 "$REPO/tests/harness/vm/agent" "$REPO/tests/harness/vm/forward" "$VM_DIR/boot/"
    # The disk a stalled workload reads from (vm_stall_disk).
    truncate -s 64M "$VM_DIR/stall.img"
    local port ports=(-device virtio-serial-pci,id=vser)
    for port in agent out; do
        ports+=(-chardev "socket,id=$port,path=$VM_DIR/$port.sock,server=on,wait=off"
            -device "virtserialport,bus=vser.0,chardev=$port,name=$port")
    done
    harness_stat boot
    qemu-system-x86_64 -machine pc,accel=tcg -m 768 -smp 1 \
        -nodefaults -no-user-config -display none \
        -serial "file:$VM_DIR/console.log" \
        -kernel "$VM_BASE/vmlinuz" -initrd "$VM_BASE/initrd.gz" \
        -append "console=ttyS0 net.ifnames=0 panic=-1 systemd.firstboot=off systemd.unit=multi-user.target systemd.show_status=error systemd.mask=serial-getty@ttyS0.service systemd.journald.forward_to_console=1 systemd.journald.max_level_console=warning clocksource=hpet $*" \
        -drive "file=$VM_IMAGE,if=virtio,format=raw,snapshot=on" \
        -drive "file=$VM_DIR/stall.img,if=none,id=stall,format=raw,cache=none" \
        -device virtio-blk-pci,drive=stall,id=stalldev,serial=stall \
        -netdev user,id=net0 -device virtio-net-pci,netdev=net0 \
        -device i6300esb -action watchdog=reset \
        -fsdev "local,id=boot,path=$VM_DIR/boot,security_model=none,readonly=on" \
        -device virtio-9p-pci,fsdev=boot,mount_tag=boot \
        "${ports[@]}" \
        -qmp "unix:$VM_DIR/qmp.sock,server=on,wait=off" \
        -qmp "unix:$VM_DIR/events.sock,server=on,wait=off" \
        </dev/null >"$VM_DIR/qemu.log" 2>&1 &
    VM_PID=$!
    "$REPO/tests/harness/vm/qmp" --events "$VM_DIR/events.sock" >"$VM_DIR/events.log" 2>&1 &
    VM_EVENTS_PID=$!
    "$REPO/tests/harness/vm/bridge" "$VM_DIR/agent.sock" "$VM_DIR/out.sock" "$VM_DIR/ctl" "$VM_DIR/out" \
        >"$VM_DIR/bridge.log" 2>&1 &
    VM_BRIDGE_PID=$!
    vm_wait_up "$BOOT_TIMEOUT_VM" || die "the guest $name did not come up in $BOOT_TIMEOUT_VM s; see $VM_DIR/console.log"
}
# Under TCG beside the other nodes a boot takes tens of seconds.
BOOT_TIMEOUT_VM=${BOOT_TIMEOUT_VM:-240}

# vm_wait_up SECONDS: the guest's manager is up (running or degraded) and
# its agent answers.
vm_wait_up() {
    local state
    wait_for "$1" vm_up
}
vm_up() {
    kill -0 "$VM_PID" 2>/dev/null || die "QEMU exited; see $VM_DIR/qemu.log and $VM_DIR/console.log"
    case "$(vm_run_within 20 systemctl is-system-running 2>/dev/null)" in
        running | degraded) return 0 ;;
    esac
    return 1
}

# vm_run CMD...: runs the shell command CMD... in the guest (as root, in
# the agent's service); prints its output, returns its status. Fails
# after 60 s without an answer.
vm_run() { vm_run_within 60 "$@"; }
vm_run_within() {
    local limit=$1 n
    shift
    # Unique without a counter: callers run it in subshells ($(...)).
    n=$VM_DIR/ctl/${EPOCHREALTIME//[!0-9]/}-$BASHPID
    printf '%s\n' "$*" >"$n.tmp"
    mv "$n.tmp" "$n.cmd"
    wait_for "$limit" test -e "$n.rc" || { echo "vm_run: no answer within $limit s: $*" >&2; return 124; }
    cat "$n.out"
    return "$(cat "$n.rc")"
}

# vm_qmp COMMAND [JSON-ARGUMENTS]: one QMP command; prints its return.
vm_qmp() { "$REPO/tests/harness/vm/qmp" "$VM_DIR/qmp.sock" "$@"; }

# vm_events NAME: the host times of each QMP event NAME so far.
vm_events() { awk -v e="$1" '$2 == e { print $1 }' "$VM_DIR/events.log"; }

# vm_pause SECONDS: pauses the whole guest (QMP stop) for SECONDS and
# resumes it; then waits up to 60 s for a new stop-end line in its db log
# (a file on a host share: the host sees the line as it lands). Prints the
# host times of the pause, the resume and that line (0 when none came).
vm_pause() {
    local before paused resumed stopped
    before=$(vm_db_stops)
    vm_qmp stop >/dev/null
    paused=$(date +%s.%N)
    sleep "$1"
    vm_qmp cont >/dev/null
    resumed=$(date +%s.%N)
    stopped=$(vm_db_stop_after "$before")
    echo "$paused $resumed $stopped"
}

# vm_suspend UNTIL: suspends the guest to RAM (systemctl suspend in it),
# wakes it at the host time UNTIL (QMP system_wakeup), then
# waits up to 60 s for a new stop-end line in its db log. Prints the host
# times of the suspend (QMP's SUSPEND), the wake-up and that line (0 when
# none came); returns 1 when the guest did not suspend within 30 s.
vm_suspend() {
    local before t0 suspended woke stopped
    before=$(vm_db_stops)
    t0=$(date +%s.%N)
    # Delayed: the agent answers before user space freezes.
    vm_run '(sleep 1; systemctl suspend) >/dev/null 2>&1 &' >/dev/null
    wait_for 30 vm_event_after SUSPEND "$t0" || return 1
    suspended=$(vm_event_after SUSPEND "$t0")
    sleep "$(python3 -c "print(max(0.0, $1 - $(date +%s.%N)))")"
    vm_qmp system_wakeup >/dev/null
    woke=$(date +%s.%N)
    stopped=$(vm_db_stop_after "$before")
    echo "$suspended $woke $stopped"
}
# vm_event_after NAME T: the host time of the first QMP event NAME after T.
vm_event_after() { vm_events "$1" | awk -v t="$2" '$1 > t { print; found = 1; exit } END { exit !found }'; }

# vm_db_stop_after N: the host time at which the db log has more than N
# stop-end lines, polled every 50 ms for up to 60 s (0 when it did not).
vm_db_stop_after() {
    local _
    for _ in $(seq 1200); do
        if [ "$(vm_db_stops)" -gt "$1" ]; then
            date +%s.%N
            return
        fi
        sleep 0.05
    done
    echo 0
}
vm_db_stops() {
    local n
    n=$(grep -c '^stop-end ' "$VM_DIR/out/db.log" 2>/dev/null) || true
    echo "${n:-0}"
}

vm_cleanup() {
    [ -z "$VM_PID" ] || { kill "$VM_PID" 2>/dev/null || true; wait "$VM_PID" 2>/dev/null || true; }
    [ -z "$VM_EVENTS_PID" ] || kill "$VM_EVENTS_PID" 2>/dev/null || true
    [ -z "$VM_BRIDGE_PID" ] || kill "$VM_BRIDGE_PID" 2>/dev/null || true
}
