package portforward

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFailedStreamKeepsSharedConnection: one stream that fails to open
// must not close the pod's connection under the streams already on it.
func TestFailedStreamKeepsSharedConnection(t *testing.T) {
	ctx := context.Background()
	d, up := startFake(t, Options{})
	a, err := d.Dial(ctx, "t", "ns", "p", 80)
	require.NoError(t, err)
	defer a.Close()

	up.upgrades()[0].failNextCreate()
	_, err = d.Dial(ctx, "t", "ns", "p", 80)

	assert.False(t, up.upgrades()[0].isClosed(), "a failed stream closed the shared connection")
	assert.NoError(t, echo(a, "still here"), "a stream opened before the failure")
	assert.ErrorIs(t, err, errInjected)
	assert.ErrorContains(t, err, "t/ns/p:80")
	b, err := d.Dial(ctx, "t", "ns", "p", 80)
	require.NoError(t, err)
	defer b.Close()
	assert.NoError(t, echo(b, "next"))
	assert.Len(t, up.upgrades(), 1, "the live connection carries the next stream")
}

// TestFailedStreamOnDeadConnectionRedials: when the shared connection
// itself died, Dial drops it and opens a new one.
func TestFailedStreamOnDeadConnectionRedials(t *testing.T) {
	ctx := context.Background()
	d, up := startFake(t, Options{})
	a, err := d.Dial(ctx, "t", "ns", "p", 80)
	require.NoError(t, err)
	a.Close()
	_ = up.upgrades()[0].Close()
	// The supervisor may not have forgotten the dead connection yet: Dial
	// either finds it dead and redials, or dials afresh.
	b, err := d.Dial(ctx, "t", "ns", "p", 80)
	require.NoError(t, err)
	defer b.Close()
	assert.NoError(t, echo(b, "fresh"))
	assert.Len(t, up.upgrades(), 2)
}

// TestWedgedConnectionRedials: a shared connection that answers no new
// stream (each times out) is closed, and the next dials open a new one.
func TestWedgedConnectionRedials(t *testing.T) {
	ctx := context.Background()
	d, up := startFake(t, Options{})
	a, err := d.Dial(ctx, "t", "ns", "p", 80)
	require.NoError(t, err)
	defer a.Close()
	up.upgrades()[0].timeOutCreates()
	b, err := d.Dial(ctx, "t", "ns", "p", 80)
	require.NoError(t, err)
	defer b.Close()
	assert.NoError(t, echo(b, "fresh"))
	assert.Len(t, up.upgrades(), 2, "a new connection")
	assert.True(t, up.upgrades()[0].isClosed(), "the wedged one is closed")
	c, err := d.Dial(ctx, "t", "ns", "p", 80)
	require.NoError(t, err)
	defer c.Close()
	assert.Len(t, up.upgrades(), 2, "the new connection carries the next stream")
}

// TestANewPodOfTheNameGetsANewConnection: a connection reaches the pod
// the API server found when it was made, so a dial for another pod of the
// same name (its UID in the dial's context: a volume holder replaced)
// makes a new connection, never a stream on the old one, which some
// kubelets never refuse (kwok's hung until the request timed out).
func TestANewPodOfTheNameGetsANewConnection(t *testing.T) {
	ctx := context.Background()
	d, up := startFake(t, Options{})
	a, err := d.Dial(WithPodUID(ctx, "uid-1"), "t", "ns", "p", 80)
	require.NoError(t, err)
	defer a.Close()
	b, err := d.Dial(WithPodUID(ctx, "uid-1"), "t", "ns", "p", 80)
	require.NoError(t, err)
	defer b.Close()
	assert.Len(t, up.upgrades(), 1, "the same pod: one connection")

	c, err := d.Dial(WithPodUID(ctx, "uid-2"), "t", "ns", "p", 80)
	require.NoError(t, err)
	defer c.Close()
	assert.NoError(t, echo(c, "the new pod"))
	assert.Len(t, up.upgrades(), 2, "another pod of the name: another connection")
	assert.Equal(t, "t/ns/p:80", c.RemoteAddr().String(), "named as before: a UID is no part of a pod's name")
}

