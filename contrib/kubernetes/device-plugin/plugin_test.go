package main

// The kubelet's side of the device-plugin API (deviceplugin/v1beta1),
// played by the tests: no kubelet runs here. They register the plugin,
// watch its slots turn healthy when a real softrnicd listens, allocate,
// and restart the "kubelet" by removing the plugin's socket.

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	registered chan *pluginapi.RegisterRequest
}

func (k *fakeKubelet) Register(_ context.Context, request *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.registered <- request
	return &pluginapi.Empty{}, nil
}

// startKubelet serves the registration API in a fresh device-plugin
// directory.
func startKubelet(t *testing.T) (string, *fakeKubelet) {
	dir := t.TempDir()
	return dir, serveKubelet(t, dir)
}

// serveKubelet serves the registration API in `dir`.
func serveKubelet(t *testing.T, dir string) *fakeKubelet {
	listener, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	kubelet := &fakeKubelet{registered: make(chan *pluginapi.RegisterRequest, 4)}
	server := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(server, kubelet)
	go func() { _ = server.Serve(listener) }()
	t.Cleanup(server.Stop)
	return kubelet
}

// built is a program of the build tree (scripts/build-libibverbs.sh).
func built(t *testing.T, path string) string {
	abs, err := filepath.Abs(filepath.Join("../../../target", path))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(abs); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI builds %s first (scripts/build-libibverbs.sh)", abs)
		}
		t.Skipf("no %s: run scripts/build-libibverbs.sh", abs)
	}
	return abs
}

func registration(t *testing.T, kubelet *fakeKubelet) *pluginapi.RegisterRequest {
	select {
	case request := <-kubelet.registered:
		return request
	case <-time.After(10 * time.Second):
		t.Fatal("the plugin did not register within 10 s")
		return nil
	}
}

func dial(t *testing.T, dir, endpoint string) pluginapi.DevicePluginClient {
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

func run(t *testing.T, opts Options) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, opts, t.Logf) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

func TestRegistersListsAndAllocatesAsTheKubeletAsks(t *testing.T) {
	dir, kubelet := startKubelet(t)
	softrnicd := built(t, "release/softrnicd")
	config := filepath.Join(dir, "softrnicd.toml")
	// 64 connections, 8 per tenant: 8 tenants at their limits.
	if err := os.WriteFile(config, []byte("[tenant]\nmax_connections = 8\n[daemon]\nmax_connections = 64\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "softrnicd.sock")
	run(t, Options{KubeletDir: dir, Resource: "softrnic.dev/rdma", CDIDevice: "softrnic.dev/rdma=softrnic0",
		Socket: socket, Softrnicd: softrnicd, Config: config, Every: 50 * time.Millisecond})

	request := registration(t, kubelet)
	if request.Version != pluginapi.Version || request.ResourceName != "softrnic.dev/rdma" || request.Endpoint != "softrnic.sock" {
		t.Fatalf("registered %+v", request)
	}
	client := dial(t, dir, request.Endpoint)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := client.GetDevicePluginOptions(ctx, &pluginapi.Empty{}); err != nil {
		t.Fatal(err)
	}

	// No daemon listens yet: eight slots, unhealthy.
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Devices) != 8 || first.Devices[0].Health != pluginapi.Unhealthy {
		t.Fatalf("without a daemon: %v", first.Devices)
	}
	// softrnicd starts: the slots turn healthy.
	daemon := exec.Command(softrnicd, "--socket", socket, "--nice", "0")
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = daemon.Process.Kill(); _ = daemon.Wait() }()
	second, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	for _, device := range second.Devices {
		if device.Health != pluginapi.Healthy {
			t.Fatalf("with softrnicd listening: %v", second.Devices)
		}
	}

	// Two containers of a pod, a slot each: the CDI device for both.
	response, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{first.Devices[0].ID}}, {DevicesIds: []string{first.Devices[7].ID}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(response.ContainerResponses) != 2 {
		t.Fatalf("%v", response)
	}
	for _, container := range response.ContainerResponses {
		if len(container.CdiDevices) != 1 || container.CdiDevices[0].Name != "softrnic.dev/rdma=softrnic0" || len(container.Mounts) != 0 {
			t.Fatalf("%v", container)
		}
	}
	// A slot this node never advertised is refused.
	_, err = client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"softrnic0-slot-8"}},
	}})
	if err == nil || !strings.Contains(err.Error(), "no softrnic slot") {
		t.Fatalf("an unknown slot: %v", err)
	}

	// A restarting kubelet removes the plugins' sockets: it registers again.
	if err := os.Remove(filepath.Join(dir, request.Endpoint)); err != nil {
		t.Fatal(err)
	}
	if again := registration(t, kubelet); again.ResourceName != "softrnic.dev/rdma" {
		t.Fatalf("registered again as %+v", again)
	}
}

