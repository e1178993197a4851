// Package ident holds the patterns of the identifiers the node's files share (GPU and pod UIDs,
// node names, MIG profiles; docs/contracts.md), so the assignment, inventory and ledger decoders
// check them the same way.
package ident

import sj "neuronetes.io/node-agent/nri/internal/strictjson"

var (
	// GPUUUID is NVML's GPU UUID.
	GPUUUID = sj.NewPattern(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	// PodUID is a Kubernetes object UID.
	PodUID = sj.NewPattern(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	// DNSSubdomain is a Kubernetes DNS subdomain name (node names among them).
	DNSSubdomain = sj.NewPattern(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	// MIGProfile is a MIG profile name such as 1g.10gb or 1g.10gb+me.
	MIGProfile = sj.NewPattern(`^[1-9][0-9]*g\.[1-9][0-9]*gb(\+me)?$`)
)

// ObjectName is a Kubernetes object name that must be a DNS subdomain (1 to 253 characters): node
// and pod names.
var ObjectName = sj.StrSpec{MinLen: 1, MaxLen: 253, Pattern: DNSSubdomain}
