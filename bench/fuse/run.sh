#!/usr/bin/env bash
# Benchmark `tessera mount` against the native directory and bindfs, in one run.
#
#   bench/fuse/run.sh                         # as root; needs fio, bindfs, a C compiler, python3
#   BACKEND=xfs-prjquota bench/fuse/run.sh    # the same on XFS with project quotas
#
# BACKEND says what filesystem the three targets sit on:
#   - dir (default): BENCH_DIR's own filesystem; tessera picks its quota mode itself
#     (daemon mode unless that filesystem is XFS mounted with prjquota);
#   - xfs-prjquota: a fresh XFS filesystem on a sparse loop image in the scratch
#     directory, mounted with -o prjquota; tessera runs with --quota=backend (an XFS
#     project quota holds the volume, writable opens use kernel passthrough), and the
#     run fails if the kernel cannot do that (needs xfsprogs, loop devices and
#     CONFIG_XFS_QUOTA). Native and bindfs directories are on the same XFS.
#
# Rows: fio sequential 1 MiB write (without and with a final fsync), the same with dd
# (a write-only open: tessera serves those with direct I/O, read-write opens through
# the page cache), sequential 1 MiB read, random 4 KiB read and write; metadata:
# create/stat/unlink of FILES small files
# (bench/fuse/metabench.c). Columns: native directory, tessera (release build), bindfs
# (--multithreaded, otherwise defaults); each FUSE column also as a ratio to native.
# Every row is run ROUNDS times with the target order rotated; the median is shown.
#
# Page cache, and why: all three targets sit on the same backing filesystem, so a
# disk-bound measurement would show the disk three times. The point is what each path
# adds, so:
#   - writes go to fresh files, buffered (direct=0); `sync` and a cache drop come
#     before each write job so none pays for an earlier job's writeback. "seq write"
#     ends when the data is in the page cache; "seq write+fsync" includes the flush;
#   - reads are warm: the file was written through the same target, is read once
#     through it before the timed run, and fio's cache invalidation is off
#     (invalidate=0: its fadvise(DONTNEED) would reach the native file but not a
#     FUSE mount's backing file, which would be unfair either way);
#   - random writes overwrite the existing file in place (no growth);
#   - fio lays a new file out (writes it whole, untimed) before a write job, so the
#     fio "seq write" rows time an overwrite of a file fio has just written; the dd
#     row is the one that appends to a fresh file.
#
# Knobs (environment): SIZE (fio file size, 256M), RUNTIME (seconds per timed read or
# random job, 5), FILES (metadata files, 10000), ROUNDS (3), BENCH_DIR (where the
# scratch directory goes, /var/tmp), TESSERA_BIN (a prebuilt binary; otherwise
# `cargo build --release`), TESSERA_ARGS (extra `tessera mount` arguments), BACKEND
# (above), XFS_SIZE (the loop image's size for xfs-prjquota, 4G).
set -euo pipefail

SIZE=${SIZE:-256M}
RUNTIME=${RUNTIME:-5}
FILES=${FILES:-10000}
ROUNDS=${ROUNDS:-3}
BENCH_DIR=${BENCH_DIR:-/var/tmp}
BACKEND=${BACKEND:-dir}
XFS_SIZE=${XFS_SIZE:-4G}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)

die() { echo "run.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root (mounts, drop_caches)"
for tool in fio bindfs cc python3; do
    command -v "$tool" >/dev/null || die "$tool is missing (apt-get install fio bindfs gcc python3)"
done
case $BACKEND in
dir) ;;
xfs-prjquota)
    command -v mkfs.xfs >/dev/null || die "mkfs.xfs is missing (apt-get install xfsprogs)"
    ;;
*) die "BACKEND must be dir or xfs-prjquota, not $BACKEND" ;;
esac

if [ -z "${TESSERA_BIN:-}" ]; then
    (cd "$REPO" && cargo build --release --bin tessera >&2)
    TESSERA_BIN="$REPO/target/release/tessera"
