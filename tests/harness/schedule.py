#!/usr/bin/env python3
"""Runs the harness's jobs side by side and prints "N passed, N failed".

A job is one scenario script of one suite (tests/harness/SET/*.sh), or a
command given with --command (lint, the cargo tests). Most of a scenario's
time is spent waiting on systemd, so several run at once (--jobs); a few
rules keep them honest:

  heavy  CPU-bound (a build, a flood, QEMU under TCG, podman): never beside
         another heavy job or a tight one;
  tight  measures times or races a deadline: never beside a heavy job;
  exclusive
         both, and more (a QEMU guest whose emulated watchdog counts on
         host time: a starved guest would be reset for nothing): alone;
  background
         CPU-bound for many minutes (the package builds): run under
         SCHED_IDLE and the idle I/O class, so that it gets only the CPU
         and disk time the other jobs leave (a task of any other policy
         that wakes takes the CPU from it at once): one at a time, outside
         --jobs, beside anything, even an exclusive job; it starts before
         the first heavy job or when the heavy jobs left are expected to
         end within HEAVY_TAIL_MIN (see may_start), and one that started
         before runs on beside them;
  (none) anything else.

A scenario names its class, its expected minutes and what it waits for in
its header:

    # harness-job: class=tight minutes=6 after=unit-tests

Background and exclusive jobs go first, the exclusive ones alone but
for a background job; then heavy jobs, one at a time, with plain ones beside them; the tight
ones follow, side by side; within a class the longest start first (by the
last run's times in the cache when there are any, else by the header).
Each job's output goes
to a log that is printed when the job ends; its results (passed, failed,
boots, power-offs, wall time) go into the table at the end.
"""

import argparse
import glob
import os
import re
import signal
import subprocess
import sys
import time

HEADER = re.compile(r"^# harness-job:(.*)$", re.M)
CGROUP_ROOTS = ("/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified", "/sys/fs/cgroup")


class Job:
    def __init__(self, name, argv, env, klass="", minutes=2.0, after=(), timeout_min=None, group=None):
        self.name = name
        self.group = group or name
        self.argv = argv
        self.env = env
        self.klass = klass
        self.minutes = minutes
        self.after = set(after)
        self.timeout_min = timeout_min or max(15.0, 3 * minutes)
        self.proc = None
        self.log = None
        self.started = None
        self.ended = None
        self.rc = None
        self.timed_out = False
        self.passed = 0
        self.failed = 0
        self.boots = 0
        self.poweroffs = 0


def parse_header(path):
    """The class, minutes and dependencies a scenario asks for."""
    with open(path, encoding="utf-8") as f:
        m = HEADER.search(f.read(4096))
    fields = {}
    if m:
        for word in m.group(1).split():
            key, _, value = word.partition("=")
            fields[key] = value
    klass = fields.get("class", "")
    if klass not in ("", "heavy", "tight", "exclusive", "background"):
        raise SystemExit(f"schedule: {path}: unknown class '{klass}'")
    return {
        "klass": klass,
        "minutes": float(fields.get("minutes", "2")),
        "after": [a for a in fields.get("after", "").split(",") if a],
        "timeout_min": float(fields["timeout"]) if "timeout" in fields else None,
    }


def load_times(path):
    times = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2:
                    times[parts[0]] = float(parts[1]) / 60
    except (OSError, ValueError):
        pass
    return times


# A background job may start while the heavy jobs left are expected to
# end within this (their last, short ones): it then reaches the tight
# jobs' idle time running, instead of starting only there.
HEAVY_TAIL_MIN = 2.0


def may_start(job, running, heavy_queued, heavy_started=False, heavy_left_min=0.0):
    classes = [j.klass for j in running]
    if job.klass == "background":
        # One at a time, in the idle time of the exclusive jobs (the first
        # one, before any heavy job started) or of the tight ones (near
        # the end of the heavy jobs): beside the heavy jobs there is little
        # idle time, and a build there slows them.
        if "background" in classes:
            return False
        return not heavy_started or heavy_left_min <= HEAVY_TAIL_MIN
    if job.klass == "exclusive":
        return all(c == "background" for c in classes)
    if "exclusive" in classes:
        return False
    if job.klass == "heavy":
        return "heavy" not in classes and "tight" not in classes
    if job.klass == "tight":
        return "heavy" not in classes and not heavy_queued
    return True


def kill_job_cgroups(pid):
    """Containers a killed job left: their cgroups carry the job's PID."""
    groups = [cg for root in CGROUP_ROOTS for cg in glob.glob(f"{root}/berth-harness-berth-*-{pid}")]
    for cg in groups:
        for dirpath, _, _ in os.walk(cg, topdown=False):
            try:
                with open(os.path.join(dirpath, "cgroup.procs"), encoding="ascii") as f:
                    for p in f.read().split():
                        try:
                            os.kill(int(p), signal.SIGKILL)
                        except OSError:
                            pass
            except OSError:
                pass
    if groups:
        time.sleep(1)
    for cg in groups:
        for dirpath, _, _ in os.walk(cg, topdown=False):
            try:
                os.rmdir(dirpath)
            except OSError:
                pass


