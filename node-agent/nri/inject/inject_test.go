package inject_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"neuronetes.io/node-agent/nri/assignment"
	. "neuronetes.io/node-agent/nri/inject"
	"neuronetes.io/node-agent/nri/internal/nodetest"
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
	doc := map[string]any{"version": 1, "node": nodetest.Node, "podUID": nodetest.PodUID, "containers": containers}
	raw, _ := json.Marshal(doc)
	return Pod{UID: nodetest.PodUID, Namespace: "team-a", Name: "trainer-0", Annotations: map[string]string{assignment.Annotation: string(raw)}}
}

// bound puts the pod into the node ledger with its annotation, as the agent does when the API
// server shows it bound here (the ledger cross-check has its own tests below).
func bound(h *nodetest.Host, pod Pod) {
	value, ok := pod.Annotations[assignment.Annotation]
	if !ok {
		return
	}
	if _, err := assignment.Decode([]byte(value)); err != nil {
		return // the agent does not record an assignment it cannot decode
	}
	for i, p := range h.LedgerPods {
		if p.(map[string]any)["uid"] == pod.UID {
			h.LedgerPods = append(h.LedgerPods[:i], h.LedgerPods[i+1:]...)
			break
		}
	}
	h.Bind(pod.UID, pod.Namespace, pod.Name, value)
}

func decide(t *testing.T, h *nodetest.Host, pod Pod, ctr Container) *Plan {
	t.Helper()
	bound(h, pod)
	plan, err := Decide(pod, ctr, h.Host())
	if err != nil {
		t.Fatalf("refused: %v", err)
	}
	return plan
}

func refused(t *testing.T, h *nodetest.Host, pod Pod, ctr Container, fragment string) {
	t.Helper()
	bound(h, pod)
	refusedAsIs(t, h, pod, ctr, fragment)
}

// refusedAsIs: refused with the node ledger as it is.
func refusedAsIs(t *testing.T, h *nodetest.Host, pod Pod, ctr Container, fragment string) {
	t.Helper()
	plan, err := Decide(pod, ctr, h.Host())
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
	h := nodetest.New(t)
	region := h.Region(nodetest.PodUID, "trainer")
	pod := annotated(map[string]any{"trainer": entry(gpu(nodetest.UUID1, 1, 81920, 100), gpu(nodetest.UUID0, 0, 81920, 100))})
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
		"CUDA_VISIBLE_DEVICES":       nodetest.UUID1 + "," + nodetest.UUID0, // the assignment's order
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
		{ShimLibraryPath, filepath.Join(h.ShimDir, "libneuronetes-cuda.so"), "ro"},
		{ShimPreloadFile, filepath.Join(h.ShimDir, "ld.so.preload"), "ro"},
		{"/run/neuronetes", region, "ro"},
		{ShimControlPath, filepath.Join(region, "control"), "ro"},
		{ShimStatePath, filepath.Join(region, "state"), "rw"},
		{"/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15", "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15", "ro"},
	}
	for _, c := range checks {
		m, ok := mounts[c.dest]
		if !ok || m.Source != c.source || !slices.Contains(m.Options, c.mode) {
			t.Fatalf("mount %s: %+v", c.dest, m)
		}
	}
	if len(plan.Mounts) != len(checks) || len(plan.Hooks) != 1 || plan.Hooks[0].Path != "/usr/bin/nvidia-cdi-hook" {
		t.Fatalf("mounts %+v hooks %+v", plan.Mounts, plan.Hooks)
	}
}

func TestSharedSlicesOfOneGPU(t *testing.T) {
	h := nodetest.New(t)
	pod := annotated(map[string]any{
		"infer": entry(gpu(nodetest.UUID2, 2, 10240, 30)),
		"embed": entry(gpu(nodetest.UUID2, 2, 4096, 20)),
	})
	for _, name := range []string{"infer", "embed"} {
		h.Region(nodetest.PodUID, name)
		plan := decide(t, h, pod, Container{Name: name})
		want := append(append([]string{}, controlPaths...), "/dev/nvidia2")
		if got := devicePaths(plan); !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: devices %v", name, got)
		}
		if env(plan)["CUDA_VISIBLE_DEVICES"] != nodetest.UUID2 {
			t.Fatalf("%s: env %v", name, env(plan))
		}
	}
}

