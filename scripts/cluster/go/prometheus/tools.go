//go:build tools

// The packages scripts/cluster/build compiles, named here so that `go mod tidy` keeps every module
// they need (and go.sum their hashes). Never built: the `tools` tag is never set.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
)