def stop_job(job):
    """Ends a job's process group and whatever containers it left."""
    try:
        os.killpg(job.proc.pid, signal.SIGTERM)
        try:
            job.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(job.proc.pid, signal.SIGKILL)
            job.proc.wait()
    except ProcessLookupError:
        pass
    kill_job_cgroups(job.proc.pid)


def start(job, logdir):
    job.log = os.path.join(logdir, job.name.replace("/", "-") + ".log")
    env = dict(os.environ)
    env.update(job.env)
    env["HARNESS_RESULTS"] = job.log + ".results"
    env["HARNESS_STATS"] = job.log + ".stats"
    for f in (env["HARNESS_RESULTS"], env["HARNESS_STATS"]):
        open(f, "w").close()
    out = open(job.log, "w")
    job.started = time.monotonic()
    argv, idle = job.argv, None
    if job.klass == "background":
        # Inherited by everything the job starts.
        argv = ["ionice", "-c", "3"] + argv

        def idle():
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    job.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=idle)
    out.close()


def finish(job):
    job.ended = time.monotonic()
    try:
        with open(job.log + ".results", encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3:
                    job.passed += int(parts[1])
                    job.failed += int(parts[2])
        with open(job.log + ".stats", encoding="utf-8") as f:
            for line in f:
                job.boots += line.strip() == "boot"
                job.poweroffs += line.strip() == "poweroff"
        with open(job.log, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        text = f"(log unreadable: {e})"
    cargo = re.findall(r"^test result: \w+\. (\d+) passed; (\d+) failed", text, re.M)
    if cargo:
        job.passed += sum(int(p) for p, _ in cargo)
        job.failed += sum(int(f) for _, f in cargo)
    # A job that says nothing of its checks counts as one check.
    if job.passed == 0 and job.failed == 0:
        job.passed = 1 if job.rc == 0 else 0
    if job.rc != 0 and job.failed == 0:
        job.failed = 1
    return text


def resolve_after(jobs):
    """`after=` names another job: a command's name, or a scenario of the
    same suite; one that is not part of this run (a pattern left it out)
    is taken as done."""
    names = {j.name for j in jobs}
    for j in jobs:
        suite = j.name.split("/")[0] + "/" if "/" in j.name else ""
        resolved = set()
        for a in j.after:
            if a in names:
                resolved.add(a)
            elif suite + a in names:
                resolved.add(suite + a)
        j.after = resolved


def run(jobs, max_jobs, logdir):
    running = []

    # A run that is interrupted or cancelled takes its jobs with it: each
    # runs in a session of its own, out of reach of the terminal's signals.
    def interrupted(signum, _frame):
        raise SystemExit(f"schedule: signal {signum}: stopping {len(running)} running jobs")

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)
    try:
        run_queue(jobs, max_jobs, logdir, running)
    finally:
        for j in running:
            stop_job(j)


def run_queue(jobs, max_jobs, logdir, running):
    resolve_after(jobs)
    # Heavy and tight jobs exclude each other, so the run takes at least
    # the heavy jobs one after another plus the tight ones side by side:
    # the heavy ones go first (a failed lint or unit test shows early),
    # plain ones beside them, then the tight ones, longest first.
    rank = {"background": 0, "exclusive": 0, "heavy": 1}
    queue = sorted(jobs, key=lambda j: (rank.get(j.klass, 2), -j.minutes))
    done = set()
    heavy_started = False
    while queue or running:
        for j in list(running):
            rc = j.proc.poll()
            if rc is None and time.monotonic() - j.started > j.timeout_min * 60:
                j.timed_out = True
                stop_job(j)
                rc = j.proc.returncode
            if rc is None:
                continue
            # Containers outlive a job that died before its cleanup.
            kill_job_cgroups(j.proc.pid)
            j.rc = rc
            running.remove(j)
            done.add(j.name)
            text = finish(j)
            stamp = time.strftime("%H:%M:%S")
            print(f"\n===== [{stamp}] {j.name}: {j.ended - j.started:.0f} s, "
                  f"{j.passed} passed, {j.failed} failed"
                  + (f" (killed after {j.timeout_min:.0f} min)" if j.timed_out else ""), flush=True)
            sys.stdout.write(text)
            sys.stdout.flush()
        ready = [j for j in queue if j.after <= done]
        for j in ready:
            if j.klass != "background" and sum(r.klass != "background" for r in running) >= max_jobs:
                continue
            heavy_queued = any(q.klass == "heavy" for q in queue)
            now = time.monotonic()
            heavy_left = sum(q.minutes for q in queue if q.klass == "heavy") + sum(
                max(0.0, r.minutes - (now - r.started) / 60) for r in running if r.klass == "heavy")
            if may_start(j, running, heavy_queued, heavy_started, heavy_left):
                queue.remove(j)
                start(j, logdir)
                running.append(j)
                heavy_started = heavy_started or j.klass == "heavy"
                print(f"[{time.strftime('%H:%M:%S')}] start {j.name}"
                      f" ({j.klass or 'plain'}, ~{j.minutes:.1f} min; running: "
                      f"{', '.join(r.name for r in running)})", flush=True)
        if not running and queue:
            blocked = ", ".join(f"{j.name} after {','.join(sorted(j.after - done))}" for j in queue)
            raise SystemExit(f"schedule: nothing can start: {blocked}")
        time.sleep(0.5)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("HARNESS_JOBS", "4")))
    ap.add_argument("--suites", default="bookworm")
    ap.add_argument("--sets", default="scenarios")
    ap.add_argument("--logs", required=True, help="directory for the jobs' logs")
    ap.add_argument("--times", help="file of the last run's times (read, then rewritten)")
    ap.add_argument("--table", help="file the job table is written to")
    ap.add_argument("--command", nargs=4, action="append", default=[],
                    metavar=("NAME", "CLASS", "MINUTES", "SHELL"),
                    help="an extra job: a shell command")
    ap.add_argument("patterns", nargs="*", help="scenario names to run (substrings)")
    args = ap.parse_args()
    if args.jobs < 1:
        raise SystemExit(f"schedule: HARNESS_JOBS must be at least 1, not {args.jobs}")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.makedirs(args.logs, exist_ok=True)
    times = load_times(args.times) if args.times else {}

    jobs = []
    for name, klass, minutes, shell in args.command:
        jobs.append(Job(name, ["bash", "-c", shell], {}, klass, times.get(name, float(minutes))))
    for suite in args.suites.split():
        for s in args.sets.split():
            folder = os.path.join(repo, "tests", "harness", s)
            if not os.path.isdir(folder):
                raise SystemExit(f"schedule: no scenario folder tests/harness/{s}")
            for script in sorted(glob.glob(os.path.join(folder, "*.sh"))):
                base = os.path.basename(script)[:-3]
                if args.patterns and not any(p in base for p in args.patterns):
                    continue
                h = parse_header(script)
                name = f"{suite}/{base}"
                jobs.append(Job(name, ["bash", script], {"HARNESS_SUITE": suite}, h["klass"],
                                times.get(name, h["minutes"]), h["after"], h["timeout_min"],
                                group=f"{s} ({suite})"))
    scenario_jobs = [j for j in jobs if "/" in j.name]
    if args.patterns and not scenario_jobs:
        raise SystemExit(f"schedule: no scenario matches {' '.join(args.patterns)}")

    t0 = time.monotonic()
    run(jobs, args.jobs, args.logs)
    wall = time.monotonic() - t0

    rows = sorted(jobs, key=lambda j: j.started)
    lines = [f"{'job':36} {'class':6} {'start':>6} {'wall':>6} {'boots':>5} {'offs':>4} {'passed':>6} {'failed':>6}"]
    for j in rows:
        lines.append(f"{j.name:36} {j.klass or '-':6} {j.started - t0:6.0f} {j.ended - j.started:6.0f} "
                     f"{j.boots:5d} {j.poweroffs:4d} {j.passed:6d} {j.failed:6d}")
    busy = sum(j.ended - j.started for j in jobs)
    lines.append(f"{len(jobs)} jobs in {wall:.0f} s wall ({busy:.0f} s of job time, "
                 f"{busy / wall if wall else 0:.1f} at once on average, --jobs {args.jobs}); "
                 f"{sum(j.boots for j in jobs)} boots, {sum(j.poweroffs for j in jobs)} power-offs")
    lines.append("")
    lines.append(f"{'lane':36} {'from':>6} {'to':>6} {'jobs':>5} {'job time':>8}")
    groups = {}
    for j in rows:
        groups.setdefault(j.group, []).append(j)
    for g, members in groups.items():
        first = min(j.started for j in members) - t0
        last = max(j.ended for j in members) - t0
        lines.append(f"{g:36} {first:6.0f} {last:6.0f} {len(members):5d} "
                     f"{sum(j.ended - j.started for j in members):8.0f}")
    table = "\n".join(lines)
    print("\n" + table)
    if args.table:
        with open(args.table, "w", encoding="utf-8") as f:
            f.write(table + "\n")
    if args.times:
        merged = {k: v * 60 for k, v in load_times(args.times).items()}
        for j in jobs:
            if j.rc == 0:
                merged[j.name] = j.ended - j.started
        with open(args.times + ".tmp", "w", encoding="utf-8") as f:
            for k in sorted(merged):
                f.write(f"{k} {merged[k]:.0f}\n")
        os.replace(args.times + ".tmp", args.times)
    passed = sum(j.passed for j in jobs)
    failed = sum(j.failed for j in jobs)
    print(f"harness: {len(scenario_jobs)} scenarios, {len(jobs) - len(scenario_jobs)} other jobs")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 and all(j.rc == 0 for j in jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
