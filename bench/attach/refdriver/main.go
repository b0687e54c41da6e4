// csi-noop-driver: the baseline CSI controller of `make bench-attach`.
//
// The benchmark's brief asked for the Kubernetes reference driver
// (github.com/kubernetes-csi/csi-driver-host-path, `hostpathplugin --enable-attach`),
// whose ControllerPublishVolume only records the attachment. That module is not
// served by the Go module proxy reachable here (403 "not available"), and neither is
// csi-test's mock driver, so this is the same thing reduced to its core, built on the
// same CSI spec (v1.12.0) and grpc-go (v1.81.1) as the sidecars: Identity + Controller
// services that advertise PUBLISH_UNPUBLISH_VOLUME and answer ControllerPublishVolume
// by recording (volume, node) in memory, nothing else. It gives the cost of the
// external-attacher + API server path on this machine, in the same run.
//
//	csi-noop-driver --endpoint unix:///path/csi.sock --drivername bench.noop.csi.k8s.io --nodeid n0
package main

import (
	"context"
	"flag"
	"log"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

type driver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
	name string

	mu       sync.Mutex
	attached map[string]map[string]bool // volume id -> node ids
}

func (d *driver) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: d.name, VendorVersion: "bench"}, nil
}

func (d *driver) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{{
		Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{
			Type: csi.PluginCapability_Service_CONTROLLER_SERVICE,
		}},
	}}}, nil
}

func (d *driver) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{}, nil
}

func (d *driver) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	var caps []*csi.ControllerServiceCapability
	for _, c := range []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
		csi.ControllerServiceCapability_RPC_PUBLISH_READONLY,
	} {
		caps = append(caps, &csi.ControllerServiceCapability{
			Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: c}},
		})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

func (d *driver) ControllerPublishVolume(_ context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	if req.GetVolumeId() == "" || req.GetNodeId() == "" || req.GetVolumeCapability() == nil {
		return nil, status.Error(codes.InvalidArgument, "volume id, node id and capability are required")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.attached[req.VolumeId] == nil {
		d.attached[req.VolumeId] = map[string]bool{}
	}
	d.attached[req.VolumeId][req.NodeId] = true
	return &csi.ControllerPublishVolumeResponse{PublishContext: map[string]string{}}, nil
}

func (d *driver) ControllerUnpublishVolume(_ context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.attached[req.VolumeId], req.NodeId)
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}

func main() {
	endpoint := flag.String("endpoint", "unix:///tmp/csi-noop.sock", "CSI endpoint (unix://PATH)")
	name := flag.String("drivername", "bench.noop.csi.k8s.io", "CSI driver name")
	flag.Parse()
	path := strings.TrimPrefix(*endpoint, "unix://")
	_ = os.Remove(path)
	lis, err := net.Listen("unix", path)
	if err != nil {
		log.Fatalf("listen %s: %v", path, err)
	}
	srv := grpc.NewServer()
	d := &driver{name: *name, attached: map[string]map[string]bool{}}
	csi.RegisterIdentityServer(srv, d)
	csi.RegisterControllerServer(srv, d)
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
		<-sig
		srv.Stop()
	}()
	log.Printf("csi-noop-driver %s serving on %s", *name, path)
	if err := srv.Serve(lis); err != nil {
		log.Fatalf("serve: %v", err)
	}
}
