#!/usr/bin/env python3
"""The tables and the BENCH line of bench/fuse/run.sh.

    report.py RESULTS [PROFILE_DIR] [key=value ...]

RESULTS holds "job target value" lines, one per job, target and round, in round
order (bytes/s for 1 MiB jobs, IOPS for 4 KiB jobs, operations/s for metadata
phases, µs for "<phase>-p50-us"). PROFILE_DIR, when given, holds what the profile
passes left for each profiled target T, pass N: phases-T.N.txt (`metabench DIR COUNT
-t PID` output) and, if the pass was traced, trace-T.N.txt (the fuse_request_send/end
events of T's connection, "mono" trace clock). key=value arguments describe the run
(backend, fs, rounds, size, runtime, files, cores, kernel, load_before, load_after,
traced) and are copied into the closing BENCH line.

Prints, on stdout: the table against native and bindfs; the metadata table against
the null FUSE filesystem (median per-operation time, tessera ÷ nullfs); the profile pass
(per file: wall and CPU time of metabench and of the daemon, the FUSE requests by
kind with the kernel's mean send→reply time); and, last, one line
"BENCH fuse key=value ...".
"""

import os
import re
import statistics
import sys
from collections import defaultdict

# (job, label, unit, goal for tessera/native); every row also has the goal "faster
# than bindfs".
ROWS = [
    ("seqwrite-1m", "seq overwrite 1 MiB (fio, read-write open)", "MiB/s", 0.9),
    ("seqwrite-wronly-1m", "seq write 1 MiB (dd, write-only open)", "MiB/s", 0.9),
    ("seqwrite-fsync-1m", "seq write 1 MiB + fsync", "MiB/s", 0.9),
    ("seqread-1m", "seq read 1 MiB (warm)", "MiB/s", 0.9),
    ("randread-4k", "rand read 4 KiB (warm)", "IOPS", 0.75),
    ("randwrite-4k", "rand write 4 KiB", "IOPS", None),
    ("create", "create (open+write 100 B+close)", "files/s", 0.4),
    ("stat", "stat", "files/s", 0.4),
    ("unlink", "unlink", "files/s", 0.4),
]
META = [
    ("create", "create (open+write 100 B+close)", None),
    ("stat", "stat", 1.2),
    ("unlink", "unlink", 1.2),
]
# Units of the BENCH keys, by row unit.
KEY_UNIT = {"MiB/s": "mibs", "IOPS": "iops", "files/s": "per_s"}


def key(s):
    return re.sub(r"[^a-z0-9]+", "_", s.lower()).strip("_")


def load_results(path):
    vals = defaultdict(list)
    for line in open(path):
        job, target, value = line.split()
        vals[(job, target)].append(float(value))
    return vals


def fmt_ratio(x):
    return f"{x:.2f}"


