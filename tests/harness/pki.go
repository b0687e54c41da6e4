package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// runPKI writes, into DIR:
//
//	ca.crt ca.key                 ECDSA P-256 CA (also the client CA)
//	serving.crt serving.key       apiserver serving cert, SANs 127.0.0.1 localhost
//	                              kubernetes[.default[.svc[.cluster.local]]] 10.0.0.1
//	                              and every --ip (the nodes' Pods reach the apiserver there)
//	registry.crt registry.key     the harness OCI registry's serving cert (registry.sh),
//	                              SANs 127.0.0.1 localhost and every --ip
//	admin.crt admin.key           client cert CN=admin O=system:masters
//	sa.key sa.pub                 service-account signing key pair
//	admin.kubeconfig              https://127.0.0.1:PORT, CA only in certificate-authority-data
func runPKI(args []string) int {
	fs := flag.NewFlagSet("pki", flag.ContinueOnError)
	port := fs.Int("port", 6443, "kube-apiserver secure port written into admin.kubeconfig")
	kubeconfigOnly := fs.Bool("kubeconfig-only", false, "reuse the existing CA/admin cert and only rewrite admin.kubeconfig")
	extraIPs := fs.String("ip", "", "comma-separated extra IP SANs of the serving certificate")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() < 1 {
		fmt.Fprintln(os.Stderr, "usage: k8s-harness pki [--port N] DIR")
		return 2
	}
	dir := fs.Arg(0)
	// allow flags after DIR too: `pki DIR --port N`
	if err := fs.Parse(fs.Args()[1:]); err != nil {
		return 2
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var err error
	if *kubeconfigOnly {
		err = writeKubeconfigFromDir(dir, *port)
	} else {
		var ips []net.IP
		for _, s := range strings.Split(*extraIPs, ",") {
			if s = strings.TrimSpace(s); s == "" {
				continue
			}
			ip := net.ParseIP(s)
			if ip == nil {
				fmt.Fprintf(os.Stderr, "pki: bad --ip %q\n", s)
				return 2
			}
			ips = append(ips, ip)
		}
		err = generatePKI(dir, *port, ips)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "pki: %v\n", err)
		return 1
	}
	return 0
}

func generatePKI(dir string, port int, extraIPs []net.IP) error {
	notBefore := time.Now().Add(-1 * time.Hour)
	notAfter := notBefore.Add(10 * 365 * 24 * time.Hour)

	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "tessera-test-ca"},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		return err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	if err := writeCertKey(dir, "ca", caDER, caKey); err != nil {
		return err
	}

	// serving certificate
	servKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	servTmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{
			"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local",
		},
		IPAddresses: append([]net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.0.0.1")}, extraIPs...),
	}
	servDER, err := x509.CreateCertificate(rand.Reader, servTmpl, caCert, servKey.Public(), caKey)
	if err != nil {
		return err
	}
	if err := writeCertKey(dir, "serving", servDER, servKey); err != nil {
		return err
	}

	// the harness registry's serving certificate (tests/harness/registry.sh): the
	// nodes' containerd trust it through this CA (hosts.toml)
	regKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	regTmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "tessera-harness-registry"},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  append([]net.IP{net.ParseIP("127.0.0.1")}, extraIPs...),
	}
	regDER, err := x509.CreateCertificate(rand.Reader, regTmpl, caCert, regKey.Public(), caKey)
	if err != nil {
		return err
	}
	if err := writeCertKey(dir, "registry", regDER, regKey); err != nil {
		return err
	}

	// admin client certificate
	adminKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	adminTmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "admin", Organization: []string{"system:masters"}},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	adminDER, err := x509.CreateCertificate(rand.Reader, adminTmpl, caCert, adminKey.Public(), caKey)
	if err != nil {
		return err
	}
	if err := writeCertKey(dir, "admin", adminDER, adminKey); err != nil {
		return err
	}

	// service-account key pair
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	saKeyDER, err := x509.MarshalECPrivateKey(saKey)
	if err != nil {
		return err
	}
	saPubDER, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return err
	}
	if err := writePEM(filepath.Join(dir, "sa.key"), "EC PRIVATE KEY", saKeyDER, 0o600); err != nil {
		return err
	}
	if err := writePEM(filepath.Join(dir, "sa.pub"), "PUBLIC KEY", saPubDER, 0o644); err != nil {
		return err
	}

	return writeKubeconfigFromDir(dir, port)
}

// writeKubeconfigFromDir writes DIR/admin.kubeconfig from DIR/ca.crt, DIR/admin.{crt,key}.
func writeKubeconfigFromDir(dir string, port int) error {
	ca, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return err
	}
	crt, err := os.ReadFile(filepath.Join(dir, "admin.crt"))
	if err != nil {
		return err
	}
	key, err := os.ReadFile(filepath.Join(dir, "admin.key"))
	if err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["tessera"] = &clientcmdapi.Cluster{
		Server:                   fmt.Sprintf("https://127.0.0.1:%d", port),
		CertificateAuthorityData: ca,
	}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{
		ClientCertificateData: crt,
		ClientKeyData:         key,
	}
	cfg.Contexts["tessera"] = &clientcmdapi.Context{Cluster: "tessera", AuthInfo: "admin", Namespace: "default"}
	cfg.CurrentContext = "tessera"
	path := filepath.Join(dir, "admin.kubeconfig")
	tmp := path + ".tmp"
	if err := clientcmd.WriteToFile(*cfg, tmp); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func writeCertKey(dir, name string, certDER []byte, key crypto.Signer) error {
	ecKey, ok := key.(*ecdsa.PrivateKey)
	if !ok {
		return fmt.Errorf("unsupported key type %T", key)
	}
	keyDER, err := x509.MarshalECPrivateKey(ecKey)
	if err != nil {
		return err
	}
	if err := writePEM(filepath.Join(dir, name+".crt"), "CERTIFICATE", certDER, 0o644); err != nil {
		return err
	}
	return writePEM(filepath.Join(dir, name+".key"), "EC PRIVATE KEY", keyDER, 0o600)
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		panic(err)
	}
	return n
}
