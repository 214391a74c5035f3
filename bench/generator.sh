#!/usr/bin/env bash
# Benchmark: berth-generator on N workloads against systemd's own
# systemd-fstab-generator on N fstab entries, N = 1000 and 5000 (issue 16),
# measured in the same run so both see the same machine load. Prints the
# median ratio berth/fstab per N and whether it meets the target (<= 0.75).
# Exits 0 whatever the ratio; non-zero only on setup errors or a failing
# generator.
#
#   bench/generator.sh                    # 21 timed runs of each
#   SIZES="1000" bench/generator.sh
#   RUNS=51 bench/generator.sh
#   BERTH_GENERATOR=/path/to/berth-generator bench/generator.sh
set -euo pipefail

cd "$(dirname "$(readlink -f "$0")")/.."

SIZES=${SIZES:-1000 5000}
WARMUP=3
RUNS=${RUNS:-21}
TARGET=0.75
GEN=${BERTH_GENERATOR:-target/release/berth-generator}
FSTABGEN=/lib/systemd/system-generators/systemd-fstab-generator

die() { echo "bench/generator.sh: $*" >&2; exit 1; }

[[ $RUNS =~ ^[1-9][0-9]*$ ]] || die "RUNS must be a positive integer, not '$RUNS'"
[[ -x $GEN ]] || die "berth generator not found at $GEN (run 'cargo build --release' or set BERTH_GENERATOR)"
[[ -x $FSTABGEN ]] || die "reference generator not found at $FSTABGEN (systemd not installed?)"
command -v python3 >/dev/null || die "python3 is needed to time the runs"
GEN=$(readlink -f "$GEN")

# Everything -- inputs and outputs -- lives on tmpfs, so we time the
# generators, not the disk.
TMP=$(mktemp -d -p /dev/shm berth-bench.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
fstype=$(stat -f -c %T "$TMP")
[[ $fstype == tmpfs ]] || die "$TMP is on $fstype, not tmpfs"

# --- Inputs -----------------------------------------------------------------

for N in $SIZES; do
ROOT=$TMP/root-$N
mkdir -p "$ROOT/etc/berth/workloads"
echo 'drain_parallelism = 8' >"$ROOT/etc/berth/berth.toml"
for ((i = 1; i <= N; i++)); do
    printf '%s\n' \
        "description = \"bench workload $i\"" \
        'exec = ["/usr/bin/sleep", "infinity"]' \
        "order = $((i % 10))" \
        'stop_delay_s = 30' \
        'after = ["network-online.target"]' \
        '' \
        '[environment]' \
        "SLOT = \"$i\"" \
        '' \
        '[service]' \
        'MemoryMax = "512M"' \
        >"$ROOT/etc/berth/workloads/w$(printf %04d "$i").toml"
done

# nofail keeps the entries realistic for data disks; the generator still
# writes a .mount unit and a local-fs.target.wants link for each.
FSTAB=$TMP/fstab-$N
{
    echo '# <file system> <mount point> <type> <options> <dump> <pass>'
    for ((i = 1; i <= N; i++)); do
        printf '/dev/disk/by-uuid/%08x-%04x-4%03x-8%03x-%012x /srv/d%04d ext4 defaults,nofail 0 2\n' \
            $((0x5eed0000 + i)) $((i * 7 % 65536)) $((i % 4096)) $((i * 13 % 4096)) $((i * 2654435761 % 281474976710656)) "$i"
    done
} >"$FSTAB"

# --- Timing -----------------------------------------------------------------

# The loop is in Python: one long-lived process spawning both generators the
# same way (posix_spawn + waitpid around perf_counter_ns) gives identical,
# small overhead to each, unlike forking `date` around every run.
#
# systemd-fstab-generator environment: SYSTEMD_FSTAB replaces /etc/fstab,
# SYSTEMD_PROC_CMDLINE="" keeps the host's kernel command line (fstab=,
# systemd.swap=, ...) out of it, SYSTEMD_IN_INITRD=0 pins the non-initrd
# code path (otherwise it would read /sysroot/etc/fstab).
export GEN FSTABGEN ROOT FSTAB TMP N WARMUP RUNS TARGET
python3 - <<'EOF'
import os, shutil, statistics, sys, time

env = dict(os.environ)
tmp, n = env["TMP"], int(env["N"])
warmup, runs, target = int(env["WARMUP"]), int(env["RUNS"]), float(env["TARGET"])

def check_berth(out):
    got = sum(1 for e in os.listdir(f"{out}/n") if e.startswith("berth@"))
    return got == n, f"wrote {got} berth@ drop-ins, expected {n}"

def check_fstab(out):
    got = sum(1 for e in os.listdir(f"{out}/n") if e.endswith(".mount"))
    # With a read-only /sys (most containers) systemd 252 silently skips every
    # /dev entry, which would make the reference look free.
    return got == n, (f"wrote {got} .mount units, expected {n}"
                      + (" (read-only /sys? it then skips /dev entries)" if got == 0 else ""))

gens = {
    "berth-generator": (env["GEN"], {**env, "BERTH_ROOT": env["ROOT"]}, check_berth),
    "systemd-fstab-generator": (env["FSTABGEN"], {**env, "SYSTEMD_FSTAB": env["FSTAB"],
        "SYSTEMD_PROC_CMDLINE": "", "SYSTEMD_IN_INITRD": "0"}, check_fstab),
}
times = {name: [] for name in gens}
seq = 0

def run(name):
    global seq
    path, genv, check = gens[name]
    # Fresh, empty output dirs for every run (generators refuse or fail on
    # leftovers), made before the clock starts and removed after it stops.
    seq += 1
    out = f"{tmp}/out{seq}"
    dirs = [f"{out}/n", f"{out}/e", f"{out}/l"]
    for d in dirs:
        os.makedirs(d)
    t0 = time.perf_counter_ns()
    pid = os.posix_spawn(path, [path, *dirs], genv)
    _, status = os.waitpid(pid, 0)
    t1 = time.perf_counter_ns()
    rc = os.waitstatus_to_exitcode(status)
    if rc != 0:
        sys.exit(f"bench/generator.sh: {name} exited with {rc}")
    ok, why = check(out)
    if not ok:
        sys.exit(f"bench/generator.sh: {name} {why}")
    shutil.rmtree(out)
    return (t1 - t0) / 1e6

# Interleave A B A B ... so drift in machine load (other jobs, CPU frequency,
# page cache) hits both generators alike.
for _ in range(warmup):
    for name in gens:
        run(name)
for _ in range(runs):
    for name in gens:
        times[name].append(run(name))

print(f"generator benchmark: {n} workloads vs systemd-fstab-generator on {n} fstab entries "
      f"(tmpfs, fresh output dirs, {runs} runs each)")
med = {}
for name, ts in times.items():
    med[name] = statistics.median(ts)
    print(f"{name:<23} median {med[name]:.2f} ms  min {min(ts):.2f} ms")
ratio = med["berth-generator"] / med["systemd-fstab-generator"]
verdict = "PASS" if ratio <= target else "over target"
print(f"ratio (median berth / median fstab): {ratio:.3f}  target <= {target}: {verdict}")
EOF
done
