# Tessera. `make demo` runs Tessera locally; `make test` runs every test.
# See README.md.

CARGO ?= cargo

include tests/harness/harness.mk

.PHONY: all build dist test lint crds diagrams charts dashboard-picture monitoring demo image-containerfile push bench-fuse bench-controller bench-rwx bench-attach

all: build

## build: the tessera and kubectl-tessera binaries (release)
build:
	$(CARGO) build --release

## dist: release archives of kubectl-tessera (the binary and LICENSE, a tar.gz per
## target of DIST_TARGETS, default this machine's) and their krew manifest with each
## archive's sha256, in target/dist/ (plugins/dist.sh; DIST_URL: where the archives
## will be downloadable; TESSERA_PLUGIN_BIN: package that binary, no build)
dist:
	CARGO="$(CARGO)" bash plugins/dist.sh

## crds: regenerate crds/ from the Rust types, and the Helm chart's copy
crds:
	$(CARGO) run -q -- crds > crds/tessera.io.yaml
	cp crds/tessera.io.yaml charts/tessera/files/crds.yaml

## monitoring: after editing config/monitoring/tessera.rules.yaml or the dashboard: the
## PrometheusRule's groups from the rules file, and the Helm chart's copies
monitoring:
	{ sed -n '1,/^spec:$$/p' config/monitoring/prometheusrule.yaml; \
	  grep -v '^#' config/monitoring/tessera.rules.yaml | sed 's/^/  /'; } > config/monitoring/prometheusrule.yaml.new
	mv config/monitoring/prometheusrule.yaml.new config/monitoring/prometheusrule.yaml
	cp config/monitoring/tessera-dashboard.json config/monitoring/tessera.rules.yaml charts/tessera/files/

## lint: formatting, clippy (warnings are errors), what each crate may depend on, and
## the pictures in docs/ are the renderings of their sources (diagrams, bench charts)
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	bash tests/arch/deps.sh
	bash docs/diagrams/render.sh --check
	python3 bench/charts.py --check

## diagrams: render docs/diagrams/*.dot (Graphviz) to the SVGs beside them
diagrams:
	bash docs/diagrams/render.sh

## charts: the benchmark charts of docs/figures.md, docs/figures/*.svg, from the
## recorded BENCH lines in bench/results/
charts:
	python3 bench/charts.py

## dashboard-picture: docs/figures/dashboard.svg, the Grafana dashboard's own queries
## drawn over a real run scraped by a real Prometheus (bench/dashboard.sh; not Grafana;
## root and /dev/fuse; about 5 minutes; not part of `make test`)
dashboard-picture: harness
	bash bench/dashboard.sh

## test: lint, build the harness, start the local control plane (unless KUBECONFIG
## names a cluster), run every test, stop the control plane
test: lint harness
	bash tests/run.sh

## demo: run Tessera locally (ONCE=1: run the flow once, tear down, exit)
demo: harness
	ONCE=$(ONCE) bash tests/demo.sh

## image-containerfile: the Tessera image built from the Containerfile with buildah
## (daemonless; its store in target/buildah/): the release binary built here and copied
## in (BINARY=prebuilt; TESSERA_IMAGE_BIN=PATH takes another), on the Containerfile's
## base (distroless; IMAGE_BASE=offline: one made from this machine's libraries).
## `make image push REGISTRY=...` does this, then pushes.
image-containerfile:
	bash tests/harness/images.sh containerfile

## push: every image Tessera deploys, to REGISTRY (host[:port][/path]): tessera:VERSION
## and the CSI sidecars under REGISTRY/sig-storage/ (copied from registry.k8s.io);
## credentials: `buildah login` or REGISTRY_AUTHFILE. docs/operations.md.
push: image-containerfile
	@test -n "$(REGISTRY)" || { echo "make push: REGISTRY=host[:port][/path] is needed"; exit 1; }
	bash tests/harness/images.sh push $(REGISTRY)

## Every benchmark ends with one `BENCH <name> key=value ...` line; figures and
## their analysis: bench/README.md.

## bench-fuse: fio + metadata benchmark: native vs tessera mount vs bindfs, and the
## metadata rows against a null FUSE filesystem (bench/fuse/nullfs.rs, the round-trip
## floor), on the scratch directory's filesystem and then on XFS with project quotas
## (tessera's backend quota mode; fails where the kernel lacks CONFIG_XFS_QUOTA)
bench-fuse:
	bash bench/fuse/run.sh
	BACKEND=xfs-prjquota bash bench/fuse/run.sh

## bench-controller: 1,000 volumes through the controller on the local control plane
bench-controller: harness
	bash bench/controller/run.sh

## bench-rwx: one RWX volume, 50 then NODES (default 500) nodes, through the real
## csi-attacher and the CSI controller, against a no-op driver: make bench-rwx NODES=1000
bench-rwx: harness
	NODES=$(NODES) bash bench/rwx/run.sh

## bench-startup: Pods with a Tessera claim each vs with an emptyDir, on two real nodes
bench-startup: harness
	bash bench/startup/run.sh

## bench-attach: attach latency through the real csi-attacher, Tessera vs a no-op driver
## (builds that driver, bench/attach/refdriver, on first use)
bench-attach: harness
	bash bench/attach/run.sh
