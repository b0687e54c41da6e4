#!/usr/bin/env bash
# What the nodes' shared backend gives two clients, measured on the running nodes
# (`make cluster-up`): data written on one node read on the other, fcntl and flock
# locks taken on A conflicting on B, how long B waits after A releases, and how long
# a write closed on A takes to be read on B. Prints one line per probe; exits 1 if
# data or a lock does not cross the nodes.
#
#   bash tests/harness/sharedfs-check.sh [NODE_A NODE_B]
#   ENTER_A='nsenter -m -t PID' ENTER_B=... bash tests/harness/sharedfs-check.sh
#                                 (any two mount namespaces with the backend at DIR)
# DIR (default /mnt/shared) is the backend in both; ROUNDS (50), GAP_MS (100).
set -euo pipefail
HARNESS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
A=${1:-tessera-node-a}; B=${2:-tessera-node-b}
read -r -a EA <<<"${ENTER_A:-bash $HARNESS_DIR/nodes.sh enter $A}"
read -r -a EB <<<"${ENTER_B:-bash $HARNESS_DIR/nodes.sh enter $B}"
DIR=${DIR:-/mnt/shared}
PROBE="$HARNESS_DIR/sharedfs-probe.py"
d="$DIR/.sharedfs-check.$$"
rc=0
fail() { echo "FAIL: $*"; rc=1; }
on() { local w=$1; shift; if [[ $w == A ]]; then "${EA[@]}" "$@"; else "${EB[@]}" "$@"; fi; }
ms() { python3 -c 'import sys; print(f"{(int(sys.argv[2]) - int(sys.argv[1])) / 1e6:.1f}")' "$1" "$2"; }

tmp=$(mktemp -d)
on A mkdir -p "$d"
trap 'on A rm -rf "$d" || true; rm -rf "$tmp"' EXIT
echo "backend at $DIR: A $(on A findmnt -no FSTYPE,SOURCE --target "$DIR" | head -n1), B $(on B findmnt -no FSTYPE,SOURCE --target "$DIR" | head -n1)"

# Data: written on one node, read on the other (each right after the other's close).
on A sh -c "echo from-A >'$d/a'"; got=$(on B cat "$d/a" 2>&1) || true
[[ $got == from-A ]] && echo "A→B data: ok" || fail "A wrote from-A, B read '$got'"
on B sh -c "echo from-B >'$d/b'"; got=$(on A cat "$d/b" 2>&1) || true
[[ $got == from-B ]] && echo "B→A data: ok" || fail "B wrote from-B, A read '$got'"

# Locks: A holds KIND; B's non-blocking try must conflict (B's try of the other kind is
# shown: Linux keeps flock and fcntl apart, a backend may not), B's blocking wait returns
# after A's release: LOCK_ROUNDS times, the wait from release on A to acquired on B.
for kind in fcntl flock; do
  f="$d/lock-$kind"
  other=$([[ $kind == fcntl ]] && echo flock || echo fcntl)
  waits=()
  for ((r = 0; r < ${LOCK_ROUNDS:-3}; r++)); do
    out="$tmp/$kind.$r"   # one file per round: never read the previous round's `locked`
    on A python3 "$PROBE" hold "$f" "$kind" 3 >"$out" 2>&1 &
    pid=$!
    for ((i = 0; i < 100; i++)); do grep -q locked "$out" 2>/dev/null && break; sleep 0.05; done
    grep -q locked "$out" || { fail "A could not take the $kind lock: $(cat "$out")"; wait "$pid"; continue; }
    try=$(on B python3 "$PROBE" try "$f" "$kind")
    cross=$(on B python3 "$PROBE" try "$f" "$other")
    acq=$(on B python3 "$PROBE" wait "$f" "$kind")
    wait "$pid"
    rel=$(sed -n 's/released at=//p' "$out")
    # (a try after A's release, on a loaded machine, proves nothing either way)
    if ((${try#*at=} < rel)); then
      [[ ${try% *} == conflict=1 ]] || fail "$kind lock held on A: B's try gave $try"
    else
      echo "($kind round $r: B's try came after A's release: not counted)"
    fi
    try=${try% *}; cross=${cross% *}
    waits+=("$(ms "$rel" "${acq#acquired at=}")")
  done
  sorted=$(printf '%s\n' "${waits[@]}" | sort -n | tr '\n' ' ')
  echo "$kind: held on A, B's try: $try; B's $other try: $cross; B's wait after A's release (ms): $sorted"
done

# Visibility: A rewrites one file every GAP_MS (open, write, close); B re-reads it
# (open, read, close) in a loop: the delay from A's write to B's first read of it.
on B python3 "$PROBE" watch "$d/v" "${ROUNDS:-50}" 60 >"$tmp/watch" &
wpid=$!
sleep 0.5
on A python3 "$PROBE" write "$d/v" "${ROUNDS:-50}" "${GAP_MS:-100}"
wait "$wpid"
echo "A write → B read (close-to-open, B polling): $(cat "$tmp/watch")"
rm -f "$tmp/watch"
exit $rc
