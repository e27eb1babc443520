//go:build tools

// The packages scripts/cluster/build compiles for Cilium (only when asked for by name: they are
// not in its default set), named here so that `go mod tidy` keeps every module they need (and
// go.sum their hashes). Never built: the `tools` tag is never set.
package tools

import (
	_ "github.com/cilium/cilium/cilium-dbg"
	_ "github.com/cilium/cilium/cilium-health/responder"
	_ "github.com/cilium/cilium/daemon"
	_ "github.com/cilium/cilium/operator"
	_ "github.com/cilium/cilium/plugins/cilium-cni"
)
