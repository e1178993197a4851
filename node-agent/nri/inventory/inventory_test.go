package inventory

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const valid = `{
 "version": 1, "node": "gpu-node-1", "generation": 3, "updatedAt": "2026-11-23T12:00:00Z",
 "controlDevices": [
  {"path": "/dev/nvidia-uvm", "major": 508, "minor": 0},
  {"path": "/dev/nvidiactl", "major": 195, "minor": 255},
  {"path": "/dev/nvidia-uvm-tools", "major": 508, "minor": 1}],
 "gpus": [
  {"uuid": "GPU-5e6c1b1e-0a1b-4c2d-8e3f-000000000000", "index": 0,
   "device": {"path": "/dev/nvidia0", "major": 195, "minor": 0}, "migInstances": []},
  {"uuid": "GPU-5e6c1b1e-0a1b-4c2d-8e3f-000000000001", "index": 1,
   "device": {"path": "/dev/nvidia1", "major": 195, "minor": 1},
   "migInstances": [{"uuid": "MIG-9a1e0e75-7230-4e65-8e3f-000000000036", "profile": "1g.10gb+me", "start": 6,
     "caps": [{"path": "/dev/nvidia-caps/nvidia-cap66", "major": 511, "minor": 66},
              {"path": "/dev/nvidia-caps/nvidia-cap67", "major": 511, "minor": 67}]}]}],
 "shim": {"library": "/var/lib/neuronetes/shim/libneuronetes-cuda.so", "preloadFile": "/var/lib/neuronetes/shim/ld.so.preload"},
 "driver": {"capabilities": "compute,utility", "mounts": [], "hooks": []}
}`

func TestValidInventory(t *testing.T) {
	inv, err := Decode([]byte(valid))
	if err != nil {
		t.Fatal(err)
	}
	if inv.Node != "gpu-node-1" || inv.Generation != 3 || len(inv.GPUs) != 2 {
		t.Fatalf("%+v", inv)
	}
	// control devices come back in injection order whatever the file's order
	for i, want := range ControlDevicePaths {
		if inv.ControlDevices[i].Path != want {
			t.Fatalf("control devices %+v", inv.ControlDevices)
		}
	}
	g, ok := inv.GPUByUUID("GPU-5e6c1b1e-0a1b-4c2d-8e3f-000000000001")
	if !ok || g.Device.Minor != 1 {
		t.Fatalf("%+v", g)
	}
	mi, ok := g.Instance("1g.10gb+me", 6)
	if !ok || mi.Caps[1].Path != "/dev/nvidia-caps/nvidia-cap67" {
		t.Fatalf("%+v", mi)
	}
	if _, ok := g.Instance("1g.10gb+me", 5); ok {
		t.Fatal("instance found at the wrong slot")
	}
}

func TestInvalidInventories(t *testing.T) {
	cases := []struct{ old, new, says string }{
		{`"version": 1`, `"version": 2`, "Expected `int` <= 1 - at `$.version`"},
		{`"generation": 3`, `"generation": 3, "extra": 1`, "unknown field `extra`"},
		{`"updatedAt": "2026-11-23T12:00:00Z"`, `"updatedAt": "yesterday"`, "RFC 3339"},
		{`{"path": "/dev/nvidia-uvm", "major": 508, "minor": 0},`, ``, "Expected `array` of length >= 3 - at `$.controlDevices`"},
		{`"path": "/dev/nvidia-uvm",`, `"path": "/dev/nvidiactl",`, "/dev/nvidiactl is listed twice"},
		{`"path": "/dev/nvidia0"`, `"path": "/dev/sda"`, "at `$.gpus[0].device.path`"},
		{`"path": "/dev/nvidia1"`, `"path": "/dev/nvidia0"`, "/dev/nvidia0 is listed twice"},
		{`"index": 1`, `"index": 0`, "index 0 is listed twice"},
		{`"major": 195, "minor": 0}`, `"major": 0, "minor": 0}`, "Expected `int` >= 1 - at `$.gpus[0].device.major`"},
		{`"MIG-9a1e0e75`, `"GPU-9a1e0e75`, "at `$.gpus[1].migInstances[0].uuid`"},
		{`"start": 6`, `"start": 8`, "Expected `int` <= 7"},
		{`{"path": "/dev/nvidia-caps/nvidia-cap66", "major": 511, "minor": 66},`, ``, "Expected `array` of length >= 2"},
		{`/var/lib/neuronetes/shim/libneuronetes-cuda.so`, `shim/../libneuronetes-cuda.so`, "clean absolute path"},
		{`"capabilities": "compute,utility"`, `"capabilities": "all"`, "at `$.driver.capabilities`"},
		{`"hooks": []`, `"hooks": [{"path": "/bin/true", "args": [], "env": ["=x"]}]`, "at `$.driver.hooks[0].env[0]`"},
		{`, "hooks": []`, ``, "Object missing required field `hooks` - at `$.driver`"},
	}
	for _, c := range cases {
		doc := strings.Replace(valid, c.old, c.new, 1)
		if doc == valid {
			t.Fatalf("case %q changes nothing", c.old)
		}
		_, err := Decode([]byte(doc))
		if err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%q -> %q: got %v, want %q", c.old, c.new, err, c.says)
		}
	}
}

func TestSourceChecksNodeAgeAndGeneration(t *testing.T) {
	file := filepath.Join(t.TempDir(), "inventory.json")
	if err := os.WriteFile(file, []byte(valid), 0o644); err != nil {
		t.Fatal(err)
	}
	updated := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	now := updated.Add(30 * time.Second)
	src := NewSource(file, "gpu-node-1", DefaultMaxAge, func() time.Time { return now })
	if _, err := src.Current(); err != nil {
		t.Fatal(err)
	}
	now = updated.Add(DefaultMaxAge + time.Second)
	if _, err := src.Current(); err == nil || !strings.Contains(err.Error(), "is stale") {
		t.Fatalf("stale file used: %v", err)
	}
	now = updated.Add(-DefaultMaxAge - time.Second) // written "in the future": a clock jump
	if _, err := src.Current(); err == nil || !strings.Contains(err.Error(), "is stale") {
		t.Fatalf("future file used: %v", err)
	}
	now = updated
	other := NewSource(file, "gpu-node-2", DefaultMaxAge, src.Now)
	if _, err := other.Current(); err == nil || !strings.Contains(err.Error(), `is for node "gpu-node-1"`) {
		t.Fatalf("foreign file used: %v", err)
	}
	older := strings.Replace(valid, `"generation": 3`, `"generation": 2`, 1)
	if err := os.WriteFile(file, []byte(older), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Current(); err == nil || !strings.Contains(err.Error(), "generation 2 is older than 3") {
		t.Fatalf("older generation used: %v", err)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "absent.json"), "gpu-node-1", DefaultMaxAge, now); err == nil {
		t.Fatal("missing file loaded")
	}
}
