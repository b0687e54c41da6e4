package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// runFreePorts prints N distinct free TCP ports on 127.0.0.1, one per line.
// All listeners are held open until every port is chosen, so they are distinct.
func runFreePorts(args []string) int {
	n := 1
	if len(args) > 0 {
		v, err := strconv.Atoi(args[0])
		if err != nil || v < 1 {
			fmt.Fprintln(os.Stderr, "usage: k8s-harness freeports N")
			return 2
		}
		n = v
	}
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		ls = append(ls, l)
		fmt.Println(l.Addr().(*net.TCPAddr).Port)
	}
	return 0
}

func clientFromKubeconfig(path string, timeout time.Duration) (*kubernetes.Clientset, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, err
	}
	cfg.Timeout = timeout
	cfg.QPS = 50
	cfg.Burst = 100
	return kubernetes.NewForConfig(cfg)
}

func probeReadyz(ctx context.Context, cs *kubernetes.Clientset) error {
	body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil {
		if len(body) > 0 {
			return fmt.Errorf("%v: %s", err, body)
		}
		return err
	}
	if string(body) != "ok" {
		return fmt.Errorf("readyz: %q", body)
	}
	return nil
}

// runReadyz performs one /readyz probe; exit 0 when the apiserver answers "ok".
func runReadyz(args []string) int {
	fs := flag.NewFlagSet("readyz", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "admin kubeconfig")
	timeout := fs.Duration("timeout", 3*time.Second, "request timeout")
	quiet := fs.Bool("q", false, "print nothing")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cs, err := clientFromKubeconfig(*kubeconfig, *timeout)
	if err != nil {
		if !*quiet {
			fmt.Fprintln(os.Stderr, err)
		}
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if err := probeReadyz(ctx, cs); err != nil {
		if !*quiet {
			fmt.Fprintln(os.Stderr, err)
		}
		return 1
	}
	if !*quiet {
		fmt.Println("ok")
	}
	return 0
}

// runWaitReady polls /readyz until "ok", then makes sure the `default`
// namespace exists (creating it if the bootstrap controller has not yet).
func runWaitReady(args []string) int {
	fs := flag.NewFlagSet("wait-ready", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "admin kubeconfig")
	timeout := fs.Duration("timeout", 120*time.Second, "overall timeout")
	pids := fs.String("pids", "", "comma-separated pids that must stay alive while waiting (fail fast if one exits)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var watch []int
	for _, p := range strings.Split(*pids, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		n, err := strconv.Atoi(p)
		if err != nil {
			fmt.Fprintf(os.Stderr, "wait-ready: bad pid %q\n", p)
			return 2
		}
		watch = append(watch, n)
	}
	cs, err := clientFromKubeconfig(*kubeconfig, 5*time.Second)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	var last error
	for {
		if last = probeReadyz(ctx, cs); last == nil {
			break
		}
		for _, p := range watch {
			if err := syscall.Kill(p, 0); err == syscall.ESRCH {
				fmt.Fprintf(os.Stderr, "wait-ready: process %d exited before the apiserver became ready (last probe: %v)\n", p, last)
				return 1
			}
		}
		select {
		case <-ctx.Done():
			fmt.Fprintf(os.Stderr, "wait-ready: apiserver not ready after %v: %v\n", *timeout, last)
			return 1
		case <-time.After(250 * time.Millisecond):
		}
	}

	for {
		_, err := cs.CoreV1().Namespaces().Get(ctx, metav1.NamespaceDefault, metav1.GetOptions{})
		if err == nil {
			break
		}
		if apierrors.IsNotFound(err) {
			_, err = cs.CoreV1().Namespaces().Create(ctx,
				&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: metav1.NamespaceDefault}},
				metav1.CreateOptions{})
			if err == nil || apierrors.IsAlreadyExists(err) {
				break
			}
		}
		select {
		case <-ctx.Done():
			fmt.Fprintf(os.Stderr, "wait-ready: default namespace: %v\n", err)
			return 1
		case <-time.After(250 * time.Millisecond):
		}
	}
	return 0
}
