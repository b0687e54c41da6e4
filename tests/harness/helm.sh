#!/usr/bin/env bash
# Installs Tessera on the harness nodes with Helm (charts/tessera), as deploy.sh does
# with kustomize, and checks the chart's install and uninstall for real.
#
# The harness values are those of deploy.sh's overlay (KUBERNETES_SERVICE_HOST/PORT in
# extraEnv: no kube-proxy; the example StorageClass on), except the images: as a user
# installs, Tessera's image is built from the Containerfile (buildah) and pushed with
# the CSI sidecars to the harness registry (registry.sh push), and every Pod, mount
# Pods included, pulls them from there with the pull Secret tessera-registry
# (imagePullSecrets). The chart too comes from the registry, as users get it: `helm
# package`, `helm registry login` and `helm push` to oci://REGISTRY/charts, then `helm
# install oci://REGISTRY/charts/tessera --version CHART_VERSION --ca-file CA` (the
# harness CA; the login's credentials, kept in $CL/helm/config). HARNESS_IMAGES=offline:
# the images `make image` loaded instead (harness.tessera.io/..., pullPolicy Never), as
# deploy.sh does, and the chart from the directory.
#
# The release namespace (HELM_NAMESPACE, default tessera-system) is created and
# labelled pod-security.kubernetes.io/enforce=privileged before the install, as
# docs/operations.md says: the chart refuses to install into a namespace without it.
#
#   helm.sh up      helm install --wait; wait until every node's kubelet lists the driver
#   helm.sh down    helm uninstall --wait; check that nothing but the CRDs is left
#                   (crds.keep: the chart keeps them, and so every Volume)
#   helm.sh values  print the harness values
#   helm.sh previous  the previous release ($PREVIOUS, tests/upgrade/) from the
#                   registry: its chart pushed beside this one, this image also
#                   tagged $PREVIOUS; installed and rolled out (tests/pods/release.rs)
#   helm.sh upgrade helm upgrade to this checkout's chart (--reset-then-reuse-values,
#                   as docs/operations.md says), every workload rolled to the new image
#   helm.sh verify VOLUME  after the upgrade: the user's values kept, the CRDs this
#                   checkout's, the admission policies in force, mount Pods pulled
#   helm.sh rollback  helm rollback to revision 1, every workload on its image again
#   helm.sh test    on a cluster deployed by deploy.sh (the demo's): undeploy the
#                   kustomize install; into the namespace tessera-alt (not the
#                   default): the chart's Pod Security refusals (no namespace yet, then
#                   one enforcing baseline) and the fix each prints, run as printed;
#                   `up` from the OCI chart; the admission policies name and hold the
#                   agent of tessera-alt; a Pod on a new claim to Running, the Pod and
#                   claim deleted to the Volume gone; `down`; the namespace deleted;
#                   the CRDs removed as docs/operations.md says (tests/run.sh)
set -euo pipefail

