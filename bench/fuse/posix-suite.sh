#!/usr/bin/env bash
# Run the pjdfstest POSIX suite (the Rust rewrite, crates.io `pjdfstest`) over a
# `tessera mount`, and print its summary and the pass rate.
#
#   bench/fuse/posix-suite.sh                 # default mount (nodev)
#   bench/fuse/posix-suite.sh --options dev   # extra `tessera mount` arguments
#
# As root. Installs pjdfstest 0.2.2 with `cargo install` into target/tools the first
# time (a few minutes), and creates the unprivileged user `tests` it switches to if it
# does not exist. Remount tests (EROFS) are skipped: they need remounting the
# filesystem under test. Device-node tests (mknod of char/block devices) fail on the
# default `nodev` mount by design: tessera refuses to create device nodes there (they
# would be inert through the mount but live in the backing directory); with
# `--options dev` they are allowed.
#
# Environment: TESSERA_BIN (a prebuilt binary; otherwise `cargo build`), PJDFSTEST
# (a prebuilt pjdfstest binary).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
die() { echo "posix-suite.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root"

if [ -z "${PJDFSTEST:-}" ]; then
    PJDFSTEST="$REPO/target/tools/bin/pjdfstest"
    if [ ! -x "$PJDFSTEST" ]; then
        cargo install --locked --version 0.2.2 --root "$REPO/target/tools" pjdfstest >&2
    fi
fi
if [ -z "${TESSERA_BIN:-}" ]; then
    (cd "$REPO" && cargo build --bin tessera >&2)
    TESSERA_BIN="$REPO/target/debug/tessera"
fi
id tests >/dev/null 2>&1 || useradd --no-create-home --shell /usr/sbin/nologin tests
nogroup=$(id -gn nobody)

W=$(mktemp -d /var/tmp/tessera-posix.XXXXXX)
PID=
cleanup() {
    set +e
    [ -n "$PID" ] && kill -TERM "$PID" 2>/dev/null && wait "$PID"
    mountpoint -q "$W/mnt" && umount -l "$W/mnt"
    rm -rf "$W"
}
trap cleanup EXIT
# The suite switches to unprivileged users, who must reach the mount point.
chmod 755 "$W"
mkdir -p "$W/src" "$W/mnt" "$W/secondary"
cat >"$W/pjdfstest.toml" <<EOF
[features]
posix_fallocate = {}
utimensat = {}
utime_now = {}
rename_ctime = {}

[settings]
# Larger than the kernel's timestamp granularity (a jiffy), or timestamp tests flake
# on any filesystem, ext4 included.
naptime = 0.01
allow_remount = false

[dummy_auth]
entries = [["nobody", "$nogroup"], ["tests", "tests"]]
EOF

# A quota far above what the suite writes (one test makes a sparse 2 GiB file; the
# quota counts apparent sizes).
"$TESSERA_BIN" mount --source "$W/src" --mountpoint "$W/mnt" \
    --capacity-bytes $((64 << 30)) "$@" 2>"$W/tessera.log" &
PID=$!
for _ in $(seq 100); do
    [ "$(stat -f -c %t "$W/mnt")" = 65735546 ] && break
    sleep 0.1
done
[ "$(stat -f -c %t "$W/mnt")" = 65735546 ] || { cat "$W/tessera.log"; die "no mount"; }

# The secondary filesystem (for EXDEV cases) is the one holding the scratch dir.
(cd "$W/mnt" && "$PJDFSTEST" -c "$W/pjdfstest.toml" -p "$W/mnt" -s "$W/secondary") \
    >"$W/pjdfstest.log" 2>&1 || true
grep -E "FAILED" -A1 "$W/pjdfstest.log" | grep -v -- "^--" | paste - - | sed 's/\t\+/  /' || true
summary=$(grep '^Summary:' "$W/pjdfstest.log") || { tail -50 "$W/pjdfstest.log"; die "no summary"; }
echo "$summary"
python3 - "$summary" <<'EOF'
import re, sys
failed, skipped, passed = (int(x) for x in re.findall(r"(\d+) (?:failed|skipped|passed)", sys.argv[1]))
ran = failed + passed
print(f"pass rate: {passed}/{ran} = {100 * passed / ran:.1f}% of the tests that ran ({skipped} skipped)")
EOF
