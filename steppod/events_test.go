package steppod

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/wire"
)

// TestAgentSpec: a validated request is the spec the agent runs, the
// same for the same request; its inputs and outputs are its volumes.
func TestAgentSpec(t *testing.T) {
	r := wire.Request{Handle: "build-1", Type: "task", Image: "busybox", Run: wire.Run{Path: "sh", Args: []string{"-c", "true"}}}
	r.Run.Env = map[string]string{"B": "2", "A": "1"}
	r.Timeout = "90s"
	r.Stdin = "hello"
	r.Inputs = []wire.Input{{Name: "src", From: wire.InputSource{Target: "a", Pod: "p", Handle: "h"}}}
	r.Outputs = []wire.Output{{Name: "out", Path: "build/out"}}
	require.Nil(t, r.Validate())
	assert.Equal(t, "src", r.Inputs[0].Path)
	sp := AgentSpec(&r)
	assert.Equal(t, []string{"A=1", "B=2"}, sp.Env, "sorted, so the same request gives the same spec")
	assert.Equal(t, 90*time.Second, time.Duration(sp.Timeout))
	assert.Equal(t, []byte("hello"), sp.Stdin)
	require.Len(t, sp.Volumes, 2)
	assert.Equal(t, "input-src", sp.Volumes[0].Handle)
	assert.Equal(t, "src", sp.Volumes[0].Path)
	assert.Equal(t, "output-out", sp.Volumes[1].Handle)
	assert.Equal(t, "build/out", sp.Volumes[1].Path)
}

// TestStatusEventOfEachEnd: how each end the agent records becomes the
// step's last event; a process the kernel killed at its memory limit
// failed, like an exit status, and says OOMKilled with its container.
func TestStatusEventOfEachEnd(t *testing.T) {
	for _, c := range []struct {
		st                 stepagent.Status
		typ, reason, inMsg string
		phase              wire.Phase
	}{
		{stepagent.Status{Reason: stepagent.ReasonExited}, wire.EventExited, "", "", wire.Succeeded},
		{stepagent.Status{Reason: stepagent.ReasonExited, ExitStatus: 3}, wire.EventExited, "", "", wire.Failed},
		{stepagent.Status{Reason: stepagent.ReasonExited, ExitStatus: 137, Signal: "killed"}, wire.EventExited, "killed", "", wire.Failed},
		{stepagent.Status{Reason: stepagent.ReasonOOMKilled, ExitStatus: 137, Signal: "killed", Message: "memory limit"},
			wire.EventExited, "OOMKilled", `container "step": OOMKilled (137): memory limit`, wire.Failed},
		{stepagent.Status{Reason: stepagent.ReasonAborted, ExitStatus: 143}, wire.EventFailed, stepagent.ReasonAborted, "", wire.Aborted},
		{stepagent.Status{Reason: stepagent.ReasonTimeout, ExitStatus: 143}, wire.EventFailed, stepagent.ReasonTimeout, "", wire.Errored},
		{stepagent.Status{Reason: stepagent.ReasonLost, ExitStatus: 1}, wire.EventFailed, stepagent.ReasonLost, "", wire.Errored},
	} {
		e := StatusEvent(c.st)
		assert.Equal(t, c.typ, e.Type, "%+v", c.st)
		assert.Equal(t, c.phase, e.Phase, "%+v", c.st)
		assert.Equal(t, c.reason, e.Reason, "%+v", c.st)
		assert.Contains(t, e.Message, c.inMsg, "%+v", c.st)
		assert.Equal(t, c.st.ExitStatus, *e.ExitStatus)
	}
}
