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
#
# The round-trip floor: a null FUSE filesystem (bench/fuse/nullfs.rs, a Cargo example:
# the same fuser, worker threads, mount options and init flags as tessera, names and
# sizes in memory, no backing files) runs the metadata rows too, in the same rounds.
# A second table gives each metadata operation's median time (metabench times every
# single operation) as a ratio to nullfs's (tessera ÷ nullfs, goal ≤ 1.2 for stat and
# unlink) and to nullfs's plus native's (the round trip plus the backing filesystem's
# own work). Then a profile pass, two more metabench runs on each of nullfs and
# tessera (in the order A B B A) whose times are not in those tables, says where the
# time goes: per file, the CPU time of metabench and of the daemon, and the FUSE
# requests each phase sends, by kind, with the kernel's mean time from sending each
# to its reply (the fuse_request_send/end tracepoints, in a tracefs instance of its
# own filtered to the connection; TRACE=0 or a kernel without them leaves the
# requests out). bench/fuse/report.py prints the
# tables; the last line of output is one "BENCH fuse key=value ..." line.
#
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
# `cargo build --release`), NULLFS_BIN (a prebuilt nullfs; otherwise `cargo build
# --release --example nullfs`), TESSERA_ARGS (extra `tessera mount` arguments), BACKEND
# (above), XFS_SIZE (the loop image's size for xfs-prjquota, 4G), TRACE (1, the
# default: trace the profile pass's FUSE requests where the kernel can; 0: do not).
# Figures and their analysis: bench/fuse/README.md.
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