fi

W=$(mktemp -d "$BENCH_DIR/tessera-bench.XXXXXX")
TESSERA_PID=
cleanup() {
    set +e
    [ -n "$TESSERA_PID" ] && kill -TERM "$TESSERA_PID" 2>/dev/null && wait "$TESSERA_PID"
    mountpoint -q "$W/tessera" && umount -l "$W/tessera"
    mountpoint -q "$W/bindfs" && { fusermount3 -u "$W/bindfs" 2>/dev/null || umount -l "$W/bindfs"; }
    # `mount -o loop` detaches the loop device at unmount.
    mountpoint -q "$W/xfs" && { umount "$W/xfs" || umount -l "$W/xfs"; }
    [ -f "$W/xfs.img" ] && losetup -j "$W/xfs.img" | cut -d: -f1 | xargs -r -n1 losetup -d
    rm -rf "$W"
}
trap cleanup EXIT

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
# Where native, tessera's volume and bindfs's source live.
BASE=$W
if [ "$BACKEND" = xfs-prjquota ]; then
    BASE=$W/xfs
    truncate -s "$XFS_SIZE" "$W/xfs.img"
    mkfs.xfs -q "$W/xfs.img"
    mkdir -p "$BASE"
    mount -t xfs -o loop,prjquota "$W/xfs.img" "$BASE" ||
        die "mount -o loop,prjquota of a fresh XFS image failed (loop devices and a kernel with CONFIG_XFS_QUOTA are needed): $(dmesg | tail -n 1)"
    TESSERA_ARGS="--quota=backend ${TESSERA_ARGS:-}"
fi
mkdir -p "$BASE/native" "$BASE/tessera-src" "$W/tessera" "$BASE/bindfs-src" "$W/bindfs"
cc -O2 -o "$W/metabench" "$HERE/metabench.c"

# shellcheck disable=SC2086 # TESSERA_ARGS is a list of words
"$TESSERA_BIN" mount --source "$BASE/tessera-src" --mountpoint "$W/tessera" \
    --capacity-bytes $((1 << 40)) ${TESSERA_ARGS:-} 2>"$W/tessera.log" &
TESSERA_PID=$!
bindfs --multithreaded "$BASE/bindfs-src" "$W/bindfs"
for _ in $(seq 100); do
    [ "$(stat -f -c %t "$W/tessera")" = 65735546 ] && break
    sleep 0.1
done
[ "$(stat -f -c %t "$W/tessera")" = 65735546 ] || { cat "$W/tessera.log"; die "tessera did not mount"; }
mountpoint -q "$W/bindfs" || die "bindfs did not mount"

declare -A DIR=([native]="$BASE/native" [tessera]="$W/tessera" [bindfs]="$W/bindfs")
TARGETS=(native tessera bindfs)
RESULTS="$W/results"
: >"$RESULTS"

drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }

# fio JOB TARGET ARGS...: records "JOB TARGET value" (bytes/s for 1M jobs, IOPS for 4K).
fio_job() {
    local job=$1 target=$2
    shift 2
    fio --name="$job" --filename="${DIR[$target]}/bench.dat" --size="$SIZE" \
        --ioengine=psync --direct=0 --invalidate=0 --fallocate=none \
        --output-format=json "$@" >"$W/fio.json"
    python3 - "$job" "$target" "$W/fio.json" >>"$RESULTS" <<'EOF'
import json, sys
job, target, path = sys.argv[1:]
j = json.load(open(path))["jobs"][0]
side = j["write"] if j["write"]["io_bytes"] else j["read"]
value = side["iops"] if "4k" in job else side["bw_bytes"]
print(job, target, value)
EOF
}

