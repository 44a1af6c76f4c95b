package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Options are the plugin's flags.
type Options struct {
	KubeletDir string
	Resource   string
	CDIDevice  string
	Socket     string
	Softrnicd  string
	Config     string
	Slots      int
	NoCDI      bool
	Softrnic   string
	Libraries  string
	// How often health and the plugin's socket are looked at (a second
	// unless a test says otherwise).
	Every time.Duration
}

// endpoint is the plugin's socket's name in the kubelet's directory.
const endpoint = "softrnic.sock"

// registerRetry is how long the plugin waits before asking a kubelet
// that refused (or was not there) again.
var registerRetry = 5 * time.Second

// Run serves the kubelet until ctx ends: it registers, and registers
// again whenever a restarting kubelet has removed the plugin's socket.
func Run(ctx context.Context, opts Options, log func(string, ...any)) error {
	if opts.Every == 0 {
		opts.Every = time.Second
	}
	if opts.Slots == 0 {
		slots, err := slotsFromDaemon(opts.Softrnicd, opts.Config)
		if err != nil {
			return err
		}
		opts.Slots = slots
	}
	var edits *pluginapi.ContainerAllocateResponse
	if opts.NoCDI {
		var err error
		if edits, err = editsFromSpec(opts); err != nil {
			return err
		}
	}
	for ctx.Err() == nil {
		if err := serveOnce(ctx, opts, edits, log); err != nil {
			return err
		}
	}
	return nil
}

// output runs a softrnic program and returns what it printed, or what it
// said on stderr when it failed, or `fix` when it could not run at all.
func output(fix, program string, args ...string) ([]byte, error) {
	out, err := exec.Command(program, args...).Output()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return out, nil
	case errors.As(err, &exit):
		return nil, fmt.Errorf("%s %s: %s", program, args[0], exit.Stderr)
	default:
		return nil, fmt.Errorf("cannot run %s %s (%v): %s", program, args[0], err, fix)
	}
}

// slotsFromDaemon is how many tenants softrnicd holds at their limits.
func slotsFromDaemon(softrnicd, config string) (int, error) {
	args := []string{"--print-config"}
	if config != "" {
		args = append(args, "--config", config)
	}
	out, err := output("give --softrnicd, or --slots", softrnicd, args...)
	if err != nil {
		return 0, err
	}
	var limits struct {
		Tenant struct {
			MaxConnections int `json:"max_connections"`
		} `json:"tenant"`
		Daemon struct {
			MaxConnections int `json:"max_connections"`
		} `json:"daemon"`
	}
	if err := json.Unmarshal(out, &limits); err != nil {
		return 0, fmt.Errorf("%s --print-config printed no configuration: %v", softrnicd, err)
	}
	if limits.Tenant.MaxConnections <= 0 {
		return 0, fmt.Errorf("%s --print-config: no [tenant] max_connections", softrnicd)
	}
	return max(1, limits.Daemon.MaxConnections/limits.Tenant.MaxConnections), nil
}

// serveOnce serves on a fresh socket and registers with the kubelet
// (again and again until one answers); it returns nil when the socket
// disappears (the kubelet restarted) or ctx ends, and an error when it
// cannot serve at all.
func serveOnce(ctx context.Context, opts Options, edits *pluginapi.ContainerAllocateResponse, log func(string, ...any)) error {
	path := filepath.Join(opts.KubeletDir, endpoint)
	_ = os.Remove(path)
	listener, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("cannot listen on %s: %v", path, err)
	}
	server := grpc.NewServer()
	stopped := make(chan struct{})
	pluginapi.RegisterDevicePluginServer(server, &plugin{opts: opts, edits: edits, stopped: stopped})
	go func() { _ = server.Serve(listener) }()
	defer func() {
		close(stopped)
		server.Stop()
	}()

	// A kubelet that is not up yet (the node starting) is waited for.
	for {
		err := register(ctx, opts)
		if err == nil {
			break
		}
		log("softrnic-device-plugin: %v; trying again in %v", err, registerRetry)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(registerRetry):
		}
	}
	log("softrnic-device-plugin: %d slots of %s registered with the kubelet (%s)", opts.Slots, opts.Resource, answer(opts))
	ticker := time.NewTicker(opts.Every)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
			if _, err := os.Stat(path); err != nil {
				log("softrnic-device-plugin: %s is gone (the kubelet restarted): registering again", path)
				return nil
			}
		}
	}
}