// TestRefusedStreamRetiresConnection: a stream the kubelet refuses (its
// error stream says why) retires the shared connection: it may reach a
// pod that is gone, another made under its name since, so the next Dial
// makes a new connection, and the old one closes once its last stream
// ends.
func TestRefusedStreamRetiresConnection(t *testing.T) {
	ctx := context.Background()
	d, up := startFake(t, Options{})
	a, err := d.Dial(ctx, "t", "ns", "p", 80)
	require.NoError(t, err)
	up.upgrades()[0].refuseStreams()
	b, err := d.Dial(ctx, "t", "ns", "p", 80)
	require.NoError(t, err)
	assert.ErrorContains(t, <-b.remoteErr, "no such pod sandbox", "the kubelet's verdict, read after the retire")
	b.Close()
	assert.NoError(t, echo(a, "still here"), "a stream opened before the refusal")
	assert.False(t, up.upgrades()[0].isClosed(), "open while a stream is on it")

	c, err := d.Dial(ctx, "t", "ns", "p", 80)
	require.NoError(t, err)
	defer c.Close()
	assert.NoError(t, echo(c, "fresh"))
	assert.Len(t, up.upgrades(), 2, "a new connection")
	a.Close()
	assert.True(t, up.upgrades()[0].isClosed(), "the retired one closes with its last stream")
}

// TestCloseIdleNeverHandsOutClosingConnection runs a Dial exactly between
// closeIdle choosing an idle connection and closing it: the Dial must get
// a new connection, not the one about to close.
func TestCloseIdleNeverHandsOutClosingConnection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		d, up := startFake(t, Options{IdleTimeout: time.Minute})
		got := make(chan *Conn, 1)
		errs := make(chan error, 1)
		d.hookIdlePicked = func() {
			d.hookIdlePicked = nil
			c, err := d.Dial(ctx, "t", "ns", "p", 80)
			errs <- err
			got <- c
		}
		first, err := d.Dial(ctx, "t", "ns", "p", 80)
		require.NoError(t, err)
		first.Close()

		time.Sleep(2 * time.Minute) // past the idle timeout: closeIdle runs the hook
		synctest.Wait()
		require.NoError(t, <-errs)
		c := <-got
		defer c.Close()
		assert.True(t, up.upgrades()[0].isClosed(), "the idle connection is closed")
		assert.NoError(t, echo(c, "survives closeIdle"))
		assert.Len(t, up.upgrades(), 2, "the Dial racing closeIdle opened a new connection")
	})
}

// TestIdleConnectionClosedAfterTimeout: a connection with open streams
// stays however long they last; once its last stream closes it stays for
// IdleTimeout, then closes, and the next Dial opens a new one.
func TestIdleConnectionClosedAfterTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		d, up := startFake(t, Options{IdleTimeout: time.Minute})
		c, err := d.Dial(ctx, "t", "ns", "p", 80)
		require.NoError(t, err)
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		require.False(t, up.upgrades()[0].isClosed(), "closed under an open stream")
		require.NoError(t, echo(c, "busy"))

		c.Close()
		time.Sleep(59 * time.Second)
		synctest.Wait()
		require.False(t, up.upgrades()[0].isClosed(), "closed before IdleTimeout")
		// The supervisor checks every IdleTimeout/4: closed by 1m15s.
		time.Sleep(16 * time.Second)
		synctest.Wait()
		require.True(t, up.upgrades()[0].isClosed(), "still open after IdleTimeout")

		c, err = d.Dial(ctx, "t", "ns", "p", 80)
		require.NoError(t, err)
		defer c.Close()
		assert.NoError(t, echo(c, "again"))
		assert.Len(t, up.upgrades(), 2)
	})
}
