// Command k8s-harness is Tessera's test control plane: one binary, one
// Kubernetes component per OS process.
//
// Usage (first argument, or the basename of argv[0] when invoked via symlink):
//
//	k8s-harness pki [--port N] DIR          CA, serving/admin certs, SA keys, DIR/admin.kubeconfig
//	k8s-harness etcd --data-dir D --client-port P1 --peer-port P2
//	k8s-harness kube-apiserver ARGS...      upstream cobra command
//	k8s-harness kube-controller-manager ARGS...
//	k8s-harness kube-scheduler ARGS...
//	k8s-harness freeports N                 print N free loopback TCP ports
//	k8s-harness wait-ready --kubeconfig F [--timeout 120s]
//	k8s-harness readyz --kubeconfig F       one /readyz probe, exit 0 if "ok"
//	k8s-harness version
//
// Each Kubernetes component must run in its own process:
// k8s.io/apiserver/pkg/server.SetupSignalContext panics when called twice.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics plugins
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric registration
	"k8s.io/component-base/version"

	apiserverapp "k8s.io/kubernetes/cmd/kube-apiserver/app"
	kcmapp "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	schedulerapp "k8s.io/kubernetes/cmd/kube-scheduler/app"

	_ "time/tzdata" // CronJob time zone support, as upstream mains do
)

func usage() {
	fmt.Fprintf(os.Stderr, `usage: k8s-harness COMMAND [ARGS...]

commands:
  pki [--port N] DIR            generate PKI and DIR/admin.kubeconfig
  etcd --data-dir D --client-port P1 --peer-port P2
  kube-apiserver ARGS...
  kube-controller-manager ARGS...
  kube-scheduler ARGS...
  freeports N                   print N free loopback TCP ports
  wait-ready --kubeconfig F [--timeout D]
  readyz --kubeconfig F         single /readyz probe
  version
`)
}

func main() {
	name := filepath.Base(os.Args[0])
	args := os.Args[1:]
	switch name {
	case "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler":
		// invoked through a symlink named like the component
	default:
		if len(args) == 0 {
			usage()
			os.Exit(2)
		}
		name, args = args[0], args[1:]
	}

	switch name {
	case "pki":
		os.Exit(runPKI(args))
	case "etcd":
		os.Exit(runEtcd(args))
	case "kube-apiserver":
		os.Exit(runCobra(apiserverapp.NewAPIServerCommand(), args))
	case "kube-controller-manager":
		os.Exit(runCobra(kcmapp.NewControllerManagerCommand(), args))
	case "kube-scheduler":
		os.Exit(runCobra(schedulerapp.NewSchedulerCommand(), args))
	case "freeports":
		os.Exit(runFreePorts(args))
	case "wait-ready":
		os.Exit(runWaitReady(args))
	case "readyz":
		os.Exit(runReadyz(args))
	case "version", "--version", "-version":
		fmt.Println(version.Get().GitVersion)
	case "help", "-h", "--help":
		usage()
	default:
		fmt.Fprintf(os.Stderr, "k8s-harness: unknown command %q\n", name)
		usage()
		os.Exit(2)
	}
}

func runCobra(cmd *cobra.Command, args []string) int {
	cmd.SetArgs(args)
	return cli.Run(cmd)
}

func init() {
	// Guard against an accidental empty ldflags build: make it visible.
	if strings.Contains(version.Get().GitVersion, "$Format") {
		fmt.Fprintln(os.Stderr, "k8s-harness: warning: built without -ldflags version stamp")
	}
}
