package inject

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"neuronetes.io/node-agent/nri/assignment"
)

func gpu(uuid string, index, memoryMiB, compute int) map[string]any {
	return map[string]any{"uuid": uuid, "index": index, "memoryMiB": memoryMiB, "computePercent": compute}
}

func migGPU(uuid string, index int, profile string, start int) map[string]any {
	g := gpu(uuid, index, 4864, 100)
	g["migProfile"], g["migStart"] = profile, start
	return g
}

func entry(gpus ...map[string]any) map[string]any {
	list := make([]any, len(gpus))
	for i, g := range gpus {
		list[i] = g
	}
	return map[string]any{"gpus": list, "priority": 1000, "qos": "Guaranteed"}
}

// annotated is a pod of this node carrying an assignment for containers.
func annotated(containers map[string]any) Pod {
	doc := map[string]any{"version": 1, "node": testNode, "podUID": podUID, "containers": containers}
	raw, _ := json.Marshal(doc)
	return Pod{UID: podUID, Namespace: "team-a", Name: "trainer-0", Annotations: map[string]string{assignment.Annotation: string(raw)}}
}

func decide(t *testing.T, h *testHost, pod Pod, ctr Container) *Plan {
	t.Helper()
	plan, err := Decide(pod, ctr, h.host())
	if err != nil {
		t.Fatalf("refused: %v", err)
	}
	return plan
}

func refused(t *testing.T, h *testHost, pod Pod, ctr Container, fragment string) {
	t.Helper()
	plan, err := Decide(pod, ctr, h.host())
	var refusal *Refusal
	if !errors.As(err, &refusal) {
		t.Fatalf("not refused (err %v): %+v", err, plan)
	}
	if !strings.Contains(err.Error(), fragment) {
		t.Fatalf("refusal %q does not say %q", err, fragment)
	}
}

func devicePaths(p *Plan) []string {
	out := make([]string, len(p.Devices))
	for i, d := range p.Devices {
		out[i] = d.Path
	}
	return out
}

func env(p *Plan) map[string]string {
	out := map[string]string{}
	for _, e := range p.SetEnv {
		out[e.Key] = e.Value
	}
	return out
}

var controlPaths = []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}

func TestWholeGPUs(t *testing.T) {
	h := newTestHost(t)
	region := h.region(podUID, "trainer")
	pod := annotated(map[string]any{"trainer": entry(gpu(uuid1, 1, 81920, 100), gpu(uuid0, 0, 81920, 100))})
	plan := decide(t, h, pod, Container{Name: "trainer"})

	want := append(append([]string{}, controlPaths...), "/dev/nvidia1", "/dev/nvidia0")
	if got := devicePaths(plan); !reflect.DeepEqual(got, want) || !plan.GPUs {
		t.Fatalf("devices %v, want %v", got, want)
	}
	if d := plan.Devices[4]; d.Major != 195 || d.Minor != 0 {
		t.Fatalf("nvidia0 is %d:%d", d.Major, d.Minor)
	}
	wantEnv := map[string]string{
		"NVIDIA_VISIBLE_DEVICES":     "void",
		"NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
		"CUDA_VISIBLE_DEVICES":       uuid1 + "," + uuid0, // the assignment's order
	}
	if got := env(plan); !reflect.DeepEqual(got, wantEnv) {
		t.Fatalf("env %v", got)
	}
	mounts := map[string]Mount{}
	for _, m := range plan.Mounts {
		mounts[m.Destination] = m
	}
	checks := []struct {
		dest, source, mode string
	}{
		{ShimLibraryPath, filepath.Join(h.shimDir, "libneuronetes-cuda.so"), "ro"},
		{ShimPreloadFile, filepath.Join(h.shimDir, "ld.so.preload"), "ro"},
		{"/run/neuronetes", filepath.Dir(region), "ro"},
		{ShimRegionPath, region, "rw"},
		{"/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15", "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15", "ro"},
	}
	for _, c := range checks {
		m, ok := mounts[c.dest]
		if !ok || m.Source != c.source || !containsString(m.Options, c.mode) {
			t.Fatalf("mount %s: %+v", c.dest, m)
		}
	}
	if len(plan.Mounts) != len(checks) || len(plan.Hooks) != 1 || plan.Hooks[0].Path != "/usr/bin/nvidia-cdi-hook" {
		t.Fatalf("mounts %+v hooks %+v", plan.Mounts, plan.Hooks)
	}
}

