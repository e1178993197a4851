// Package plugin is the NRI plumbing of neuronetes-nri: it turns NRI's CreateContainer request
// into the decision's input (package inject) and the decision's Plan into an NRI container
// adjustment. Nothing here decides anything.
package plugin

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/containerd/nri/pkg/api"

	"neuronetes.io/node-agent/nri/inject"
	"neuronetes.io/node-agent/nri/inventory"
	"neuronetes.io/node-agent/nri/records"
)

// Plugin implements the stub's CreateContainer, StartContainer, StopContainer, RemoveContainer
// and RemovePodSandbox handlers.
type Plugin struct {
	Host inject.Host
	Log  *slog.Logger
	// Records is where each container with GPUs is recorded for the agent (its cgroup path).
	Records records.Dir
	// Forget, when set, is told the UID of each removed pod sandbox (the pod-spec cache).
	Forget func(podUID string)
}

// CreateContainer adjusts every container: GPUs for listed ones, none for the rest, and the
// tenant's device env stripped from all. An error refuses the container (the runtime fails
// CreateContainer; kubelet retries with back-off and reports the message in the pod's events).
func (p *Plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	plan, err := inject.Decide(podOf(pod), containerOf(ctr), p.Host)
	if err != nil {
		p.Log.Warn("container refused", "pod", pod.GetNamespace()+"/"+pod.GetName(), "container", ctr.GetName(), "error", err)
		return nil, nil, err
	}
	if plan.GPUs {
		if err := p.record(pod, ctr); err != nil {
			p.Log.Warn("container refused", "pod", pod.GetNamespace()+"/"+pod.GetName(), "container", ctr.GetName(), "error", err)
			return nil, nil, &inject.Refusal{Pod: pod.GetNamespace() + "/" + pod.GetName(), Container: ctr.GetName(), Reason: err.Error()}
		}
		p.Log.Info("GPUs injected", "pod", pod.GetNamespace()+"/"+pod.GetName(), "container", ctr.GetName(), "devices", len(plan.Devices))
	}
	return Adjustment(plan), nil, nil
}

// record tells the agent where the container's processes are: without it the agent cannot
// register their host PIDs, so a container whose record cannot be written is refused.
func (p *Plugin) record(pod *api.PodSandbox, ctr *api.Container) error {
	return p.Records.Write(records.Record{
		PodUID:      pod.GetUid(),
		Namespace:   pod.GetNamespace(),
		Pod:         pod.GetName(),
		Container:   ctr.GetName(),
		ContainerID: ctr.GetId(),
		CgroupsPath: ctr.GetLinux().GetCgroupsPath(),
		RegionDir:   filepath.Join(p.Host.StateDir, inject.ContainersDir, pod.GetUid(), ctr.GetName()),
		WrittenAt:   time.Now().UTC(),
	})
}

// StartContainer refuses to start a container whose final spec is not what CreateContainer
// planned (the runtime did not apply the adjustment); containerd fails the start before the
// task runs when a plugin returns an error here.
func (p *Plugin) StartContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	c := containerOf(ctr)
	plan, err := inject.Decide(podOf(pod), c, p.Host)
	if err == nil {
		var mounts []string
		for _, m := range ctr.GetMounts() {
			mounts = append(mounts, m.GetDestination())
		}
		err = inject.Verify(plan, c, mounts)
	}
	if err == nil && plan.GPUs {
		// again from the final spec: a plugin after this one may have moved the cgroup
		err = p.record(pod, ctr)
	}
	if err != nil {
		p.Log.Warn("container start refused", "pod", pod.GetNamespace()+"/"+pod.GetName(), "container", ctr.GetName(), "error", err)
		return fmt.Errorf("neuronetes: refusing to start container %q of pod %s/%s: %w", ctr.GetName(), pod.GetNamespace(), pod.GetName(), err)
	}
	return nil
}

// StopContainer removes the container's record: its processes are gone (the agent keeps
// reclaiming their region slots without it).
func (p *Plugin) StopContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) ([]*api.ContainerUpdate, error) {
	p.forgetContainer(pod, ctr)
	return nil, nil
}

// RemoveContainer removes the container's record, if StopContainer did not.
func (p *Plugin) RemoveContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	p.forgetContainer(pod, ctr)
	return nil
}

