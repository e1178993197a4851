package ledger_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"neuronetes.io/node-agent/nri/internal/nodetest"
	"neuronetes.io/node-agent/nri/ledger"
)

func annotation(uid, node string, gpus ...map[string]any) string {
	list := make([]any, len(gpus))
	for i, g := range gpus {
		list[i] = g
	}
	raw, _ := json.Marshal(map[string]any{
		"version": 1, "node": node, "podUID": uid,
		"containers": map[string]any{"main": map[string]any{"gpus": list, "priority": 0, "qos": "Guaranteed"}},
	})
	return string(raw)
}

func slice(uuid string, index, memoryMiB int) map[string]any {
	return map[string]any{"uuid": uuid, "index": index, "memoryMiB": memoryMiB, "computePercent": 50}
}

func doc(pods ...map[string]any) map[string]any {
	list := make([]any, len(pods))
	for i, p := range pods {
		list[i] = p
	}
	return map[string]any{
		"version": 1, "node": nodetest.Node, "generation": 3, "updatedAt": "2026-11-23T12:00:00Z",
		"gpus": []any{map[string]any{"uuid": nodetest.UUID0, "memoryMiB": 81920}},
		"pods": list,
	}
}

func pod(uid, name, value string) map[string]any {
	return map[string]any{"uid": uid, "namespace": "ns", "name": name, "assignment": value}
}

func decode(t *testing.T, d map[string]any) (*ledger.Ledger, error) {
	t.Helper()
	raw, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return ledger.Decode(raw)
}

func TestDecodeKeepsOrderAndAnnotation(t *testing.T) {
	a := annotation(nodetest.PodUID, nodetest.Node, slice(nodetest.UUID0, 0, 1024))
	b := annotation(nodetest.OtherUID, nodetest.Node, slice(nodetest.UUID0, 0, 2048))
	l, err := decode(t, doc(pod(nodetest.PodUID, "a", a), pod(nodetest.OtherUID, "b", b)))
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Pods) != 2 || l.Pods[0].Annotation != a || l.Pods[1].Name != "b" || l.Generation != 3 ||
		!l.UpdatedAt.Equal(time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)) || l.GPUs[0].MemoryMiB != 81920 {
		t.Fatalf("%+v", l)
	}
	if err := l.Admit(nodetest.OtherUID, b); err != nil {
		t.Fatalf("slices that fit refused: %v", err)
	}
}

func TestDecodeRefusesWhatTheAgentNeverWrites(t *testing.T) {
	good := annotation(nodetest.PodUID, nodetest.Node, slice(nodetest.UUID0, 0, 1024))
	cases := []struct {
		name string
		doc  map[string]any
		says string
	}{
		{"unknown field", func() map[string]any { d := doc(); d["extra"] = 1; return d }(), "unknown field `extra`"},
		{"missing pods", func() map[string]any { d := doc(); delete(d, "pods"); return d }(), "missing required field `pods`"},
		{"version", func() map[string]any { d := doc(); d["version"] = 2; return d }(), "$.version"},
		{"pod listed twice", doc(pod(nodetest.PodUID, "a", good), pod(nodetest.PodUID, "a", good)), "is listed twice"},
		{"undecodable assignment", doc(pod(nodetest.PodUID, "a", `{"version":1}`)), "$.pods[0].assignment"},
		{"assignment of another pod", doc(pod(nodetest.OtherUID, "a", good)), "names pod UID " + nodetest.PodUID},
		{"assignment of another node", doc(pod(nodetest.PodUID, "a", annotation(nodetest.PodUID, "gpu-node-2", slice(nodetest.UUID0, 0, 1)))), `is for node "gpu-node-2"`},
		{"bad pod UID", doc(pod("not-a-uid", "a", good)), "$.pods[0].uid"},
		{"GPU memory 0", func() map[string]any {
			d := doc()
			d["gpus"] = []any{map[string]any{"uuid": nodetest.UUID0, "memoryMiB": 0}}
			return d
		}(), "$.gpus[0].memoryMiB"},
	}
	for _, c := range cases {
		if _, err := decode(t, c.doc); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Fatalf("%s: %v (want %q)", c.name, err, c.says)
		}
	}
}

func TestAdmitRefusesGPUsNotInTheLedger(t *testing.T) {
	unknown := "GPU-5e6c1b1e-0a1b-4c2d-8e3f-0000000000ff"
	a := annotation(nodetest.PodUID, nodetest.Node, slice(unknown, 9, 1024))
	l, err := decode(t, doc(pod(nodetest.PodUID, "a", a)))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Admit(nodetest.PodUID, a); err == nil || !strings.Contains(err.Error(), "is not in the node ledger") {
		t.Fatalf("%v", err)
	}
}