func TestSharedSlicesOfOneGPU(t *testing.T) {
	h := newTestHost(t)
	pod := annotated(map[string]any{
		"infer": entry(gpu(uuid2, 2, 10240, 30)),
		"embed": entry(gpu(uuid2, 2, 4096, 20)),
	})
	for _, name := range []string{"infer", "embed"} {
		h.region(podUID, name)
		plan := decide(t, h, pod, Container{Name: name})
		want := append(append([]string{}, controlPaths...), "/dev/nvidia2")
		if got := devicePaths(plan); !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: devices %v", name, got)
		}
		if env(plan)["CUDA_VISIBLE_DEVICES"] != uuid2 {
			t.Fatalf("%s: env %v", name, env(plan))
		}
	}
}

func TestMIGInstanceGetsParentAndCapabilityNodes(t *testing.T) {
	h := newTestHost(t)
	h.region(podUID, "app")
	pod := annotated(map[string]any{"app": entry(migGPU(uuid3, 3, "1g.10gb", 6))})
	plan := decide(t, h, pod, Container{Name: "app"})
	want := append(append([]string{}, controlPaths...),
		"/dev/nvidia3", "/dev/nvidia-caps/nvidia-cap66", "/dev/nvidia-caps/nvidia-cap67")
	if got := devicePaths(plan); !reflect.DeepEqual(got, want) {
		t.Fatalf("devices %v, want %v", got, want)
	}
	if c := plan.Devices[4]; c.Major != capMajor || c.Minor != 66 {
		t.Fatalf("cap node %+v", c)
	}
	if env(plan)["CUDA_VISIBLE_DEVICES"] != migSmall {
		t.Fatalf("env %v", env(plan))
	}
	// the other instance of the same GPU is not reachable from this container
	for _, p := range devicePaths(plan) {
		if strings.HasSuffix(p, "cap30") || strings.HasSuffix(p, "cap31") {
			t.Fatalf("foreign MIG instance injected: %v", p)
		}
	}
}

func TestInitSidecarAndAppContainersEachGetTheirOwnEntry(t *testing.T) {
	h := newTestHost(t)
	pod := annotated(map[string]any{
		"fetch":   entry(gpu(uuid0, 0, 81920, 100), gpu(uuid1, 1, 81920, 100)), // init, runs alone
		"proxy":   entry(gpu(uuid0, 0, 81920, 100)),                             // sidecar
		"trainer": entry(gpu(uuid1, 1, 81920, 100), gpu(uuid2, 2, 81920, 100)), // app
	})
	want := map[string][]string{
		"fetch":   {"/dev/nvidia0", "/dev/nvidia1"},
		"proxy":   {"/dev/nvidia0"},
		"trainer": {"/dev/nvidia1", "/dev/nvidia2"},
	}
	for name, gpus := range want {
		h.region(podUID, name)
		plan := decide(t, h, pod, Container{Name: name})
		if got := devicePaths(plan)[len(controlPaths):]; !reflect.DeepEqual(got, gpus) {
			t.Fatalf("%s: devices %v, want %v", name, got, gpus)
		}
	}
	// a container the assignment does not list (a log shipper) gets no GPU at all, even when
	// something else put a GPU device or device env into its spec
	plan := decide(t, h, pod, Container{
		Name:    "logs",
		Env:     []string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all", "CUDA_VISIBLE_DEVICES=0"},
		Devices: []string{"/dev/nvidia0", "/dev/nvidiactl", "/dev/fuse"},
	})
	if plan.GPUs || len(plan.Devices) != 0 || len(plan.Mounts) != 0 {
		t.Fatalf("unlisted container gets GPU things: %+v", plan)
	}
	if !reflect.DeepEqual(env(plan), map[string]string{"NVIDIA_VISIBLE_DEVICES": "void"}) {
		t.Fatalf("env %v", env(plan))
	}
	if !reflect.DeepEqual(plan.RemoveEnv, []string{"CUDA_VISIBLE_DEVICES"}) {
		t.Fatalf("remove env %v", plan.RemoveEnv)
	}
	if !reflect.DeepEqual(plan.RemoveDevices, []string{"/dev/nvidia0", "/dev/nvidiactl"}) {
		t.Fatalf("remove devices %v", plan.RemoveDevices)
	}
}