# dd_job TARGET: sequential 1 MiB writes through a write-only open (fio always opens
# read-write), as cp, tar, dd and log appenders do; records bytes/s.
dd_job() {
    local target=$1 bytes secs
    read -r bytes secs < <(dd if=/dev/zero of="${DIR[$target]}/bench.dat" bs=1M \
        count=$(($(numfmt --from=iec "$SIZE") >> 20)) 2>&1 |
        awk '/copied/ {print $1, $(NF-3)}')
    echo "seqwrite-wronly-1m $target $(python3 -c "print($bytes / $secs)")" >>"$RESULTS"
}

one_round() {
    local target=$1 dir=${DIR[$1]}
    rm -f "$dir/bench.dat"
    drop_caches
    dd_job "$target"
    rm -f "$dir/bench.dat"
    drop_caches
    fio_job seqwrite-1m "$target" --rw=write --bs=1M
    rm -f "$dir/bench.dat"
    drop_caches
    fio_job seqwrite-fsync-1m "$target" --rw=write --bs=1M --end_fsync=1
    cat "$dir/bench.dat" >/dev/null
    fio_job seqread-1m "$target" --rw=read --bs=1M --time_based --runtime="$RUNTIME"
    fio_job randread-4k "$target" --rw=randread --bs=4k --time_based --runtime="$RUNTIME" \
        --norandommap --randrepeat=0
    fio_job randwrite-4k "$target" --rw=randwrite --bs=4k --time_based --runtime="$RUNTIME" \
        --norandommap --randrepeat=0
    rm -f "$dir/bench.dat"
    mkdir -p "$dir/meta"
    drop_caches
    "$W/metabench" "$dir/meta" "$FILES" | while read -r phase value; do
        echo "$phase $target $value" >>"$RESULTS"
    done
    rmdir "$dir/meta"
}

for round in $(seq "$ROUNDS"); do
    # Rotate the order so no target always runs first (or right after another's writeback).
    for i in 0 1 2; do
        target=${TARGETS[$(((i + round) % 3))]}
        echo "round $round/$ROUNDS: $target" >&2
        one_round "$target"
    done
done

python3 - "$RESULTS" <<'EOF'
import statistics, sys
from collections import defaultdict
vals = defaultdict(list)
for line in open(sys.argv[1]):
    job, target, value = line.split()
    vals[(job, target)].append(float(value))
# (job, label, unit, goal for tessera/native); every row also has the goal "faster
# than bindfs".
rows = [
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
def med(job, target):
    v = statistics.median(vals[(job, target)])
    return v / (1 << 20) if job.endswith("1m") else v
def spread(job, target):
    v = vals[(job, target)]
    return f"{min(v) / max(v):.2f}" if len(v) > 1 else "-"
print("| workload | unit | native | tessera | tessera/native | goal | bindfs | bindfs/native | tessera/bindfs | min/max tessera |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for job, label, unit, goal in rows:
    n, t, b = (med(job, x) for x in ("native", "tessera", "bindfs"))
    ok = "-" if goal is None else f"≥{goal} " + ("met" if t / n >= goal else "NOT met")
    vs = "faster" if t > b else "SLOWER"
    print(f"| {label} | {unit} | {n:,.0f} | {t:,.0f} | {t / n:.2f} | {ok} | {b:,.0f} | {b / n:.2f} | {t / b:.2f} {vs} | {spread(job, 'tessera')} |")
EOF
echo "(BACKEND=$BACKEND: $(stat -f -c %T "$BASE/native"); median of $ROUNDS rounds; SIZE=$SIZE RUNTIME=${RUNTIME}s FILES=$FILES; $(nproc) cores, $(uname -r); load before: $LOAD_BEFORE, after: $(cut -d' ' -f1-3 /proc/loadavg))"
# Stop tessera now, so its log ends with the counters (which opens were passthrough,
# how many reads and writes still reached the daemon).
kill -TERM "$TESSERA_PID" && wait "$TESSERA_PID" || true
TESSERA_PID=
grep -E "quota mode chosen|kernel cache lifetimes|FUSE connection initialised| unmounted " "$W/tessera.log" | sed 's/^/tessera: /' >&2 || true
