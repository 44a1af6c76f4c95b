// softrnic-device-plugin advertises softrnic to the kubelet through the
// device-plugin API (deviceplugin/v1beta1), so that a pod asks for it as
// for any device:
//
//	resources:
//	  limits:
//	    softrnic.dev/rdma: 1
//
// and the kubelet answers the allocation with the CDI device softrnic
// names (softrnic.dev/rdma=softrnic0: the host softrnicd's socket and the
// drop-in libraries, `softrnic cdi`), or with the same mounts and
// variables for runtimes without CDI (--no-cdi).
//
// softrnic is one device shared by every pod, as an RDMA NIC's shared mode
// is: the plugin advertises one slot per tenant the node's softrnicd can
// hold at its tenant limits ([daemon] max_connections over [tenant]
// max_connections, read from `softrnicd --print-config`), so that the
// scheduler never places more pods on a node than its daemon admits at
// their limits. Slots are healthy while the daemon answers on its socket.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

func main() {
	var opts Options
	flag.StringVar(&opts.KubeletDir, "kubelet-dir", pluginapi.DevicePluginPath, "the kubelet's device-plugin directory (its registration socket and the plugins')")
	flag.StringVar(&opts.Resource, "resource", "softrnic.dev/rdma", "the extended resource pods ask for")
	flag.StringVar(&opts.CDIDevice, "cdi-device", "softrnic.dev/rdma=softrnic0", "the CDI device an allocation names (softrnic cdi writes its spec)")
	flag.StringVar(&opts.Socket, "socket", "/run/softrnic/softrnicd.sock", "the host softrnicd's socket: slots are healthy while it answers")
	flag.StringVar(&opts.Softrnicd, "softrnicd", "softrnicd", "the softrnicd whose --print-config gives the tenant limits")
	flag.StringVar(&opts.Config, "config", "", "softrnicd's --config file (empty: its defaults)")
	flag.IntVar(&opts.Slots, "slots", 0, "slots to advertise (0: from the daemon's limits)")
	flag.BoolVar(&opts.NoCDI, "no-cdi", false, "answer with mounts and variables instead of the CDI device name")
	flag.StringVar(&opts.Softrnic, "softrnic", "softrnic", "with --no-cdi: the softrnic whose `cdi --print` gives the mounts and variables")
	flag.StringVar(&opts.Libraries, "libraries", "/opt/softrnic/lib", "with --no-cdi: the host's directory of the drop-in libraries")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := Run(ctx, opts, func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }); err != nil {
		fmt.Fprintf(os.Stderr, "softrnic-device-plugin: %v\n", err)
		os.Exit(1)
	}
}
