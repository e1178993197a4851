// Package inject is the NRI plugin's decision, kept free of NRI types so it is tested without a
// runtime: pod metadata + one container + the node inventory -> the container's adjustment (a
// Plan) or a refusal. A refusal makes CreateContainer fail, so a container whose assignment cannot
// be honoured is never started without its isolation (docs/node-injection.md, failure table).
package inject

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"neuronetes.io/node-agent/nri/assignment"
	"neuronetes.io/node-agent/nri/internal/ident"
	"neuronetes.io/node-agent/nri/inventory"
	"neuronetes.io/node-agent/nri/ledger"
)

// Paths inside the container and tenant-forbidden env (neuronetes/contracts.py holds the same
// values; tests/fixtures/assignment-vectors.json pins them for both sides).
const (
	ShimLibraryPath = "/usr/lib/neuronetes/libneuronetes-cuda.so"
	ShimPreloadFile = "/etc/ld.so.preload"
	// The shim's region in the container (node-agent/shim/include/neuronetes_region.h): the
	// directory and the agent's control file read-only, the container's state file writable.
	ShimRegionDir   = "/run/neuronetes"
	ShimControlPath = ShimRegionDir + "/" + ControlFile
	ShimStatePath   = ShimRegionDir + "/" + StateFile
	ControlFile     = "control"
	StateFile       = "state"
	// ControlSize and StateSize are the sizes of the two region files (NN_CONTROL_SIZE,
	// NN_STATE_SIZE of major version 2).
	ControlSize = 16 * 1024
	StateSize   = 64 * 1024
	// ContainersDir is, under the state directory, where the agent creates the regions:
	// <state>/containers/<pod-uid>/<container>/{control,state}.
	ContainersDir = "containers"
)

// Env the plugin owns in every container.
const (
	EnvNvidiaVisibleDevices = "NVIDIA_VISIBLE_DEVICES"
	EnvNvidiaCapabilities   = "NVIDIA_DRIVER_CAPABILITIES"
	EnvCudaVisibleDevices   = "CUDA_VISIBLE_DEVICES"
	// NvidiaVoid tells NVIDIA's runtime hook to do nothing: the devices come from this plugin only.
	NvidiaVoid = "void"
)

var (
	// ForbiddenEnvPrefixes and ForbiddenEnvNames = contracts.TENANT_FORBIDDEN_ENV_PREFIXES / _NAMES.
	ForbiddenEnvPrefixes = []string{"NVIDIA_", "CUDA_DEVICE_", "NEURONETES_"}
	ForbiddenEnvNames    = []string{"LD_PRELOAD", "LD_AUDIT"}
	// GPU device nodes a container must not bring in by itself (a CDI or device-plugin leftover).
	gpuDevicePattern = regexp.MustCompile(`^/dev/(nvidia[0-9]+|nvidiactl|nvidia-uvm|nvidia-uvm-tools|nvidia-modeset|nvidia-caps/.*)$`)
)

// Pod is what the decision needs of the pod sandbox.
type Pod struct {
	UID         string
	Namespace   string
	Name        string
	Annotations map[string]string
}

// Container is what the decision needs of the container being created.
type Container struct {
	Name    string
	Env     []string // the final env (image ENV, envFrom and env merged), "KEY=value"
	Devices []string // device node paths already in the container's spec
	// AllDevices: the container's device cgroup allows every device (a privileged container, such
	// as the node agent's own). The runtime gives it every host device node and it may make more,
	// so no device check can narrow it: Verify does not refuse it for a GPU node it was not
	// assigned (keeping privileged pods from tenants is Pod Security's job, docs/threat-model.md).
	AllDevices bool
}

// Host is the node-side configuration of the decision.
type Host struct {
	Node      string                               // this node's name
	StateDir  string                               // /run/neuronetes (regions under StateDir/containers)
	Inventory func() (*inventory.Inventory, error) // loaded only for containers with GPUs
	// Ledger is the agent's record of the pods bound to this node (loaded only for containers
	// with GPUs); the assignment must be in it and fit beside the pods recorded before it.
	Ledger func() (*ledger.Ledger, error)
	// PodRequests names the containers of the pod that ask for NeuroNetes resources (from the
	// pod spec: CRI and NRI do not carry extended resources). nil, or an error, means unknown:
	// such a container then gets no GPU, which is safe, instead of a clear refusal.
	PodRequests func(Pod) (map[string]bool, error)
}

