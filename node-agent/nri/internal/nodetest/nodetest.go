// Package nodetest builds a simulated GPU node for the plugin's tests: a real state directory
// with an inventory file (four GPUs, the last in MIG mode), a node ledger, the shim library and
// preload file, and the regions the node agent would create. Only tests import it.
package nodetest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"neuronetes.io/node-agent/nri/inject"
	"neuronetes.io/node-agent/nri/inventory"
	"neuronetes.io/node-agent/nri/ledger"
)

const (
	Node     = "gpu-node-1"
	PodUID   = "0b6f3c8e-4c1d-4f57-9a1e-2f0c4a1b9d77"
	OtherUID = "6f1c2d3e-0000-4000-8000-00000000beef"
	UUID0    = "GPU-5e6c1b1e-0a1b-4c2d-8e3f-000000000000"
	UUID1    = "GPU-5e6c1b1e-0a1b-4c2d-8e3f-000000000001"
	UUID2    = "GPU-5e6c1b1e-0a1b-4c2d-8e3f-000000000002"
	UUID3    = "GPU-5e6c1b1e-0a1b-4c2d-8e3f-000000000003" // in MIG mode
	MIGBig   = "MIG-9a1e0e75-7230-4e65-8e3f-000000000030"
	MIGSmall = "MIG-9a1e0e75-7230-4e65-8e3f-000000000036"
	UVMMajor = 508
	CapMajor = 511
	// GPUMemoryMiB is every GPU's memory in the ledger (an 80 GB A100).
	GPUMemoryMiB = 81920
)

func dev(path string, major, minor int) map[string]any {
	return map[string]any{"path": path, "major": major, "minor": minor}
}

func capDev(minor int) map[string]any {
	return dev(fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", minor), CapMajor, minor)
}

// InventoryDoc is the file the agent writes for a 4-GPU node whose last GPU is in MIG mode
// (a 3g.40gb instance at slot 0 and a 1g.10gb instance at slot 6).
func InventoryDoc(node string, updatedAt time.Time, shimDir string) map[string]any {
	plain := func(uuid string, index int) map[string]any {
		return map[string]any{
			"uuid": uuid, "index": index, "migInstances": []any{},
			"device": dev(fmt.Sprintf("/dev/nvidia%d", index), 195, index),
		}
	}
	migGPU := plain(UUID3, 3)
	migGPU["migInstances"] = []any{
		map[string]any{"uuid": MIGBig, "profile": "3g.40gb", "start": 0, "caps": []any{capDev(30), capDev(31)}},
		map[string]any{"uuid": MIGSmall, "profile": "1g.10gb", "start": 6, "caps": []any{capDev(66), capDev(67)}},
	}
	return map[string]any{
		"version":    1,
		"node":       node,
		"generation": 7,
		"updatedAt":  updatedAt.UTC().Format(time.RFC3339Nano),
		"controlDevices": []any{
			dev("/dev/nvidiactl", 195, 255), dev("/dev/nvidia-uvm", UVMMajor, 0), dev("/dev/nvidia-uvm-tools", UVMMajor, 1),
		},
		"gpus": []any{plain(UUID0, 0), plain(UUID1, 1), plain(UUID2, 2), migGPU},
		"shim": map[string]any{
			"library":     filepath.Join(shimDir, "libneuronetes-cuda.so"),
			"preloadFile": filepath.Join(shimDir, "ld.so.preload"),
		},
		"driver": map[string]any{
			"capabilities": "compute,utility",
			"mounts": []any{map[string]any{
				"hostPath":      "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
				"containerPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
			}},
			"hooks": []any{map[string]any{
				"path": "/usr/bin/nvidia-cdi-hook",
				"args": []any{"nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"},
				"env":  []any{},
			}},
		},
	}
}

// Host is a node: state dir, shim files, inventory file, ledger and a clock.
type Host struct {
	t          *testing.T
	StateDir   string
	ShimDir    string
	InvPath    string
	LedgerPath string
	Now        time.Time
	// LedgerPods are the ledger's pods in order (written by Bind).
	LedgerPods []any
	generation int
}

// New builds a node in a temporary directory.
func New(t *testing.T) *Host {
	t.Helper()
	root := t.TempDir()
	h := &Host{
		t:        t,
		StateDir: filepath.Join(root, "run-neuronetes"),
		ShimDir:  filepath.Join(root, "shim"),
		Now:      time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC),
	}
	h.InvPath = filepath.Join(h.StateDir, "inventory.json")
	h.LedgerPath = filepath.Join(h.StateDir, ledger.FileName)
	Must(t, os.MkdirAll(h.ShimDir, 0o755))
	Must(t, os.WriteFile(filepath.Join(h.ShimDir, "libneuronetes-cuda.so"), []byte("\x7fELF"), 0o644))
	Must(t, os.WriteFile(filepath.Join(h.ShimDir, "ld.so.preload"), []byte(inject.ShimLibraryPath+"\n"), 0o644))
	h.WriteInventory(InventoryDoc(Node, h.Now.Add(-10*time.Second), h.ShimDir))
	h.WriteLedger(Node, h.Now.Add(-5*time.Second))
	return h
}

