// Package assignment decodes the `neuronetes.io/assigned-gpus` pod annotation: the extender's
// per-container GPU decision (docs/contracts.md, "The assignment annotation").
//
// The decoder is the Go twin of the Python one (neuronetes/contracts.py: decode_assignment): strict
// (no unknown field, no type coercion, ranges and formats checked, at most 64 KiB), it reads
// exactly the schema versions it knows, and its error messages have the same wording. Both are
// checked against the shared vectors in tests/fixtures/assignment-vectors.json, so they cannot
// drift apart: a document one side acts on and the other refuses would be a hole.
package assignment

import (
	"fmt"
	"strings"

	"neuronetes.io/node-agent/nri/internal/ident"
	sj "neuronetes.io/node-agent/nri/internal/strictjson"
)

// The contract's names and bounds (neuronetes/contracts.py holds the same values).
const (
	Annotation          = "neuronetes.io/assigned-gpus"
	SchemaVersion       = 1
	MaxBytes            = 64 * 1024
	MaxGPUIndex         = 255
	MaxGPUMemoryMiB     = 1 << 24
	MaxGPUsPerContainer = 64
	MaxContainers       = 256
	MaxGangSize         = 100_000
	MigStartSlots       = 8
	PriorityMin         = -(1 << 31)
	PriorityMax         = 1<<31 - 1
)

// SupportedVersions are the schema versions this reader accepts (a new one is added here, and
// in contracts.SUPPORTED_ASSIGNMENT_VERSIONS, before any extender writes it).
var SupportedVersions = []int64{SchemaVersion}

// QoS classes of a slice.
const (
	QoSGuaranteed = "Guaranteed"
	QoSBurstable  = "Burstable"
	QoSBestEffort = "BestEffort"
)

