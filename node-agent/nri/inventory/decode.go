package inventory

// The strict decoder of the inventory file (schema: docs/contracts.md, "The node inventory file").
// It checks every field of the schema by hand, in document order and with msgspec's wording, like
// the assignment decoder (each object through strictjson's Fields).

import (
	"fmt"
	"path"

	"neuronetes.io/node-agent/nri/internal/ident"
	sj "neuronetes.io/node-agent/nri/internal/strictjson"
)

var (
	migUUIDPattern  = sj.NewPattern(`^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	gpuDevPattern   = sj.NewPattern(`^/dev/nvidia(0|[1-9][0-9]{0,2})$`)
	capDevPattern   = sj.NewPattern(`^/dev/nvidia-caps/nvidia-cap[1-9][0-9]{0,6}$`)
	envEntryPattern = sj.NewPattern(`^[A-Za-z_][A-Za-z0-9_]*=[^\x00]*$`)
	absPathSpec     = sj.StrSpec{MinLen: 1, MaxLen: 4096}
)

// Decode parses and validates an inventory document.
func Decode(data []byte) (*Inventory, error) {
	if len(data) > MaxBytes {
		return nil, fmt.Errorf("%d bytes, more than the %d allowed", len(data), MaxBytes)
	}
	root, err := sj.Parse(data)
	if err != nil {
		return nil, err
	}
	inv := &Inventory{}
	err = root.Fields("$", func(m sj.Member, p string) (err error) {
		switch m.Key {
		case "version":
			inv.Version, err = m.Val.Int(p, SchemaVersion, SchemaVersion)
		case "node":
			inv.Node, err = m.Val.Str(p, ident.ObjectName)
		case "generation":
			inv.Generation, err = m.Val.Int(p, 1, 1<<53)
		case "updatedAt":
			inv.UpdatedAt, err = m.Val.Timestamp(p)
		case "controlDevices":
			inv.ControlDevices, err = controlDevices(m.Val, p)
		case "gpus":
			inv.GPUs, err = gpus(m.Val, p)
		case "shim":
			err = shim(m.Val, p, inv)
		case "driver":
			err = driver(m.Val, p, inv)
		default:
			err = sj.Unknown("$", m.Key)
		}
		return err
	}, "version", "node", "generation", "updatedAt", "controlDevices", "gpus", "shim", "driver")
	if err != nil {
		return nil, err
	}
	return inv, nil
}

func absPath(v *sj.Value, p string) (string, error) {
	s, err := v.Str(p, absPathSpec)
	if err != nil {
		return "", err
	}
	if !path.IsAbs(s) || path.Clean(s) != s {
		return "", sj.Errorf(p, "Expected a clean absolute path")
	}
	return s, nil
}

func device(v *sj.Value, p string, pattern *sj.Pattern) (Device, error) {
	var d Device
	err := v.Fields(p, func(m sj.Member, fp string) (err error) {
		switch m.Key {
		case "path":
			d.Path, err = m.Val.Str(fp, sj.StrSpec{MaxLen: 64, Pattern: pattern})
		case "major":
			d.Major, err = m.Val.Int(fp, 1, 4095) // Linux majors are 12 bits; 0 is unnamed devices
		case "minor":
			d.Minor, err = m.Val.Int(fp, 0, 1<<20-1) // and minors 20 bits
		default:
			err = sj.Unknown(p, m.Key)
		}
		return err
	}, "path", "major", "minor")
	return d, err
}

var controlPathPattern = sj.NewPattern(`^/dev/(nvidiactl|nvidia-uvm|nvidia-uvm-tools)$`)

func controlDevices(v *sj.Value, p string) ([]Device, error) {
	items, err := v.Items(p, len(ControlDevicePaths), len(ControlDevicePaths))
	if err != nil {
		return nil, err
	}
	byPath := map[string]Device{}
	for i, item := range items {
		d, err := device(item, sj.Index(p, i), controlPathPattern)
		if err != nil {
			return nil, err
		}
		if _, dup := byPath[d.Path]; dup {
			return nil, sj.Errorf(p, "device %s is listed twice", d.Path)
		}
		byPath[d.Path] = d
	}
	ordered := make([]Device, 0, len(ControlDevicePaths))
	for _, want := range ControlDevicePaths {
		ordered = append(ordered, byPath[want])
	}
	return ordered, nil
}

func gpus(v *sj.Value, p string) ([]GPU, error) {
	items, err := v.Items(p, 0, 256)
	if err != nil {
		return nil, err
	}
	out := make([]GPU, 0, len(items))
	seen := map[string]bool{}
	for i, item := range items {
		g, err := gpu(item, sj.Index(p, i))
		if err != nil {
			return nil, err
		}
		for _, key := range []string{g.UUID, fmt.Sprintf("index %d", g.Index), g.Device.Path} {
			if seen[key] {
				return nil, sj.Errorf(sj.Index(p, i), "%s is listed twice", key)
			}
			seen[key] = true
		}
		out = append(out, g)
	}
	return out, nil
}

func gpu(v *sj.Value, p string) (GPU, error) {
	var g GPU
	err := v.Fields(p, func(m sj.Member, fp string) (err error) {
		var n int64
		switch m.Key {
		case "uuid":
			g.UUID, err = m.Val.Str(fp, sj.StrSpec{Pattern: ident.GPUUUID})
		case "index":
			n, err = m.Val.Int(fp, 0, 255)
			g.Index = int(n)
		case "device":
			g.Device, err = device(m.Val, fp, gpuDevPattern)
		case "migInstances":
			g.MIG, err = migInstances(m.Val, fp)
		default:
			err = sj.Unknown(p, m.Key)
		}
		return err
	}, "uuid", "index", "device", "migInstances")
	return g, err
}

func migInstances(v *sj.Value, p string) ([]MIGInstance, error) {
	items, err := v.Items(p, 0, 8)
	if err != nil {
		return nil, err
	}
	out := make([]MIGInstance, 0, len(items))
	seen := map[string]bool{}
	for i, item := range items {
		ip := sj.Index(p, i)
		mi, err := migInstance(item, ip)
		if err != nil {
			return nil, err
		}
		slot := fmt.Sprintf("%s at %d", mi.Profile, mi.Start)
		for _, key := range []string{mi.UUID, slot} {
			if seen[key] {
				return nil, sj.Errorf(ip, "%s is listed twice", key)
			}
			seen[key] = true
		}
		out = append(out, mi)
	}
	return out, nil
}

func migInstance(v *sj.Value, p string) (MIGInstance, error) {
	var mi MIGInstance
	err := v.Fields(p, func(m sj.Member, fp string) (err error) {
		var n int64
		switch m.Key {
		case "uuid":
			mi.UUID, err = m.Val.Str(fp, sj.StrSpec{Pattern: migUUIDPattern})
		case "profile":
			mi.Profile, err = m.Val.Str(fp, sj.StrSpec{MaxLen: 32, Pattern: ident.MIGProfile})
		case "start":
			n, err = m.Val.Int(fp, 0, 7)
			mi.Start = int(n)
		case "caps":
			var items []*sj.Value
			items, err = m.Val.Items(fp, 2, 2) // the GPU instance's and the compute instance's access node
			for i := 0; err == nil && i < len(items); i++ {
				var d Device
				d, err = device(items[i], sj.Index(fp, i), capDevPattern)
				mi.Caps = append(mi.Caps, d)
			}
		default:
			err = sj.Unknown(p, m.Key)
		}
		return err
	}, "uuid", "profile", "start", "caps")
	return mi, err
}

func shim(v *sj.Value, p string, inv *Inventory) error {
	return v.Fields(p, func(m sj.Member, fp string) (err error) {
		switch m.Key {
		case "library":
			inv.ShimLibrary, err = absPath(m.Val, fp)
		case "preloadFile":
			inv.ShimPreloadFile, err = absPath(m.Val, fp)
		default:
			err = sj.Unknown(p, m.Key)
		}
		return err
	}, "library", "preloadFile")
}

var capabilitiesPattern = sj.NewPattern(`^(compute|utility|video|graphics|display|compat32)(,(compute|utility|video|graphics|display|compat32))*$`)

func driver(v *sj.Value, p string, inv *Inventory) error {
	return v.Fields(p, func(m sj.Member, fp string) (err error) {
		switch m.Key {
		case "capabilities":
			inv.DriverCapabilities, err = m.Val.Str(fp, sj.StrSpec{MaxLen: 128, Pattern: capabilitiesPattern})
		case "mounts":
			inv.DriverMounts, err = mounts(m.Val, fp)
		case "hooks":
			inv.DriverHooks, err = hooks(m.Val, fp)
		default:
			err = sj.Unknown(p, m.Key)
		}
		return err
	}, "capabilities", "mounts", "hooks")
}

func mounts(v *sj.Value, p string) ([]Mount, error) {
	items, err := v.Items(p, 0, 1024)
	if err != nil {
		return nil, err
	}
	out := make([]Mount, 0, len(items))
	seen := map[string]bool{}
	for i, item := range items {
		ip := sj.Index(p, i)
		var mt Mount
		err := item.Fields(ip, func(m sj.Member, fp string) (err error) {
			switch m.Key {
			case "hostPath":
				mt.HostPath, err = absPath(m.Val, fp)
			case "containerPath":
				mt.ContainerPath, err = absPath(m.Val, fp)
			default:
				err = sj.Unknown(ip, m.Key)
			}
			return err
		}, "hostPath", "containerPath")
		if err != nil {
			return nil, err
		}
		if seen[mt.ContainerPath] {
			return nil, sj.Errorf(ip, "containerPath %s is listed twice", mt.ContainerPath)
		}
		seen[mt.ContainerPath] = true
		out = append(out, mt)
	}
	return out, nil
}

func hooks(v *sj.Value, p string) ([]Hook, error) {
	items, err := v.Items(p, 0, 16)
	if err != nil {
		return nil, err
	}
	out := make([]Hook, 0, len(items))
	for i, item := range items {
		ip := sj.Index(p, i)
		var h Hook
		err := item.Fields(ip, func(m sj.Member, fp string) (err error) {
			switch m.Key {
			case "path":
				h.Path, err = absPath(m.Val, fp)
			case "args":
				h.Args, err = stringList(m.Val, fp, sj.StrSpec{MaxLen: 4096})
			case "env":
				h.Env, err = stringList(m.Val, fp, sj.StrSpec{MaxLen: 4096, Pattern: envEntryPattern})
			default:
				err = sj.Unknown(ip, m.Key)
			}
			return err
		}, "path", "args", "env")
		if err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	return out, nil
}

func stringList(v *sj.Value, p string, spec sj.StrSpec) ([]string, error) {
	items, err := v.Items(p, 0, 256)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(items))
	for i, item := range items {
		s, err := item.Str(sj.Index(p, i), spec)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}