func TestMIGInstanceGetsParentAndCapabilityNodes(t *testing.T) {
	h := nodetest.New(t)
	h.Region(nodetest.PodUID, "app")
	pod := annotated(map[string]any{"app": entry(migGPU(nodetest.UUID3, 3, "1g.10gb", 6))})
	plan := decide(t, h, pod, Container{Name: "app"})
	want := append(append([]string{}, controlPaths...),
		"/dev/nvidia3", "/dev/nvidia-caps/nvidia-cap66", "/dev/nvidia-caps/nvidia-cap67")
	if got := devicePaths(plan); !reflect.DeepEqual(got, want) {
		t.Fatalf("devices %v, want %v", got, want)
	}
	if c := plan.Devices[4]; c.Major != nodetest.CapMajor || c.Minor != 66 {
		t.Fatalf("cap node %+v", c)
	}
	if env(plan)["CUDA_VISIBLE_DEVICES"] != nodetest.MIGSmall {
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
	h := nodetest.New(t)
	pod := annotated(map[string]any{
		"fetch":   entry(gpu(nodetest.UUID0, 0, 81920, 100), gpu(nodetest.UUID1, 1, 81920, 100)), // init, runs alone
		"proxy":   entry(gpu(nodetest.UUID0, 0, 81920, 100)),                                     // sidecar
		"trainer": entry(gpu(nodetest.UUID1, 1, 81920, 100), gpu(nodetest.UUID2, 2, 81920, 100)), // app
	})
	want := map[string][]string{
		"fetch":   {"/dev/nvidia0", "/dev/nvidia1"},
		"proxy":   {"/dev/nvidia0"},
		"trainer": {"/dev/nvidia1", "/dev/nvidia2"},
	}
	for name, gpus := range want {
		h.Region(nodetest.PodUID, name)
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
	if !reflect.DeepEqual(plan.ClearEnv, []string{"CUDA_VISIBLE_DEVICES"}) {
		t.Fatalf("remove env %v", plan.ClearEnv)
	}
	if !reflect.DeepEqual(plan.RemoveDevices, []string{"/dev/nvidia0", "/dev/nvidiactl"}) {
		t.Fatalf("remove devices %v", plan.RemoveDevices)
	}
}

func TestPodWithoutAssignmentGetsNoGPU(t *testing.T) {
	h := nodetest.New(t)
	plan := decide(t, h, Pod{UID: nodetest.PodUID, Namespace: "web", Name: "nginx"}, Container{Name: "nginx", Env: []string{"LD_PRELOAD=/x.so"}})
	if plan.GPUs || len(plan.Devices) != 0 || !reflect.DeepEqual(plan.ClearEnv, []string{"LD_PRELOAD"}) {
		t.Fatalf("%+v", plan)
	}
}

func TestContainerAskingForGPUsWithoutAnEntryIsRefused(t *testing.T) {
	h := nodetest.New(t)
	host := h.Host()
	host.PodRequests = func(Pod) (map[string]bool, error) {
		return map[string]bool{"trainer": true, "fetch": true, "logs": false}, nil
	}
	bare := Pod{UID: nodetest.PodUID, Namespace: "team-a", Name: "trainer-0"}
	if _, err := Decide(bare, Container{Name: "trainer"}, host); err == nil ||
		!strings.Contains(err.Error(), "has no neuronetes.io/assigned-gpus annotation") {
		t.Fatalf("pod bound without an assignment: %v", err)
	}
	partial := annotated(map[string]any{"trainer": entry(gpu(nodetest.UUID0, 0, 81920, 100))})
	if _, err := Decide(partial, Container{Name: "fetch"}, host); err == nil ||
		!strings.Contains(err.Error(), "has no entry for it") {
		t.Fatalf("asking container without an entry: %v", err)
	}
	if plan, err := Decide(partial, Container{Name: "logs"}, host); err != nil || plan.GPUs {
		t.Fatalf("a container that asks for nothing: %v %+v", err, plan)
	}
	// the pod spec cannot be read: no refusal, and still no GPU
	host.PodRequests = func(Pod) (map[string]bool, error) { return nil, errors.New("API server down") }
	if plan, err := Decide(bare, Container{Name: "trainer"}, host); err != nil || plan.GPUs || len(plan.Devices) != 0 {
		t.Fatalf("unknown requests: %v %+v", err, plan)
	}
}

func TestMalformedAssignmentIsRefusedForEveryContainerOfThePod(t *testing.T) {
	h := nodetest.New(t)
	pod := annotated(map[string]any{"trainer": entry(gpu(nodetest.UUID0, 0, 81920, 100))})
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
	h := nodetest.New(t)
	h.Region(nodetest.PodUID, "trainer")
	h.Region(nodetest.OtherUID, "trainer")
	copied := annotated(map[string]any{"trainer": entry(gpu(nodetest.UUID0, 0, 81920, 100))})
	copied.UID = nodetest.OtherUID // the annotation names nodetest.PodUID, this pod is another one
	refused(t, h, copied, Container{Name: "trainer"}, "a copied annotation")
	refused(t, h, copied, Container{Name: "unlisted"}, "a copied annotation")
}

func TestWrongNodeIsRefused(t *testing.T) {
	h := nodetest.New(t)
	h.Region(nodetest.PodUID, "trainer")
	pod := annotated(map[string]any{"trainer": entry(gpu(nodetest.UUID0, 0, 81920, 100))})
	pod.Annotations[assignment.Annotation] = strings.Replace(pod.Annotations[assignment.Annotation], nodetest.Node, "gpu-node-2", 1)
	refused(t, h, pod, Container{Name: "trainer"}, `is for node "gpu-node-2"`)
}

func TestUnknownGPUOrInstanceIsRefused(t *testing.T) {
	h := nodetest.New(t)
	h.Region(nodetest.PodUID, "trainer")
	unknown := "GPU-5e6c1b1e-0a1b-4c2d-8e3f-0000000000ff"
	for _, c := range []struct {
		gpu  map[string]any
		says string
	}{
		{gpu(unknown, 4, 81920, 100), "not in the node inventory"},
		{gpu(nodetest.UUID0, 1, 81920, 100), "has index 0 on this node, the assignment says 1"},
		{migGPU(nodetest.UUID3, 3, "1g.10gb", 5), "no MIG instance 1g.10gb at slot 5"},
		{migGPU(nodetest.UUID0, 0, "1g.10gb", 0), "no MIG instance"},
		{gpu(nodetest.UUID3, 3, 81920, 100), "is in MIG mode"},
	} {
		refused(t, h, annotated(map[string]any{"trainer": entry(c.gpu)}), Container{Name: "trainer"}, c.says)
	}
}

func TestTenantDeviceEnvIsStripped(t *testing.T) {
	h := nodetest.New(t)
	h.Region(nodetest.PodUID, "trainer")
	pod := annotated(map[string]any{"trainer": entry(gpu(nodetest.UUID0, 0, 81920, 100))})
	plan := decide(t, h, pod, Container{Name: "trainer", Env: []string{
		"PATH=/usr/bin", "NVIDIA_VISIBLE_DEVICES=all", "CUDA_VISIBLE_DEVICES=0,1,2,3", "LD_PRELOAD=/tmp/evil.so",
		"LD_AUDIT=/tmp/a.so", "NVIDIA_DRIVER_CAPABILITIES=all", "NVIDIA_MIG_CONFIG_DEVICES=all",
		"CUDA_DEVICE_ORDER=FASTEST_FIRST", "NEURONETES_WORKSTATION=1", "CUDA_HOME=/usr/local/cuda", "LD_LIBRARY_PATH=/opt",
	}})
	// keys the plugin sets are replaced; the other forbidden ones are removed; the rest stays
	wantRemoved := []string{"LD_PRELOAD", "LD_AUDIT", "NVIDIA_MIG_CONFIG_DEVICES", "CUDA_DEVICE_ORDER", "NEURONETES_WORKSTATION"}
	if !reflect.DeepEqual(plan.ClearEnv, wantRemoved) {
		t.Fatalf("removed %v, want %v", plan.ClearEnv, wantRemoved)
	}
	got := env(plan)
	if got["NVIDIA_VISIBLE_DEVICES"] != "void" || got["CUDA_VISIBLE_DEVICES"] != nodetest.UUID0 || got["NVIDIA_DRIVER_CAPABILITIES"] != "compute,utility" {
		t.Fatalf("env %v", got)
	}
}

func TestMissingShimOrRegionIsRefused(t *testing.T) {
	pod := annotated(map[string]any{"trainer": entry(gpu(nodetest.UUID0, 0, 81920, 100))})
	ctr := Container{Name: "trainer"}

	h := nodetest.New(t)
	refused(t, h, pod, ctr, "shim region") // the agent has not created it yet
	region := h.Region(nodetest.PodUID, "trainer")
	nodetest.Must(t, os.Truncate(filepath.Join(region, "state"), 100))
	refused(t, h, pod, ctr, "state has 100 bytes, not 65536")
	region = h.Region(nodetest.PodUID, "trainer")
	nodetest.Must(t, os.Truncate(filepath.Join(region, "control"), 65536)) // a major-1 size
	refused(t, h, pod, ctr, "control has 65536 bytes, not 16384")
	region = h.Region(nodetest.PodUID, "trainer")
	nodetest.Must(t, os.Remove(filepath.Join(region, "state")))
	refused(t, h, pod, ctr, "shim region")
	// a directory holding only a major-1 region (one file) is no region
	nodetest.Must(t, os.Remove(filepath.Join(region, "control")))
	nodetest.Must(t, os.WriteFile(filepath.Join(region, "region"), make([]byte, 65536), 0o666))
	refused(t, h, pod, ctr, "shim region")

	h = nodetest.New(t)
	h.Region(nodetest.PodUID, "trainer")
	nodetest.Must(t, os.Remove(filepath.Join(h.ShimDir, "libneuronetes-cuda.so")))
	refused(t, h, pod, ctr, "shim library")

	h = nodetest.New(t)
	h.Region(nodetest.PodUID, "trainer")
	nodetest.Must(t, os.WriteFile(filepath.Join(h.ShimDir, "ld.so.preload"), []byte("/tmp/other.so\n"), 0o644))
	refused(t, h, pod, ctr, "must name exactly "+ShimLibraryPath)
}

func TestDriverMountCannotCoverTheShim(t *testing.T) {
	pod := annotated(map[string]any{"trainer": entry(gpu(nodetest.UUID0, 0, 81920, 100))})
	for _, dest := range []string{"/etc/ld.so.preload", "/run", "/run/neuronetes/state", "/run/neuronetes/control", "/usr/lib/neuronetes", "/dev/nvidia1"} {
		h := nodetest.New(t)
		h.Region(nodetest.PodUID, "trainer")
		doc := nodetest.InventoryDoc(nodetest.Node, h.Now, h.ShimDir)
		doc["driver"].(map[string]any)["mounts"] = []any{map[string]any{"hostPath": "/usr/lib/x.so", "containerPath": dest}}
		h.WriteInventory(doc)
		refused(t, h, pod, Container{Name: "trainer"}, "driver mount "+dest+" would cover")
	}
}

func TestInventoryMissingStaleOrForeignIsRefused(t *testing.T) {
	pod := annotated(map[string]any{"trainer": entry(gpu(nodetest.UUID0, 0, 81920, 100))})
	ctr := Container{Name: "trainer"}
	cases := []struct {
		name   string
		change func(h *nodetest.Host)
		says   string
	}{
		{"missing", func(h *nodetest.Host) { nodetest.Must(t, os.Remove(h.InvPath)) }, "no such file"},
		{"stale", func(h *nodetest.Host) { h.Now = h.Now.Add(2 * time.Minute) }, "is stale"},
		{"foreign", func(h *nodetest.Host) { h.WriteInventory(nodetest.InventoryDoc("gpu-node-9", h.Now, h.ShimDir)) }, `is for node "gpu-node-9"`},
		{"undecodable", func(h *nodetest.Host) {
			doc := nodetest.InventoryDoc(nodetest.Node, h.Now, h.ShimDir)
			doc["gpus"].([]any)[0].(map[string]any)["index"] = "0"
			h.WriteInventory(doc)
		}, "Expected `int`, got `str` - at `$.gpus[0].index`"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := nodetest.New(t)
			h.Region(nodetest.PodUID, "trainer")
			c.change(h)
			refused(t, h, pod, ctr, c.says)
		})
	}
}

func TestVerifyRefusesAContainerTheRuntimeDidNotAdjust(t *testing.T) {
	h := nodetest.New(t)
	h.Region(nodetest.PodUID, "trainer")
	pod := annotated(map[string]any{"trainer": entry(gpu(nodetest.UUID0, 0, 81920, 100))})
	created := Container{Name: "trainer", Env: []string{"PATH=/bin", "LD_PRELOAD=/tmp/x.so"}}
	plan := decide(t, h, pod, created)

	// the container as a runtime that applied the plan hands it to StartContainer
	good := Container{Name: "trainer", Env: []string{"PATH=/bin", "LD_PRELOAD="}}
	for _, e := range plan.SetEnv {
		good.Env = append(good.Env, e.Key+"="+e.Value)
	}
	good.Devices = devicePaths(plan)
	var mounts []string
	for _, m := range plan.Mounts {
		mounts = append(mounts, m.Destination)
	}
	startPlan := decide(t, h, pod, good)
	if err := Verify(startPlan, good, mounts); err != nil {
		t.Fatalf("applied plan refused: %v", err)
	}
	bad := []struct {
		change func(c *Container, mounts *[]string)
		says   string
	}{
		{func(c *Container, _ *[]string) { c.Env = append([]string{"NVIDIA_VISIBLE_DEVICES=all"}, c.Env...) }, "NVIDIA_VISIBLE_DEVICES=\"all\""},
		{func(c *Container, _ *[]string) { c.Env = append(c.Env, "NVIDIA_VISIBLE_DEVICES=void") }, "set twice"},
		{func(c *Container, _ *[]string) { c.Env = append(c.Env, "LD_AUDIT=/tmp/a.so") }, "LD_AUDIT"},
		{func(c *Container, _ *[]string) { c.Env = c.Env[:2] }, "is missing"},
		{func(c *Container, _ *[]string) { c.Devices = append(c.Devices, "/dev/nvidia1") }, "/dev/nvidia1 is in the container"},
		{func(c *Container, _ *[]string) { c.Devices = c.Devices[:3] }, "device /dev/nvidia0 is missing"},
		{func(_ *Container, m *[]string) { *m = (*m)[1:] }, "mount " + ShimLibraryPath + " is missing"},
	}
	for _, b := range bad {
		c := good
		c.Env = slices.Clone(good.Env)
		c.Devices = slices.Clone(good.Devices)
		m := slices.Clone(mounts)
		b.change(&c, &m)
		p, err := Decide(pod, c, h.Host())
		if err == nil {
			err = Verify(p, c, m)
		}
		if err == nil || !strings.Contains(err.Error(), b.says) {
			t.Errorf("want refusal saying %q, got %v", b.says, err)
		}
	}
}

// TestVerifyLetsAPrivilegedContainerKeepTheHostsDevices: a container allowed every device (the
// node agent's own, privileged) has the host's GPU nodes from the runtime; refusing its start would
// keep the agent from restarting while the plugin runs, and would narrow nothing.
func TestVerifyLetsAPrivilegedContainerKeepTheHostsDevices(t *testing.T) {
	h := nodetest.New(t)
	plain := Container{Name: "agent", Env: []string{"PATH=/bin"}, Devices: []string{"/dev/nvidia0", "/dev/nvidiactl"}}
	plan := decide(t, h, Pod{UID: nodetest.PodUID, Namespace: "kube-system", Name: "agent-x"}, plain)
	started := plain
	for _, e := range plan.SetEnv {
		started.Env = append(started.Env, e.Key+"="+e.Value)
	}
	for _, k := range plan.ClearEnv {
		started.Env = append(started.Env, k+"=")
	}
	if err := Verify(plan, started, nil); err == nil || !strings.Contains(err.Error(), "/dev/nvidia0 is in the container") {
		t.Fatalf("unprivileged: want the foreign device refused, got %v", err)
	}
	started.AllDevices = true
	if err := Verify(plan, started, nil); err != nil {
		t.Fatalf("privileged: want it started, got %v", err)
	}
}

// TestContractConstantsMatchPython: the paths and forbidden env names are neuronetes/contracts.py's
// (tests/fixtures/assignment-vectors.json pins them; tests/unit/test_assignment_vectors.py checks
// the Python side of the same file).
func TestContractConstantsMatchPython(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "..", "tests", "fixtures", "assignment-vectors.json"))
	nodetest.Must(t, err)
	var doc struct {
		Contract struct {
			ForbiddenEnvPrefixes []string `json:"forbiddenEnvPrefixes"`
			ForbiddenEnvNames    []string `json:"forbiddenEnvNames"`
			ShimLibraryPath      string   `json:"shimLibraryPath"`
			ShimPreloadFile      string   `json:"shimPreloadFile"`
			ShimControlPath      string   `json:"shimControlPath"`
			ShimStatePath        string   `json:"shimStatePath"`
		} `json:"contract"`
	}
	nodetest.Must(t, json.Unmarshal(raw, &doc))
	c := doc.Contract
	if !slices.Equal(c.ForbiddenEnvPrefixes, ForbiddenEnvPrefixes) || !slices.Equal(c.ForbiddenEnvNames, ForbiddenEnvNames) {
		t.Fatalf("forbidden env drifted: %+v", c)
	}
	if c.ShimLibraryPath != ShimLibraryPath || c.ShimPreloadFile != ShimPreloadFile ||
		c.ShimControlPath != ShimControlPath || c.ShimStatePath != ShimStatePath {
		t.Fatalf("shim paths drifted: %+v", c)
	}
}

