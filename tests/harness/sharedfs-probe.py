#!/usr/bin/env python3
"""Probes of the nodes' shared backend, run in a node by sharedfs-check.sh.

Every mode prints one line `key=value ...`; times are the host's CLOCK_REALTIME in
nanoseconds (both nodes run on one host, so they compare across nodes).

  hold PATH KIND SECONDS   take a KIND (fcntl|flock) exclusive lock, print
                           `locked`, hold it, print `released at=NS`
  try PATH KIND            non-blocking attempt: `conflict=1 at=NS` or `conflict=0 at=NS`
  wait PATH KIND           blocking lock: `acquired at=NS`
  write PATH N GAP_MS      N times: write "i ns" to PATH (open, write, close), sleep GAP
  watch PATH N TIMEOUT_S   open/read/close PATH in a loop until round N-1 was seen;
                           per round the delay from its close on the writer to its
                           first read here: `rounds=.. seen=.. p50_ms=.. max_ms=..`
"""
import fcntl
import os
import sys
import time


def lock(fd, kind, blocking):
    if kind == "fcntl":
        fcntl.lockf(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    elif kind == "flock":
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    else:
        sys.exit(f"unknown lock kind {kind}")


def unlock(fd, kind):
    if kind == "fcntl":
        fcntl.lockf(fd, fcntl.LOCK_UN)
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)


def main(argv):
    mode, path = argv[1], argv[2]
    if mode == "hold":
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        lock(fd, argv[3], True)
        print("locked", flush=True)
        time.sleep(float(argv[4]))
        at = time.time_ns()
        unlock(fd, argv[3])
        print(f"released at={at}", flush=True)
    elif mode == "try":
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            lock(fd, argv[3], False)
            print(f"conflict=0 at={time.time_ns()}", flush=True)
        except (BlockingIOError, PermissionError):
            print(f"conflict=1 at={time.time_ns()}", flush=True)
    elif mode == "wait":
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        lock(fd, argv[3], True)
        print(f"acquired at={time.time_ns()}", flush=True)
    elif mode == "write":
        n, gap = int(argv[3]), float(argv[4]) / 1000
        for i in range(n):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
            # the line's time is taken before the write: the delay covers write + close
            os.pwrite(fd, f"{i} {time.time_ns()}\n".ljust(40).encode(), 0)
            os.close(fd)
            time.sleep(gap)
    elif mode == "watch":
        n, deadline = int(argv[3]), time.time() + float(argv[4])
        delays, last = {}, -1
        while last < n - 1 and time.time() < deadline:
            try:
                with open(path, "rb") as f:
                    data = f.read(64)
            except FileNotFoundError:
                continue
            now = time.time_ns()
            parts = data.split()
            if len(parts) != 2:
                continue
            i, t = int(parts[0]), int(parts[1])
            if i not in delays:
                delays[i] = (now - t) / 1e6
                last = max(last, i)
        d = sorted(delays.values())
        p50 = d[len(d) // 2] if d else -1
        print(f"rounds={n} seen={len(d)} p50_ms={p50:.2f} max_ms={(d[-1] if d else -1):.2f}")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