// Mount is a bind mount to add.
type Mount struct {
	Source      string
	Destination string
	Options     []string
}

// EnvVar is one variable to set.
type EnvVar struct {
	Key   string
	Value string
}

// Plan is the adjustment for one container.
type Plan struct {
	// GPUs is true when the container is listed in the assignment and gets devices.
	GPUs    bool
	Devices []inventory.Device // to add, each with an allow rule in the device cgroup
	// RemoveDevices are GPU device nodes in the container that are not its own. NRI applies the
	// removal to what earlier plugins added; one already in the runtime's spec is caught at
	// start (Verify).
	RemoveDevices []string
	Mounts        []Mount
	SetEnv        []EnvVar
	// ClearEnv are tenant-set forbidden keys, overridden with an empty value: NRI's adaptation
	// drops removal-only env adjustments, and an empty LD_PRELOAD, LD_AUDIT, CUDA_VISIBLE_DEVICES
	// or NVIDIA_* variable is inert.
	ClearEnv []string
	Hooks    []inventory.Hook // createContainer hooks
}

// Refusal is why a container must not be created.
type Refusal struct {
	Pod       string // namespace/name
	Container string
	Reason    string
}

func (r *Refusal) Error() string {
	return fmt.Sprintf("neuronetes: refusing container %q of pod %s: %s", r.Container, r.Pod, r.Reason)
}

// Decide returns the adjustment for ctr, or a *Refusal.
func Decide(pod Pod, ctr Container, host Host) (*Plan, error) {
	refuse := func(format string, args ...any) (*Plan, error) {
		return nil, &Refusal{Pod: pod.Namespace + "/" + pod.Name, Container: ctr.Name, Reason: fmt.Sprintf(format, args...)}
	}
	value, annotated := pod.Annotations[assignment.Annotation]
	if !annotated {
		if host.asks(pod, ctr.Name) {
			return refuse("it asks for NeuroNetes resources but the pod has no %s annotation "+
				"(bound by another scheduler, or spec.nodeName set)", assignment.Annotation)
		}
		return noGPU(ctr), nil
	}
	a, err := assignment.Decode([]byte(value))
	if err != nil {
		return refuse("%v", err)
	}
	// A pod whose annotation is not its own is refused as a whole: a copied or stale annotation
	// means the pod's placement cannot be trusted, listed container or not.
	if a.PodUID != "" && a.PodUID != pod.UID {
		return refuse("%s names pod UID %s, this pod is %s (a copied annotation)", assignment.Annotation, a.PodUID, pod.UID)
	}
	if a.Node != host.Node {
		return refuse("%s is for node %q, this is %q", assignment.Annotation, a.Node, host.Node)
	}
	entry, listed := a.Containers[ctr.Name]
	if !listed {
		if host.asks(pod, ctr.Name) {
			return refuse("it asks for NeuroNetes resources but %s has no entry for it", assignment.Annotation)
		}
		return noGPU(ctr), nil
	}
	if !ident.PodUID.MatchString(pod.UID) {
		return refuse("pod UID %q is not a Kubernetes UID", pod.UID)
	}
	inv, err := host.Inventory()
	if err != nil {
		return refuse("%v", err)
	}
	plan, reason := withGPUs(pod, ctr, entry, inv, host)
	if reason != "" {
		return refuse("%s", reason)
	}
	if err := crossCheck(pod.UID, value, host); err != nil {
		return refuse("%v", err)
	}
	return plan, nil
}

// crossCheck: the annotation alone only proves somebody put it on the pod sandbox; the node
// ledger (the API server's view, kept by the agent) must hold the pod with that annotation and no
// earlier pod may hold the same GPU memory or MIG instance (docs/node-injection.md).
func crossCheck(podUID, annotation string, host Host) error {
	if host.Ledger == nil {
		return errors.New("no node ledger is configured")
	}
	l, err := host.Ledger()
	if err != nil {
		return err
	}
	return l.Admit(podUID, annotation)
}