// annotatedAs is another pod of this node, with its own UID, carrying an assignment.
func annotatedAs(uid, name string, containers map[string]any) Pod {
	doc := map[string]any{"version": 1, "node": nodetest.Node, "podUID": uid, "containers": containers}
	raw, _ := json.Marshal(doc)
	return Pod{UID: uid, Namespace: "team-b", Name: name, Annotations: map[string]string{assignment.Annotation: string(raw)}}
}

const thirdUID = "3c9d1e2f-1111-4222-8333-444455556666"

func TestPodMissingFromTheNodeLedgerIsRefused(t *testing.T) {
	h := nodetest.New(t)
	h.Region(nodetest.PodUID, "trainer")
	pod := annotated(map[string]any{"trainer": entry(gpu(nodetest.UUID0, 0, 81920, 100))})
	// bound without the extender (or not yet seen by the agent): not in the ledger
	refusedAsIs(t, h, pod, Container{Name: "trainer"}, "is not in the node ledger")
	// a container without an entry still starts (without GPUs): the ledger is about GPUs
	if plan, err := Decide(pod, Container{Name: "logs"}, h.Host()); err != nil || plan.GPUs {
		t.Fatalf("unlisted container: %v %+v", err, plan)
	}
}

func TestAnnotationChangedAfterBindIsRefused(t *testing.T) {
	h := nodetest.New(t)
	h.Region(nodetest.PodUID, "trainer")
	atBind := annotated(map[string]any{"trainer": entry(gpu(nodetest.UUID0, 0, 81920, 100))})
	h.Bind(atBind.UID, atBind.Namespace, atBind.Name, atBind.Annotations[assignment.Annotation])
	patched := annotated(map[string]any{"trainer": entry(gpu(nodetest.UUID1, 1, 81920, 100))})
	refusedAsIs(t, h, patched, Container{Name: "trainer"}, "differs from the one the node ledger recorded")
	if _, err := Decide(atBind, Container{Name: "trainer"}, h.Host()); err != nil {
		t.Fatalf("the recorded assignment is refused: %v", err)
	}
}

