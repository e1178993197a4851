package records

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// fixture is shared with the agent's reader (tests/unit/test_agent_containers.py): what this
// writer produces is what the agent decodes.
var fixture = filepath.Join("..", "..", "..", "tests", "fixtures", "container-record.json")

const (
	uid = "0b6f3c8e-4c1d-4f57-9a1e-2f0c4a1b9d77"
	cid = "5f2a9c0d7e1b4a3c8d6e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e"
)

func sample() Record {
	return Record{
		PodUID: uid, Namespace: "team-a", Pod: "trainer-0", Container: "trainer", ContainerID: cid,
		CgroupsPath: "kubepods-burstable-pod0b6f3c8e_4c1d_4f57_9a1e_2f0c4a1b9d77.slice:cri-containerd:" + cid,
		RegionDir:   "/run/neuronetes/containers/" + uid + "/trainer",
		WrittenAt:   time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC),
	}
}

func TestWriteProducesTheSharedFixture(t *testing.T) {
	d := In(t.TempDir())
	if err := d.Write(sample()); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(d.Path, uid+".trainer.json")
	got, want := readJSON(t, path), readJSON(t, fixture)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("record %v\nfixture %v", got, want)
	}
	for p, mode := range map[string]os.FileMode{path: 0o600, d.Path: 0o700 | os.ModeDir} {
		if info, err := os.Stat(p); err != nil || info.Mode() != mode {
			t.Fatalf("%s: mode %v (%v), want %v", p, info.Mode(), err, mode)
		}
	}
	entries, _ := os.ReadDir(d.Path)
	if len(entries) != 1 {
		t.Fatalf("temporary files left: %v", entries)
	}
}

func readJSON(t *testing.T, path string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

func TestRewriteReplacesAndRemoveOnlyTakesTheSameContainer(t *testing.T) {
	d := In(t.TempDir())
	old := sample()
	if err := d.Write(old); err != nil {
		t.Fatal(err)
	}
	again := sample()
	again.ContainerID = "0123456789ab" // the kubelet created the container again
	again.CgroupsPath = "/kubepods/burstable/pod" + uid + "/0123456789ab"
	if err := d.Write(again); err != nil {
		t.Fatal(err)
	}
	// the old container's late removal leaves the new record
	if err := d.Remove(uid, "trainer", cid); err != nil {
		t.Fatal(err)
	}
	if r, err := d.Read(uid, "trainer"); err != nil || r.ContainerID != "0123456789ab" {
		t.Fatalf("record %+v (%v)", r, err)
	}
	if err := d.Remove(uid, "trainer", "0123456789ab"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Read(uid, "trainer"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("not removed: %v", err)
	}
	if err := d.Remove(uid, "trainer", "0123456789ab"); err != nil {
		t.Fatalf("removing twice: %v", err)
	}
}

func TestRemovePodTakesEveryContainerOfThePod(t *testing.T) {
	d := In(t.TempDir())
	other := "6f1c2d3e-0000-4000-8000-00000000beef"
	a, b, c := sample(), sample(), sample()
	b.Container = "sidecar"
	c.PodUID = other
	for _, r := range []Record{a, b, c} {
		if err := d.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.RemovePod(uid); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(d.Path)
	if len(entries) != 1 || !strings.HasPrefix(entries[0].Name(), other+".") {
		t.Fatalf("left %v", entries)
	}
}

func TestUnsafeNamesAndMissingCgroupAreRefused(t *testing.T) {
	d := In(t.TempDir())
	for _, c := range []struct {
		change func(*Record)
		says   string
	}{
		{func(r *Record) { r.Container = "../../etc" }, "is not a DNS label"},
		{func(r *Record) { r.Container = "a.b" }, "is not a DNS label"},
		{func(r *Record) { r.PodUID = "../x" }, "is not a Kubernetes UID"},
		{func(r *Record) { r.CgroupsPath = "" }, "no container ID or cgroup path"},
		{func(r *Record) { r.ContainerID = "" }, "no container ID or cgroup path"},
	} {
		r := sample()
		c.change(&r)
		if err := d.Write(r); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Fatalf("%+v: %v", r, err)
		}
	}
	if entries, _ := os.ReadDir(d.Path); len(entries) != 0 {
		t.Fatalf("written anyway: %v", entries)
	}
}
