#!/usr/bin/env bash
# Run test binaries inside a throwaway QEMU VM booted from Debian's 6.12 cloud kernel
# (bookworm-backports), which has XFS project quotas (CONFIG_XFS_QUOTA) and FUSE
# passthrough. For hosts whose kernel lacks XFS quota support: tests/run.sh runs the
# project-quota tests of tests/fuse/backend_quota.rs through this script there.
#
#   tests/vm/xfs-quota.sh TEST_BINARY...     (TEST_ARGS: arguments for each binary)
#
# The VM boots straight into an initramfs holding busybox, mkfs.xfs, the kernel's
# xfs/loop modules, the tessera binary the tests spawn (at the same path as on the
# host) and the test binaries, runs each binary, prints its libtest output and
# "VM TEST EXIT <name>: <code>", and powers off. No KVM is needed (TCG emulation), so
# timings inside mean nothing; only pass/fail does.
#
# The kernel package is downloaded once with a private apt configuration (the host's
# sources are not touched) into $TESSERA_VM_CACHE (default ~/.cache/tessera/vm).
# Needs: qemu-system-x86_64, busybox (static), mkfs.xfs, dpkg-deb, xz, cpio-capable
# busybox, apt-get (all installed by .ci/install-deps.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE=${TESSERA_VM_CACHE:-$HOME/.cache/tessera/vm}
TESSERA_BIN=${TESSERA_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/tessera}
die() { echo "xfs-quota.sh: $*" >&2; exit 1; }
(($# > 0)) || die "usage: $0 TEST_BINARY..."
for tool in qemu-system-x86_64 busybox mkfs.xfs dpkg-deb xz apt-get; do
    command -v "$tool" >/dev/null || die "$tool is missing (bash .ci/install-deps.sh)"
done
[[ -x $TESSERA_BIN ]] || die "no tessera binary at $TESSERA_BIN (cargo build --bin tessera)"

# --- the kernel, once --------------------------------------------------------------
kernel_dir=$CACHE/kernel
if ! ls "$kernel_dir"/boot/vmlinuz-* >/dev/null 2>&1; then
    apt=$CACHE/apt
    mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/etc"
    echo "deb http://deb.debian.org/debian bookworm-backports main" >"$apt/etc/sources.list"
    opts=(-o "Dir::Etc::SourceList=$apt/etc/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
          -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -o "APT::Get::List-Cleanup=0")
    apt-get "${opts[@]}" -qq update
    # The metapackage names the current image package of bookworm-backports.
    pkg=$(apt-cache "${opts[@]}" depends linux-image-cloud-amd64/bookworm-backports 2>/dev/null |
          awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
    [[ -n $pkg ]] || pkg=$(apt-cache "${opts[@]}" search '^linux-image-6\.12.*-cloud-amd64$' |
                          awk '{print $1}' | sort -V | tail -1)
    [[ -n $pkg ]] || die "no 6.12 cloud kernel found in bookworm-backports"
    (cd "$apt/cache" && apt-get "${opts[@]}" -qq download "$pkg")
    rm -rf "$kernel_dir.tmp" && mkdir -p "$kernel_dir.tmp"
    dpkg-deb -x "$apt/cache/${pkg}"_*.deb "$kernel_dir.tmp"
    rm -f "$apt/cache/${pkg}"_*.deb
    rm -rf "$kernel_dir" && mv "$kernel_dir.tmp" "$kernel_dir"
fi
vmlinuz=$(ls "$kernel_dir"/boot/vmlinuz-* | head -1)
modules=$(ls -d "$kernel_dir"/lib/modules/*/kernel)

# --- the initramfs -----------------------------------------------------------------
ir=$(mktemp -d /var/tmp/tessera-vm.XXXXXX)
trap 'rm -rf "$ir" "$ir.cpio.gz"' EXIT
chmod 755 "$ir"
mkdir -p "$ir"/{bin,lib64,lib/x86_64-linux-gnu,mods,proc,sys,dev,tmp,usr/sbin,etc}
cp "$(command -v busybox)" "$ir/bin/"
cp "$(command -v mkfs.xfs)" "$ir/usr/sbin/"
mkdir -p "$ir$(dirname "$TESSERA_BIN")"
cp "$TESSERA_BIN" "$ir$TESSERA_BIN" && strip "$ir$TESSERA_BIN"
names=()
for bin in "$@"; do
    cp "$bin" "$ir/bin/" && strip "$ir/bin/$(basename "$bin")"
    names+=("$(basename "$bin")")
done
for lib in $(ldd "$(command -v mkfs.xfs)" "$TESSERA_BIN" "$@" | awk '/=>/ {print $3}' | sort -u); do
    cp -L "$lib" "$ir/lib/x86_64-linux-gnu/"
done
cp -L /lib64/ld-linux-x86-64.so.2 "$ir/lib64/"
cp /etc/passwd /etc/group "$ir/etc/"
for m in lib/libcrc32c fs/xfs/xfs drivers/block/loop; do
    src=$(ls "$modules/$m".ko* 2>/dev/null | head -1)
    [[ -n $src ]] || continue # built in
    case $src in
        *.xz) xz -dc "$src" >"$ir/mods/$(basename "$m").ko" ;;
        *) cp "$src" "$ir/mods/" ;;
    esac
done
{
    echo '#!/bin/busybox sh'
    echo '/bin/busybox --install -s /bin'
    echo 'export PATH=/bin:/usr/sbin RUST_BACKTRACE=0'
    echo 'mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev'
    echo 'mount -t tmpfs -o size=2g tmp /tmp; mkdir -p /var/tmp; mount -t tmpfs tmp /var/tmp'
    echo 'for m in libcrc32c xfs loop; do [ -e /mods/$m.ko ] && insmod /mods/$m.ko; done'
    echo 'echo "VM kernel: $(uname -r)"'
    echo "mkdir -p $ROOT && cd $ROOT"
    for name in "${names[@]}"; do
        echo "echo '=== $name'"
        echo "/bin/$name ${TEST_ARGS:-} 2>&1; echo \"VM TEST EXIT $name: \$?\""
    done
    echo 'poweroff -f'
} >"$ir/init"
chmod +x "$ir/init"
(cd "$ir" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1 >"$ir.cpio.gz")

# --- boot it -----------------------------------------------------------------------
out=$(mktemp)
timeout "${TESSERA_VM_TIMEOUT:-900}" qemu-system-x86_64 -accel tcg,thread=multi \
    -cpu qemu64,-cx16 -smp 2 -m 3072 -nographic -no-reboot \
    -kernel "$vmlinuz" -initrd "$ir.cpio.gz" -append "console=ttyS0 quiet panic=-1" |
    tr -d '\r' | sed -n '/VM kernel/,$p' | tee "$out"
rc=0
for name in "${names[@]}"; do
    grep -q "^VM TEST EXIT $name: 0$" "$out" || { echo "xfs-quota.sh: $name failed in the VM" >&2; rc=1; }
done
rm -f "$out"
exit "$rc"