func TestGPUOfAnEarlierPodIsNotGivenAgain(t *testing.T) {
	h := nodetest.New(t)
	first := annotatedAs(nodetest.OtherUID, "first", map[string]any{
		"a": entry(gpu(nodetest.UUID0, 0, 81920, 100)),
		"b": entry(gpu(nodetest.UUID2, 2, 61440, 60)),
		"c": entry(migGPU(nodetest.UUID3, 3, "1g.10gb", 6)),
	})
	h.Bind(first.UID, first.Namespace, first.Name, first.Annotations[assignment.Annotation])
	for _, name := range []string{"a", "b", "c"} {
		h.Region(first.UID, name)
		if _, err := Decide(first, Container{Name: name}, h.Host()); err != nil {
			t.Fatalf("the first pod is refused: %v", err)
		}
	}
	h.Region(nodetest.PodUID, "trainer")
	for _, c := range []struct {
		gpu  map[string]any
		says string
	}{
		// a double-booked whole GPU, a slice beside a whole GPU, slices past the GPU's memory,
		// the same MIG instance twice
		{gpu(nodetest.UUID0, 0, 81920, 100), "is held whole by pod team-b/first"},
		{gpu(nodetest.UUID0, 0, 1024, 10), "is held whole by pod team-b/first"},
		{gpu(nodetest.UUID2, 2, 30720, 40), "would hold 92160 MiB of slices with the pods recorded before this one, it has 81920 MiB"},
		{migGPU(nodetest.UUID3, 3, "1g.10gb", 6), "MIG instance at slot 6 of GPU " + nodetest.UUID3 + " is already held by pod team-b/first"},
	} {
		h.LedgerPods = h.LedgerPods[:1]
		refused(t, h, annotated(map[string]any{"trainer": entry(c.gpu)}), Container{Name: "trainer"}, c.says)
	}
	// what fits beside it is given: another slice, another MIG instance, another GPU
	for _, g := range []map[string]any{
		gpu(nodetest.UUID2, 2, 20480, 40), migGPU(nodetest.UUID3, 3, "3g.40gb", 0), gpu(nodetest.UUID1, 1, 81920, 100),
	} {
		h.LedgerPods = h.LedgerPods[:1]
		decide(t, h, annotated(map[string]any{"trainer": entry(g)}), Container{Name: "trainer"})
	}
	// the pod recorded first keeps its GPUs even when a later one collides with it
	third := annotatedAs(thirdUID, "third", map[string]any{"x": entry(gpu(nodetest.UUID0, 0, 81920, 100))})
	h.Region(third.UID, "x")
	h.Bind(third.UID, third.Namespace, third.Name, third.Annotations[assignment.Annotation])
	refusedAsIs(t, h, third, Container{Name: "x"}, "is held whole by pod team-b/first")
	if _, err := Decide(first, Container{Name: "a"}, h.Host()); err != nil {
		t.Fatalf("the first pod lost its GPU to a later one: %v", err)
	}
}

