package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/api"
	"github.com/jetway-ci/jetway/selection"
	"github.com/jetway-ci/jetway/steps"
	"github.com/jetway-ci/jetway/targets"
)

// fleet is api.Targets over a fixed list.
type fleet []targets.Status

func (f fleet) Snapshot() []targets.Status { return f }

func (f fleet) Get(name string) (targets.Status, error) {
	for _, s := range f {
		if s.Name == name {
			return s, nil
		}
	}
	return targets.Status{}, targets.ErrNotFound
}

func (f fleet) Find(name string) (targets.Status, error) { return f.Get(name) }

var placeFleet = fleet{
	{Name: "tb1", State: targets.StateRunning,
		Meta:   targets.Metadata{Team: "main", Tags: []string{"gpu"}, Platform: "linux"},
		Counts: targets.Counts{ActiveContainers: 4, BuildContainers: 3, ActiveTasks: 1}},
	{Name: "tb2", State: targets.StateRunning,
		Meta:   targets.Metadata{Team: "main", Tags: []string{"gpu", "big"}, Platform: "linux", MaxActiveTasks: 2},
		Counts: targets.Counts{ActiveContainers: 2, BuildContainers: 2, ActiveTasks: 2}},
	{Name: "tb3", State: targets.StateLanded, Meta: targets.Metadata{Team: "main", Tags: []string{"gpu"}, Platform: "linux"}},
	{Name: "g1", State: targets.StateRunning, Meta: targets.Metadata{Platform: "linux"}},
	{Name: "o1", State: targets.StateRunning, Meta: targets.Metadata{Team: "other", Tags: []string{"gpu"}, Platform: "linux"}},
}

// placeGateway serves the real API over placeFleet, with a global limit of
// one active task.
func placeGateway(t *testing.T) string {
	srv := httptest.NewServer(api.New(api.Options{
		Gatherer: prometheus.NewRegistry(), Targets: placeFleet,
		Tokens:    []api.Token{{Name: "main-ci", Token: "main-token-0123456789", Team: "main"}},
		Placement: steps.PlacementOptions{Limits: selection.Limits{ActiveTasks: 1}},
	}).Handler())
	t.Cleanup(func() {
		srv.Close()
		http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	})
	return srv.URL
}

func TestPlace(t *testing.T) {
	url := placeGateway(t)
	tests := []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{name: "chosen, then the order, then each rejection by name", code: 0,
			args: []string{"--team", "main", "--tag", "gpu", "--platform", "linux", "--input-on", "tb2"},
			stdout: `target: tb2

name  team  tags      platform  tasks  containers  verdict
tb2   main  gpu, big  linux     2      2           chosen
tb1   main  gpu       linux     1      4           #2
g1    none  none      linux     0      0           missing tags gpu
tb3   main  gpu       linux     0      0           state landed
`},
		{name: "no compatible target: the table and exit 1", code: 1,
			args: []string{"--team", "main", "--tag", "gpu", "--tag", "big", "--platform", "windows"},
			stdout: `name  team  tags      platform  tasks  containers  verdict
g1    none  none      linux     0      0           platform linux
tb1   main  gpu       linux     1      4           platform linux
tb2   main  gpu, big  linux     2      2           platform linux
tb3   main  gpu       linux     0      0           state landed
`,
			stderr: "gateway: no placement (422 Unprocessable Entity): no target satisfies team 'main', tags 'gpu, big', platform 'windows'\n"},
		{name: "every target at a limit: the table and exit 1", code: 1,
			args: []string{"--team", "main", "--tag", "gpu", "--strategy", "limit-active-tasks"},
			stdout: `name  team  tags      platform  tasks  containers  verdict
g1    none  none      linux     0      0           missing tags gpu
tb1   main  gpu       linux     1      4           at limit active-tasks 1/1
tb2   main  gpu, big  linux     2      2           at limit active-tasks 2/2
tb3   main  gpu       linux     0      0           state landed
`,
			stderr: "gateway: no placement (503 Service Unavailable): every compatible target is at a limit (team 'main', tags 'gpu'); retry after 5s\n"},
		{name: "another team", code: 1, args: []string{"--team", "other"},
			stderr: "gateway: POST /api/v1/placements: 403 Forbidden: a team token places only its own team's steps\n"},
		{name: "bad type", code: 1, args: []string{"--team", "main", "--type", "deploy"},
			stderr: "gateway: POST /api/v1/placements: 400 Bad Request: type: \"deploy\" is not one of task, get, put, check\n"},
		{name: "stray argument", code: 2, args: []string{"tb1"}, stderr: "gateway: unknown command \"tb1\" for \"gateway place\"\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			args := append([]string{"place", "--url", url, "--token", "main-token-0123456789"}, tt.args...)
			require.Equal(t, tt.code, execute(args, &stdout, &stderr), "stderr: %s", stderr.String())
			assert.Equal(t, tt.stdout, stdout.String())
			assert.Equal(t, tt.stderr, stderr.String())
		})
	}
}

func TestPrintPlacementTargetsChangedMeanwhile(t *testing.T) {
	var b bytes.Buffer
	printPlacement(&b, api.Placement{Target: "a", Order: []string{"a"}, Rejected: map[string]string{"gone": "state landed"}},
		[]api.Target{{Name: "a", Platform: "linux"}, {Name: "new", Platform: "linux"}})
	assert.Equal(t, `name  team  tags  platform  tasks  containers  verdict
a     none  none  linux     0      0           chosen
gone  ?     ?     ?         ?      ?           state landed
new   none  none  linux     0      0           not in the decision (new target?)
`, b.String())
}

func TestPrintPlacementWithoutTargets(t *testing.T) {
	var b bytes.Buffer
	printPlacement(&b, api.Placement{Rejected: map[string]string{}}, nil)
	assert.Equal(t, "no targets visible to this token\n", b.String())
}
