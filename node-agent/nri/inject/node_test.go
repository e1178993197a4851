package inject

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"neuronetes.io/node-agent/nri/inventory"
)

// A simulated node for the decision tests: a real state directory with an inventory file, the
// shim library and preload file, and the regions the agent would have created.

const (
	testNode = "gpu-node-1"
	podUID   = "0b6f3c8e-4c1d-4f57-9a1e-2f0c4a1b9d77"
	otherUID = "6f1c2d3e-0000-4000-8000-00000000beef"
	uuid0    = "GPU-5e6c1b1e-0a1b-4c2d-8e3f-000000000000"
	uuid1    = "GPU-5e6c1b1e-0a1b-4c2d-8e3f-000000000001"
	uuid2    = "GPU-5e6c1b1e-0a1b-4c2d-8e3f-000000000002"
	uuid3    = "GPU-5e6c1b1e-0a1b-4c2d-8e3f-000000000003" // in MIG mode
	migBig   = "MIG-9a1e0e75-7230-4e65-8e3f-000000000030"
	migSmall = "MIG-9a1e0e75-7230-4e65-8e3f-000000000036"
	uvmMajor = 508
	capMajor = 511
)

func dev(path string, major, minor int) map[string]any {
	return map[string]any{"path": path, "major": major, "minor": minor}
}

func capDev(minor int) map[string]any {
	return dev(fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", minor), capMajor, minor)
}

// inventoryDoc is the file the agent writes for a 4-GPU node whose last GPU is in MIG mode
// (a 3g.40gb instance at slot 0 and a 1g.10gb instance at slot 6).
func inventoryDoc(node string, updatedAt time.Time, shimDir string) map[string]any {
	plain := func(uuid string, index int) map[string]any {
		return map[string]any{
			"uuid": uuid, "index": index, "migInstances": []any{},
			"device": dev(fmt.Sprintf("/dev/nvidia%d", index), 195, index),
		}
	}
	migGPU := plain(uuid3, 3)
	migGPU["migInstances"] = []any{
		map[string]any{"uuid": migBig, "profile": "3g.40gb", "start": 0, "caps": []any{capDev(30), capDev(31)}},
		map[string]any{"uuid": migSmall, "profile": "1g.10gb", "start": 6, "caps": []any{capDev(66), capDev(67)}},
	}
	return map[string]any{
		"version":    1,
		"node":       node,
		"generation": 7,
		"updatedAt":  updatedAt.UTC().Format(time.RFC3339Nano),
		"controlDevices": []any{
			dev("/dev/nvidiactl", 195, 255), dev("/dev/nvidia-uvm", uvmMajor, 0), dev("/dev/nvidia-uvm-tools", uvmMajor, 1),
		},
		"gpus": []any{plain(uuid0, 0), plain(uuid1, 1), plain(uuid2, 2), migGPU},
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

// testHost is a node: state dir, shim files, inventory file and a clock.
type testHost struct {
	t        *testing.T
	stateDir string
	shimDir  string
	invPath  string
	now      time.Time
}

func newTestHost(t *testing.T) *testHost {
	t.Helper()
	root := t.TempDir()
	h := &testHost{
		t:        t,
		stateDir: filepath.Join(root, "run-neuronetes"),
		shimDir:  filepath.Join(root, "shim"),
		now:      time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC),
	}
	h.invPath = filepath.Join(h.stateDir, "inventory.json")
	must(t, os.MkdirAll(h.shimDir, 0o755))
	must(t, os.WriteFile(filepath.Join(h.shimDir, "libneuronetes-cuda.so"), []byte("\x7fELF"), 0o644))
	must(t, os.WriteFile(filepath.Join(h.shimDir, "ld.so.preload"), []byte(ShimLibraryPath+"\n"), 0o644))
	h.writeInventory(inventoryDoc(testNode, h.now.Add(-10*time.Second), h.shimDir))
	return h
}

func (h *testHost) writeInventory(doc map[string]any) {
	data, err := json.Marshal(doc)
	must(h.t, err)
	must(h.t, os.MkdirAll(h.stateDir, 0o755))
	must(h.t, os.WriteFile(h.invPath, data, 0o644))
}

// region creates the region file the agent would create for a container.
func (h *testHost) region(pod, container string) string {
	dir := filepath.Join(h.stateDir, ContainersDir, pod, container)
	must(h.t, os.MkdirAll(dir, 0o755))
	path := filepath.Join(dir, "region")
	must(h.t, os.WriteFile(path, make([]byte, RegionSize), 0o600))
	return path
}

func (h *testHost) host() Host {
	src := &inventory.Source{Path: h.invPath, Node: testNode, MaxAge: inventory.DefaultMaxAge, Now: func() time.Time { return h.now }}
	return Host{Node: testNode, StateDir: h.stateDir, Inventory: src.Current}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