func TestPodWithoutAssignmentGetsNoGPU(t *testing.T) {
	h := newTestHost(t)
	plan := decide(t, h, Pod{UID: podUID, Namespace: "web", Name: "nginx"}, Container{Name: "nginx", Env: []string{"LD_PRELOAD=/x.so"}})
	if plan.GPUs || len(plan.Devices) != 0 || !reflect.DeepEqual(plan.RemoveEnv, []string{"LD_PRELOAD"}) {
		t.Fatalf("%+v", plan)
	}
}

func TestMalformedAssignmentIsRefusedForEveryContainerOfThePod(t *testing.T) {
	h := newTestHost(t)
	pod := annotated(map[string]any{"trainer": entry(gpu(uuid0, 0, 81920, 100))})
	for _, bad := range []struct{ value, says string }{
		{"", "not a versioned assignment document"},
		{`{"version": 2}`, "schema version 2 is not supported"},
		{strings.Replace(pod.Annotations[assignment.Annotation], `"memoryMiB":81920`, `"memoryMiB":"81920"`, 1), "Expected `int`, got `str`"},
		{strings.Replace(pod.Annotations[assignment.Annotation], `"qos"`, `"exclusive":true,"qos"`, 1), "unknown field `exclusive`"},
	} {
		broken := annotated(nil)
		broken.Annotations[assignment.Annotation] = bad.value
		refused(t, h, broken, Container{Name: "trainer"}, bad.says)
		refused(t, h, broken, Container{Name: "sidecar-not-listed"}, bad.says)
	}
}

func TestCopiedAnnotationFromAnotherPodIsRefused(t *testing.T) {
	h := newTestHost(t)
	h.region(podUID, "trainer")
	h.region(otherUID, "trainer")
	copied := annotated(map[string]any{"trainer": entry(gpu(uuid0, 0, 81920, 100))})
	copied.UID = otherUID // the annotation names podUID, this pod is another one
	refused(t, h, copied, Container{Name: "trainer"}, "a copied annotation")
	refused(t, h, copied, Container{Name: "unlisted"}, "a copied annotation")
}

func TestWrongNodeIsRefused(t *testing.T) {
	h := newTestHost(t)
	h.region(podUID, "trainer")
	pod := annotated(map[string]any{"trainer": entry(gpu(uuid0, 0, 81920, 100))})
	pod.Annotations[assignment.Annotation] = strings.Replace(pod.Annotations[assignment.Annotation], testNode, "gpu-node-2", 1)
	refused(t, h, pod, Container{Name: "trainer"}, `is for node "gpu-node-2"`)
}

func TestUnknownGPUOrInstanceIsRefused(t *testing.T) {
	h := newTestHost(t)
	h.region(podUID, "trainer")
	unknown := "GPU-5e6c1b1e-0a1b-4c2d-8e3f-0000000000ff"
	for _, c := range []struct {
		gpu  map[string]any
		says string
	}{
		{gpu(unknown, 4, 81920, 100), "not in the node inventory"},
		{gpu(uuid0, 1, 81920, 100), "has index 0 on this node, the assignment says 1"},
		{migGPU(uuid3, 3, "1g.10gb", 5), "no MIG instance 1g.10gb at slot 5"},
		{migGPU(uuid0, 0, "1g.10gb", 0), "no MIG instance"},
		{gpu(uuid3, 3, 81920, 100), "is in MIG mode"},
	} {
		refused(t, h, annotated(map[string]any{"trainer": entry(c.gpu)}), Container{Name: "trainer"}, c.says)
	}
}

