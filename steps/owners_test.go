package steps

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/wire"
)

// TestLiveness: a gateway is alive while its Lease keeps changing, as
// this gateway's own clock sees it; gone once its Lease is deleted, or
// unchanged for a lease duration; one never seen is given a short grace
// (a watch of Leases may lag one of records).
func TestLiveness(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLiveness("me", time.Now)
		l.observe(map[string]string{"b": "1", "c": "1"})
		assert.True(t, l.alive("b"))
		assert.True(t, l.alive("me"), "this gateway, while it runs")

		time.Sleep(leaseDuration - time.Second)
		l.observe(map[string]string{"b": "2", "c": "1"}) // b renewed, c did not
		time.Sleep(2 * time.Second)
		assert.True(t, l.alive("b"), "renewed a second ago")
		assert.False(t, l.alive("c"), "not renewed for a lease duration")

		l.observe(map[string]string{"c": "1"}) // b's Lease deleted: it stopped
		assert.False(t, l.alive("b"), "gone at once")

		assert.True(t, l.alive("new"), "never seen: a grace")
		time.Sleep(leaseUnknownGrace)
		assert.False(t, l.alive("new"), "never seen for the grace: gone")
		l.observe(map[string]string{"c": "1", "new": "1"})
		assert.True(t, l.alive("new"), "seen at last")

		assert.False(t, l.forgotten("c"))
		time.Sleep(leaseForgetAfter)
		assert.True(t, l.forgotten("c"), "a Lease unrenewed this long may go")

		assert.False(t, l.valid(), "never renewed its own")
		l.renewed()
		assert.True(t, l.valid())
		time.Sleep(leaseValid)
		assert.False(t, l.valid(), "an owner that could not renew for leaseValid stops acting")
		assert.Less(t, leaseValid, leaseDuration, "before any other may take its steps over")
		l.stop()
		assert.False(t, l.alive("me"))
	})
}

// TestEventsAreNumberedFromTheRecord: the head and the end come from the
// record, so every gateway numbers them alike; the end follows the
// log's events.
func TestEventsAreNumberedFromTheRecord(t *testing.T) {
	at := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	code := 3
	r := &Record{Status: Status{
		Waiting:   []Waiting{{At: at, Reason: wire.ReasonTargetsAtLimit, Message: "full"}, {At: at.Add(time.Second), Reason: wire.ReasonNoTargetFits, Message: "gone"}},
		Placed:    &Placed{Target: "east", Pod: "p", At: at.Add(2 * time.Second)},
		Scheduled: &Node{Name: "n1", At: at.Add(3 * time.Second)},
	}}
	head, final := r.Head()
	require.Len(t, head, 4)
	assert.True(t, final, "scheduled: the log may begin")
	for i, e := range head {
		assert.Equal(t, i, e.N)
	}
	assert.Equal(t, []string{wire.EventWaiting, wire.EventWaiting, wire.EventPlaced, wire.EventScheduled}, []string{head[0].Type, head[1].Type, head[2].Type, head[3].Type})
	_, ended := r.EndEvent()
	assert.False(t, ended)

	r.Status.End = &End{Phase: wire.Failed, ExitStatus: &code, At: at.Add(time.Minute), LogEvents: 7, Kept: true}
	end, ended := r.EndEvent()
	require.True(t, ended)
	assert.Equal(t, wire.Event{N: 11, Type: wire.EventExited, Time: at.Add(time.Minute), Phase: wire.Failed, ExitStatus: &code}, end)
	v := r.View()
	assert.Equal(t, 12, v.Events)
	assert.Equal(t, wire.Failed, v.Phase)
	assert.Len(t, v.Outputs, 0)

	pending := &Record{}
	head, final = pending.Head()
	assert.Empty(t, head)
	assert.False(t, final)
}

// TestTailIsBounded: a step's tail keeps the last events only, whatever
// the step prints; a follower behind it reads the pod instead.
func TestTailIsBounded(t *testing.T) {
	tl := newTail(2)
	chunk := make([]byte, 32<<10)
	for i := range 1000 {
		tl.add(wire.Event{N: 2 + i, Type: wire.EventStdout, Data: string(chunk)})
	}
	tl.mu.Lock()
	n, bytes := len(tl.events), tl.bytes
	tl.mu.Unlock()
	assert.LessOrEqual(t, bytes, tailBytes)
	assert.LessOrEqual(t, n, tailEvents)
	assert.Equal(t, 1002, tl.count())
	_, ok, _, _ := tl.from(2)
	assert.False(t, ok, "the first events are the pod's to serve now")
	evs, ok, done, _ := tl.from(1000)
	require.True(t, ok)
	assert.False(t, done)
	assert.Len(t, evs, 2)
	assert.Equal(t, 1000, evs[0].N)
	tl.end(false)
	_, _, done, _ = tl.from(1002)
	assert.True(t, done)
}
