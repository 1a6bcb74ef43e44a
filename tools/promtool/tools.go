//go:build tools

// Package promtool pins the promtool that `make test` builds into bin/ to
// evaluate the Helm chart's alert rules (deploy/helm TestAlertRules).
package promtool

import _ "github.com/prometheus/prometheus/cmd/promtool"