func answer(opts Options) string {
	if opts.NoCDI {
		return "allocations get mounts and variables"
	}
	return "allocations name " + opts.CDIDevice
}

func register(ctx context.Context, opts Options) error {
	kubelet := filepath.Join(opts.KubeletDir, filepath.Base(pluginapi.KubeletSocket))
	conn, err := grpc.NewClient("unix://"+kubelet, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("cannot reach the kubelet at %s: %v", kubelet, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     endpoint,
		ResourceName: opts.Resource,
		Options:      &pluginapi.DevicePluginOptions{},
	})
	if err != nil {
		return fmt.Errorf("the kubelet at %s refused the registration: %v", kubelet, err)
	}
	return nil
}

// plugin answers the kubelet's DevicePlugin calls.
type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	opts Options
	// With --no-cdi, what every allocation gets.
	edits   *pluginapi.ContainerAllocateResponse
	stopped chan struct{}
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the slots, and again whenever their health changes.
func (p *plugin) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	last := ""
	for {
		health := daemonHealth(p.opts.Socket)
		if health != last {
			if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices(health)}); err != nil {
				return err
			}
			last = health
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-p.stopped:
			return nil
		case <-time.After(p.opts.Every):
		}
	}
}

func (p *plugin) devices(health string) []*pluginapi.Device {
	devices := make([]*pluginapi.Device, p.opts.Slots)
	for i := range devices {
		devices[i] = &pluginapi.Device{ID: slotID(i), Health: health}
	}
	return devices
}

func slotID(i int) string { return fmt.Sprintf("softrnic0-slot-%d", i) }

// daemonHealth is Healthy while softrnicd accepts a connection of the kind
// programs make (SOCK_SEQPACKET).
func daemonHealth(socket string) string {
	conn, err := net.DialTimeout("unixpacket", socket, time.Second)
	if err != nil {
		return pluginapi.Unhealthy
	}
	conn.Close()
	return pluginapi.Healthy
}

// Allocate gives each container the CDI device, or its edits by hand.
func (p *plugin) Allocate(_ context.Context, request *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	response := &pluginapi.AllocateResponse{}
	for _, container := range request.ContainerRequests {
		for _, id := range container.DevicesIds {
			if !p.ours(id) {
				return nil, fmt.Errorf("no softrnic slot %q (this node has %d)", id, p.opts.Slots)
			}
		}
		if p.edits != nil {
			response.ContainerResponses = append(response.ContainerResponses, p.edits)
		} else {
			response.ContainerResponses = append(response.ContainerResponses, &pluginapi.ContainerAllocateResponse{
				CdiDevices: []*pluginapi.CDIDevice{{Name: p.opts.CDIDevice}},
			})
		}
	}
	return response, nil
}

func (p *plugin) ours(id string) bool {
	for i := 0; i < p.opts.Slots; i++ {
		if slotID(i) == id {
			return true
		}
	}
	return false
}

// editsFromSpec turns the CDI spec `softrnic cdi` writes (the one place
// that knows the device's mounts and variables) into an allocation's
// mounts and variables, for a runtime without CDI.
func editsFromSpec(opts Options) (*pluginapi.ContainerAllocateResponse, error) {
	out, err := output("give --softrnic", opts.Softrnic, "cdi", "--print", "--socket", opts.Socket, "--libraries", opts.Libraries)
	if err != nil {
		return nil, err
	}
	var spec struct {
		Devices []struct {
			ContainerEdits struct {
				Env    []string `json:"env"`
				Mounts []struct {
					HostPath      string   `json:"hostPath"`
					ContainerPath string   `json:"containerPath"`
					Options       []string `json:"options"`
				} `json:"mounts"`
			} `json:"containerEdits"`
		} `json:"devices"`
	}
	if err := json.Unmarshal(out, &spec); err != nil || len(spec.Devices) != 1 {
		return nil, fmt.Errorf("%s cdi --print printed no spec of one device (%v)", opts.Softrnic, err)
	}
	edits := spec.Devices[0].ContainerEdits
	response := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{}}
	for _, variable := range edits.Env {
		name, value, ok := strings.Cut(variable, "=")
		if !ok {
			return nil, fmt.Errorf("the spec's variable %q has no value", variable)
		}
		response.Envs[name] = value
	}
	for _, mount := range edits.Mounts {
		response.Mounts = append(response.Mounts, &pluginapi.Mount{
			HostPath:      mount.HostPath,
			ContainerPath: mount.ContainerPath,
			ReadOnly:      slices.Contains(mount.Options, "ro"),
		})
	}
	return response, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}