// asks reports whether the pod spec is known to give the container NeuroNetes resources.
func (h Host) asks(pod Pod, container string) bool {
	if h.PodRequests == nil {
		return false
	}
	requests, err := h.PodRequests(pod)
	return err == nil && requests[container]
}

// noGPU: a container without an entry gets no GPU device and no way to ask the runtime for one.
func noGPU(ctr Container) *Plan {
	plan := &Plan{SetEnv: []EnvVar{{EnvNvidiaVisibleDevices, NvidiaVoid}}}
	plan.ClearEnv = tenantEnv(ctr.Env, plan.SetEnv)
	plan.RemoveDevices = foreignDevices(ctr.Devices, nil)
	return plan
}

func withGPUs(pod Pod, ctr Container, entry *assignment.Container, inv *inventory.Inventory, host Host) (*Plan, string) {
	plan := &Plan{GPUs: true}
	plan.Devices = append(plan.Devices, inv.ControlDevices...)
	visible := make([]string, 0, len(entry.GPUs))
	for _, g := range entry.GPUs {
		devices, id, reason := resolve(g, inv)
		if reason != "" {
			return nil, reason
		}
		visible = append(visible, id)
		for _, d := range devices {
			if !containsDevice(plan.Devices, d.Path) {
				plan.Devices = append(plan.Devices, d)
			}
		}
	}
	mounts, reason := shimMounts(pod, ctr, inv, host)
	if reason != "" {
		return nil, reason
	}
	plan.Mounts = mounts
	for _, m := range inv.DriverMounts {
		if reserved := shadowedBy(m.ContainerPath); reserved != "" {
			return nil, fmt.Sprintf("node inventory: driver mount %s would cover %s", m.ContainerPath, reserved)
		}
		plan.Mounts = append(plan.Mounts, Mount{m.HostPath, m.ContainerPath, []string{"rbind", "ro", "nosuid", "nodev"}})
	}
	plan.Hooks = inv.DriverHooks
	plan.SetEnv = []EnvVar{
		{EnvNvidiaVisibleDevices, NvidiaVoid},
		{EnvNvidiaCapabilities, inv.DriverCapabilities},
		// CUDA numbers devices in this order; UUIDs keep it right whatever the enumeration
		{EnvCudaVisibleDevices, strings.Join(visible, ",")},
	}
	plan.ClearEnv = tenantEnv(ctr.Env, plan.SetEnv)
	plan.RemoveDevices = foreignDevices(ctr.Devices, plan.Devices)
	return plan, ""
}

// resolve maps one assigned GPU (or MIG instance) to its device nodes and the ID CUDA knows it by.
// MIG follows NVIDIA's container toolkit: the parent GPU's node plus the instance's two
// capability nodes (GPU-instance and compute-instance access).
func resolve(g assignment.GPU, inv *inventory.Inventory) ([]inventory.Device, string, string) {
	gpu, ok := inv.GPUByUUID(g.UUID)
	if !ok {
		return nil, "", fmt.Sprintf("GPU %s is not in the node inventory", g.UUID)
	}
	if gpu.Index != g.Index {
		return nil, "", fmt.Sprintf("GPU %s has index %d on this node, the assignment says %d", g.UUID, gpu.Index, g.Index)
	}
	if !g.IsMIG {
		if len(gpu.MIG) > 0 {
			return nil, "", fmt.Sprintf("GPU %s is in MIG mode; the assignment gives it whole or shared", g.UUID)
		}
		return []inventory.Device{gpu.Device}, gpu.UUID, ""
	}
	mig, ok := gpu.Instance(g.MigProfile, g.MigStart)
	if !ok {
		return nil, "", fmt.Sprintf("GPU %s has no MIG instance %s at slot %d in the node inventory", g.UUID, g.MigProfile, g.MigStart)
	}
	return append([]inventory.Device{gpu.Device}, mig.Caps...), mig.UUID, ""
}

