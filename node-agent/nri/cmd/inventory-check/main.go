// Command inventory-check reads a node inventory file with the plugin's own strict reader
// (package inventory: decoding, node and freshness checks) and prints OK with what it holds, or
// the reader's error. The agent's tests run it on the files the Python agent writes, so the two
// sides of the contract (docs/contracts.md, "The node inventory file") cannot drift apart.
//
//	inventory-check FILE NODE
package main

import (
	"fmt"
	"os"
	"time"

	"neuronetes.io/node-agent/nri/inventory"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: inventory-check FILE NODE")
		os.Exit(2)
	}
	inv, err := inventory.Load(os.Args[1], os.Args[2], inventory.DefaultMaxAge, time.Now())
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
	instances := 0
	for _, g := range inv.GPUs {
		instances += len(g.MIG)
	}
	fmt.Printf("OK node=%s generation=%d gpus=%d migInstances=%d mounts=%d hooks=%d\n",
		inv.Node, inv.Generation, len(inv.GPUs), instances, len(inv.DriverMounts), len(inv.DriverHooks))
}
