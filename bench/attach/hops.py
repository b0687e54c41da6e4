#!/usr/bin/env python3
"""Per-hop breakdown of bench-attach's Tessera attaches, from the components' logs.

Run the benchmark with BENCH_ATTACH_TRACE=<trace file>, BENCH_ATTACHER_V=5 and
RUST_LOG=info,kube=warn,tessera_node=debug,tessera_controller=debug,tessera_csi=debug,
then (the benchmark prints its log directory; <id> is the benchmark's id):

  bench/attach/hops.py TRACE /tmp/tessera-controller-<id>-*.log \
      /tmp/tessera-node-<id>-n0.log /tmp/tessera-bench-attach-<id>/csi-attacher-tessera.log

For each Tessera attach of the trace, the first line of each hop's log after the
previous hop's, within the attach's window; printed: the median time of each hop after
the VolumeAttachment's create call, and the median of each hop's own duration.
With HOPS_JSON=1: the per-attach rows as JSON instead (to merge several runs).
See bench/attach/README.md, "Where one attach's time goes".
"""
import datetime
import json
import os
import re
import statistics
import sys

UTC = datetime.timezone.utc


def rfc3339(s):
    return datetime.datetime.strptime(s[:26].rstrip("Z"), "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=UTC).timestamp()


def load(path, klog):
    out = []
    year = datetime.datetime.now(UTC).year
    for line in open(path, errors="replace"):
        if klog:
            m = re.match(r"[IWE](\d\d)(\d\d) (\d\d:\d\d:\d\d\.\d+)", line)
            if m:
                t = datetime.datetime.strptime(f"{year}-{m[1]}-{m[2]} {m[3]}", "%Y-%m-%d %H:%M:%S.%f")
                out.append((t.replace(tzinfo=UTC).timestamp(), line))
        else:
            m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z?", line)
            if m:
                out.append((rfc3339(m[1]), line))
    return out


HOPS = [
    ("csi-attacher: ControllerPublish call", "k", r'GRPC call" VolumeAttachment="{va}" method="/csi.v1.Controller/ControllerPublish'),
    ("CSI driver: ticket upserted", "c", r"ticket upserted"),
    ("controller: reconcile", "c", r"attachment reconcile"),
    ("controller: MountPod created", "c", r"tessera_controller::attachment::mountpods: attaching"),
    ("agent: reconcile", "a", r"mountpod reconcile"),
    ("agent: daemon spawned", "a", r"fuse daemon started"),
    ("agent: mount answers", "a", r"mount answers"),
    ("agent: Ready written", "a", r"status written phase=Some\(Ready\)"),
    ("controller: reconcile", "c", r"attachment reconcile"),
    ("controller: ticket satisfied", "c", r"ticket status changed.*satisfied=true"),
    ("csi-attacher: ControllerPublish response", "k", r'GRPC response" VolumeAttachment="{va}"'),
]


def main():
    trace, ctrl, agent, attacher = sys.argv[1:5]
    logs = {"c": load(ctrl, False), "a": load(agent, False), "k": load(attacher, True)}
    rows = []
    for line in open(trace):
        kind, va, created, attached = line.split()
        if kind != "t":
            continue
        t0, t1 = rfc3339(created), rfc3339(attached)
        prev, row = t0 - 0.002, []
        for _, src, rx in HOPS:
            rx = rx.replace("{va}", re.escape(va))
            hit = next((t for t, l in logs[src] if prev <= t <= t1 + 0.05 and re.search(rx, l)), None)
            row.append(None if hit is None else (hit - t0) * 1000)
            if hit is not None:
                prev = hit
        row.append((t1 - t0) * 1000)
        rows.append(row)
    if os.environ.get("HOPS_JSON"):
        print(json.dumps(rows))
        return
    print(f"{len(rows)} attaches; ms after the create call (median), and the median of each hop's own duration")
    for i, label in enumerate([h[0] for h in HOPS] + ["attached: true seen (benchmark's watch)"]):
        at = [r[i] for r in rows if r[i] is not None]
        own = [r[i] - max([x for x in r[:i] if x is not None], default=0) for r in rows if r[i] is not None]
        if at:
            print(f"  {label:42s} {statistics.median(at):7.1f}  hop {statistics.median(own):6.1f}  n={len(at)}")


if __name__ == "__main__":
    main()
