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
	"time"

	"neuronetes.io/node-agent/nri/internal/statefile"
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

var format = statefile.Format[*Inventory]{
	What:     "node inventory",
	MaxBytes: MaxBytes,
	Decode:   Decode,
	Header: func(inv *Inventory) statefile.Header {
		return statefile.Header{Node: inv.Node, Generation: inv.Generation, UpdatedAt: inv.UpdatedAt}
	},
}

// Load reads and decodes the file at file and checks it is this node's and fresh.
func Load(file, node string, maxAge time.Duration, now time.Time) (*Inventory, error) {
	return format.Load(file, node, maxAge, now)
}

// Source loads the file for each decision and refuses one of a generation older than one it has
// already used.
type Source = statefile.Source[*Inventory]

// NewSource reads the file at path for node on the clock now.
func NewSource(path, node string, maxAge time.Duration, now func() time.Time) *Source {
	return &Source{Format: format, Path: path, Node: node, MaxAge: maxAge, Now: now}
}
