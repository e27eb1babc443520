//go:build tools

// The packages scripts/cluster/build compiles for helm (only when asked for: it renders Cilium's
// chart, scripts/cluster/cilium), named here so that `go mod tidy` keeps every module they need
// (and go.sum their hashes). Never built: the `tools` tag is never set.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