func TestWithoutCDIAllocationsCarryTheSpecsMountsAndVariables(t *testing.T) {
	dir, kubelet := startKubelet(t)
	softrnic := built(t, "release/softrnic")
	libraries := filepath.Dir(built(t, "softrnic/lib/libibverbs.so.1"))
	run(t, Options{KubeletDir: dir, Resource: "softrnic.dev/rdma", Socket: "/run/softrnic/softrnicd.sock",
		Slots: 2, NoCDI: true, Softrnic: softrnic, Libraries: libraries, Every: 50 * time.Millisecond})
	client := dial(t, dir, registration(t, kubelet).Endpoint)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	response, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"softrnic0-slot-1"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	container := response.ContainerResponses[0]
	if container.Envs["SOFTRNIC_DAEMON"] != "/run/softrnic/softrnicd.sock" || container.Envs["LD_LIBRARY_PATH"] != "/usr/lib/softrnic" {
		t.Fatalf("variables: %v", container.Envs)
	}
	if len(container.Mounts) != 2 || container.Mounts[0].HostPath != "/run/softrnic" || container.Mounts[0].ReadOnly ||
		container.Mounts[1].HostPath != libraries || container.Mounts[1].ContainerPath != "/usr/lib/softrnic" || !container.Mounts[1].ReadOnly {
		t.Fatalf("mounts: %v", container.Mounts)
	}
	if len(container.CdiDevices) != 0 {
		t.Fatalf("--no-cdi named a CDI device: %v", container.CdiDevices)
	}
}

func TestAKubeletNotUpYetIsWaitedFor(t *testing.T) {
	registerRetry = 50 * time.Millisecond
	dir := t.TempDir()
	run(t, Options{KubeletDir: dir, Resource: "softrnic.dev/rdma", Socket: filepath.Join(dir, "none.sock"),
		Slots: 1, Every: 50 * time.Millisecond})
	// The plugin starts first; the kubelet's socket comes a moment later.
	time.Sleep(200 * time.Millisecond)
	kubelet := serveKubelet(t, dir)
	if request := registration(t, kubelet); request.ResourceName != "softrnic.dev/rdma" {
		t.Fatalf("registered as %+v", request)
	}
}

func TestABadDaemonConfigurationIsRefusedInTheDaemonsWords(t *testing.T) {
	softrnicd := built(t, "release/softrnicd")
	config := filepath.Join(t.TempDir(), "softrnicd.toml")
	if err := os.WriteFile(config, []byte("[tenant]\nmax_conections = 8\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := slotsFromDaemon(softrnicd, config); err == nil || !strings.Contains(err.Error(), "max_conections") {
		t.Fatalf("a misspelt limit: %v", err)
	}
	if _, err := slotsFromDaemon("/nonexistent/softrnicd", ""); err == nil || !strings.Contains(err.Error(), "--slots") {
		t.Fatalf("no softrnicd: %v", err)
	}
}
