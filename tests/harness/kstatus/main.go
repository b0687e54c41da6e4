// Command kstatus prints kstatus's verdict on Kubernetes objects: the status that
// sigs.k8s.io/cli-utils/pkg/kstatus/status.Compute (the code behind Flux's health
// checks, `kpt live status` and cli-utils' appliers) gives each object.
//
// It reads JSON or YAML on stdin: one object, a List (`kubectl get -o json`), or a
// stream of YAML documents. For each object it prints one line, tab-separated:
//
//	<kind>/<name>	<status>	<message>
//
// where status is one of Current, InProgress, Failed, Terminating, NotFound, Unknown.
// Tessera's tests (tests/controller/gitops_health.rs) run it over real objects.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "kstatus:", err)
		os.Exit(1)
	}
}

func run(in io.Reader, out io.Writer) error {
	dec := yaml.NewYAMLOrJSONDecoder(bufio.NewReader(in), 4096)
	w := bufio.NewWriter(out)
	defer w.Flush()
	n := 0
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return fmt.Errorf("decoding object %d: %w", n+1, err)
		}
		if len(raw) == 0 || string(raw) == "null" {
			continue
		}
		// The unstructured JSON scheme keeps integers int64, as the API machinery's
		// own decoding does (kstatus reads generations as int64).
		decoded, err := runtime.Decode(unstructured.UnstructuredJSONScheme, raw)
		if err != nil {
			return fmt.Errorf("reading object %d: %w", n+1, err)
		}
		var items []unstructured.Unstructured
		switch o := decoded.(type) {
		case *unstructured.Unstructured:
			items = []unstructured.Unstructured{*o}
		case *unstructured.UnstructuredList:
			items = o.Items
		default:
			return fmt.Errorf("object %d: unexpected %T", n+1, decoded)
		}
		for i := range items {
			item := &items[i]
			res, err := status.Compute(item)
			if err != nil {
				return fmt.Errorf("%s/%s: %w", item.GetKind(), item.GetName(), err)
			}
			msg := strings.ReplaceAll(res.Message, "\n", " ")
			fmt.Fprintf(w, "%s/%s\t%s\t%s\n", item.GetKind(), item.GetName(), res.Status, msg)
			n++
		}
	}
	if n == 0 {
		return errors.New("no object on stdin")
	}
	return nil
}
