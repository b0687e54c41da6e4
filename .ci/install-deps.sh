#!/usr/bin/env bash
# Installs what the tests need on a fresh machine (Debian, root). Idempotent and quick
# when everything is present.
set -euo pipefail

need_apt=()
command -v flock >/dev/null || need_apt+=(util-linux)
command -v fusermount3 >/dev/null || need_apt+=(fuse3)
command -v fio >/dev/null || need_apt+=(fio)
command -v bindfs >/dev/null || need_apt+=(bindfs)
# tests/fuse/backend_quota.rs and `make bench-fuse` make XFS filesystems.
command -v mkfs.xfs >/dev/null || need_apt+=(xfsprogs)
# Where the kernel has no XFS quota support, tests/run.sh runs the project-quota tests
# in a QEMU VM on Debian's 6.12 kernel (tests/vm/xfs-quota.sh).
modprobe xfs 2>/dev/null || true
if [[ ! -e /proc/fs/xfs/xqmstat ]]; then
  command -v qemu-system-x86_64 >/dev/null || need_apt+=(qemu-system-x86)
  dpkg -s busybox-static >/dev/null 2>&1 || need_apt+=(busybox-static)
  command -v xz >/dev/null || need_apt+=(xz-utils)
fi
# The harness nodes (tests/harness/nodes.sh, images.sh): runc is built with seccomp
# (cgo, libseccomp-dev), the test image is Debian's static busybox, and the nodes use
# unshare/findmnt/mountpoint (util-linux), ip (iproute2) and a C compiler for cgo.
dpkg -s libseccomp-dev >/dev/null 2>&1 || need_apt+=(libseccomp-dev)
dpkg -s busybox-static >/dev/null 2>&1 || need_apt+=(busybox-static)
command -v ip >/dev/null || need_apt+=(iproute2)
command -v gcc >/dev/null || need_apt+=(gcc libc6-dev)
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
# The real nodes' shared backend (tests/harness/gluster.sh): a GlusterFS server
# (glusterd, started by the harness in a namespace of its own, not as a service) and
# its FUSE client, one per node.
command -v glusterd >/dev/null || need_apt+=(glusterfs-server)
command -v glusterfs >/dev/null || need_apt+=(glusterfs-client)
# The real-Pod lock tests (tests/pods/locks.rs) and their comparator (tests/fuse/locks.rs)
# run the sqlite3 CLI; images.sh copies it into the tools image.
command -v sqlite3 >/dev/null || need_apt+=(sqlite3)
# `make lint` checks the pictures in docs/ against their sources: Graphviz renders
# docs/diagrams/*.dot (with the DejaVu fonts the sources name), Python's standard
# library the bench charts (bench/charts.py).
command -v dot >/dev/null || need_apt+=(graphviz)
dpkg -s fonts-dejavu-core >/dev/null 2>&1 || need_apt+=(fonts-dejavu-core)
command -v python3 >/dev/null || need_apt+=(python3)
# The harness registry (tests/harness/registry.sh: Debian's docker-registry, run by the
# harness, not as the package's service; htpasswd from apache2-utils; curl checks it)
# and the Containerfile image built with buildah (daemonless, --isolation chroot).
command -v docker-registry >/dev/null || need_apt+=(docker-registry)
command -v htpasswd >/dev/null || need_apt+=(apache2-utils)
command -v buildah >/dev/null || need_apt+=(buildah)
command -v curl >/dev/null || need_apt+=(curl)
if ((${#need_apt[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi

# Go modules (the control plane, the sidecars, helm, promtool for the alert rules'
# tests) are built by `make harness` (tests/harness/build.sh), not installed here.
command -v go >/dev/null || { echo "Go is required (1.26)" >&2; exit 1; }
command -v cargo >/dev/null || { echo "Rust (cargo) is required" >&2; exit 1; }
rustup component add rustfmt clippy >/dev/null 2>&1 || true