var (
	dnsLabelPattern   = sj.NewPattern(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	labelValuePattern = sj.NewPattern(`^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$`)

	gpuUUIDSpec     = sj.StrSpec{Pattern: ident.GPUUUID}
	migProfileSpec  = sj.StrSpec{MaxLen: 32, Pattern: ident.MIGProfile}
	containerSpec   = sj.StrSpec{MinLen: 1, MaxLen: 63, Pattern: dnsLabelPattern}
	gangNameSpec    = sj.StrSpec{MinLen: 1, MaxLen: 63, Pattern: labelValuePattern}
	podUIDSpec      = sj.StrSpec{Pattern: ident.PodUID}
	gpuFields       = []string{"uuid", "index", "memoryMiB", "computePercent"}
	containerFields = []string{"gpus", "priority", "qos"}
)

// GPU is one GPU, or one MIG instance of it, given to one container.
type GPU struct {
	UUID           string // the physical GPU's NVML UUID
	Index          int    // the GPU's index on the node
	MemoryMiB      int64  // hard memory limit the shim enforces
	ComputePercent int    // compute share the shim paces to (100: none; always 100 for MIG)
	// MIG: the instance of MigProfile placed at memory slice MigStart on this GPU.
	IsMIG      bool
	MigProfile string
	MigStart   int
}

// Container is what one container (app, init or sidecar) gets.
type Container struct {
	GPUs     []GPU
	Priority int32
	QoS      string
}

// Gang is the pod group the pod was reserved with.
type Gang struct {
	Name string
	Size int64
}

// Assignment is a decoded annotation, schema version 1.
type Assignment struct {
	Version    int64
	Node       string
	PodUID     string // "" when the document has none
	Containers map[string]*Container
	Order      []string // container names in document order
	Gang       *Gang
}

// Error is an annotation that must not be acted on; its message starts with the annotation name.
type Error struct{ msg string }

func (e *Error) Error() string { return Annotation + ": " + e.msg }

func fail(err error) *Error { return &Error{msg: err.Error()} }

// Decode parses and validates an annotation value. Every error is an *Error.
func Decode(data []byte) (*Assignment, error) {
	if len(data) > MaxBytes {
		return nil, &Error{msg: fmt.Sprintf("%d bytes, more than the %d allowed", len(data), MaxBytes)}
	}
	root, err := sj.Parse(data)
	if err != nil {
		return nil, &Error{msg: "not a versioned assignment document: " + err.Error()}
	}
	version, err := probeVersion(root)
	if err != nil {
		return nil, &Error{msg: "not a versioned assignment document: " + err.Error()}
	}
	if !supported(version) {
		known := make([]string, len(SupportedVersions))
		for i, v := range SupportedVersions {
			known[i] = fmt.Sprint(v)
		}
		return nil, &Error{msg: fmt.Sprintf(
			"schema version %s is not supported by this reader (it reads %s); upgrade the node agent before the extender",
			version, strings.Join(known, ", "))}
	}
	a, err := decodeV1(root)
	if err != nil {
		return nil, fail(err)
	}
	return a, nil
}

// probeVersion reads only `version` (any other field is the versioned decoder's business).
func probeVersion(root *sj.Value) (string, error) {
	members, err := root.Members("$", 0, 0)
	if err != nil {
		return "", err
	}
	version := ""
	for _, m := range members {
		if m.Key == "version" { // every occurrence is checked, the last one counts
			n, err := m.Val.BigInt("$.version")
			if err != nil {
				return "", err
			}
			version = n.String()
		}
	}
	if version == "" {
		return "", sj.RequireFields("$", nil, "version")
	}
	return version, nil
}

func supported(version string) bool {
	for _, v := range SupportedVersions {
		if fmt.Sprint(v) == version {
			return true
		}
	}
	return false
}

func decodeV1(root *sj.Value) (*Assignment, error) {
	a := &Assignment{Containers: map[string]*Container{}}
	err := root.Fields("$", func(m sj.Member, path string) (err error) {
		switch m.Key {
		case "version":
			a.Version, err = m.Val.Int(path, SchemaVersion, SchemaVersion)
		case "node":
			a.Node, err = m.Val.Str(path, ident.ObjectName)
		case "podUID":
			if m.Val.Kind != sj.Null {
				a.PodUID, err = m.Val.Str(path, podUIDSpec)
			}
		case "containers":
			err = decodeContainers(m.Val, path, a)
		case "gang":
			if m.Val.Kind != sj.Null {
				a.Gang, err = decodeGang(m.Val, path)
			}
		default:
			err = sj.Unknown("$", m.Key)
		}
		return err
	}, "version", "node", "containers")
	if err != nil {
		return nil, err
	}
	return a, checkIndexes(a)
}

func decodeContainers(v *sj.Value, path string, a *Assignment) error {
	members, err := v.Members(path, 1, MaxContainers)
	if err != nil {
		return err
	}
	for _, m := range members {
		if _, err := sj.CheckStr(m.Key, sj.KeyOf(path), containerSpec); err != nil {
			return err
		}
		c, err := decodeContainer(m.Val, sj.AnyValue(path))
		if err != nil {
			return err
		}
		if _, dup := a.Containers[m.Key]; !dup {
			a.Order = append(a.Order, m.Key)
		}
		a.Containers[m.Key] = c
	}
	return nil
}

func decodeContainer(v *sj.Value, path string) (*Container, error) {
	c := &Container{}
	err := v.Fields(path, func(m sj.Member, fieldPath string) (err error) {
		switch m.Key {
		case "gpus":
			c.GPUs, err = decodeGPUs(m.Val, fieldPath)
		case "priority":
			var p int64
			p, err = m.Val.Int(fieldPath, PriorityMin, PriorityMax)
			c.Priority = int32(p)
		case "qos":
			c.QoS, err = m.Val.Enum(fieldPath, QoSGuaranteed, QoSBurstable, QoSBestEffort)
		default:
			err = sj.Unknown(path, m.Key)
		}
		return err
	}, containerFields...)
	if err != nil {
		return nil, err
	}
	// a GPU (or MIG slot of it) twice in one container is a builder bug, never a bigger grant
	seen := map[string]bool{}
	for _, g := range c.GPUs {
		key := g.UUID
		if g.IsMIG {
			key = fmt.Sprintf("%s/%d", g.UUID, g.MigStart)
		}
		if seen[key] {
			return nil, sj.Errorf(path, "GPU %s is listed twice", g.UUID)
		}
		seen[key] = true
	}
	return c, nil
}

func decodeGPUs(v *sj.Value, path string) ([]GPU, error) {
	items, err := v.Items(path, 1, MaxGPUsPerContainer)
	if err != nil {
		return nil, err
	}
	gpus := make([]GPU, 0, len(items))
	for i, item := range items {
		g, err := decodeGPU(item, sj.Index(path, i))
		if err != nil {
			return nil, err
		}
		gpus = append(gpus, g)
	}
	return gpus, nil
}

func decodeGPU(v *sj.Value, path string) (GPU, error) {
	var g GPU
	hasProfile, hasStart := false, false
	err := v.Fields(path, func(m sj.Member, fieldPath string) (err error) {
		var n int64
		switch m.Key {
		case "uuid":
			g.UUID, err = m.Val.Str(fieldPath, gpuUUIDSpec)
		case "index":
			n, err = m.Val.Int(fieldPath, 0, MaxGPUIndex)
			g.Index = int(n)
		case "memoryMiB":
			g.MemoryMiB, err = m.Val.Int(fieldPath, 1, MaxGPUMemoryMiB)
		case "computePercent":
			n, err = m.Val.Int(fieldPath, 1, 100)
			g.ComputePercent = int(n)
		case "migProfile":
			hasProfile = m.Val.Kind != sj.Null
			if hasProfile {
				g.MigProfile, err = m.Val.Str(fieldPath, migProfileSpec)
			}
		case "migStart":
			hasStart = m.Val.Kind != sj.Null
			if hasStart {
				n, err = m.Val.Int(fieldPath, 0, MigStartSlots-1)
				g.MigStart = int(n)
			}
		default:
			err = sj.Unknown(path, m.Key)
		}
		return err
	}, gpuFields...)
	if err != nil {
		return g, err
	}
	if hasProfile != hasStart {
		return g, sj.Errorf(path, "migProfile and migStart go together (both or neither)")
	}
	g.IsMIG = hasProfile
	if g.IsMIG && g.ComputePercent != 100 {
		return g, sj.Errorf(path, "computePercent of a MIG instance must be 100 (MIG isolates compute in hardware)")
	}
	return g, nil
}

func decodeGang(v *sj.Value, path string) (*Gang, error) {
	g := &Gang{}
	err := v.Fields(path, func(m sj.Member, fieldPath string) (err error) {
		switch m.Key {
		case "name":
			g.Name, err = m.Val.Str(fieldPath, gangNameSpec)
		case "size":
			g.Size, err = m.Val.Int(fieldPath, 1, MaxGangSize)
		default:
			err = sj.Unknown(path, m.Key)
		}
		return err
	}, "name", "size")
	if err != nil {
		return nil, err
	}
	return g, nil
}

// checkIndexes: the same UUID has the same index everywhere in the document.
func checkIndexes(a *Assignment) error {
	type first struct {
		index     int
		container string
	}
	indexOf := map[string]first{}
	for _, name := range a.Order {
		for _, g := range a.Containers[name].GPUs {
			f, ok := indexOf[g.UUID]
			if !ok {
				indexOf[g.UUID] = first{g.Index, name}
				continue
			}
			if f.index != g.Index {
				return sj.Errorf("$", "container '%s': GPU %s has index %d, but index %d in container '%s'",
					name, g.UUID, g.Index, f.index, f.container)
			}
		}
	}
	return nil
}
