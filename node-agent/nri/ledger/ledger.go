// Package ledger reads the node ledger the node agent writes (docs/contracts.md, "The node
// ledger file") and cross-checks a pod's assignment against it (docs/node-injection.md, "The
// node ledger cross-check").
//
// The annotation the plugin reads comes from the pod sandbox, so on its own it only proves that
// somebody put it on the pod. The ledger is the agent's view of the API server: every pod bound
// to this node with the assignment it carried when the agent first saw it bound (later changes
// are ignored), in that order. The plugin gives GPUs only to a pod that is in the ledger with
// exactly the annotation it carries, and only when no pod recorded before it already holds the
// same MIG instance or, with the slices of every pod before it, more memory of the same GPU
// than the GPU has: a tampered, replayed or double-booked assignment cannot share a GPU with the
// pod that got it first.
package ledger

import (
	"fmt"
	"time"

	"neuronetes.io/node-agent/nri/assignment"
	"neuronetes.io/node-agent/nri/internal/statefile"
)

// Contract constants.
const (
	SchemaVersion = 1
	// MaxBytes bounds the file: a few thousand pods with their assignments.
	MaxBytes = 8 << 20
	// FileName is the file's name in the agent's state directory.
	FileName = "ledger.json"
	// DefaultMaxAge: the agent rewrites the file at least every 30 s; three missed rewrites make it stale.
	DefaultMaxAge = 90 * time.Second
	// MaxPods bounds the pods of one node.
	MaxPods = 4096
)

// GPU is one physical GPU of the node with the memory slices are counted against.
type GPU struct {
	UUID      string
	MemoryMiB int64
}

// Pod is one pod bound to the node, with the assignment the agent recorded for it.
type Pod struct {
	UID        string
	Namespace  string
	Name       string
	Annotation string // the neuronetes.io/assigned-gpus value, byte for byte
	Assignment *assignment.Assignment
}

// Ledger is a decoded ledger file.
type Ledger struct {
	Version    int64
	Node       string
	Generation int64
	UpdatedAt  time.Time
	GPUs       []GPU
	Pods       []Pod // in the order the agent recorded them
}

var format = statefile.Format[*Ledger]{
	What:     "node ledger",
	MaxBytes: MaxBytes,
	Decode:   Decode,
	Header: func(l *Ledger) statefile.Header {
		return statefile.Header{Node: l.Node, Generation: l.Generation, UpdatedAt: l.UpdatedAt}
	},
}

// Load reads and decodes the file at file and checks it is this node's and fresh.
func Load(file, node string, maxAge time.Duration, now time.Time) (*Ledger, error) {
	return format.Load(file, node, maxAge, now)
}

// Source loads the file for each decision and refuses one of a generation older than one it has
// already used.
type Source = statefile.Source[*Ledger]

// NewSource reads the file at path for node on the clock now.
func NewSource(path, node string, maxAge time.Duration, now func() time.Time) *Source {
	return &Source{Format: format, Path: path, Node: node, MaxAge: maxAge, Now: now}
}

// claim is what one pod holds on one GPU or MIG instance: the largest slice any of its
// containers got (a pod's containers share its grant, as the extender counts it).
type claim struct {
	uuid      string
	mig       bool
	migStart  int
	memoryMiB int64
}

func claims(a *assignment.Assignment) []claim {
	var out []claim
	index := map[[2]any]int{}
	for _, name := range a.Order {
		for _, g := range a.Containers[name].GPUs {
			key := [2]any{g.UUID, -1}
			if g.IsMIG {
				key[1] = g.MigStart
			}
			if i, seen := index[key]; seen {
				out[i].memoryMiB = max(out[i].memoryMiB, g.MemoryMiB)
				continue
			}
			index[key] = len(out)
			out = append(out, claim{uuid: g.UUID, mig: g.IsMIG, migStart: g.MigStart, memoryMiB: g.MemoryMiB})
		}
	}
	return out
}

// Admit checks the pod with UID uid, carrying annotation, against the ledger: it must be
// recorded with that very annotation, and what it claims must fit beside the pods recorded
// before it. The error says why not.
func (l *Ledger) Admit(uid, annotation string) error {
	at := -1
	for i := range l.Pods {
		if l.Pods[i].UID == uid {
			at = i
			break
		}
	}
	if at < 0 {
		return fmt.Errorf("pod %s is not in the node ledger (the API server does not show it bound to this node with an assignment)", uid)
	}
	pod := &l.Pods[at]
	if pod.Annotation != annotation {
		return fmt.Errorf("%s differs from the one the node ledger recorded when the pod was bound", assignment.Annotation)
	}
	for _, c := range claims(pod.Assignment) {
		if err := l.fits(c, at); err != nil {
			return err
		}
	}
	return nil
}

// fits checks one claim of the pod at position at against the pods recorded before it.
func (l *Ledger) fits(c claim, at int) error {
	total := int64(-1)
	for _, g := range l.GPUs {
		if g.UUID == c.uuid {
			total = g.MemoryMiB
		}
	}
	if total < 0 {
		return fmt.Errorf("GPU %s is not in the node ledger", c.uuid)
	}
	used := c.memoryMiB
	for _, earlier := range l.Pods[:at] {
		for _, e := range claims(earlier.Assignment) {
			if e.uuid != c.uuid || e.mig != c.mig {
				continue
			}
			if c.mig && e.migStart == c.migStart {
				return fmt.Errorf("MIG instance at slot %d of GPU %s is already held by pod %s/%s",
					c.migStart, c.uuid, earlier.Namespace, earlier.Name)
			}
			if !c.mig {
				if e.memoryMiB >= total {
					return fmt.Errorf("GPU %s is held whole by pod %s/%s", c.uuid, earlier.Namespace, earlier.Name)
				}
				used += e.memoryMiB
			}
		}
	}
	if !c.mig && used > total {
		return fmt.Errorf("GPU %s would hold %d MiB of slices with the pods recorded before this one, it has %d MiB",
			c.uuid, used, total)
	}
	return nil
}
