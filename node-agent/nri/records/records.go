// Package records writes the container records the node agent reads (docs/contracts.md, "The
// container records"): for each container that got GPUs, who it is and where its cgroup is, so the
// agent can find the container's processes (host-PID registration, dead-slot reclaim) without
// guessing. The runtime knows the cgroup path; the agent, which sees pods only through the API
// server, does not.
//
// One JSON file per container, <state>/containers.d/<pod-uid>.<container>.json, written
// atomically (temporary file, fsync, rename) with mode 0600 in a 0700 directory, and removed when
// the container stops or is removed, or when its pod sandbox is removed.
package records

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"neuronetes.io/node-agent/nri/internal/ident"
)

// Contract constants.
const (
	SchemaVersion = 1
	// DirName is the records' directory under the agent's state directory.
	DirName = "containers.d"
	// MaxBytes bounds one record (the agent refuses larger files).
	MaxBytes = 16 * 1024
)

var (
	// Kubernetes container names are DNS labels: no '.', so "<uid>.<name>.json" is unambiguous.
	containerPattern = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
)

// Record is one container's record; the JSON names are the contract's.
type Record struct {
	Version     int       `json:"version"`
	PodUID      string    `json:"podUID"`
	Namespace   string    `json:"namespace"`
	Pod         string    `json:"pod"`
	Container   string    `json:"container"`
	ContainerID string    `json:"containerID"`
	CgroupsPath string    `json:"cgroupsPath"` // the OCI spec's linux.cgroupsPath, as the runtime gave it
	RegionDir   string    `json:"regionDir"`   // host directory of the container's shim region
	WrittenAt   time.Time `json:"writtenAt"`
}

// Dir is the records' directory.
type Dir struct {
	Path string
}

// In returns the records' directory of a state directory.
func In(stateDir string) Dir { return Dir{Path: filepath.Join(stateDir, DirName)} }

func (d Dir) file(podUID, container string) (string, error) {
	if !ident.PodUID.MatchString(podUID) {
		return "", fmt.Errorf("pod UID %q is not a Kubernetes UID", podUID)
	}
	if !containerPattern.MatchString(container) {
		return "", fmt.Errorf("container name %q is not a DNS label", container)
	}
	return filepath.Join(d.Path, podUID+"."+container+".json"), nil
}

// Write stores r atomically: a reader sees the previous record or this one, never a mix.
func (d Dir) Write(r Record) error {
	r.Version = SchemaVersion
	if r.ContainerID == "" || r.CgroupsPath == "" {
		return errors.New("container record: the runtime gave no container ID or cgroup path")
	}
	target, err := d.file(r.PodUID, r.Container)
	if err != nil {
		return fmt.Errorf("container record: %w", err)
	}
	data, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("container record: %w", err)
	}
	if len(data) > MaxBytes {
		return fmt.Errorf("container record: %d bytes, more than %d", len(data), MaxBytes)
	}
	if err := os.MkdirAll(d.Path, 0o700); err != nil {
		return fmt.Errorf("container record: %w", err)
	}
	tmp := filepath.Join(d.Path, fmt.Sprintf(".%s.%d.tmp", filepath.Base(target), os.Getpid()))
	if err := writeSynced(tmp, data); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("container record: %w", err)
	}
	if err := os.Rename(tmp, target); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("container record: %w", err)
	}
	return syncDir(d.Path)
}

func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if err := f.Chmod(0o600); err != nil { // the umask does not decide a contract's mode
		_ = f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

func syncDir(path string) error {
	dir, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("container record: %w", err)
	}
	defer dir.Close()
	if err := dir.Sync(); err != nil {
		return fmt.Errorf("container record: %w", err)
	}
	return nil
}

// Read returns the record of the pod's container (os.ErrNotExist when there is none).
func (d Dir) Read(podUID, container string) (*Record, error) {
	target, err := d.file(podUID, container)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(target)
	if err != nil {
		return nil, err
	}
	var r Record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("container record %s: %w", target, err)
	}
	return &r, nil
}

// Remove deletes the record of the pod's container, but only while it is this container's: a
// container the kubelet created again under the same name has replaced it, and the old one's
// removal (garbage collection comes late) must not delete the new one's record.
func (d Dir) Remove(podUID, container, containerID string) error {
	r, err := d.Read(podUID, container)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if r.ContainerID != containerID {
		return nil
	}
	target, _ := d.file(podUID, container)
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// RemovePod deletes every record of the pod (its sandbox is gone).
func (d Dir) RemovePod(podUID string) error {
	if !ident.PodUID.MatchString(podUID) {
		return nil // no record was ever written for it
	}
	entries, err := os.ReadDir(d.Path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var first error
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), podUID+".") && strings.HasSuffix(e.Name(), ".json") {
			if err := os.Remove(filepath.Join(d.Path, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) && first == nil {
				first = err
			}
		}
	}
	return first
}
