package stepagent_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/stepagent"
)

// What the supervisor logs, and where tail and run start, through the
// agent's binary (see agent_test.go).

func TestTheSupervisorStampsFramesWithTheirTimes(t *testing.T) {
	root, spec := newStep(t, `echo a; echo b >&2; sleep 0.05; echo c; echo d >&2`)
	inputs := []byte(`[{"name":"src","bytes":3,"sha256":"abc"}]`)
	before := time.Now()
	out, code := agent(t, root, slices.Concat(spec, inputs),
		"run", "--spec-bytes", strconv.Itoa(len(spec)), "--inputs-bytes", strconv.Itoa(len(inputs)))
	require.Equal(t, 0, code, "%s", out)
	fs := frames(t, out)
	require.Greater(t, len(fs), 5)
	assert.True(t, fs[0].Time.IsZero(), "the position carries no time")
	input, begun := fs[1], fs[2]
	require.Equal(t, stepagent.KindInput, input.Kind)
	require.Equal(t, stepagent.KindStarted, begun.Kind)
	var started stepagent.Started
	require.NoError(t, json.Unmarshal(begun.Payload, &started))
	assert.Equal(t, started.At, begun.Time, "the started frame is stamped with the start")
	assert.WithinRange(t, input.Time, before.Truncate(0), started.At, "an input is stamped when written, before the start")

	_, _, st := outcome(t, fs)
	last, outputs := started.At, 0
	for _, f := range fs[3:] {
		if f.Kind == stepagent.KindStatus {
			break
		}
		require.Contains(t, []byte{stepagent.KindStdout, stepagent.KindStderr}, f.Kind)
		assert.WithinRange(t, f.Time, last, st.FinishedAt, "output %q: after the frames before it, before the end", f.Payload)
		last = f.Time
		outputs++
	}
	assert.GreaterOrEqual(t, outputs, 2)
	status, trailer := fs[len(fs)-2], fs[len(fs)-1]
	assert.Equal(t, st.FinishedAt, status.Time, "the status frame is stamped with the end")
	assert.Equal(t, st.FinishedAt, trailer.Time, "so is the trailer")
}

func TestAnAnswerIsNotTheLog(t *testing.T) {
	root, spec := newStep(t, `echo '{"version":{"ref":"1"}}'; echo fetching >&2`, func(sp *stepagent.Spec) { sp.Answer = true })
	fs := run(t, root, spec)
	stdout, stderr, st := outcome(t, fs)
	assert.Empty(t, stdout, "stdout is the answer")
	assert.Equal(t, "fetching\n", stderr)
	assert.Equal(t, 0, st.ExitStatus)
	var answer string
	events := 0
	for _, f := range fs {
		if f.Kind == stepagent.KindAnswer {
			answer += string(f.Payload)
		}
		if stepagent.IsEvent(f.Kind) {
			events++
		}
	}
	assert.Equal(t, "{\"version\":{\"ref\":\"1\"}}\n", answer)

	out, code := agent(t, root, nil, "tail", "--skip", "all")
	require.Equal(t, 0, code, "%s", out)
	assert.Equal(t, stepagent.Position{Offset: logSize(t, root), Events: events}, position(t, frames(t, out)[0]),
		"the events are the start and stderr")
}

// logSize is the size of the log in root.
func logSize(t *testing.T, root string) int64 {
	t.Helper()
	fi, err := os.Stat(stepagent.Path(root, stepagent.LogFile))
	require.NoError(t, err)
	return fi.Size()
}

func TestTailAndRunStartWhereTheirFlagsSay(t *testing.T) {
	root, spec := newStep(t, `echo one; echo two >&2; echo three`)
	run(t, root, spec)
	b, err := os.ReadFile(stepagent.Path(root, stepagent.LogFile))
	require.NoError(t, err)
	// The start, outputs, the status: every frame but the last an event.
	log := frames(t, b)
	at := func(i int) int64 { // the offset of log[i]
		var off int64
		for _, f := range log[:i] {
			off += f.Size()
		}
		return off
	}
	offset1 := strconv.FormatInt(at(1), 10)
	end := len(log)
	for _, tt := range []struct {
		args   []string
		from   int // the log's frame the output starts with
		events int
	}{
		{[]string{"tail"}, 0, 0},
		{[]string{"tail", "--skip", "0"}, 0, 0},
		{[]string{"tail", "--skip", "1"}, 1, 1},
		{[]string{"tail", "--offset", offset1, "--events", "1", "--skip", "1"}, 2, 2},
		{[]string{"tail", "--offset", offset1, "--events", "1"}, 1, 1},
		{[]string{"tail", "--skip", "all"}, end, end - 1},
		{[]string{"tail", "--skip", "1000"}, end, end - 1},
		{[]string{"run", "--inputs-bytes", "0", "--skip", "all"}, end, end - 1},
		{[]string{"run", "--inputs-bytes", "0", "--skip", "2"}, 2, 2},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			out, code := agent(t, root, nil, tt.args...)
			require.Equal(t, 0, code, "%s", out)
			fs := frames(t, out)
			assert.Equal(t, stepagent.Position{Offset: at(tt.from), Events: tt.events}, position(t, fs[0]))
			assert.Equal(t, log[tt.from:], fs[1:len(fs)-1])
			assert.Equal(t, stepagent.KindStatus, fs[len(fs)-1].Kind, "the trailer")
		})
	}

	out, code := agent(t, root, nil, "tail", "--offset", strconv.FormatInt(logSize(t, root)+1, 10), "--skip", "all")
	assert.Equal(t, 1, code)
	assert.Contains(t, string(out), "past the log's end")
}

func TestBadTailFlagsAreUsageErrors(t *testing.T) {
	for _, bad := range [][]string{
		{"--skip", "x"}, {"--skip", "-1"}, {"--skip", ""}, {"--skip", "1.5"},
		{"--offset", "-1"}, {"--events", "-3"}, {"--offset", "x"},
	} {
		for _, cmd := range []string{"tail", "run"} {
			t.Run(cmd+" "+strings.Join(bad, " "), func(t *testing.T) {
				root, spec := newStep(t, `echo run >> ../ran`)
				args := append([]string{cmd, "--spec-bytes", strconv.Itoa(len(spec)), "--inputs-bytes", "2"}, bad...)
				out, code := agent(t, root, slices.Concat(spec, []byte("[]")), args...)
				assert.Equal(t, stepagent.ExitUsage, code, "%s", out)
				assert.NoFileExists(t, filepath.Join(root, "ran"), "the step never starts")
			})
		}
	}
}