func TestTenantDeviceEnvIsStripped(t *testing.T) {
	h := newTestHost(t)
	h.region(podUID, "trainer")
	pod := annotated(map[string]any{"trainer": entry(gpu(uuid0, 0, 81920, 100))})
	plan := decide(t, h, pod, Container{Name: "trainer", Env: []string{
		"PATH=/usr/bin", "NVIDIA_VISIBLE_DEVICES=all", "CUDA_VISIBLE_DEVICES=0,1,2,3", "LD_PRELOAD=/tmp/evil.so",
		"LD_AUDIT=/tmp/a.so", "NVIDIA_DRIVER_CAPABILITIES=all", "NVIDIA_MIG_CONFIG_DEVICES=all",
		"CUDA_DEVICE_ORDER=FASTEST_FIRST", "NEURONETES_STANDALONE=1", "CUDA_HOME=/usr/local/cuda", "LD_LIBRARY_PATH=/opt",
	}})
	// keys the plugin sets are replaced; the other forbidden ones are removed; the rest stays
	wantRemoved := []string{"LD_PRELOAD", "LD_AUDIT", "NVIDIA_MIG_CONFIG_DEVICES", "CUDA_DEVICE_ORDER", "NEURONETES_STANDALONE"}
	if !reflect.DeepEqual(plan.RemoveEnv, wantRemoved) {
		t.Fatalf("removed %v, want %v", plan.RemoveEnv, wantRemoved)
	}
	got := env(plan)
	if got["NVIDIA_VISIBLE_DEVICES"] != "void" || got["CUDA_VISIBLE_DEVICES"] != uuid0 || got["NVIDIA_DRIVER_CAPABILITIES"] != "compute,utility" {
		t.Fatalf("env %v", got)
	}
}

func TestMissingShimOrRegionIsRefused(t *testing.T) {
	pod := annotated(map[string]any{"trainer": entry(gpu(uuid0, 0, 81920, 100))})
	ctr := Container{Name: "trainer"}

	h := newTestHost(t)
	refused(t, h, pod, ctr, "shim region") // the agent has not created it yet
	region := h.region(podUID, "trainer")
	must(t, os.Truncate(region, 100))
	refused(t, h, pod, ctr, "has 100 bytes, not 65536")

	h = newTestHost(t)
	h.region(podUID, "trainer")
	must(t, os.Remove(filepath.Join(h.shimDir, "libneuronetes-cuda.so")))
	refused(t, h, pod, ctr, "shim library")

	h = newTestHost(t)
	h.region(podUID, "trainer")
	must(t, os.WriteFile(filepath.Join(h.shimDir, "ld.so.preload"), []byte("/tmp/other.so\n"), 0o644))
	refused(t, h, pod, ctr, "must name exactly "+ShimLibraryPath)
}

func TestInventoryMissingStaleOrForeignIsRefused(t *testing.T) {
	pod := annotated(map[string]any{"trainer": entry(gpu(uuid0, 0, 81920, 100))})
	ctr := Container{Name: "trainer"}
	cases := []struct {
		name   string
		change func(h *testHost)
		says   string
	}{
		{"missing", func(h *testHost) { must(t, os.Remove(h.invPath)) }, "no such file"},
		{"stale", func(h *testHost) { h.now = h.now.Add(2 * time.Minute) }, "is stale"},
		{"foreign", func(h *testHost) { h.writeInventory(inventoryDoc("gpu-node-9", h.now, h.shimDir)) }, `is for node "gpu-node-9"`},
		{"undecodable", func(h *testHost) {
			doc := inventoryDoc(testNode, h.now, h.shimDir)
			doc["gpus"].([]any)[0].(map[string]any)["index"] = "0"
			h.writeInventory(doc)
		}, "Expected `int`, got `str` - at `$.gpus[0].index`"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newTestHost(t)
			h.region(podUID, "trainer")
			c.change(h)
			refused(t, h, pod, ctr, c.says)
		})
	}
}
