package podspec

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"neuronetes.io/node-agent/nri/inject"
)

const podJSON = `{"metadata": {"name": "trainer-0", "uid": "0b6f3c8e-4c1d-4f57-9a1e-2f0c4a1b9d77"},
 "spec": {
  "initContainers": [
   {"name": "fetch", "resources": {"limits": {"neuronetes.io/gpu": "2"}}},
   {"name": "proxy", "restartPolicy": "Always", "resources": {"limits": {"cpu": "1"}}}],
  "containers": [
   {"name": "trainer", "resources": {"limits": {"neuronetes.io/gpu-memory": "10240", "neuronetes.io/gpu-compute": "30"}}},
   {"name": "mig", "resources": {"requests": {"neuronetes.io/mig-1g.5gb": "1"}}},
   {"name": "logs", "resources": {}}]}}`

func server(t *testing.T, body string, status int) (*Client, *atomic.Int32) {
	t.Helper()
	var calls atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if r.Header.Get("Authorization") != "Bearer sa-token" || r.URL.Path != "/api/v1/namespaces/team-a/pods/trainer-0" {
			http.Error(w, "forbidden", http.StatusForbidden)
			return
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("sa-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return &Client{BaseURL: srv.URL, TokenFile: token, HTTP: srv.Client(), Timeout: 5 * time.Second}, &calls
}

var trainerPod = inject.Pod{UID: "0b6f3c8e-4c1d-4f57-9a1e-2f0c4a1b9d77", Namespace: "team-a", Name: "trainer-0"}

func TestRequestsFromThePodSpec(t *testing.T) {
	c, calls := server(t, podJSON, http.StatusOK)
	asks, err := c.Requests(trainerPod)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"fetch": true, "proxy": false, "trainer": true, "mig": true, "logs": false}
	for name, w := range want {
		if asks[name] != w {
			t.Fatalf("%s: asks=%v, want %v (%v)", name, asks[name], w, asks)
		}
	}
	if _, err := c.Requests(trainerPod); err != nil || calls.Load() != 1 {
		t.Fatalf("second lookup: err %v, %d API calls (want one, cached)", err, calls.Load())
	}
	c.Forget(trainerPod.UID)
	if _, err := c.Requests(trainerPod); err != nil || calls.Load() != 2 {
		t.Fatalf("after Forget: err %v, %d API calls", err, calls.Load())
	}
}

func TestLookupFailuresAreErrors(t *testing.T) {
	c, _ := server(t, podJSON, http.StatusOK)
	replaced := trainerPod
	replaced.UID = "6f1c2d3e-0000-4000-8000-00000000beef" // same name, another pod
	if _, err := c.Requests(replaced); err == nil || !strings.Contains(err.Error(), "has UID") {
		t.Fatalf("replaced pod: %v", err)
	}
	c, _ = server(t, `{"kind": "Status"}`, http.StatusNotFound)
	if _, err := c.Requests(trainerPod); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("missing pod: %v", err)
	}
	c, _ = server(t, `{not json`, http.StatusOK)
	if _, err := c.Requests(trainerPod); err == nil {
		t.Fatal("garbage decoded")
	}
}
