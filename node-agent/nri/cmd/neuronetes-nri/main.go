// Command neuronetes-nri is NeuroNetes' NRI plugin: at container creation it gives each container
// exactly the GPUs its pod's neuronetes.io/assigned-gpus annotation assigns it (devices, cgroup
// rules, shim library, preload file, region, env) and refuses containers whose assignment it
// cannot honour. How it works: docs/node-injection.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/containerd/nri/pkg/stub"

	"neuronetes.io/node-agent/nri/inject"
	"neuronetes.io/node-agent/nri/inventory"
	"neuronetes.io/node-agent/nri/ledger"
	"neuronetes.io/node-agent/nri/plugin"
	"neuronetes.io/node-agent/nri/podspec"
	"neuronetes.io/node-agent/nri/records"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "neuronetes-nri:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		node      = flag.String("node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
		stateDir  = flag.String("state-dir", "/run/neuronetes", "the node agent's state directory (inventory.json, ledger.json, containers/<pod-uid>/<container>/{control,state}; this plugin writes containers.d/)")
		maxAge    = flag.Duration("inventory-max-age", inventory.DefaultMaxAge, "refuse GPU containers when the inventory file is older than this")
		ledgerAge = flag.Duration("ledger-max-age", ledger.DefaultMaxAge, "refuse GPU containers when the node ledger file is older than this")
		socket    = flag.String("nri-socket", "", "NRI socket of the runtime (default: NRI's default, /var/run/nri/nri.sock)")
		pluginIdx = flag.String("plugin-index", "10", "NRI plugin index (order among plugins)")
	)
	flag.Parse()
	if *node == "" {
		return errors.New("--node-name (or $NODE_NAME) is required")
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	source := inventory.NewSource(filepath.Join(*stateDir, "inventory.json"), *node, *maxAge, time.Now)
	bound := ledger.NewSource(filepath.Join(*stateDir, ledger.FileName), *node, *ledgerAge, time.Now)
	p := &plugin.Plugin{
		Host:    inject.Host{Node: *node, StateDir: *stateDir, Inventory: source.Current, Ledger: bound.Current},
		Log:     log,
		Records: records.In(*stateDir),
	}
	if pods, err := podspec.InCluster(); err != nil {
		// containers asking for GPUs without an assignment entry then get no GPU (safe) instead
		// of a refusal naming the reason
		log.Warn("pod spec lookups off", "error", err)
	} else {
		p.Host.PodRequests, p.Forget = pods.Requests, pods.Forget
	}
	opts := []stub.Option{stub.WithPluginName("neuronetes"), stub.WithPluginIdx(*pluginIdx)}
	if *socket != "" {
		opts = append(opts, stub.WithSocketPath(*socket))
	}
	s, err := stub.New(p, opts...)
	if err != nil {
		return fmt.Errorf("creating the NRI stub: %w", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log.Info("starting", "plugin", p.String(), "stateDir", *stateDir)
	if err := s.Run(ctx); err != nil && ctx.Err() == nil {
		return fmt.Errorf("NRI connection: %w", err)
	}
	return nil
}
