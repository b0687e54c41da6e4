// Command oci-image writes a one-layer OCI image archive (an OCI image layout in a
// tar file, as `ctr images import` reads it) from files on this machine: no
// registry, no container engine, no base image.
//
//	oci-image --name REF --out FILE.tar [--entrypoint PATH[,ARG...]] [--cmd ARG[,ARG...]]
//	          [--env K=V]... [--user UID[:GID]] [--workdir DIR]
//	          [--file SRC:DST[:MODE]]... [--dir DST]... [--symlink DST:TARGET]...
//	          [--busybox-applets BUSYBOX:DIR]
//
// --file copies SRC (following symlinks) to DST with SRC's mode unless MODE (octal)
// is given; parent directories are created. --busybox-applets runs `BUSYBOX --list`
// and adds DIR/<applet> -> BUSYBOX-in-image symlinks (BUSYBOX must also be a --file
// DST). The layer is an uncompressed tar with fixed timestamps and root ownership,
// so the same inputs give the same image digest.
//
// The index carries both `io.containerd.image.name` (the full reference, which
// `ctr images import` uses) and `org.opencontainers.image.ref.name` (the tag).
package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, " ") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

// entry is one path in the layer.
type entry struct {
	typ    byte // tar.TypeReg, tar.TypeDir, tar.TypeSymlink
	src    string
	mode   int64
	target string
}

var epoch = time.Unix(0, 0).UTC()

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "oci-image:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("oci-image", flag.ContinueOnError)
	name := fs.String("name", "", "image reference, e.g. harness.tessera.io/tessera:0.1.0")
	out := fs.String("out", "", "output archive")
	entrypoint := fs.String("entrypoint", "", "comma-separated entrypoint")
	cmd := fs.String("cmd", "", "comma-separated default arguments")
	user := fs.String("user", "", "user[:group]")
	workdir := fs.String("workdir", "", "working directory")
	var files, dirs, links, envs, applets multi
	fs.Var(&files, "file", "SRC:DST[:MODE]")
	fs.Var(&dirs, "dir", "DST (empty directory, 0755; add 1777 with DST:MODE)")
	fs.Var(&links, "symlink", "DST:TARGET")
	fs.Var(&envs, "env", "K=V")
	fs.Var(&applets, "busybox-applets", "BUSYBOX-HOST-PATH:DIR")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *name == "" || *out == "" {
		return fmt.Errorf("--name and --out are required")
	}

	entries := map[string]entry{}
	addParents := func(p string) {
		for d := path.Dir(p); d != "/" && d != "."; d = path.Dir(d) {
			if _, ok := entries[d]; !ok {
				entries[d] = entry{typ: tar.TypeDir, mode: 0o755}
			}
		}
	}
	for _, f := range files {
		parts := strings.Split(f, ":")
		if len(parts) < 2 || len(parts) > 3 {
			return fmt.Errorf("--file %q: want SRC:DST[:MODE]", f)
		}
		st, err := os.Stat(parts[0])
		if err != nil {
			return err
		}
		mode := int64(st.Mode().Perm())
		if len(parts) == 3 {
			m, err := strconv.ParseInt(parts[2], 8, 32)
			if err != nil {
				return fmt.Errorf("--file %q: mode: %v", f, err)
			}
			mode = m
		}
		dst := path.Clean("/" + parts[1])
		entries[dst] = entry{typ: tar.TypeReg, src: parts[0], mode: mode}
		addParents(dst)
	}
	for _, d := range dirs {
		dst, mode := d, int64(0o755)
		if i := strings.LastIndex(d, ":"); i > 0 {
			m, err := strconv.ParseInt(d[i+1:], 8, 32)
			if err != nil {
				return fmt.Errorf("--dir %q: mode: %v", d, err)
			}
			dst, mode = d[:i], m
		}
		dst = path.Clean("/" + dst)
		entries[dst] = entry{typ: tar.TypeDir, mode: mode}
		addParents(dst)
	}
	for _, l := range links {
		dst, target, ok := strings.Cut(l, ":")
		if !ok {
			return fmt.Errorf("--symlink %q: want DST:TARGET", l)
		}
		dst = path.Clean("/" + dst)
		entries[dst] = entry{typ: tar.TypeSymlink, target: target, mode: 0o777}
		addParents(dst)
	}
	for _, a := range applets {
		bb, dir, ok := strings.Cut(a, ":")
		if !ok {
			return fmt.Errorf("--busybox-applets %q: want BUSYBOX:DIR", a)
		}
		list, err := exec.Command(bb, "--list").Output()
		if err != nil {
			return fmt.Errorf("%s --list: %v", bb, err)
		}
		for _, app := range strings.Fields(string(list)) {
			dst := path.Join("/", dir, app)
			if _, exists := entries[dst]; !exists {
				entries[dst] = entry{typ: tar.TypeSymlink, target: "busybox", mode: 0o777}
				addParents(dst)
			}
		}
	}

	layer, err := buildLayer(entries)
	if err != nil {
		return err
	}
	layerDigest := digest(layer)

	cfg := map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"created":      epoch.Format(time.RFC3339),
		"config":       imageConfig(*entrypoint, *cmd, *user, *workdir, envs),
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
		"history":      []map[string]any{{"created": epoch.Format(time.RFC3339), "created_by": "tessera tests/harness oci-image"}},
	}
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	manifest := map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        desc("application/vnd.oci.image.config.v1+json", cfgJSON, nil),
		"layers":        []any{desc("application/vnd.oci.image.layer.v1.tar", layer, nil)},
	}
	manJSON, err := json.Marshal(manifest)
	if err != nil {
		return err
	}
	tag := *name
	if i := strings.LastIndex(tag, ":"); i > strings.LastIndex(tag, "/") {
		tag = tag[i+1:]
	} else {
		tag = "latest"
	}
	index := map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests": []any{desc("application/vnd.oci.image.manifest.v1+json", manJSON, map[string]string{
			"io.containerd.image.name":          *name,
			"org.opencontainers.image.ref.name": tag,
		})},
	}
	indexJSON, err := json.Marshal(index)
	if err != nil {
		return err
	}
	return writeLayout(*out, map[string][]byte{
		"oci-layout": []byte(`{"imageLayoutVersion":"1.0.0"}`),
		"index.json": indexJSON,
	}, [][]byte{layer, cfgJSON, manJSON})
}