// forgetContainer never fails the runtime's call: a record left behind is removed by the agent
// once its pod is gone (docs/contracts.md).
func (p *Plugin) forgetContainer(pod *api.PodSandbox, ctr *api.Container) {
	if err := p.Records.Remove(pod.GetUid(), ctr.GetName(), ctr.GetId()); err != nil {
		p.Log.Warn("container record not removed", "pod", pod.GetNamespace()+"/"+pod.GetName(), "container", ctr.GetName(), "error", err)
	}
}

// RemovePodSandbox forgets what was cached about the pod and removes its records.
func (p *Plugin) RemovePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	if p.Forget != nil {
		p.Forget(pod.GetUid())
	}
	if err := p.Records.RemovePod(pod.GetUid()); err != nil {
		p.Log.Warn("container records not removed", "pod", pod.GetNamespace()+"/"+pod.GetName(), "error", err)
	}
	return nil
}

func podOf(pod *api.PodSandbox) inject.Pod {
	return inject.Pod{UID: pod.GetUid(), Namespace: pod.GetNamespace(), Name: pod.GetName(), Annotations: pod.GetAnnotations()}
}

func containerOf(ctr *api.Container) inject.Container {
	c := inject.Container{Name: ctr.GetName(), Env: ctr.GetEnv()}
	for _, d := range ctr.GetLinux().GetDevices() {
		c.Devices = append(c.Devices, d.GetPath())
	}
	c.AllDevices = allowsAllDevices(ctr.GetLinux().GetResources().GetDevices())
	return c
}

// allowsAllDevices: the device cgroup rules, applied in order, end allowing every device (a
// privileged container's single "allow a *:* rwm"). A deny after the last allow-all counts as
// not all (conservative: the foreign-device check then applies).
func allowsAllDevices(rules []*api.LinuxDeviceCgroup) bool {
	all := false
	for _, r := range rules {
		wildcard := (r.GetType() == "" || r.GetType() == "a") && r.GetMajor() == nil && r.GetMinor() == nil
		switch {
		case r.GetAllow() && wildcard:
			all = true
		case !r.GetAllow():
			all = false
		}
	}
	return all
}

// Adjustment is the NRI form of a plan: devices with their cgroup allow rules, bind mounts, env
// and createContainer hooks.
func Adjustment(plan *inject.Plan) *api.ContainerAdjustment {
	adjust := &api.ContainerAdjustment{}
	for _, key := range plan.ClearEnv {
		adjust.AddEnv(key, "")
	}
	for _, e := range plan.SetEnv {
		adjust.AddEnv(e.Key, e.Value)
	}
	for _, path := range plan.RemoveDevices {
		adjust.RemoveDevice(path)
	}
	for _, d := range plan.Devices {
		adjust.AddDevice(linuxDevice(d))
	}
	if len(plan.Devices) > 0 {
		rules := make([]*api.LinuxDeviceCgroup, 0, len(plan.Devices))
		for _, d := range plan.Devices {
			rules = append(rules, &api.LinuxDeviceCgroup{
				Allow: true, Type: "c", Major: api.Int64(d.Major), Minor: api.Int64(d.Minor), Access: "rw",
			})
		}
		if adjust.Linux == nil {
			adjust.Linux = &api.LinuxContainerAdjustment{}
		}
		adjust.Linux.Resources = &api.LinuxResources{Devices: rules}
	}
	for _, m := range plan.Mounts {
		adjust.AddMount(&api.Mount{Source: m.Source, Destination: m.Destination, Type: "bind", Options: m.Options})
	}
	if len(plan.Hooks) > 0 {
		hooks := &api.Hooks{}
		for _, h := range plan.Hooks {
			hooks.CreateContainer = append(hooks.CreateContainer, &api.Hook{Path: h.Path, Args: h.Args, Env: h.Env})
		}
		adjust.AddHooks(hooks)
	}
	return adjust
}

func linuxDevice(d inventory.Device) *api.LinuxDevice {
	return &api.LinuxDevice{
		Path: d.Path, Type: "c", Major: d.Major, Minor: d.Minor,
		// 0666 as nvidia-modprobe creates them on the host (any user in the container may use
		// the GPU it was given); which devices can be opened at all is the cgroup rule's job
		FileMode: api.FileMode(0o666),
	}
}

// String names the plugin in logs.
func (p *Plugin) String() string { return fmt.Sprintf("neuronetes-nri(node=%s)", p.Host.Node) }
