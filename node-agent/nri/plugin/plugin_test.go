package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"

	"neuronetes.io/node-agent/nri/assignment"
	"neuronetes.io/node-agent/nri/inject"
	"neuronetes.io/node-agent/nri/internal/nodetest"
	"neuronetes.io/node-agent/nri/records"
)

// runtime is NRI's own runtime side (pkg/adaptation, what containerd and CRI-O embed) with the
// plugin connected to it over a real socket through the official stub, so the test exercises the
// registration, the ttrpc round trip and NRI's merging of the adjustment into the container.
type runtime struct {
	nri  *adaptation.Adaptation
	stub stub.Stub
}

func startRuntime(t *testing.T, host inject.Host) *runtime {
	t.Helper()
	dir := t.TempDir()
	socket := filepath.Join(dir, "nri.sock")
	noSync := func(context.Context, adaptation.SyncCB) error { return nil }
	noUpdate := func(context.Context, []*adaptation.ContainerUpdate) ([]*adaptation.ContainerUpdate, error) {
		return nil, nil
	}
	nri, err := adaptation.New("test-runtime", "v0.0.0", noSync, noUpdate,
		adaptation.WithPluginPath(filepath.Join(dir, "plugins")),
		adaptation.WithPluginConfigPath(filepath.Join(dir, "conf.d")),
		adaptation.WithSocketPath(socket))
	nodetest.Must(t, err)
	nodetest.Must(t, nri.Start())
	t.Cleanup(nri.Stop)

	p := &Plugin{Host: host, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Records: records.In(host.StateDir)}
	s, err := stub.New(p, stub.WithPluginName("neuronetes"), stub.WithPluginIdx("10"), stub.WithSocketPath(socket))
	nodetest.Must(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); s.Stop() })
	nodetest.Must(t, s.Start(ctx))
	return &runtime{nri: nri, stub: s}
}

