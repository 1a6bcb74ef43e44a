package wire

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// One Worker serves the web node and fly: a registration carries no
// state (the web node keeps its own), the API's listing always does, and
// the keys are atc.Worker's, in its order.
func TestWorkerJSONIsConcourses(t *testing.T) {
	w := Worker{GardenAddr: "0.0.0.0:7777", BaggageclaimURL: "http://0.0.0.0:7788", Platform: "linux",
		Tags: []string{"gpu"}, Team: "main", Name: "t", Version: WorkerVersion, StartTime: 1_700_000_000,
		ResourceTypes: []ResourceType{{Type: "git", Image: "docker.io/concourse/git-resource"}}}
	b, err := json.Marshal(w)
	require.NoError(t, err)
	assert.Equal(t, `{"addr":"0.0.0.0:7777","baggageclaim_url":"http://0.0.0.0:7788","active_containers":0,"active_volumes":0,`+
		`"active_tasks":0,"resource_types":[{"type":"git","image":"docker.io/concourse/git-resource","version":"",`+
		`"privileged":false,"unique_version_history":false}],"platform":"linux","tags":["gpu"],"team":"main","name":"t",`+
		`"version":"2.5","start_time":1700000000,"ephemeral":false}`, string(b), "what the TSA reads")

	w.State, w.ResourceTypes = "running", []ResourceType{}
	b, err = json.Marshal(w)
	require.NoError(t, err)
	assert.JSONEq(t, `{"addr":"0.0.0.0:7777","baggageclaim_url":"http://0.0.0.0:7788","active_containers":0,"active_volumes":0,`+
		`"active_tasks":0,"resource_types":[],"platform":"linux","tags":["gpu"],"team":"main","name":"t",`+
		`"version":"2.5","start_time":1700000000,"ephemeral":false,"state":"running"}`, string(b), "what fly reads")
}
