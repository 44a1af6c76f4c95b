// cdi-check validates softrnic's CDI spec and applies one of its devices
// to an OCI bundle, with the CNCF's reference implementation of the
// Container Device Interface (tags.cncf.io/container-device-interface):
// what a CDI-aware runtime (podman, containerd, CRI-O, Docker 25+) does
// before it starts a container.
//
//	cdi-check SPEC_DIR                        # validate every spec in SPEC_DIR, list the devices
//	cdi-check SPEC_DIR DEVICE BUNDLE_CONFIG   # and inject DEVICE into the bundle's config.json
package main

import (
	"encoding/json"
	"fmt"
	"os"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

func main() {
	if len(os.Args) != 2 && len(os.Args) != 4 {
		fail("usage: cdi-check SPEC_DIR [DEVICE BUNDLE_CONFIG]")
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(os.Args[1]), cdi.WithAutoRefresh(false))
	if err != nil {
		fail("cannot read the specs in %s: %v", os.Args[1], err)
	}
	// A spec the cache refused (bad kind, name, edits) is an error here,
	// where a runtime would only leave its devices out.
	for path, errs := range cache.GetErrors() {
		for _, e := range errs {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, e)
		}
		fail("the spec in %s is not valid CDI", path)
	}
	devices := cache.ListDevices()
	if len(devices) == 0 {
		fail("no CDI device in %s", os.Args[1])
	}
	for _, device := range devices {
		fmt.Printf("valid: %s\n", device)
	}
	if len(os.Args) == 2 {
		return
	}
	device, config := os.Args[2], os.Args[3]
	raw, err := os.ReadFile(config)
	if err != nil {
		fail("%v", err)
	}
	var spec oci.Spec
	if err := json.Unmarshal(raw, &spec); err != nil {
		fail("%s: %v", config, err)
	}
	if unresolved, err := cache.InjectDevices(&spec, device); err != nil {
		fail("cannot inject %v: %v", unresolved, err)
	}
	out, err := json.MarshalIndent(&spec, "", " ")
	if err != nil {
		fail("%v", err)
	}
	if err := os.WriteFile(config, out, 0o644); err != nil {
		fail("%v", err)
	}
	fmt.Printf("injected %s into %s\n", device, config)
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "cdi-check: "+format+"\n", args...)
	os.Exit(1)
}
