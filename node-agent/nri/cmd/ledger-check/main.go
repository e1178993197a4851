// Command ledger-check reads a node ledger file with the plugin's own strict reader (package
// ledger: decoding, node and freshness checks) and prints OK with what it holds, or the reader's
// error; given pod UIDs, it also runs the plugin's cross-check for each (the pod with the
// annotation the ledger recorded for it) and prints "admit UID" or "refuse UID: why". The agent's
// tests run it on the files the Python agent writes, so the two sides of the contract
// (docs/contracts.md, "The node ledger file") cannot drift apart.
//
//	ledger-check FILE NODE [POD-UID...]
package main

import (
	"fmt"
	"os"
	"time"

	"neuronetes.io/node-agent/nri/ledger"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: ledger-check FILE NODE [POD-UID...]")
		os.Exit(2)
	}
	l, err := ledger.Load(os.Args[1], os.Args[2], ledger.DefaultMaxAge, time.Now())
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
	fmt.Printf("OK node=%s generation=%d gpus=%d pods=%d\n", l.Node, l.Generation, len(l.GPUs), len(l.Pods))
	for _, uid := range os.Args[3:] {
		annotation := ""
		for _, p := range l.Pods {
			if p.UID == uid {
				annotation = p.Annotation
			}
		}
		if err := l.Admit(uid, annotation); err != nil {
			fmt.Printf("refuse %s: %v\n", uid, err)
		} else {
			fmt.Printf("admit %s\n", uid)
		}
	}
}
