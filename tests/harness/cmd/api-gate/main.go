// Command api-gate is the relay through which the harness nodes reach the API
// server, so that a test can cut one node off it (a partition) without touching the
// host's network: the node's processes keep running, its connections stay open but
// carry no bytes, and new ones are accepted but carry nothing either, as on a network
// that silently drops packets. Healed, every held byte goes on, in order.
//
//	api-gate -to 127.0.0.1:6443 -control FILE \
//	    -listen pods=192.0.2.2:7001 -listen tessera-node-a=127.0.0.1:7002 ... \
//	    -cidr tessera-node-a=10.244.1.0/24 ...
//
// A connection belongs to a node: the node named by its listener, or, on a shared
// listener (the Pods'), the node whose Pod CIDR holds its source address. FILE lists
// the nodes cut off, one per line; it is read every 100 ms.
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"strings"
	"sync"
	"time"
)

type pairs []string

func (p *pairs) String() string     { return strings.Join(*p, ",") }
func (p *pairs) Set(v string) error { *p = append(*p, v); return nil }

// cut is the set of nodes cut off, as last read from the control file.
type cut struct {
	mu    sync.Mutex
	nodes map[string]bool
}

func (c *cut) has(node string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return node != "" && c.nodes[node]
}

func (c *cut) watch(path string) {
	for {
		b, _ := os.ReadFile(path)
		nodes := map[string]bool{}
		for _, l := range strings.Fields(string(b)) {
			nodes[l] = true
		}
		c.mu.Lock()
		c.nodes = nodes
		c.mu.Unlock()
		time.Sleep(100 * time.Millisecond)
	}
}

// waitOpen blocks while node is cut off.
func (c *cut) waitOpen(node string) {
	for c.has(node) {
		time.Sleep(50 * time.Millisecond)
	}
}

// relay copies src to dst, holding each chunk while the node is cut off.
func relay(c *cut, node string, dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			c.waitOpen(node)
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	if tc, ok := dst.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	} else {
		_ = dst.Close()
	}
}

func main() {
	to := flag.String("to", "", "the API server's address")
	control := flag.String("control", "", "the file naming the nodes cut off")
	var listens, cidrs pairs
	flag.Var(&listens, "listen", "NAME=ADDR: a listener of node NAME, or 'pods' (repeatable)")
	flag.Var(&cidrs, "cidr", "NODE=CIDR: the Pod CIDR of a node (repeatable)")
	flag.Parse()
	if *to == "" || *control == "" || len(listens) == 0 {
		log.Fatal("api-gate: -to, -control and -listen are required")
	}
	type podNet struct {
		node string
		net  *net.IPNet
	}
	var nets []podNet
	for _, p := range cidrs {
		node, cidr, ok := strings.Cut(p, "=")
		_, n, err := net.ParseCIDR(cidr)
		if !ok || err != nil {
			log.Fatalf("api-gate: -cidr %q: want NODE=CIDR", p)
		}
		nets = append(nets, podNet{node, n})
	}
	c := &cut{nodes: map[string]bool{}}
	go c.watch(*control)
	var wg sync.WaitGroup
	for _, p := range listens {
		name, addr, ok := strings.Cut(p, "=")
		if !ok {
			log.Fatalf("api-gate: -listen %q: want NAME=ADDR", p)
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			log.Fatalf("api-gate: %v", err)
		}
		fmt.Printf("api-gate: %s on %s -> %s\n", name, l.Addr(), *to)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				conn, err := l.Accept()
				if err != nil {
					log.Printf("api-gate: accept on %s: %v", addr, err)
					return
				}
				node := name
				if name == "pods" {
					node = ""
					ip := conn.RemoteAddr().(*net.TCPAddr).IP
					for _, n := range nets {
						if n.net.Contains(ip) {
							node = n.node
						}
					}
				}
				go func() {
					up, err := net.Dial("tcp", *to)
					if err != nil {
						_ = conn.Close()
						return
					}
					go relay(c, node, up, conn)
					relay(c, node, conn, up)
				}()
			}
		}()
	}
	wg.Wait()
}