// Bind records a pod in the node ledger, after the pods already there, as the agent does when it
// sees the pod bound to the node with that annotation.
func (h *Host) Bind(uid, namespace, name, annotation string) {
	h.LedgerPods = append(h.LedgerPods, map[string]any{"uid": uid, "namespace": namespace, "name": name, "assignment": annotation})
	h.WriteLedger(Node, h.Now.Add(-5*time.Second))
}

// LedgerDoc is the ledger file of node: its four GPUs and h.LedgerPods.
func (h *Host) LedgerDoc(node string, updatedAt time.Time) map[string]any {
	var gpus []any
	for _, u := range []string{UUID0, UUID1, UUID2, UUID3} {
		gpus = append(gpus, map[string]any{"uuid": u, "memoryMiB": GPUMemoryMiB})
	}
	pods := append([]any{}, h.LedgerPods...)
	h.generation++
	return map[string]any{
		"version": 1, "node": node, "generation": h.generation,
		"updatedAt": updatedAt.UTC().Format(time.RFC3339Nano), "gpus": gpus, "pods": pods,
	}
}

// WriteLedger writes the ledger file as the agent would.
func (h *Host) WriteLedger(node string, updatedAt time.Time) {
	h.WriteJSON(h.LedgerPath, h.LedgerDoc(node, updatedAt))
}

// WriteJSON writes doc as a file of the state directory.
func (h *Host) WriteJSON(path string, doc map[string]any) {
	data, err := json.Marshal(doc)
	Must(h.t, err)
	Must(h.t, os.MkdirAll(filepath.Dir(path), 0o755))
	Must(h.t, os.WriteFile(path, data, 0o644))
}

// WriteInventory writes doc as the inventory file.
func (h *Host) WriteInventory(doc map[string]any) {
	h.WriteJSON(h.InvPath, doc)
}

// Region creates the region the agent would create for a container (its control and state
// files) and returns its directory.
func (h *Host) Region(pod, container string) string {
	dir := filepath.Join(h.StateDir, inject.ContainersDir, pod, container)
	Must(h.t, os.MkdirAll(dir, 0o755))
	Must(h.t, os.WriteFile(filepath.Join(dir, inject.ControlFile), make([]byte, inject.ControlSize), 0o644))
	Must(h.t, os.WriteFile(filepath.Join(dir, inject.StateFile), make([]byte, inject.StateSize), 0o666))
	return dir
}

// Host is the decision's view of this node (inventory and ledger read through Sources on the
// fake clock).
func (h *Host) Host() inject.Host {
	now := func() time.Time { return h.Now }
	src := inventory.NewSource(h.InvPath, Node, inventory.DefaultMaxAge, now)
	led := ledger.NewSource(h.LedgerPath, Node, ledger.DefaultMaxAge, now)
	return inject.Host{Node: Node, StateDir: h.StateDir, Inventory: src.Current, Ledger: led.Current}
}

// Must fails the test on err.
func Must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