// shimMounts: the shim library, the preload file naming it, and the container's region (both its
// files), each checked on the host first; ld.so only warns about a preload it cannot load, so a
// missing library would silently run the container unshimmed.
func shimMounts(pod Pod, ctr Container, inv *inventory.Inventory, host Host) ([]Mount, string) {
	if err := regularFile(inv.ShimLibrary, -1); err != nil {
		return nil, fmt.Sprintf("shim library: %v", err)
	}
	preload, err := os.ReadFile(inv.ShimPreloadFile)
	if err != nil {
		return nil, fmt.Sprintf("shim preload file: %v", err)
	}
	if strings.TrimSpace(string(preload)) != ShimLibraryPath {
		return nil, fmt.Sprintf("shim preload file %s must name exactly %s", inv.ShimPreloadFile, ShimLibraryPath)
	}
	regionDir := filepath.Join(host.StateDir, ContainersDir, pod.UID, ctr.Name)
	control := filepath.Join(regionDir, ControlFile)
	state := filepath.Join(regionDir, StateFile)
	for _, f := range []struct {
		path string
		size int64
	}{{control, ControlSize}, {state, StateSize}} {
		if err := regularFile(f.path, f.size); err != nil {
			return nil, fmt.Sprintf("shim region (the node agent creates it before the container starts): %v", err)
		}
	}
	ro := []string{"rbind", "ro", "nosuid", "nodev"}
	return []Mount{
		{inv.ShimLibrary, ShimLibraryPath, ro},
		{inv.ShimPreloadFile, ShimPreloadFile, ro},
		// the directory and the agent's control file read-only: nothing the container does can
		// change what the agent wrote; the container's state file writable (its processes map it
		// shared). The agent only ever reads copies of the state file.
		{regionDir, ShimRegionDir, []string{"rbind", "ro", "nosuid", "nodev", "noexec"}},
		{control, ShimControlPath, []string{"bind", "ro", "nosuid", "nodev", "noexec"}},
		{state, ShimStatePath, []string{"bind", "rw", "nosuid", "nodev", "noexec"}},
	}, ""
}

// shadowedBy names the path of ours (or the kernel's) that a driver mount at dest would cover or
// sit inside, or "".
func shadowedBy(dest string) string {
	for _, reserved := range []string{ShimLibraryPath, ShimPreloadFile, ShimRegionDir, "/dev", "/proc", "/sys"} {
		if dest == reserved || strings.HasPrefix(dest, reserved+"/") || strings.HasPrefix(reserved, dest+"/") {
			return reserved
		}
	}
	return ""
}

func regularFile(path string, size int64) error {
	info, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if !info.Mode().IsRegular() {
		return errors.New(path + " is not a regular file")
	}
	if size >= 0 && info.Size() != size {
		return fmt.Errorf("%s has %d bytes, not %d", path, info.Size(), size)
	}
	return nil
}

// IsForbiddenEnv reports whether a tenant may not set key (the plugin owns or refuses it).
func IsForbiddenEnv(key string) bool {
	if key == EnvCudaVisibleDevices {
		return true
	}
	for _, p := range ForbiddenEnvPrefixes {
		if strings.HasPrefix(key, p) {
			return true
		}
	}
	for _, n := range ForbiddenEnvNames {
		if key == n {
			return true
		}
	}
	return false
}

// tenantEnv: forbidden keys in env that the plan does not set itself (those it sets replace them).
func tenantEnv(env []string, set []EnvVar) []string {
	var remove []string
	for _, kv := range env {
		key, _, _ := strings.Cut(kv, "=")
		if !IsForbiddenEnv(key) || containsString(remove, key) || setsKey(set, key) {
			continue
		}
		remove = append(remove, key)
	}
	return remove
}

func foreignDevices(existing []string, ours []inventory.Device) []string {
	var remove []string
	for _, path := range existing {
		if gpuDevicePattern.MatchString(path) && !containsDevice(ours, path) && !containsString(remove, path) {
			remove = append(remove, path)
		}
	}
	return remove
}

func setsKey(set []EnvVar, key string) bool {
	for _, e := range set {
		if e.Key == key {
			return true
		}
	}
	return false
}

func containsDevice(devices []inventory.Device, path string) bool {
	for _, d := range devices {
		if d.Path == path {
			return true
		}
	}
	return false
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