def main_table(vals, bench):
    def med(job, target):
        v = statistics.median(vals[(job, target)])
        return v / (1 << 20) if job.endswith("1m") else v

    def spread(job, target):
        v = vals[(job, target)]
        return f"{min(v) / max(v):.2f}" if len(v) > 1 else "-"

    print("| workload | unit | native | tessera | tessera/native | goal | bindfs | bindfs/native | tessera/bindfs | min/max tessera |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for job, label, unit, goal in ROWS:
        n, t, b = (med(job, x) for x in ("native", "tessera", "bindfs"))
        ok = "-" if goal is None else f"≥{goal} " + ("met" if t / n >= goal else "NOT met")
        vs = "faster" if t > b else "SLOWER"
        print(f"| {label} | {unit} | {n:,.0f} | {t:,.0f} | {t / n:.2f} | {ok} | {b:,.0f} | {b / n:.2f} | {t / b:.2f} {vs} | {spread(job, 'tessera')} |")
        k, u = key(job), KEY_UNIT[unit]
        for target, v in (("native", n), ("tessera", t), ("bindfs", b)):
            bench.append((f"{k}_{target}_{u}", f"{v:.0f}"))
        bench.append((f"{k}_tessera_over_native", fmt_ratio(t / n)))
        bench.append((f"{k}_bindfs_over_native", fmt_ratio(b / n)))
        bench.append((f"{k}_tessera_over_bindfs", fmt_ratio(t / b)))


def null_table(vals, bench):
    """Per-operation time of each target against the null FUSE filesystem's: the
    median over rounds of each round's median single operation (metabench's
    "<phase>-p50-us"), and, for comparison, the mean from the rate."""
    def p50(job, target):
        return statistics.median(vals[(f"{job}-p50-us", target)])

    def mean_us(job, target):
        return 1e6 / statistics.median(vals[(job, target)])

    def per_round(job):
        # Rounds pair the targets' runs.
        t, z = vals[(f"{job}-p50-us", "tessera")], vals[(f"{job}-p50-us", "nullfs")]
        return [a / b for a, b in zip(t, z)]

    print()
    print("Metadata against the null FUSE round trip (bench/fuse/nullfs.rs: same fuser, threads, mount options and init flags as tessera, answers from memory). µs per operation: the median single operation of each round, median of the rounds; the last column compares the mean times (from files/s) instead:")
    print()
    print("| operation | native µs | nullfs µs | tessera µs | bindfs µs | tessera ÷ nullfs | goal | min–max per round | tessera ÷ (nullfs + native) | bindfs ÷ nullfs | tessera ÷ nullfs, mean |")
    print("|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|")
    for job, label, goal in META:
        n, z, t, b = (p50(job, x) for x in ("native", "nullfs", "tessera", "bindfs"))
        r = t / z
        ok = "-" if goal is None else f"≤{goal} " + ("met" if r <= goal else "NOT met")
        rounds = per_round(job)
        spread = f"{min(rounds):.2f}–{max(rounds):.2f}"
        mean_ratio = mean_us(job, "tessera") / mean_us(job, "nullfs")
        print(f"| {label} | {n:.1f} | {z:.1f} | {t:.1f} | {b:.1f} | {r:.2f} | {ok} | {spread} | {t / (z + n):.2f} | {b / z:.2f} | {mean_ratio:.2f} |")
        for target, v in (("native", n), ("nullfs", z), ("tessera", t), ("bindfs", b)):
            bench.append((f"{job}_{target}_p50_us", f"{v:.1f}"))
        bench.append((f"{job}_tessera_over_null", fmt_ratio(r)))
        bench.append((f"{job}_tessera_over_null_min", fmt_ratio(min(rounds))))
        bench.append((f"{job}_tessera_over_null_max", fmt_ratio(max(rounds))))
        bench.append((f"{job}_tessera_over_null_plus_native", fmt_ratio(t / (z + n))))
        bench.append((f"{job}_bindfs_over_null", fmt_ratio(b / z)))
        bench.append((f"{job}_tessera_over_null_mean", fmt_ratio(mean_ratio)))


TRACE_RE = re.compile(
    r"\s(\d+\.\d+): fuse_request_(send|end): connection (\d+) req (\d+)"
    r"(?: opcode \d+ \((\w+)\))?"
)
PHASES = ("create", "stat", "unlink")


def read_pass(phases_path, trace_path, files):
    """One profile pass: per phase, the µs per file of the median operation, of the
    whole pass, of metabench's CPU and of the daemon's CPU; and per (phase, kind) the
    requests sent and their send→reply µs (nothing if the pass was not traced)."""
    lines = {}
    for line in open(phases_path):
        word, *values = line.split()
        lines[word] = [float(v) for v in values]
    marks = lines["phases"]
    spans = [(marks[2 * i], marks[2 * i + 1]) for i in range(len(PHASES))]

    def per_file(cpu, i):
        return (cpu[i + 1] - cpu[i]) * 1e6 / files if cpu else None

    figures = {
        name: {
            "p50_us": lines.get(f"{name}-p50-us", [None])[0],
            "wall_us": (end - start) * 1e6 / files,
            "client_cpu_us": per_file(lines.get("client_cpu"), i),
            "daemon_cpu_us": per_file(lines.get("daemon_cpu"), i),
        }
        for i, (name, (start, end)) in enumerate(zip(PHASES, spans))
    }

    def phase_of(t):
        for name, (start, end) in zip(PHASES, spans):
            if start <= t < end:
                return name
        return None

    sent = {}  # (conn, unique) -> (time, phase, kind)
    counts = defaultdict(int)  # (phase, kind) -> n
    waits = defaultdict(list)  # (phase, kind) -> [µs]
    for line in open(trace_path) if os.path.exists(trace_path) else []:
        m = TRACE_RE.search(line)
        if not m:
            continue
        t, what, conn, unique, opcode = m.groups()
        t = float(t)
        if what == "send":
            phase = phase_of(t)
            op = opcode.removeprefix("FUSE_")
            if phase:
                counts[(phase, op)] += 1
            sent[(conn, unique)] = (t, phase, op)
        elif (conn, unique) in sent:
            t0, phase, op = sent.pop((conn, unique))
            if phase:
                waits[(phase, op)].append((t - t0) * 1e6)
    return figures, counts, waits


def read_profile(profile_dir, target, files):
    """The profile passes of `target` (phases-T.N.txt, trace-T.N.txt) together: per
    phase the mean over the passes of each figure, and per (phase, kind) the requests
    per file with their mean send→reply µs. None if there is no pass."""
    passes = []
    for n in range(1, 10):
        phases = os.path.join(profile_dir, f"phases-{target}.{n}.txt")
        if os.path.exists(phases):
            trace = os.path.join(profile_dir, f"trace-{target}.{n}.txt")
            passes.append(read_pass(phases, trace, files))
    if not passes:
        return None

    def mean(values):
        values = [v for v in values if v is not None]
        return statistics.mean(values) if values else None

    figures = {
        phase: {k: mean(p[0][phase][k] for p in passes) for k in passes[0][0][phase]}
        for phase in PHASES
    }
    counts, waits = defaultdict(int), defaultdict(list)
    for _, c, w in passes:
        for k, n in c.items():
            counts[k] += n
        for k, v in w.items():
            waits[k].extend(v)
    requests = {
        k: (n / (files * len(passes)), mean(waits.get(k, [])))
        for k, n in counts.items()
    }
    return figures, requests


def profile_table(profile_dir, files, traced_requests, bench):
    traced = {t: read_profile(profile_dir, t, files) for t in ("nullfs", "tessera")}
    traced = {t: v for t, v in traced.items() if v is not None}
    if not traced:
        return
    print()
    how = "with the kernel's fuse_request_send/end tracepoints on" if traced_requests else "(requests not traced)"
    print(f"Where the time goes: two more metabench passes of {files} files per target (nullfs, tessera, tessera, nullfs) {how}; their times are not in the tables above. Per file, the mean of the two passes: the median single operation and the mean (wall time ÷ files) of a pass, metabench's CPU time (its system calls, the kernel's FUSE client side included), the daemon's CPU time (all its threads), the FUSE requests sent, and by kind the requests per file with the kernel's mean time from sending each to its reply, µs (FORGET, one per unlinked file, goes by the kernel's forget queue, unseen by these tracepoints; nullfs counts it in its last log line):")
    print()
    print("| phase | target | p50 µs | mean µs | metabench CPU µs | daemon CPU µs | requests | by kind: per file (mean µs send→reply) |")
    print("|---|---|---:|---:|---:|---:|---:|---|")

    def us(v):
        return "-" if v is None else f"{v:.1f}"

    for phase in PHASES:
        for target, (figures, requests) in traced.items():
            f = figures[phase]
            ops = sorted((op, v) for (p, op), v in requests.items() if p == phase)
            total = sum(n for _, (n, _) in ops)
            kinds = ", ".join(
                f"{op} {n:.2f}" + (f" ({w:.1f})" if w is not None else "")
                for op, (n, w) in ops
            )
            n = f"{total:.2f}" if traced_requests else "-"
            print(f"| {phase} | {target} | {us(f['p50_us'])} | {us(f['wall_us'])} | {us(f['client_cpu_us'])} | {us(f['daemon_cpu_us'])} | {n} | {kinds or '-'} |")
            p = f"profile_{phase}_{target}"
            for k in ("p50_us", "wall_us", "client_cpu_us", "daemon_cpu_us"):
                if f[k] is not None:
                    bench.append((f"{p}_{k}", f"{f[k]:.1f}"))
            if traced_requests:
                bench.append((f"{p}_requests", f"{total:.2f}"))
            for op, (n, w) in ops:
                bench.append((f"{p}_{key(op)}", f"{n:.2f}"))
                if w is not None:
                    bench.append((f"{p}_{key(op)}_rt_us", f"{w:.1f}"))


def main():
    args = sys.argv[1:]
    results = args.pop(0)
    profile_dir = args.pop(0) if args and "=" not in args[0] else None
    conditions = [a.split("=", 1) for a in args]
    files = int(dict(conditions).get("files", "0"))
    vals = load_results(results)
    bench = []
    main_table(vals, bench)
    c = dict(conditions)
    print(f"(BACKEND={c.get('backend')}: {c.get('fs')}; median of {c.get('rounds')} rounds; SIZE={c.get('size')} RUNTIME={c.get('runtime')}s FILES={files}; {c.get('cores')} cores, {c.get('kernel')}; load before: {c.get('load_before')}, after: {c.get('load_after')})")
    if ("stat-p50-us", "nullfs") in vals:
        null_table(vals, bench)
    if profile_dir:
        profile_table(profile_dir, files, c.get("traced") == "yes", bench)
    print()
    fields = [(k, v) for k, v in conditions] + bench
    print("BENCH fuse " + " ".join(f"{k}={word(v)}" for k, v in fields))


def word(v):
    """`v` as a BENCH value: no whitespace."""
    return re.sub(r"\s+", "_", str(v)) or "-"


if __name__ == "__main__":
    main()
