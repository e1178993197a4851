// Package podspec tells the plugin which containers of a pod ask for NeuroNetes resources. CRI,
// and so NRI, carry only a container's CPU and memory, not its extended resources, so without
// the pod spec a GPU container that lacks an assignment entry would simply get no GPU; with it
// the plugin refuses the container with a message saying why (docs/node-injection.md).
//
// It reads the pod from the API server with the plugin's service-account token (RBAC: get pods),
// once per pod (extended resources cannot change on a running pod), and forgets it when the
// sandbox is removed. Only the Go standard library: the plugin keeps client-go out.
package podspec

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"neuronetes.io/node-agent/nri/inject"
)

// ResourcePrefix: every NeuroNetes extended resource (gpu, gpu-memory, gpu-compute, mig-*).
const ResourcePrefix = "neuronetes.io/"

// In-cluster service-account files.
const (
	tokenFile = "/var/run/secrets/kubernetes.io/serviceaccount/token"
	caFile    = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
	// maxPodBytes bounds what is read of one pod object.
	maxPodBytes = 4 << 20
	// maxCached bounds the cache (a node runs far fewer pods; sandboxes removed are forgotten).
	maxCached = 4096
)

// Client looks pods up in the API server.
type Client struct {
	BaseURL   string // https://host:port
	TokenFile string // re-read on each request: projected tokens rotate
	HTTP      *http.Client
	Timeout   time.Duration // per lookup; well under NRI's 2 s plugin request timeout

	mu    sync.Mutex
	cache map[string]map[string]bool // pod UID -> containers asking
}

// InCluster builds a Client from the pod's service account, or says why it cannot.
func InCluster() (*Client, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, errors.New("not running in a cluster (KUBERNETES_SERVICE_HOST/PORT unset)")
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no certificate", caFile)
	}
	transport := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	return &Client{
		BaseURL:   "https://" + net.JoinHostPort(host, port),
		TokenFile: tokenFile,
		HTTP:      &http.Client{Transport: transport},
		Timeout:   time.Second,
	}, nil
}

// pod is the part of a Pod object the lookup reads.
type pod struct {
	Metadata struct {
		UID string `json:"uid"`
	} `json:"metadata"`
	Spec struct {
		Containers     []container `json:"containers"`
		InitContainers []container `json:"initContainers"`
	} `json:"spec"`
}

type container struct {
	Name      string `json:"name"`
	Resources struct {
		Limits   map[string]json.RawMessage `json:"limits"`
		Requests map[string]json.RawMessage `json:"requests"`
	} `json:"resources"`
}

// Requests returns the names of the pod's containers (init and sidecar containers included)
// that ask for a NeuroNetes resource.
func (c *Client) Requests(p inject.Pod) (map[string]bool, error) {
	c.mu.Lock()
	cached, ok := c.cache[p.UID]
	c.mu.Unlock()
	if ok {
		return cached, nil
	}
	asks, err := c.fetch(p)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cache == nil || len(c.cache) >= maxCached {
		c.cache = map[string]map[string]bool{}
	}
	c.cache[p.UID] = asks
	return asks, nil
}

// Forget drops a pod from the cache (its sandbox is gone).
func (c *Client) Forget(uid string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.cache, uid)
}

func (c *Client) fetch(p inject.Pod) (map[string]bool, error) {
	token, err := os.ReadFile(c.TokenFile)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.Timeout)
	defer cancel()
	u := fmt.Sprintf("%s/api/v1/namespaces/%s/pods/%s", c.BaseURL, url.PathEscape(p.Namespace), url.PathEscape(p.Name))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	req.Header.Set("Accept", "application/json")
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET pod %s/%s: %s", p.Namespace, p.Name, resp.Status)
	}
	var obj pod
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxPodBytes)).Decode(&obj); err != nil {
		return nil, fmt.Errorf("GET pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	if obj.Metadata.UID != p.UID {
		return nil, fmt.Errorf("pod %s/%s has UID %s, the sandbox's is %s", p.Namespace, p.Name, obj.Metadata.UID, p.UID)
	}
	asks := map[string]bool{}
	for _, ctr := range append(obj.Spec.InitContainers, obj.Spec.Containers...) {
		asks[ctr.Name] = hasNeuroNetesResource(ctr.Resources.Limits) || hasNeuroNetesResource(ctr.Resources.Requests)
	}
	return asks, nil
}

func hasNeuroNetesResource(resources map[string]json.RawMessage) bool {
	for name := range resources {
		if strings.HasPrefix(name, ResourcePrefix) {
			return true
		}
	}
	return false
}