func imageConfig(entrypoint, cmd, user, workdir string, envs []string) map[string]any {
	c := map[string]any{}
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	c["Env"] = append(env, envs...)
	if entrypoint != "" {
		c["Entrypoint"] = strings.Split(entrypoint, ",")
	}
	if cmd != "" {
		c["Cmd"] = strings.Split(cmd, ",")
	}
	if user != "" {
		c["User"] = user
	}
	if workdir != "" {
		c["WorkingDir"] = workdir
	}
	return c
}

func buildLayer(entries map[string]entry) ([]byte, error) {
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names) // parents before children
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		e := entries[n]
		h := &tar.Header{Name: strings.TrimPrefix(n, "/"), Mode: e.mode, ModTime: epoch, Typeflag: e.typ, Format: tar.FormatPAX}
		switch e.typ {
		case tar.TypeDir:
			h.Name += "/"
		case tar.TypeSymlink:
			h.Linkname = e.target
		case tar.TypeReg:
			data, err := os.ReadFile(e.src)
			if err != nil {
				return nil, err
			}
			h.Size = int64(len(data))
			if err := tw.WriteHeader(h); err != nil {
				return nil, err
			}
			if _, err := tw.Write(data); err != nil {
				return nil, err
			}
			continue
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

func desc(mediaType string, b []byte, annotations map[string]string) map[string]any {
	d := map[string]any{"mediaType": mediaType, "digest": digest(b), "size": len(b)}
	if annotations != nil {
		d["annotations"] = annotations
		d["platform"] = map[string]string{"architecture": runtime.GOARCH, "os": "linux"}
	}
	return d
}

// writeLayout writes the OCI layout as a tar archive: the named files, then every
// blob under blobs/sha256/.
func writeLayout(out string, files map[string][]byte, blobs [][]byte) error {
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	write := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: epoch, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := io.Copy(tw, bytes.NewReader(data))
		return err
	}
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Name: d, Mode: 0o755, ModTime: epoch, Typeflag: tar.TypeDir}); err != nil {
			return err
		}
	}
	for _, n := range []string{"oci-layout", "index.json"} {
		if err := write(n, files[n]); err != nil {
			return err
		}
	}
	for _, b := range blobs {
		if err := write("blobs/sha256/"+strings.TrimPrefix(digest(b), "sha256:"), b); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}
