//go:build tools

// The packages scripts/cluster/build compiles, named here so that `go mod tidy` keeps every module
// they need (and go.sum their hashes). Never built: the `tools` tag is never set.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