// create sends a CreateContainer through the runtime; the plugin is connected once its
// adjustment shows up (registration and sync finish asynchronously after Start).
func (r *runtime) create(t *testing.T, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, error) {
	t.Helper()
	nodetest.Must(t, r.nri.RunPodSandbox(context.Background(), &api.RunPodSandboxRequest{Pod: pod}))
	deadline := time.Now().Add(10 * time.Second)
	for {
		rpl, err := r.nri.CreateContainer(context.Background(), &api.CreateContainerRequest{Pod: pod, Container: ctr})
		if err != nil || len(rpl.GetAdjust().GetEnv()) > 0 {
			return rpl.GetAdjust(), err
		}
		if time.Now().After(deadline) {
			t.Fatal("the plugin never adjusted a container")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func sandbox(annotation string) *api.PodSandbox {
	return &api.PodSandbox{
		Id: "sandbox-1", Name: "trainer-0", Namespace: "team-a", Uid: nodetest.PodUID,
		Annotations: map[string]string{assignment.Annotation: annotation},
	}
}

func assignmentFor(node string, containers map[string][]string) string {
	entries := map[string]any{}
	for name, uuids := range containers {
		var gpus []any
		for _, u := range uuids {
			index := int(u[len(u)-1] - '0')
			gpus = append(gpus, map[string]any{"uuid": u, "index": index, "memoryMiB": 81920, "computePercent": 100})
		}
		entries[name] = map[string]any{"gpus": gpus, "priority": 0, "qos": "Guaranteed"}
	}
	raw, _ := json.Marshal(map[string]any{"version": 1, "node": node, "podUID": nodetest.PodUID, "containers": entries})
	return string(raw)
}

func TestThroughNRIAdaptation(t *testing.T) {
	h := nodetest.New(t)
	h.Now = time.Now() // the plugin reads the inventory on the real clock here
	h.WriteInventory(nodetest.InventoryDoc(nodetest.Node, h.Now, h.ShimDir))
	region := h.Region(nodetest.PodUID, "trainer")
	pod := sandbox(assignmentFor(nodetest.Node, map[string][]string{"trainer": {nodetest.UUID1}}))
	h.Bind(pod.Uid, pod.Namespace, pod.Name, pod.Annotations[assignment.Annotation])
	rt := startRuntime(t, h.Host())

	const cgroup = "kubepods-besteffort-pod0b6f3c8e_4c1d_4f57_9a1e_2f0c4a1b9d77.slice:cri-containerd:ctr-1"
	ctr := &api.Container{
		Id: "ctr-1", PodSandboxId: pod.Id, Name: "trainer",
		// the final env: image ENV (a CUDA image's NVIDIA_VISIBLE_DEVICES=all) and the tenant's
		Env:   []string{"PATH=/usr/bin", "NVIDIA_VISIBLE_DEVICES=all", "LD_PRELOAD=/tmp/x.so", "CUDA_VISIBLE_DEVICES=0"},
		Linux: &api.LinuxContainer{CgroupsPath: cgroup},
	}
	adjust, err := rt.create(t, pod, ctr)
	if err != nil {
		t.Fatalf("refused: %v", err)
	}
	var devices []string
	for _, d := range adjust.GetLinux().GetDevices() {
		devices = append(devices, d.GetPath())
	}
	want := []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia1"}
	if !slices.Equal(devices, want) {
		t.Fatalf("devices %v, want %v", devices, want)
	}
	rules := adjust.GetLinux().GetResources().GetDevices()
	if len(rules) != len(want) || !rules[3].Allow || rules[3].GetMajor().GetValue() != 195 || rules[3].GetMinor().GetValue() != 1 {
		t.Fatalf("cgroup rules %v", rules)
	}
	env := map[string]string{}
	for _, kv := range adjust.GetEnv() {
		env[kv.Key] = kv.Value
	}
	if env["NVIDIA_VISIBLE_DEVICES"] != "void" || env["CUDA_VISIBLE_DEVICES"] != nodetest.UUID1 {
		t.Fatalf("env %v", env)
	}
	if v, ok := env["LD_PRELOAD"]; !ok || v != "" { // overridden with an inert empty value
		t.Fatalf("LD_PRELOAD not removed: %v", env)
	}
	mounts := map[string]*api.Mount{}
	for _, m := range adjust.GetMounts() {
		mounts[m.Destination] = m
	}
	if m := mounts[inject.ShimStatePath]; m == nil || m.Source != filepath.Join(region, "state") || !slices.Contains(m.Options, "rw") {
		t.Fatalf("state mount %v", m)
	}
	// the agent's control file and the directory: read-only, never rw
	for dest, source := range map[string]string{inject.ShimControlPath: filepath.Join(region, "control"), inject.ShimRegionDir: region} {
		if m := mounts[dest]; m == nil || m.Source != source || !slices.Contains(m.Options, "ro") || slices.Contains(m.Options, "rw") {
			t.Fatalf("mount %s: %v", dest, m)
		}
	}
	if m := mounts[inject.ShimPreloadFile]; m == nil || !slices.Contains(m.Options, "ro") {
		t.Fatalf("preload mount %v", m)
	}
	if hooks := adjust.GetHooks().GetCreateContainer(); len(hooks) != 1 {
		t.Fatalf("hooks %v", hooks)
	}
	// the agent learns where the container's processes are
	dir := records.In(h.StateDir)
	rec, err := dir.Read(nodetest.PodUID, "trainer")
	if err != nil || rec.ContainerID != "ctr-1" || rec.CgroupsPath != cgroup || rec.RegionDir != region ||
		rec.Namespace != "team-a" || rec.Pod != "trainer-0" || rec.Version != records.SchemaVersion {
		t.Fatalf("container record %+v (%v)", rec, err)
	}

	// StartContainer: the final spec as the runtime built it. Applied correctly -> starts.
	applied := startedContainer(ctr, adjust, false)
	if err := rt.nri.StartContainer(context.Background(), &api.StartContainerRequest{Pod: pod, Container: applied}); err != nil {
		t.Fatalf("correctly adjusted container refused at start: %v", err)
	}
	// A runtime that appended our env instead of replacing the image's (containerd issue
	// 13432) leaves NVIDIA_VISIBLE_DEVICES=all first in the env: the start is refused.
	buggy := startedContainer(ctr, adjust, true)
	err = rt.nri.StartContainer(context.Background(), &api.StartContainerRequest{Pod: pod, Container: buggy})
	if err == nil || !strings.Contains(err.Error(), "refusing to start") {
		t.Fatalf("start not refused: %v", err)
	}

	// stopping the container removes its record; a stop of an older container of the same name
	// (created again by the kubelet) leaves the new one's record alone
	stop := func(id string) {
		t.Helper()
		c := &api.Container{Id: id, PodSandboxId: pod.Id, Name: "trainer", Linux: &api.LinuxContainer{}}
		if _, err := rt.nri.StopContainer(context.Background(), &api.StopContainerRequest{Pod: pod, Container: c}); err != nil {
			t.Fatalf("stop: %v", err)
		}
	}
	stop("ctr-0")
	if _, err := dir.Read(nodetest.PodUID, "trainer"); err != nil {
		t.Fatalf("an old container's stop removed the record: %v", err)
	}
	stop("ctr-1")
	if _, err := dir.Read(nodetest.PodUID, "trainer"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("record not removed at stop: %v", err)
	}
	// created again, then removed with its sandbox (no stop seen): the record goes too
	if _, err := rt.create(t, pod, ctr); err != nil {
		t.Fatalf("created again: %v", err)
	}
	if _, err := dir.Read(nodetest.PodUID, "trainer"); err != nil {
		t.Fatalf("no record after the second creation: %v", err)
	}
	nodetest.Must(t, rt.nri.RemovePodSandbox(context.Background(), &api.RemovePodSandboxRequest{Pod: pod}))
	if _, err := dir.Read(nodetest.PodUID, "trainer"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("record not removed with the sandbox: %v", err)
	}

	// a container whose assignment names another node is refused by the runtime
	wrong := sandbox(assignmentFor("gpu-node-2", map[string][]string{"trainer": {nodetest.UUID1}}))
	wrong.Id = "sandbox-2"
	_, err = rt.create(t, wrong, &api.Container{Id: "ctr-2", PodSandboxId: wrong.Id, Name: "trainer", Linux: &api.LinuxContainer{}})
	if err == nil || !strings.Contains(err.Error(), `is for node "gpu-node-2"`) {
		t.Fatalf("not refused: %v", err)
	}
}

// startedContainer is ctr as a runtime hands it to StartContainer after applying adjust to its
// spec; appendEnv simulates a runtime that appends env overrides instead of replacing them.
func startedContainer(ctr *api.Container, adjust *api.ContainerAdjustment, appendEnv bool) *api.Container {
	started := &api.Container{Id: ctr.Id, PodSandboxId: ctr.PodSandboxId, Name: ctr.Name, Linux: &api.LinuxContainer{CgroupsPath: ctr.GetLinux().GetCgroupsPath()}}
	override := map[string]string{}
	for _, kv := range adjust.GetEnv() {
		override[kv.Key] = kv.Value
	}
	for _, kv := range ctr.Env {
		key, _, _ := strings.Cut(kv, "=")
		if _, replaced := override[key]; !replaced || appendEnv {
			started.Env = append(started.Env, kv)
		}
	}
	for _, kv := range adjust.GetEnv() {
		started.Env = append(started.Env, kv.Key+"="+kv.Value)
	}
	started.Linux.Devices = adjust.GetLinux().GetDevices()
	started.Mounts = adjust.GetMounts()
	return started
}

// TestAllowsAllDevicesReadsTheCgroupRulesInOrder: a privileged container's "allow a *:* rwm" is
// every device; the usual "deny all, then allow some" is not, nor is an allow-all denied after.
func TestAllowsAllDevicesReadsTheCgroupRulesInOrder(t *testing.T) {
	major := &api.OptionalInt64{Value: 195}
	cases := []struct {
		name  string
		rules []*api.LinuxDeviceCgroup
		want  bool
	}{
		{"privileged", []*api.LinuxDeviceCgroup{{Allow: true, Access: "rwm"}}, true},
		{"privileged, type a", []*api.LinuxDeviceCgroup{{Allow: true, Type: "a", Access: "rwm"}}, true},
		{"default", []*api.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}, {Allow: true, Type: "c", Major: major, Access: "rw"}}, false},
		{"allow all then deny one", []*api.LinuxDeviceCgroup{{Allow: true, Access: "rwm"}, {Allow: false, Type: "c", Major: major, Access: "rwm"}}, false},
		{"none", nil, false},
	}
	for _, c := range cases {
		if got := allowsAllDevices(c.rules); got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
}
