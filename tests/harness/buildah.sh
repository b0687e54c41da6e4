# Sourced by images.sh and registry.sh: `bah ARGS...` runs buildah (Debian's, no
# daemon, no container engine) with everything it keeps under target/buildah/: its
# image store (vfs driver: no mounts left behind), its run state, and no host-wide
# configuration written (registries.conf and policy.json are the package's, read only).
BUILDAH_DIR="${BUILDAH_DIR:-$ROOT/target/buildah}"
bah() {
  command -v buildah >/dev/null || { echo "buildah missing (Debian's buildah): run .ci/install-deps.sh" >&2; return 1; }
  mkdir -p "$BUILDAH_DIR/root" "$BUILDAH_DIR/run" "$BUILDAH_DIR/tmp"
  TMPDIR="$BUILDAH_DIR/tmp" buildah --root "$BUILDAH_DIR/root" --runroot "$BUILDAH_DIR/run" --storage-driver vfs "$@"
}
