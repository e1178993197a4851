// Package inventory reads the node inventory file the node agent writes (docs/contracts.md, "The
// node inventory file"): this node's name, each GPU's UUID, index and device node, each MIG
// instance's capability device nodes, the control device nodes CUDA needs, where the shim library
// and preload file are, and the driver files a container with GPUs needs.
//
// The NRI plugin maps an assignment (GPU UUIDs, MIG profile and start) to device nodes only
// through this file, so it is decoded as strictly as the assignment: unknown fields, wrong types,
// malformed paths, duplicates and a stale or foreign file are all refused, and the plugin then
// refuses every container that has an assignment.
package inventory

import (
	"fmt"
	"os"
	"sync"
	"time"
)

// Contract constants.
const (
	SchemaVersion = 1
	MaxBytes      = 1 << 20
	// DefaultPath is where the agent writes the file (host and plugin see the same path).
	DefaultPath = "/run/neuronetes/inventory.json"
	// DefaultMaxAge: the agent rewrites the file at least every 30 s; three missed rewrites make it stale.
	DefaultMaxAge = 90 * time.Second
)

// The control device nodes every CUDA process opens, in the order they are injected.
var ControlDevicePaths = []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}

// Device is one character device node on the host (the same path inside the container).
type Device struct {
	Path  string
	Major int64
	Minor int64
}

// MIGInstance is one MIG compute instance: its UUID and the capability nodes that grant it.
type MIGInstance struct {
	UUID    string
	Profile string
	Start   int
	Caps    []Device // NVIDIA's GPU-instance and compute-instance access nodes
}

// GPU is one physical GPU of the node.
type GPU struct {
	UUID   string
	Index  int
	Device Device
	MIG    []MIGInstance
}

// Mount is one host file or directory bound read-only into GPU containers.
type Mount struct {
	HostPath      string
	ContainerPath string
}

// Hook is one OCI createContainer hook GPU containers need (e.g. NVIDIA's ldcache update).
type Hook struct {
	Path string
	Args []string
	Env  []string
}

// Inventory is a decoded inventory file.
type Inventory struct {
	Version            int64
	Node               string
	Generation         int64
	UpdatedAt          time.Time
	ControlDevices     []Device
	GPUs               []GPU
	ShimLibrary        string // host path of libneuronetes-cuda.so
	ShimPreloadFile    string // host path of the ld.so.preload naming it
	DriverCapabilities string
	DriverMounts       []Mount
	DriverHooks        []Hook
}

// GPUByUUID returns the GPU with that UUID.
func (inv *Inventory) GPUByUUID(uuid string) (*GPU, bool) {
	for i := range inv.GPUs {
		if inv.GPUs[i].UUID == uuid {
			return &inv.GPUs[i], true
		}
	}
	return nil, false
}

// Instance returns the GPU's MIG instance of that profile at that start slot.
func (g *GPU) Instance(profile string, start int) (*MIGInstance, bool) {
	for i := range g.MIG {
		if g.MIG[i].Profile == profile && g.MIG[i].Start == start {
			return &g.MIG[i], true
		}
	}
	return nil, false
}

// Load reads and decodes the file at file and checks it is this node's and fresh.
func Load(file, node string, maxAge time.Duration, now time.Time) (*Inventory, error) {
	info, err := os.Stat(file)
	if err != nil {
		return nil, fmt.Errorf("node inventory: %w", err)
	}
	if !info.Mode().IsRegular() || info.Size() > MaxBytes {
		return nil, fmt.Errorf("node inventory %s: not a regular file of at most %d bytes", file, MaxBytes)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("node inventory: %w", err)
	}
	inv, err := Decode(data)
	if err != nil {
		return nil, fmt.Errorf("node inventory %s: %w", file, err)
	}
	if inv.Node != node {
		return nil, fmt.Errorf("node inventory %s is for node %q, this is %q", file, inv.Node, node)
	}
	if age := now.Sub(inv.UpdatedAt); age > maxAge || age < -maxAge {
		return nil, fmt.Errorf("node inventory %s is stale: updatedAt %s is %s from now (bound %s); is the node agent running?",
			file, inv.UpdatedAt.Format(time.RFC3339), age.Round(time.Second), maxAge)
	}
	return inv, nil
}

// Source loads the inventory file for each decision and refuses one older than a file it has
// already used (a generation that went backwards: a restored or half-rolled-back agent state).
type Source struct {
	Path   string
	Node   string
	MaxAge time.Duration
	Now    func() time.Time

	mu             sync.Mutex
	lastGeneration int64
}

// Current returns the inventory as it is now, or why it cannot be used.
func (s *Source) Current() (*Inventory, error) {
	inv, err := Load(s.Path, s.Node, s.MaxAge, s.Now())
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if inv.Generation < s.lastGeneration {
		return nil, fmt.Errorf("node inventory %s: generation %d is older than %d, already used",
			s.Path, inv.Generation, s.lastGeneration)
	}
	s.lastGeneration = inv.Generation
	return inv, nil
}