func TestLedgerMissingStaleOrForeignIsRefused(t *testing.T) {
	h := nodetest.New(t)
	h.Region(nodetest.PodUID, "trainer")
	pod := annotated(map[string]any{"trainer": entry(gpu(nodetest.UUID0, 0, 81920, 100))})
	bound(h, pod)
	host := h.Host()
	if _, err := Decide(pod, Container{Name: "trainer"}, host); err != nil {
		t.Fatalf("refused: %v", err)
	}
	for _, c := range []struct {
		write func()
		says  string
	}{
		{func() { h.WriteLedger(nodetest.Node, h.Now.Add(-2*time.Minute)) }, "is stale"},
		{func() {
			saved := h.LedgerPods
			h.LedgerPods = nil // another node's ledger holds that node's pods
			h.WriteLedger("gpu-node-2", h.Now)
			h.LedgerPods = saved
		}, `is for node "gpu-node-2"`},
		{func() { nodetest.Must(t, os.Remove(h.LedgerPath)) }, "no such file"},
		{func() {
			doc := h.LedgerDoc(nodetest.Node, h.Now)
			doc["generation"] = 1 // older than the one this host already used
			h.WriteJSON(h.LedgerPath, doc)
		}, "generation 1 is older than"},
		{func() {
			doc := h.LedgerDoc(nodetest.Node, h.Now)
			doc["pods"].([]any)[0].(map[string]any)["since"] = "yesterday"
			h.WriteJSON(h.LedgerPath, doc)
		}, "unknown field `since`"},
	} {
		c.write()
		if _, err := Decide(pod, Container{Name: "trainer"}, host); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Fatalf("ledger case %q: %v", c.says, err)
		}
	}
	host.Ledger = nil
	if _, err := Decide(pod, Container{Name: "trainer"}, host); err == nil || !strings.Contains(err.Error(), "no node ledger") {
		t.Fatalf("no ledger configured: %v", err)
	}
}
