package integration

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/api"
	cwn "github.com/jetway-ci/jetway/integration/concourse"
	"github.com/jetway-ci/jetway/internal/meshtest"
	"github.com/jetway-ci/jetway/targets"
)

// TestAnAgentIsWhatItsCertificateSays: an agent of team main (its
// certificate says so) is attacked by a step that runs on it and so holds
// its key: the attacker joins as the agent, announcing itself global,
// untagged and allowing privileged steps. While the agent runs, the
// second session is refused. Once the agent is killed, the attacker's
// session takes its place, but the gateway takes it for what the
// certificate says: fly workers shows it of team main, another team's
// step is not placed on it, a stream it asks for another team's caller
// is refused, and the claims are counted.
func TestAnAgentIsWhatItsCertificateSays(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	web := cwn.ForTest(t, cwn.Options{HeartbeatInterval: 2 * time.Second})
	ca := meshtest.NewCA(t, "trust-ca")
	member := meshMember(t, ca, ca, "trust-gw", "127.0.0.1:0")
	g := startGateway(t, t.TempDir(), gatewayOptions{identity: "trust-gw", mesh: member, state: newState(t),
		tokens: []api.Token{adminToken, mainToken, otherTeamToken}, concourse: concourseTSA(t, web)})
	const name = "trust-mac"
	ag := joinAgent(t, g, ca, name, "--platform", "linux", "--team", "main", "--tag", "mac")
	w := flyWorker(t, web, name, 30*time.Second, workerIn("running"))
	assert.Equal(t, "main", w.Team)
	assert.Equal(t, []string{"mac"}, w.Tags)

	// What the attacker announces: the agent's name, global, untagged,
	// privileged steps allowed.
	forged := forgedAgent{targets.Status{Name: name, Server: targets.AgentServer(name), State: targets.StateRunning,
		Meta: targets.Metadata{Platform: "linux", Steps: targets.StepPolicy{AllowPrivileged: true}}}}
	duplicates := `jetway_mesh_handshake_failures_total{reason="duplicate"}`
	attacker := joinForged(t, g, name, ag.certFiles(), forged)
	eventually(t, 30*time.Second, func() error {
		if metricValue(t, g, duplicates) < 1 {
			return errorf("the second session not refused yet")
		}
		return nil
	})
	assert.Equal(t, "main", g.targetsByName(t)[name].Team, "the agent's own session stays")

	ag.kill(t) // the attacker kills the agent, to take its place
	claims := `jetway_mesh_agent_claims_refused_total{claim="team"}`
	eventually(t, 30*time.Second, func() error {
		if metricValue(t, g, claims) < 1 {
			return errorf("the attacker's claims not refused yet")
		}
		return nil
	})
	assert.GreaterOrEqual(t, metricValue(t, g, `jetway_mesh_agent_claims_refused_total{claim="tags"}`), 1.0)
	assert.GreaterOrEqual(t, metricValue(t, g, `jetway_mesh_agent_claims_refused_total{claim="privileged"}`), 1.0)
	listed := g.targetsByName(t)[name]
	assert.Equal(t, "main", listed.Team)
	assert.Equal(t, []string{"mac"}, listed.Tags)
	assert.Equal(t, "running", listed.State)

	// The web node has it of team main, with its tags.
	w = flyWorker(t, web, name, 30*time.Second, workerIn("running"))
	assert.Equal(t, "main", w.Team)
	assert.Equal(t, []string{"mac"}, w.Tags)

	// Another team's steps are not placed on it, untagged or tagged, nor
	// a privileged one; main's tagged steps still are.
	for _, step := range []api.PlacementRequest{
		{Type: "task", Team: "other", Platform: "linux"},
		{Type: "task", Team: "other", Platform: "linux", Tags: []string{"mac"}},
		{Type: "task", Team: "main", Platform: "linux", Tags: []string{"mac"}, Privileged: true},
	} {
		_, p, _ := g.place(t, adminToken.Token, step)
		assert.NotEqual(t, name, p.Target, "%+v placed on the attacker", step)
		assert.NotEmpty(t, p.Rejected[name], "%+v: the agent says why not", step)
	}
	_, p, _ := g.place(t, adminToken.Token, api.PlacementRequest{Type: "task", Team: "main", Platform: "linux", Tags: []string{"mac"}})
	assert.Equal(t, name, p.Target)

	// A stream it asks for another team's caller is refused.
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, "http://trust-gw/api/v1/mesh/stream-out", strings.NewReader("{}"))
	require.NoError(t, err)
	req.Header.Set(api.CallerHeader, `{"name":"other-ci","team":"other"}`)
	resp, err := attacker.Client().Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, "%s", body)
	assert.Contains(t, string(body), "agent trust-mac acts only for callers of its own team")
}

// certFiles are the agent's mesh CA, certificate and key files.
func (a *joinedAgent) certFiles() []string {
	var files []string
	for _, flag := range []string{"--ca", "--cert", "--key"} {
		i := slices.Index(a.args, flag)
		files = append(files, a.args[i+1])
	}
	return files
}

// forgedAgent announces one target as given.
type forgedAgent struct{ st targets.Status }

func (f forgedAgent) Snapshot() []targets.Status { return []targets.Status{f.st} }
func (forgedAgent) Changed() <-chan struct{}     { return nil }
