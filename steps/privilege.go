package steps

import (
	"fmt"

	"github.com/jetway-ci/jetway/targets"
)

// privilegeRefused says why target t does not run a privileged step, or
// nil if it does (or the step is not privileged).
func privilegeRefused(sum *Summary, t *targets.Target) error {
	if !sum.Privileged || t.Config.Meta.Steps.AllowPrivileged {
		return nil
	}
	return fmt.Errorf("target %s does not run privileged steps: its policy does not allow them (%s in its target.yaml)",
		t.Name(), targets.PrivilegedKey)
}
