package inject

import (
	"fmt"
	"strings"
)

// Verify checks a container about to start against its plan: the runtime must have applied the
// adjustment. Some runtimes drop env overrides of keys the container already has (containerd
// issue 13432: the image's NVIDIA_VISIBLE_DEVICES=all would survive), and NRI does not carry a
// plugin's device removals to the runtime, so this is the gate that keeps such a container from
// starting. mounts are the destinations of the container's mounts.
func Verify(plan *Plan, ctr Container, mounts []string) error {
	want := map[string]string{}
	for _, key := range plan.ClearEnv {
		want[key] = ""
	}
	for _, e := range plan.SetEnv {
		want[e.Key] = e.Value
	}
	seen := map[string]bool{}
	for _, kv := range ctr.Env {
		key, value, _ := strings.Cut(kv, "=")
		if !IsForbiddenEnv(key) {
			continue
		}
		expected, planned := want[key]
		switch {
		case !planned:
			return fmt.Errorf("env %s is set but was not planned", key)
		case seen[key]:
			return fmt.Errorf("env %s is set twice (the runtime did not replace the tenant's value)", key)
		case value != expected:
			return fmt.Errorf("env %s=%q, the plan says %q", key, value, expected)
		}
		seen[key] = true
	}
	for _, e := range plan.SetEnv {
		if !seen[e.Key] {
			return fmt.Errorf("env %s is missing", e.Key)
		}
	}
	if foreign := foreignDevices(ctr.Devices, plan.Devices); len(foreign) > 0 && !ctr.AllDevices {
		return fmt.Errorf("GPU device %s is in the container but not assigned to it", foreign[0])
	}
	for _, d := range plan.Devices {
		if !containsString(ctr.Devices, d.Path) {
			return fmt.Errorf("device %s is missing", d.Path)
		}
	}
	for _, m := range plan.Mounts {
		if !containsString(mounts, m.Destination) {
			return fmt.Errorf("mount %s is missing", m.Destination)
		}
	}
	return nil
}