HARNESS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HARNESS_DIR/../.." && pwd)"
BIN="${HARNESS_BIN:-$ROOT/target/harness/bin}"
CL="${HARNESS_CLUSTER_DIR:-$ROOT/target/cluster}"
TIMEOUT="${HARNESS_DEPLOY_TIMEOUT:-180}"
NS="${HELM_NAMESPACE:-tessera-system}"
ALT_NS=tessera-alt
RELEASE=tessera
DRIVER=csi.tessera.io
TEST_NS=tessera-helm
PULL_SECRET=tessera-registry
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/Cargo.toml" | head -n1)
CHART_VERSION=$(sed -n 's/^version: *//p' "$ROOT/charts/tessera/Chart.yaml")
# The previous release: its chart as published (helm package), kept in tests/upgrade/
# (README there); its image is this checkout's under the previous tag (no image of it
# was published: the upgrade tests what the chart and the rollout do, not a protocol
# change between two binaries).
PREVIOUS_CHART=$(ls "$ROOT"/tests/upgrade/tessera-*.tgz | sort -V | tail -n1)
PREVIOUS=$(basename "$PREVIOUS_CHART" .tgz)
PREVIOUS=${PREVIOUS#tessera-}
PSA_LABEL=pod-security.kubernetes.io/enforce

log() { printf '[helm] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
k() { "$BIN/kubectl" --kubeconfig "$CL/kubeconfig" --cache-dir "$CL/kubectl-cache" "$@"; }
# (HELM_*_HOME: helm writes no cache or config outside the cluster's directory)
h() {
  HELM_CACHE_HOME="$CL/helm/cache" HELM_CONFIG_HOME="$CL/helm/config" HELM_DATA_HOME="$CL/helm/data" \
    "$BIN/helm" --kubeconfig "$CL/kubeconfig" "$@"
}
# wait_for SECONDS DESCRIPTION COMMAND...: retry COMMAND until it succeeds.
wait_for() {
  local end=$(( $(date +%s) + $1 )) what=$2; shift 2
  until "$@" >/dev/null 2>&1; do
    (( $(date +%s) < end )) || die "timed out after $1 s waiting for: $what"
    sleep 0.5
  done
}
ms_since() { echo $(( $(date +%s%3N) - $1 )); }

[[ -x "$BIN/helm" ]] || die "no $BIN/helm: build the harness (make harness)"
[[ -f "$CL/cluster.env" ]] || die "no cluster: make cluster-up first"
# shellcheck disable=SC1091
. "$CL/cluster.env"
# The Pods reach the API server through the nodes' relay (nodes.sh, api-gate) when
# one runs.
# shellcheck disable=SC1091
if [[ -f "$CL/gate.env" ]]; then . "$CL/gate.env"; fi
POD_API_PORT=${TESSERA_GATE_PODS_PORT:-$TESSERA_APISERVER_PORT}

# The registry the images come from (empty: offline, the images `make image` loaded).
registry() {
  [[ "${HARNESS_IMAGES:-registry}" != offline && -f "$CL/registry.env" ]] || return 0
  sed -n 's/^TESSERA_REGISTRY=//p' "$CL/registry.env"
}

values() {
  [[ -n "${TESSERA_HOST_IP:-}" && "${TESSERA_APISERVER_BIND:-}" == 0.0.0.0 ]] ||
    die "the control plane serves on loopback only: start it with nodes (make cluster-up)"
  local s reg sidecars policy
  reg=$(registry)
  echo "# Generated by tests/harness/helm.sh; see there."
  if [[ -n "$reg" ]]; then
    sidecars=$reg/sig-storage policy=""
    # (no tag: the chart's appVersion, so an upgrade to a new chart moves the image)
    echo "image: {repository: $reg/tessera, pullPolicy: \"\"}"
    echo "imagePullSecrets: [{name: $PULL_SECRET}]"
  else
    sidecars=harness.tessera.io policy=Never
    echo "image: {repository: harness.tessera.io/tessera, tag: $VERSION, pullPolicy: Never}"
  fi
  echo "sidecars:"
  for s in provisioner attacher resizer snapshotter; do
    echo "  $s: {image: {repository: $sidecars/csi-$s, pullPolicy: \"$policy\"}}"
  done
  cat <<EOF
  registrar: {image: {repository: $sidecars/csi-node-driver-registrar, pullPolicy: "$policy"}}
extraEnv:
  - {name: KUBERNETES_SERVICE_HOST, value: "$TESSERA_HOST_IP"}
  - {name: KUBERNETES_SERVICE_PORT, value: "$POD_API_PORT"}
storageClass: {enabled: true}
EOF
}

# Every container of the release's Pods (and of mount Pods) runs an image pulled from
# the registry: its imageID names the registry (a side-loaded image's names only
# harness.tessera.io), and the Pod carries the pull Secret.
pulled_from_registry() { # pulled_from_registry SELECTOR WHAT
  local reg=$1 sel=$2 what=$3 lines bad
  lines=$(k -n "$NS" get pods -l "$sel" -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.spec.imagePullSecrets[*].name}{" "}{range .status.containerStatuses[*]}{.imageID}{" "}{end}{"\n"}{end}')
  [[ -n "$lines" ]] || die "no $what Pod found ($sel)"
  bad=$(awk -v reg="$reg" -v sec="$PULL_SECRET" '{ if ($2 != sec) { print $1 ": pull secret " $2; next }
    for (i = 3; i <= NF; i++) if (index($i, reg "/") != 1) print $1 ": " $i }' <<<"$lines")
  [[ -z "$bad" ]] || die "$what not pulled from $reg with $PULL_SECRET: $bad"
  log "$what: $(wc -l <<<"$lines") Pod(s), every container pulled from $reg with $PULL_SECRET"
}

registered() { # every node's CSINode lists the driver (written by its kubelet)
  local n
  for n in $(k get nodes -o jsonpath='{.items[*].metadata.name}'); do
    [[ "$(k get csinode "$n" -o jsonpath="{.spec.drivers[?(@.name==\"$DRIVER\")].nodeID}")" == "$n" ]] || return 1
  done
}

# Tessera's image built from the Containerfile and pushed, with the sidecars.
push_images() {
  local tp reg=$1
  tp=$(date +%s%3N)
  # (the debug binary the demo and the tests built: a release build takes minutes)
  local bin="${TESSERA_IMAGE_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/tessera}"
  [[ -x "$bin" ]] || (cd "$ROOT" && ${CARGO:-cargo} build --bin tessera)
  TESSERA_IMAGE_BIN="$bin" IMAGE_ALSO_TAGS="$PREVIOUS" \
    bash "$HARNESS_DIR/registry.sh" push
  log "built from the Containerfile and pushed to $reg in $(ms_since "$tp") ms"
}

# The chart as a package in the registry: helm package, helm registry login (the
# credentials go to $CL/helm/config/registry, the password through stdin), helm push.
# Without the login the registry refuses to serve it.
push_chart() {
  local reg=$1 tp out
  tp=$(date +%s%3N)
  # shellcheck disable=SC1091
  . "$CL/registry.env"
  rm -rf "$CL/helm/package"
  mkdir -p "$CL/helm/package"
  h package "$ROOT/charts/tessera" --destination "$CL/helm/package" >&2
  h registry login "$reg" --username "$TESSERA_REGISTRY_USER" --password-stdin \
    --ca-file "$TESSERA_REGISTRY_CA" <"$TESSERA_REGISTRY_PASSWORD_FILE" >&2
  h push "$CL/helm/package/tessera-$CHART_VERSION.tgz" "oci://$reg/charts" --ca-file "$TESSERA_REGISTRY_CA" >&2
  h push "$PREVIOUS_CHART" "oci://$reg/charts" --ca-file "$TESSERA_REGISTRY_CA" >&2
  echo '{}' >"$CL/helm/anonymous.json"
  if out=$(h show chart "oci://$reg/charts/tessera" --version "$CHART_VERSION" \
    --ca-file "$TESSERA_REGISTRY_CA" --registry-config "$CL/helm/anonymous.json" 2>&1); then
    die "the registry serves the chart without credentials"
  fi
  grep -qi 'credential\|401\|unauthorized' <<<"$out" || die "the anonymous pull failed, but not for its credentials: $out"
  log "chart packaged and pushed to oci://$reg/charts/tessera:$CHART_VERSION in $(ms_since "$tp") ms (refused without the login)"
}

# The chart to install: the OCI reference (registry) or the directory (offline);
# CHART: the version (default this checkout's).
chart_args() {
  local reg
  reg=$(registry)
  if [[ -n "$reg" ]]; then
    # shellcheck disable=SC1091
    . "$CL/registry.env"
    printf '%s\n' "oci://$reg/charts/tessera" --version "${CHART:-$CHART_VERSION}" --ca-file "$TESSERA_REGISTRY_CA"
  elif [[ "${CHART:-$CHART_VERSION}" == "$PREVIOUS" ]]; then
    printf '%s\n' "$PREVIOUS_CHART"
  else
    printf '%s\n' "$ROOT/charts/tessera"
  fi
}

# helm install ARGS...: the chart into $NS with the harness values.
helm_install() {
  local chart
  mapfile -t chart < <(chart_args)
  h install "$RELEASE" "${chart[@]}" --namespace "$NS" --create-namespace \
    --values "$CL/helm/values.yaml" "$@"
}

# The namespace as docs/operations.md makes it: labelled for the privileged node Pods.
privileged_namespace() {
  k create namespace "$NS" --dry-run=client -o yaml | k apply -f - >/dev/null
  k label namespace "$NS" "$PSA_LABEL=privileged" --overwrite >/dev/null
}

# The install itself, on a prepared namespace ($NS labelled, the pull Secret there).
install_release() {
  local t0 reg
  t0=$(date +%s%3N)
  reg=$(registry)
  if ! helm_install --wait --timeout "${TIMEOUT}s" >&2; then
    k -n "$NS" get pods -o wide >&2 || true
    die "helm install did not become Ready"
  fi
  wait_for "$TIMEOUT" "$DRIVER registered with every node's kubelet" registered
  k -n "$NS" get pods -o wide >&2
  if [[ -n "$reg" ]]; then
    pulled_from_registry "$reg" app.kubernetes.io/instance="$RELEASE" "the release's Pods"
    k -n "$NS" get events --field-selector reason=Pulled -o jsonpath='{range .items[*]}{.message}{"\n"}{end}' |
      grep -F "$reg" | sed 's/^/[helm]   /' >&2 || true
  fi
  log "installed with Helm ($(chart_args | head -n1)) into $NS in $(ms_since "$t0") ms: controller and node DaemonSet Ready, $DRIVER registered on every node"
}

prepare() {
  mkdir -p "$CL/helm"
  values >"$CL/helm/values.yaml"
  local reg
  reg=$(registry)
  if [[ -n "$reg" ]]; then
    push_images "$reg"
    push_chart "$reg"
  fi
}

pull_secret() {
  [[ -z "$(registry)" ]] || bash "$HARNESS_DIR/registry.sh" secret "$NS" "$PULL_SECRET"
}

cmd_up() {
  prepare
  # As a user does: the namespace labelled for Pod Security, and given the pull Secret
  # before the chart's Pods need it.
  privileged_namespace
  pull_secret
  install_release
}

# What the release leaves behind: every object of the chart's kinds labelled with the
# release, and the CSIDriver by name.
leftovers() {
  k get -n "$NS" deployments,daemonsets,pods,configmaps,serviceaccounts,roles,rolebindings,poddisruptionbudgets,services \
    -l app.kubernetes.io/instance="$RELEASE" -o name
  k get clusterroles,clusterrolebindings,validatingadmissionpolicies,validatingadmissionpolicybindings,storageclasses,csidrivers \
    -l app.kubernetes.io/instance="$RELEASE" -o name
  k get csidriver "$DRIVER" -o name --ignore-not-found
}

cmd_down() {
  local t0 left crds end
  t0=$(date +%s%3N)
  # The query must see the release before it can say that nothing is left of it.
  left=$(leftovers) || die "could not list the release's objects"
  [[ -n "$left" ]] || die "no object of release $RELEASE found before the uninstall"
  h uninstall "$RELEASE" --namespace "$NS" --wait --timeout "${TIMEOUT}s" >&2
  # The DaemonSet's and Deployment's Pods are deleted by the garbage collector after
  # their owners: give them their grace period.
  end=$(( $(date +%s) + 60 ))
  while :; do
    left=$(leftovers) || die "could not list what the release left"
    [[ -n "$left" ]] || break
    (( $(date +%s) < end )) || die "helm uninstall left: $(echo $left)"
    sleep 0.5
  done
  k -n "$NS" delete secret "$PULL_SECRET" --ignore-not-found >/dev/null
  crds=$(k get crd -l app.kubernetes.io/instance="$RELEASE" -o name | wc -l)
  [[ $crds == 3 ]] || die "the chart keeps its 3 CRDs on uninstall; $crds are left"
  log "uninstalled in $(ms_since "$t0") ms: nothing left but the 3 CRDs (crds.keep)"
}

# The Secret is what lets the nodes pull: the same image without it (pullPolicy
# Always, so the node's copy does not count) is refused by the registry.
pull_waiting() {
  k -n "$TEST_NS" get pod nosecret -o jsonpath='{.status.containerStatuses[0].state.waiting.reason} {.status.containerStatuses[0].state.waiting.message}'
}
pull_refused() { [[ "$(pull_waiting)" == ErrImagePull* || "$(pull_waiting)" == ImagePullBackOff* ]]; }
no_secret_refused() { # no_secret_refused REGISTRY NODE
  local why
  k -n "$TEST_NS" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: nosecret}
spec:
  nodeName: $2
  terminationGracePeriodSeconds: 1
  containers: [{name: c, image: $1/tessera:$VERSION, imagePullPolicy: Always, args: [--version]}]
YAML
  wait_for 60 "the pull without a Secret refused" pull_refused
  why=$(pull_waiting)
  k -n "$TEST_NS" delete pod nosecret --wait=false >/dev/null
  grep -qi 'authoriz\|401' <<<"$why" || die "the pull without a Secret failed, but not for its credentials: $why"
  log "without the pull Secret the same image is refused: ${why:0:200}"
}

# Pod Security: `helm install` into $NS is refused while rendering, before Helm makes
# anything (no namespace, no release), with a message saying WANT and a fix; the fix is
# run as printed (with the harness's kubectl) and must leave $NS enforcing privileged.
refused_then_fixed() { # refused_then_fixed WANT
  local out fix ns_before
  ns_before=$(k get namespace "$NS" -o name --ignore-not-found)
  if out=$(helm_install 2>&1); then die "helm install into $NS was not refused ($1)"; fi
  grep -qF "$1" <<<"$out" || die "helm install into $NS failed, but not with \"$1\": $out"
  [[ "$(k get namespace "$NS" -o name --ignore-not-found)" == "$ns_before" ]] ||
    die "the refused install changed namespace $NS (before: '${ns_before:-none}')"
  ! h status "$RELEASE" --namespace "$NS" >/dev/null 2>&1 || die "the refused install recorded a release"
  fix=$(sed -n 's/.*Fix: `\([^`]*\)`.*/\1/p' <<<"$out")
  [[ "$fix" =~ ^kubectl\ (create\ namespace\ $NS\ \&\&\ kubectl\ )?label\ namespace\ $NS\ $PSA_LABEL=privileged(\ --overwrite)?$ ]] ||
    die "no fix of the expected form in: $out"
  log "refused: ${out##*execution error at }"
  log "running the fix as printed: $fix"
  (kubectl() { k "$@"; }; eval "$fix") >&2
  [[ "$(k get namespace "$NS" -o jsonpath="{.metadata.labels.${PSA_LABEL//./\\.}}")" == privileged ]] ||
    die "after the fix, namespace $NS does not enforce privileged"
}

# The chart's admission policies follow the release namespace: each names the agent of
# $NS (and no other), is bound, and holds: a request RBAC lets that identity make but no
# agent may (it names no node: the impersonated user has no bound Pod token) is denied
# by the policy, not by RBAC.
policy_denies() { # policy_denies POLICY VERB RESOURCE KUBECTL-ARGS...
  local policy=$1 verb=$2 res=$3 agent="system:serviceaccount:$NS:tessera-node" out
  shift 3
  # (can-i warns that --namespace means nothing for the cluster-scoped kinds)
  [[ "$(k auth can-i "$verb" "$res" --namespace "$NS" --as "$agent" 2>/dev/null)" == yes ]] ||
    die "RBAC does not let $agent $verb $res: the policy check would prove nothing"
  if out=$(k --as "$agent" "$@" --dry-run=server 2>&1); then
    die "$agent may $verb $res unchecked (${*}): policy $policy is not in force for namespace $NS"
  fi
  grep -qF "ValidatingAdmissionPolicy '$policy'" <<<"$out" || die "$verb $res as $agent failed, but not by $policy: $out"
  log "  $policy denies $agent: ${out##*denied request: }"
}
policies_in_force() { # policies_in_force VOLUME
  local vol=$1 agent="system:serviceaccount:$NS:tessera-node" p exprs n=0 mp
  for p in tessera-node-own-mountpods tessera-node-inline-volumes tessera-node-inline-tickets tessera-node-own-lease; do
    exprs=$(k get validatingadmissionpolicy "$p" -o jsonpath='{.spec.matchConditions[*].expression}')
    grep -qF "'$agent'" <<<"$exprs" || die "policy $p does not name $agent: $exprs"
    [[ $(grep -o 'system:serviceaccount:[a-z0-9.-]*:' <<<"$exprs" | sort -u) == "system:serviceaccount:$NS:" ]] ||
      die "policy $p names another namespace: $exprs"
    [[ "$(k get validatingadmissionpolicybinding "$p" -o jsonpath='{.spec.policyName}')" == "$p" ]] || die "policy $p is not bound"
    n=$((n + 1))
  done
  log "$n admission policies bound, naming $agent; in force:"
  mp=$(k get mountpods.tessera.io -o jsonpath='{.items[0].metadata.name}')
  [[ -n "$mp" ]] || die "no MountPod to check the policy with"
  policy_denies tessera-node-own-lease create leases.coordination.k8s.io -n "$NS" create -f - <<YAML
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {name: tessera-node-not-a-node}
spec: {holderIdentity: probe}
YAML
  policy_denies tessera-node-inline-volumes delete volumes.tessera.io delete volumes.tessera.io "$vol"
  policy_denies tessera-node-own-mountpods patch mountpods.tessera.io \
    patch mountpods.tessera.io "$mp" --type merge -p '{"metadata":{"labels":{"probe":"x"}}}'
  policy_denies tessera-node-inline-tickets patch volumeattachments.tessera.io \
    patch volumeattachments.tessera.io "$vol" --type merge -p '{"metadata":{"labels":{"probe":"x"}}}'
}

no_tessera_objects() { [[ -z "$(k get tessera -o name)" ]]; }
pod_running() { [[ "$(k -n "$TEST_NS" get pod app -o jsonpath='{.status.phase}')" == Running ]]; }
volume_gone() { ! k get volumes.tessera.io "$1" -o name; }

cmd_test() {
  local t0 node pv vol
  t0=$(date +%s%3N)
  log "replacing the kustomize install (deploy.sh) with the chart, in namespace $ALT_NS"
  FORCE= bash "$HARNESS_DIR/deploy.sh" down
  NS=$ALT_NS
  prepare
  k delete namespace "$NS" --ignore-not-found --wait=true >/dev/null
  # As a user who installs with --create-namespace, then one whose namespace enforces
  # baseline: each refused with the fix, each fix run.
  refused_then_fixed "namespace $NS does not exist"
  k label namespace "$NS" "$PSA_LABEL=baseline" --overwrite >/dev/null
  refused_then_fixed "namespace $NS enforces Pod Security level \"baseline\""
  pull_secret
  install_release
  node=$(k get nodes -o jsonpath='{.items[0].metadata.name}')
  k create namespace "$TEST_NS" >/dev/null
  wait_for 60 "the default ServiceAccount of $TEST_NS" k -n "$TEST_NS" get serviceaccount default
  k -n "$TEST_NS" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: tessera-shared
  resources: {requests: {storage: 16Mi}}
---
apiVersion: v1
kind: Pod
metadata: {name: app}
spec:
  nodeName: $node
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: harness.tessera.io/busybox:1.35
    imagePullPolicy: Never
    command: [sh, -c, 'echo helm > /data/installed-by && exec sleep 3600']
    volumeMounts: [{name: data, mountPath: /data}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]
YAML
  wait_for 120 "Pod app on a Tessera claim Running" pod_running
  pv=$(k -n "$TEST_NS" get pvc data -o jsonpath='{.spec.volumeName}')
  vol=$(k get pv "$pv" -o jsonpath='{.spec.csi.volumeHandle}')
  log "Pod app Running on $node with Volume $vol (installed with Helm)"
  policies_in_force "$vol"
  if [[ -n "$(registry)" ]]; then
    # The mount Pod (created by the node agent) inherits the agent's pull Secret.
    pulled_from_registry "$(registry)" app.kubernetes.io/component=mount "the mount Pods"
    no_secret_refused "$(registry)" "$node"
  fi
  k -n "$TEST_NS" delete pod app --wait=true >/dev/null
  k -n "$TEST_NS" delete pvc data --wait=true >/dev/null
  wait_for 60 "Volume $vol gone" volume_gone "$vol"
  # As README.md's uninstall: every Tessera object gone (its MountPod and ticket list
  # go after the Volume) before Tessera is; else their finalizers stay for ever.
  # (by listing, not `kubectl wait --for=delete`: the data removal's MountPod has the
  # name of the serving one, which the wait takes for gone once the first is)
  wait_for 180 "every Tessera object gone" no_tessera_objects
  k delete namespace "$TEST_NS" --wait=false >/dev/null
  cmd_down
  # (the namespace is the user's, made by the fix: the chart does not delete it)
  k delete namespace "$NS" --wait=true --timeout=120s >/dev/null
  crds_removed
  log "PASSED: kustomize install replaced by Helm from $(chart_args | head -n1) into $NS (Pod Security refusals and fixes), the policies in force for $NS, a Pod ran on a claim, helm uninstall left only the CRDs ($(ms_since "$t0") ms)"
}

# The CRDs removed as docs/operations.md ("Uninstall") says: once `kubectl get
# tessera` is empty, `kubectl delete -k crds/`; they must be gone, not Terminating.
crds_removed() {
  local left t0
  t0=$(date +%s%3N)
  left=$(k get tessera -o name)
  [[ -z "$left" ]] || die "Tessera objects left after the uninstall: $(echo $left)"
  k delete -k "$ROOT/crds/" --wait=true --timeout=60s >&2 || die "kubectl delete -k crds/ did not finish"
  left=$(k get crd -o name | grep '\.tessera\.io$' || true)
  [[ -z "$left" ]] || die "CRDs left after kubectl delete -k crds/: $(echo $left)"
  log "the CRDs removed as documented (kubectl delete -k crds/) in $(ms_since "$t0") ms"
}

# The release workloads all run IMAGE (rolled out: every Pod of the new template).
rolled_to() { # rolled_to IMAGE
  local w
  for w in deployment/tessera-controller daemonset/tessera-node daemonset/tessera-fd-holder; do
    k -n "$NS" rollout status "$w" --timeout="${TIMEOUT}s" >&2 || die "$w did not roll out"
  done
  local images
  images=$(k -n "$NS" get pods -l app.kubernetes.io/instance="$RELEASE" \
    -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.metadata.deletionTimestamp}{" "}{.spec.containers[0].image}{"\n"}{end}' |
    awk -v img="$1" '$2 == "" && $NF != img { print $1 ": " $NF }')
  [[ -z "$images" ]] || die "release Pods not on $1: $images"
}

# Release $PREVIOUS from the registry into $NS (tests/pods/release.rs, then `upgrade`).
cmd_previous() {
  local t0 reg
  t0=$(date +%s%3N)
  reg=$(registry)
  [[ -n "$reg" ]] || die "the upgrade test installs from the registry (no HARNESS_IMAGES=offline)"
  prepare
  privileged_namespace
  pull_secret
  CHART=$PREVIOUS helm_install --wait --timeout "${TIMEOUT}s" >&2 || die "helm install of release $PREVIOUS failed"
  wait_for "$TIMEOUT" "$DRIVER registered with every node's kubelet" registered
  rolled_to "$reg/tessera:$PREVIOUS"
  h get values "$RELEASE" --namespace "$NS" -o json >"$CL/helm/values-$PREVIOUS.json"
  log "release $PREVIOUS installed from oci://$reg/charts/tessera into $NS in $(ms_since "$t0") ms"
}

# `helm upgrade` to this checkout's chart, as docs/operations.md says: the user's values
# kept (--reset-then-reuse-values: the new chart's defaults, then the values the user
# gave; --reuse-values would take the old chart's values and miss every value the new
# chart adds), --wait; then every workload rolled to the new image.
cmd_upgrade() {
  local t0 chart reg
  t0=$(date +%s%3N)
  reg=$(registry)
  mapfile -t chart < <(chart_args)
  h upgrade "$RELEASE" "${chart[@]}" --namespace "$NS" --reset-then-reuse-values \
    --wait --timeout "${TIMEOUT}s" >&2 || die "helm upgrade to $CHART_VERSION failed"
  rolled_to "$reg/tessera:$VERSION"
  wait_for "$TIMEOUT" "$DRIVER registered with every node's kubelet" registered
  log "upgraded $PREVIOUS → $CHART_VERSION in $(ms_since "$t0") ms: controller, node agents and fd holders on $reg/tessera:$VERSION"
}

# `helm rollback` to the first revision (the previous release), as docs/operations.md
# says: every workload back on the previous image.
cmd_rollback() {
  local t0 reg
  t0=$(date +%s%3N)
  reg=$(registry)
  h rollback "$RELEASE" 1 --namespace "$NS" --wait --timeout "${TIMEOUT}s" >&2 || die "helm rollback failed"
  rolled_to "$reg/tessera:$PREVIOUS"
  wait_for "$TIMEOUT" "$DRIVER registered with every node's kubelet" registered
  log "rolled back to revision 1 ($PREVIOUS) in $(ms_since "$t0") ms"
}

# After the upgrade: the values the user gave kept, the CRDs this checkout's, the
# admission policies in force, the mount Pods pulled from the registry.
cmd_verify() { # verify VOLUME
  local vol=${1:?usage: helm.sh verify VOLUME} crd diff
  diff <(h get values "$RELEASE" --namespace "$NS" -o json | python3 -m json.tool --sort-keys) \
    <(python3 -m json.tool --sort-keys "$CL/helm/values-$PREVIOUS.json") >&2 ||
    die "the upgrade changed the values the user gave"
  log "the values given at the install are those of the upgraded release"
  for crd in volumes.tessera.io volumeattachments.tessera.io mountpods.tessera.io; do
    [[ "$(k get crd "$crd" -o jsonpath='{.metadata.labels.helm\.sh/chart}')" == "tessera-$CHART_VERSION" ]] ||
      die "CRD $crd was not upgraded by the chart: $(k get crd "$crd" -o jsonpath='{.metadata.labels}')"
  done
  if ! diff=$(k diff --server-side --force-conflicts -f "$ROOT/crds/tessera.io.yaml" 2>&1); then
    die "the CRDs differ from this checkout's crds/: $diff"
  fi
  log "the 3 CRDs are this checkout's (helm.sh/chart=tessera-$CHART_VERSION; kubectl diff -f crds/tessera.io.yaml: none)"
  policies_in_force "$vol"
  pulled_from_registry "$(registry)" app.kubernetes.io/component=mount "the mount Pods"
}

case "${1:-}" in
  up) cmd_up ;;
  previous) cmd_previous ;;
  upgrade) cmd_upgrade ;;
  rollback) cmd_rollback ;;
  verify) shift; cmd_verify "$@" ;;
  down) cmd_down ;;
  values) values ;;
  test) cmd_test ;;
  *) echo "usage: $0 up|down|values|test|previous|upgrade|verify VOLUME|rollback" >&2; exit 2 ;;
esac
