package ledger

// The strict decoder of the ledger file (schema: docs/contracts.md, "The node ledger file"),
// worded like msgspec as the inventory's and the assignment's decoders are.

import (
	"fmt"

	"neuronetes.io/node-agent/nri/assignment"
	"neuronetes.io/node-agent/nri/internal/ident"
	sj "neuronetes.io/node-agent/nri/internal/strictjson"
)

// Decode parses and validates a ledger document; every pod's assignment is decoded with the
// assignment's strict decoder and must name the ledger's node and the pod's UID.
func Decode(data []byte) (*Ledger, error) {
	if len(data) > MaxBytes {
		return nil, fmt.Errorf("%d bytes, more than the %d allowed", len(data), MaxBytes)
	}
	root, err := sj.Parse(data)
	if err != nil {
		return nil, err
	}
	l := &Ledger{}
	err = root.Fields("$", func(m sj.Member, p string) (err error) {
		switch m.Key {
		case "version":
			l.Version, err = m.Val.Int(p, SchemaVersion, SchemaVersion)
		case "node":
			l.Node, err = m.Val.Str(p, ident.ObjectName)
		case "generation":
			l.Generation, err = m.Val.Int(p, 1, 1<<53)
		case "updatedAt":
			l.UpdatedAt, err = m.Val.Timestamp(p)
		case "gpus":
			l.GPUs, err = gpus(m.Val, p)
		case "pods":
			l.Pods, err = pods(m.Val, p)
		default:
			err = sj.Unknown("$", m.Key)
		}
		return err
	}, "version", "node", "generation", "updatedAt", "gpus", "pods")
	if err != nil {
		return nil, err
	}
	for i, pod := range l.Pods {
		if pod.Assignment.Node != l.Node {
			return nil, sj.Errorf(sj.Index("$.pods", i), "the assignment is for node %q, the ledger for %q", pod.Assignment.Node, l.Node)
		}
	}
	return l, nil
}

func gpus(v *sj.Value, p string) ([]GPU, error) {
	items, err := v.Items(p, 0, 256)
	if err != nil {
		return nil, err
	}
	out := make([]GPU, 0, len(items))
	seen := map[string]bool{}
	for i, item := range items {
		ip := sj.Index(p, i)
		var g GPU
		err := item.Fields(ip, func(m sj.Member, fp string) (err error) {
			switch m.Key {
			case "uuid":
				g.UUID, err = m.Val.Str(fp, sj.StrSpec{Pattern: ident.GPUUUID})
			case "memoryMiB":
				g.MemoryMiB, err = m.Val.Int(fp, 1, assignment.MaxGPUMemoryMiB)
			default:
				err = sj.Unknown(ip, m.Key)
			}
			return err
		}, "uuid", "memoryMiB")
		if err != nil {
			return nil, err
		}
		if seen[g.UUID] {
			return nil, sj.Errorf(ip, "%s is listed twice", g.UUID)
		}
		seen[g.UUID] = true
		out = append(out, g)
	}
	return out, nil
}

func pods(v *sj.Value, p string) ([]Pod, error) {
	items, err := v.Items(p, 0, MaxPods)
	if err != nil {
		return nil, err
	}
	out := make([]Pod, 0, len(items))
	seen := map[string]bool{}
	for i, item := range items {
		ip := sj.Index(p, i)
		pod, err := podEntry(item, ip)
		if err != nil {
			return nil, err
		}
		if seen[pod.UID] {
			return nil, sj.Errorf(ip, "pod %s is listed twice", pod.UID)
		}
		seen[pod.UID] = true
		out = append(out, pod)
	}
	return out, nil
}

func podEntry(v *sj.Value, p string) (Pod, error) {
	var pod Pod
	err := v.Fields(p, func(m sj.Member, fp string) (err error) {
		switch m.Key {
		case "uid":
			pod.UID, err = m.Val.Str(fp, sj.StrSpec{Pattern: ident.PodUID})
		case "namespace":
			pod.Namespace, err = m.Val.Str(fp, sj.StrSpec{MinLen: 1, MaxLen: 63, Pattern: ident.DNSSubdomain})
		case "name":
			pod.Name, err = m.Val.Str(fp, ident.ObjectName)
		case "assignment":
			pod.Annotation, err = m.Val.Str(fp, sj.StrSpec{MinLen: 1, MaxLen: assignment.MaxBytes})
			if err == nil {
				pod.Assignment, err = assignment.Decode([]byte(pod.Annotation))
				if err != nil {
					err = sj.Errorf(fp, "%v", err)
				}
			}
		default:
			err = sj.Unknown(p, m.Key)
		}
		return err
	}, "uid", "namespace", "name", "assignment")
	if err != nil {
		return pod, err
	}
	if pod.Assignment.PodUID != "" && pod.Assignment.PodUID != pod.UID {
		return pod, sj.Errorf(p, "the assignment names pod UID %s, the entry %s", pod.Assignment.PodUID, pod.UID)
	}
	return pod, nil
}
