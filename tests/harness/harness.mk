# Tessera test control plane. Included by the top-level Makefile:
#   include tests/harness/harness.mk
HARNESS_DIR := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))

.PHONY: harness cluster-up cluster-down cluster-status

## harness: build k8s-harness, kubectl and the CSI sidecars into target/harness/bin (no-op when up to date)
harness:
	bash $(HARNESS_DIR)/build.sh

## cluster-up: start (or reuse) the loopback control plane; kubeconfig in target/cluster/kubeconfig
cluster-up:
	bash $(HARNESS_DIR)/cluster.sh up

## cluster-down: stop every control-plane process started by cluster-up
cluster-down:
	bash $(HARNESS_DIR)/cluster.sh down

## cluster-status: show the control-plane processes; exit 0 iff ready
cluster-status:
	bash $(HARNESS_DIR)/cluster.sh status