if [ -z "${TESSERA_BIN:-}" ] || [ -z "${NULLFS_BIN:-}" ]; then
    (cd "$REPO" && cargo build --release --bin tessera --example nullfs >&2)
    TARGET_DIR=$(cd "$REPO" && cargo metadata --format-version 1 --no-deps |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
    TESSERA_BIN=${TESSERA_BIN:-$TARGET_DIR/release/tessera}
    NULLFS_BIN=${NULLFS_BIN:-$TARGET_DIR/release/examples/nullfs}
fi

TRACEFS=/sys/kernel/tracing
TRACEFS_MOUNTED=
if [ "${TRACE:-1}" = 1 ] && [ ! -d "$TRACEFS/events/fuse" ] && [ -d "$TRACEFS" ] &&
    mount -t tracefs nodev "$TRACEFS" 2>/dev/null; then
    TRACEFS_MOUNTED=1
fi
TRACE_NOTE=
if [ "${TRACE:-1}" != 1 ]; then
    TRACE_NOTE="TRACE=${TRACE:-}: the profile pass's FUSE requests are not traced"
elif [ ! -d "$TRACEFS/events/fuse/fuse_request_send" ]; then
    TRACE_NOTE="no fuse_request_send tracepoint in $TRACEFS: the profile pass's FUSE requests are not traced"
fi

W=$(mktemp -d "$BENCH_DIR/tessera-bench.XXXXXX")
TESSERA_PID=
NULLFS_PID=
TRACE_INSTANCE=
cleanup() {
    set +e
    [ -n "$TESSERA_PID" ] && kill -TERM "$TESSERA_PID" 2>/dev/null && wait "$TESSERA_PID"
    mountpoint -q "$W/tessera" && umount -l "$W/tessera"
    mountpoint -q "$W/nullfs" && umount -l "$W/nullfs"
    [ -n "$NULLFS_PID" ] && kill -TERM "$NULLFS_PID" 2>/dev/null && wait "$NULLFS_PID"
    [ -n "$TRACE_INSTANCE" ] && rmdir "$TRACE_INSTANCE"
    [ -n "$TRACEFS_MOUNTED" ] && umount "$TRACEFS"
    mountpoint -q "$W/bindfs" && { fusermount3 -u "$W/bindfs" 2>/dev/null || umount -l "$W/bindfs"; }
    # `mount -o loop` detaches the loop device at unmount.
    mountpoint -q "$W/xfs" && { umount "$W/xfs" || umount -l "$W/xfs"; }
    [ -f "$W/xfs.img" ] && losetup -j "$W/xfs.img" | cut -d: -f1 | xargs -r -n1 losetup -d
    rm -rf "$W"
}
trap cleanup EXIT

loadavg() { cut -d' ' -f1-3 /proc/loadavg | tr ' ' /; }
LOAD_BEFORE=$(loadavg)
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
mkdir -p "$BASE/native" "$BASE/tessera-src" "$W/tessera" "$BASE/bindfs-src" "$W/bindfs" "$W/nullfs"
cc -O2 -o "$W/metabench" "$HERE/metabench.c"

# As the node agent runs it: counting into a mapped counters file (fuse::contract::counters;
# builds before the flag count nothing).
if "$TESSERA_BIN" mount --help 2>/dev/null | grep -q -- --counters-file; then
    TESSERA_ARGS="--counters-file $W/tessera.counters ${TESSERA_ARGS:-}"
fi
# shellcheck disable=SC2086 # TESSERA_ARGS is a list of words
"$TESSERA_BIN" mount --source "$BASE/tessera-src" --mountpoint "$W/tessera" \
    --capacity-bytes $((1 << 40)) ${TESSERA_ARGS:-} 2>"$W/tessera.log" &
TESSERA_PID=$!
"$NULLFS_BIN" "$W/nullfs" 2>"$W/nullfs.log" &
NULLFS_PID=$!
bindfs --multithreaded "$BASE/bindfs-src" "$W/bindfs"
for m in tessera nullfs; do
    for _ in $(seq 100); do
        [ "$(stat -f -c %t "$W/$m")" = 65735546 ] && break
        sleep 0.1
    done
    [ "$(stat -f -c %t "$W/$m")" = 65735546 ] || { cat "$W/$m.log"; die "$m did not mount"; }
done
mountpoint -q "$W/bindfs" || die "bindfs did not mount"

declare -A DIR=([native]="$BASE/native" [tessera]="$W/tessera" [bindfs]="$W/bindfs" [nullfs]="$W/nullfs")
# nullfs keeps no data: it runs the metadata rows only.
TARGETS=(native tessera bindfs nullfs)
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

# metadata TARGET: the create/stat/unlink rows.
metadata() {
    local target=$1 dir=${DIR[$1]}
    mkdir -p "$dir/meta"
    drop_caches
    "$W/metabench" "$dir/meta" "$FILES" | while read -r phase value; do
        echo "$phase $target $value" >>"$RESULTS"
    done
    rmdir "$dir/meta"
}

one_round() {
    local target=$1 dir=${DIR[$1]}
    [ "$target" = nullfs ] && { metadata "$target"; return; }
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
    metadata "$target"
}

for round in $(seq "$ROUNDS"); do
    # Rotate the order so no target always runs first (or right after another's writeback).
    for i in 0 1 2 3; do
        target=${TARGETS[$(((i + round) % 4))]}
        echo "round $round/$ROUNDS: $target" >&2
        one_round "$target"
    done
done
LOAD_AFTER=$(loadavg)

# profile TARGET N: one more metabench pass, its figures not in the tables, recording
# the CPU time of metabench and of TARGET's daemon at each phase boundary
# (profile/phases-TARGET.N.txt) and, where tracing is on, the kernel's FUSE request
# events of TARGET's connection (profile/trace-TARGET.N.txt).
profile() {
    local target=$1 n=$2 dir=${DIR[$1]} dev conn lost
    if [ -n "$TRACE_INSTANCE" ]; then
        # The connection is the mount's device number in the kernel's encoding.
        dev=$(mountpoint -d "$dir")
        conn=$(((${dev%%:*} << 20) | ${dev##*:}))
        echo 0 >"$TRACE_INSTANCE/tracing_on"
        : >"$TRACE_INSTANCE/trace"
        echo "connection == $conn" >"$TRACE_INSTANCE/events/fuse/filter"
        echo 1 >"$TRACE_INSTANCE/events/fuse/enable"
    fi
    mkdir -p "$dir/meta"
    drop_caches
    [ -z "$TRACE_INSTANCE" ] || echo 1 >"$TRACE_INSTANCE/tracing_on"
    "$W/metabench" "$dir/meta" "$FILES" -t "${PID[$target]}" >"$W/profile/phases-$target.$n.txt"
    [ -z "$TRACE_INSTANCE" ] || echo 0 >"$TRACE_INSTANCE/tracing_on"
    rmdir "$dir/meta"
    [ -n "$TRACE_INSTANCE" ] || return 0
    cp "$TRACE_INSTANCE/trace" "$W/profile/trace-$target.$n.txt"
    lost=$(awk '/^overrun:/ {n += $2} END {print n + 0}' "$TRACE_INSTANCE"/per_cpu/cpu*/stats)
    [ "$lost" = 0 ] || echo "run.sh: the trace of $target lost $lost events (buffer full)" >&2
}

declare -A PID=([tessera]=$TESSERA_PID [nullfs]=$NULLFS_PID)
mkdir -p "$W/profile"
if [ -z "$TRACE_NOTE" ]; then
    TRACE_INSTANCE=$TRACEFS/instances/tessera-bench-$$
    mkdir "$TRACE_INSTANCE"
    echo mono >"$TRACE_INSTANCE/trace_clock"
    # A file costs about 20 events of under 50 bytes, in one CPU's buffer or another's:
    # FILES KiB per CPU is room enough.
    echo $((FILES > 8192 ? FILES : 8192)) >"$TRACE_INSTANCE/buffer_size_kb"
else
    echo "run.sh: $TRACE_NOTE" >&2
fi
# Two passes each, in the order A B B A, so neither target always runs first.
for pass in "nullfs 1" "tessera 1" "tessera 2" "nullfs 2"; do
    echo "profile pass: $pass" >&2
    # shellcheck disable=SC2086 # two words
    profile $pass
done
if [ -n "$TRACE_INSTANCE" ]; then
    rmdir "$TRACE_INSTANCE"
    TRACE_INSTANCE=
fi

# Stop the daemons before the report, so their logs end with their counters (which
# opens were passthrough, how many reads and writes still reached the daemon; the
# requests nullfs answered) and the report's BENCH line is the last line out.
kill -TERM "$TESSERA_PID" && wait "$TESSERA_PID" || true
TESSERA_PID=
umount "$W/nullfs" && wait "$NULLFS_PID" || true
NULLFS_PID=
grep -E "quota mode chosen|kernel cache lifetimes|FUSE connection initialised| unmounted " "$W/tessera.log" | sed 's/^/tessera: /' >&2 || true
sed 's/^nullfs: //; s/^/nullfs: /' "$W/nullfs.log" >&2 || true

python3 "$HERE/report.py" "$RESULTS" "$W/profile" backend="$BACKEND" \
    fs="$(stat -f -c %T "$BASE/native")" rounds="$ROUNDS" size="$SIZE" runtime="$RUNTIME" \
    files="$FILES" cores="$(nproc)" kernel="$(uname -r)" load_before="$LOAD_BEFORE" \
    load_after="$LOAD_AFTER" traced="$([ -z "$TRACE_NOTE" ] && echo yes || echo no)"
