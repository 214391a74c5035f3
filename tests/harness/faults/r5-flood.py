#!/usr/bin/env python3
"""Issue 10, R5: floods berth daemon's API socket and samples its health.

    r5-flood.py SOCKET STATUS_JSON SECONDS BERTH_GID RESULT.json

The flood comes from a member of group `berth` that is not root (uid
65534, gid BERTH_GID: what the socket's mode lets in); the health checks
come from root, as systemd's or a monitoring agent's would.

For SECONDS, at once: 200 idle /v1/events subscribers that never read,
100 slowloris clients (one header byte a second, reconnecting when
dropped), and waves of 1000 concurrent requests, half /v1/workloads,
half /metrics (each waits for room
in the listen queue, as a blocking connect would). Every 200 ms, from
outside the flood: one /healthz request with a blocking connect (status,
latency)
and the loop's pass age from the status file the daemon rewrites each
pass (its modification time; not through the API). Writes the figures to RESULT.json.
"""
import asyncio
import json
import os
import resource
import socket
import sys
import time

SOCK, STATUS, SECONDS, GID, RESULT = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
ROOT_SOCK = SOCK
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))

counts = {"metrics_200": 0, "flood_200": 0, "flood_503": 0, "flood_error": 0, "sse_open": 0, "sse_refused": 0, "slowloris_dropped": 0}
health = []  # (status, ms)
errors = {}  # what failed, how often
ages = []  # ms


async def connect(timeout):
    """A connection, waiting for room in the listen queue as a blocking
    connect() would (asyncio's non-blocking one fails at once with EAGAIN
    when the queue is full)."""
    give_up = time.monotonic() + timeout
    while True:
        try:
            return await asyncio.open_unix_connection(SOCK)
        except BlockingIOError:
            if time.monotonic() >= give_up:
                raise
            await asyncio.sleep(0.01)


async def request(path, timeout=10.0):
    r, w = await asyncio.wait_for(connect(timeout), timeout)
    try:
        w.write(f"GET {path} HTTP/1.1\r\nHost: berth\r\nConnection: close\r\n\r\n".encode())
        await w.drain()
        head = await asyncio.wait_for(r.readline(), timeout)
        await asyncio.wait_for(r.read(), timeout)
        return int(head.split()[1])
    finally:
        w.close()


async def flood(stop):
    async def one(path):
        try:
            code = await request(path)
            counts["flood_200" if code == 200 else "flood_503" if code == 503 else "flood_error"] += 1
            if code == 200 and path == "/metrics":
                counts["metrics_200"] += 1
        except ConnectionResetError:
            # Over the cap: the 503 is written without reading the request,
            # and the close can reach the client before it has read it.
            counts["flood_503"] += 1
        except Exception as e:  # noqa: BLE001 - counted
            counts["flood_error"] += 1
            errors[type(e).__name__ + ": " + str(e)[:60]] = errors.get(type(e).__name__ + ": " + str(e)[:60], 0) + 1

    while time.monotonic() < stop:
        # Half of each wave scrapes /metrics, which renders every series.
        await asyncio.gather(*(one("/metrics" if i % 2 else "/v1/workloads") for i in range(1000)))


async def sse(keep):
    """Subscribes, reads the status line, then never reads again."""
    try:
        r, w = await connect(10.0)
        w.write(b"GET /v1/events HTTP/1.1\r\nHost: berth\r\n\r\n")
        await w.drain()
        head = await asyncio.wait_for(r.readline(), 10)
        if int(head.split()[1]) == 200:
            keep.append(w)
            counts["sse_open"] += 1
        else:
            counts["sse_refused"] += 1
            w.close()
    except Exception:  # noqa: BLE001
        counts["sse_refused"] += 1


async def slowloris(stop):
    line = b"GET /v1/workloads HTTP/1.1\r\nHost: berth\r\nX-Slow: " + b"a" * 4000
    while time.monotonic() < stop:
        try:
            r, w = await connect(10.0)
            for byte in line:
                if time.monotonic() >= stop:
                    break
                w.write(bytes([byte]))
                await w.drain()
                await asyncio.sleep(1.0)
            w.close()
        except Exception:  # noqa: BLE001 - dropped by the daemon: come back
            counts["slowloris_dropped"] += 1
            await asyncio.sleep(0.1)


def healthz():
    """/healthz as a monitoring agent asks it: a blocking connect, 5 s."""
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(ROOT_SOCK)
        s.settimeout(5.0)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: berth\r\nConnection: close\r\n\r\n")
        data = b""
        while b"\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        return int(data.split()[1])


async def sample(stop):
    loop = asyncio.get_running_loop()
    while time.monotonic() < stop:
        t = time.monotonic()
        try:
            code = await loop.run_in_executor(None, healthz)
        except Exception as e:  # noqa: BLE001
            code = 0
            key = "healthz " + type(e).__name__ + ": " + str(e)[:60]
            errors[key] = errors.get(key, 0) + 1
        health.append((code, (time.monotonic() - t) * 1000))
        # The file's mtime, not its heartbeat_at: that is in whole seconds,
        # so it read up to 1 s old with the loop on time (2007 ms was seen
        # for a 1 s interval). The daemon writes the file anew each pass.
        try:
            ages.append((time.time_ns() - os.stat(STATUS).st_mtime_ns) / 1e6)
        except OSError:  # a file being replaced: next sample
            pass
        await asyncio.sleep(0.2)


async def attack(stop):
    keep = []
    await asyncio.gather(*(sse(keep) for _ in range(200)))
    await asyncio.gather(flood(stop), *(slowloris(stop) for _ in range(100)))
    for w in keep:
        w.close()


stop = time.monotonic() + SECONDS
child = os.fork()
if child == 0:
    # The attacker: group berth, not root. The socket's directory is
    # reached through a descriptor opened before the privileges went.
    d = os.open(os.path.dirname(SOCK), os.O_PATH | os.O_DIRECTORY)
    out = open(RESULT + ".attack", "w")
    os.setgroups([GID])
    os.setgid(GID)
    os.setuid(65534)
    SOCK = f"/proc/self/fd/{d}/{os.path.basename(ROOT_SOCK)}"
    asyncio.run(attack(stop))
    json.dump({"counts": counts, "errors": errors}, out)
    out.close()
    os._exit(0)
asyncio.run(sample(stop))
os.waitpid(child, 0)
attacked = json.load(open(RESULT + ".attack"))
counts, errors = attacked["counts"], {**attacked["errors"], **errors}
lat = sorted(ms for _, ms in health)
result = dict(counts)
result.update({
    "health_samples": len(health),
    "health_not_200": sum(1 for code, _ in health if code != 200),
    "health_ms_median": round(lat[len(lat) // 2], 1) if lat else None,
    "health_ms_max": round(lat[-1], 1) if lat else None,
    "pass_age_samples": len(ages),
    "pass_age_ms_max": round(max(ages)) if ages else None,
    "errors": errors,
})
print(json.dumps(result, indent=1))
json.dump(result, open(RESULT, "w"))
