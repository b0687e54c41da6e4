# Tessera test control plane and nodes. Included by the top-level Makefile:
#   include tests/harness/harness.mk
HARNESS_DIR := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))

# Real nodes (kubelet + containerd + runc) started by `make cluster-up`; NODES=0
# starts the control plane alone (what `make test` and the Rust tests use).
NODES ?= 2

.PHONY: harness cluster-up cluster-down cluster-status image deploy undeploy

## harness: build k8s-harness, kubectl, the kubelet, containerd, runc, the CSI sidecars, helm and kstatus into target/harness/bin (no-op when up to date)
harness:
	bash $(HARNESS_DIR)/build.sh

## cluster-up: start (or reuse) the control plane and NODES (default 2) real nodes tessera-node-a, -b; kubeconfig in target/cluster/kubeconfig
cluster-up:
	HARNESS_NODES=$(NODES) bash $(HARNESS_DIR)/cluster.sh up

## cluster-down: stop every process started by cluster-up, unmount the nodes' directories, remove their cgroups
cluster-down:
	bash $(HARNESS_DIR)/cluster.sh down

## cluster-status: show the control-plane processes and nodes; exit 0 iff ready
cluster-status:
	bash $(HARNESS_DIR)/cluster.sh status

## image: build the tessera, CSI sidecar, pause and busybox images offline (target/images/) and load them into every running node; with REGISTRY=... instead the Tessera image from the Containerfile (make image push REGISTRY=...)
ifeq ($(REGISTRY),)
image: harness
	bash $(HARNESS_DIR)/images.sh build
	bash $(HARNESS_DIR)/images.sh load
else
image: image-containerfile
endif

## deploy: apply config/ through the harness overlay and wait until Tessera runs on every node
deploy: image
	bash $(HARNESS_DIR)/deploy.sh up

## undeploy: remove what deploy applied
undeploy:
	bash $(HARNESS_DIR)/deploy.sh down
