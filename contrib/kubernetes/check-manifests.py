#!/usr/bin/python3
"""Checks contrib/kubernetes/*.yaml without a cluster: every document
parses and is of a kind the manifests mean to make; every softrnic
command in them runs as written against this build (softrnicd with the
ConfigMap's configuration, `softrnic cdi` with the init container's
flags, whose spec cdi-check then validates, the device plugin's flags);
and every pod asks for the resource the plugin advertises.

    contrib/kubernetes/check-manifests.py CDI_CHECK PLUGIN

CDI_CHECK and PLUGIN are the built contrib/cdi/cdi-check and
contrib/kubernetes/device-plugin."""

import glob
import os
import shlex
import subprocess
import sys
import tempfile

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
BUILD = os.path.join(ROOT, "target", "release")
LIBRARIES = os.path.join(ROOT, "target", "softrnic", "lib")
RESOURCE = "softrnic.dev/rdma"
KINDS = {"ConfigMap", "DaemonSet", "Service", "Pod"}


def containers(document):
    spec = document.get("spec", {})
    pod = spec.get("template", {}).get("spec", spec)
    return pod.get("initContainers", []) + pod.get("containers", [])


def run(argv, what):
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        sys.exit(f"{what}: {shlex.join(argv)} failed: {result.stderr.strip()}")
    return result.stdout


def main():
    cdi_check, plugin = sys.argv[1:3]
    scratch = tempfile.mkdtemp(prefix="softrnic-k8s-")
    config = os.path.join(scratch, "softrnicd.toml")
    checked = []
    for path in sorted(glob.glob(os.path.join(HERE, "*.yaml"))):
        name = os.path.basename(path)
        documents = [d for d in yaml.safe_load_all(open(path)) if d]
        for document in documents:
            if document["kind"] not in KINDS:
                sys.exit(f"{name}: a {document['kind']} (expected one of {sorted(KINDS)})")
            if document["kind"] == "ConfigMap":
                open(config, "w").write(document["data"]["softrnicd.toml"])
        for document in documents:
            for container in containers(document):
                command = container.get("command", [])
                what = f"{name}, container {container['name']}"
                if command[:1] == ["softrnicd"]:
                    argv = [os.path.join(BUILD, "softrnicd")] + command[1:]
                    argv[argv.index("--config") + 1] = config
                    run(argv + ["--print-config"], what)
                elif command[:1] == ["softrnic-device-plugin"]:
                    argv = [plugin] + command[1:]
                    argv[argv.index("--config") + 1] = config
                    # -h after the flags: they parse, then it stops.
                    run(argv + ["--softrnicd", os.path.join(BUILD, "softrnicd"), "-h"], what)
                elif command[:2] == ["sh", "-c"] and "softrnic cdi" in command[2]:
                    words = shlex.split(command[2].split("softrnic cdi", 1)[1].split("&&")[0])
                    out = os.path.join(scratch, "cdi")
                    words[words.index("--libraries") + 1] = LIBRARIES
                    words[words.index("--out") + 1] = out
                    run([os.path.join(BUILD, "softrnic"), "cdi"] + words, what)
                    run([cdi_check, out], what + ", its CDI spec")
                limits = container.get("resources", {}).get("limits", {})
                if limits and RESOURCE not in limits:
                    sys.exit(f"{what} asks for {list(limits)}, not {RESOURCE}")
                checked.append(what)
    print(f"manifests: {len(checked)} containers checked ({', '.join(checked)})")


if __name__ == "__main__":
    main()
