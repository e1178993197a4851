// Package statefile holds what the plugin's readers of the agent's state files (the node
// inventory, the node ledger) share: a size-bounded regular file, decoded strictly, for this
// node, fresh (updatedAt), and of a generation that never goes back (docs/contracts.md).
package statefile

import (
	"fmt"
	"os"
	"sync"
	"time"
)

// Header is what every state file carries besides its payload.
type Header struct {
	Node       string
	Generation int64
	UpdatedAt  time.Time
}

// Format describes one kind of state file.
type Format[T any] struct {
	What     string // names the file in errors ("node inventory")
	MaxBytes int64
	Decode   func([]byte) (T, error)
	Header   func(T) Header
}

// Load reads and decodes file and checks it is node's and not more than maxAge away from now.
func (f Format[T]) Load(file, node string, maxAge time.Duration, now time.Time) (T, error) {
	var zero T
	info, err := os.Stat(file)
	if err != nil {
		return zero, fmt.Errorf("%s: %w", f.What, err)
	}
	if !info.Mode().IsRegular() || info.Size() > f.MaxBytes {
		return zero, fmt.Errorf("%s %s: not a regular file of at most %d bytes", f.What, file, f.MaxBytes)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return zero, fmt.Errorf("%s: %w", f.What, err)
	}
	doc, err := f.Decode(data)
	if err != nil {
		return zero, fmt.Errorf("%s %s: %w", f.What, file, err)
	}
	h := f.Header(doc)
	if h.Node != node {
		return zero, fmt.Errorf("%s %s is for node %q, this is %q", f.What, file, h.Node, node)
	}
	if age := now.Sub(h.UpdatedAt); age > maxAge || age < -maxAge {
		return zero, fmt.Errorf("%s %s is stale: updatedAt %s is %s from now (bound %s); is the node agent running?",
			f.What, file, h.UpdatedAt.Format(time.RFC3339), age.Round(time.Second), maxAge)
	}
	return doc, nil
}

// Source loads the file for each decision and refuses one older than a file it has already used
// (a generation that went backwards: a restored or half-rolled-back agent state).
type Source[T any] struct {
	Format Format[T]
	Path   string
	Node   string
	MaxAge time.Duration
	Now    func() time.Time

	mu             sync.Mutex
	lastGeneration int64
}

// Current returns the file as it is now, or why it cannot be used.
func (s *Source[T]) Current() (T, error) {
	doc, err := s.Format.Load(s.Path, s.Node, s.MaxAge, s.Now())
	if err != nil {
		return doc, err
	}
	generation := s.Format.Header(doc).Generation
	s.mu.Lock()
	defer s.mu.Unlock()
	if generation < s.lastGeneration {
		var zero T
		return zero, fmt.Errorf("%s %s: generation %d is older than %d, already used",
			s.Format.What, s.Path, generation, s.lastGeneration)
	}
	s.lastGeneration = generation
	return doc, nil
}
