package integration

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"code.cloudfoundry.org/garden"
	gclient "code.cloudfoundry.org/garden/client"
	gconn "code.cloudfoundry.org/garden/client/connection"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestConcourseProcessMessagesAreCapped: a client sending a message past
// the cap (8 MiB) on a process's connection, here 64 MiB without a
// newline, sees its connection closed long before it finishes, and the
// refusal is counted; a stdin of a few MiB in one message, as a web node
// sends a resource script's request, arrives whole; the worker serves on.
func TestConcourseProcessMessagesAreCapped(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const name = "cwcap"
	g, srv, gc := gardenOfTarget(ctx, t, name)
	c, err := gc.Create(garden.ContainerSpec{Handle: "cwcap-1", RootFSPath: "docker:///busybox"})
	require.NoError(t, err)
	defer func() { assert.NoError(t, gc.Destroy("cwcap-1")) }()

	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	spec := `{"id":"flood","path":"cat"}`
	fmt.Fprintf(conn, "POST /containers/cwcap-1/processes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		len(spec), spec)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	first, err := br.ReadString('\n')
	require.NoError(t, err)
	assert.Contains(t, first, `"process_id":"flood"`)
	// The bound of the failure, not a wait for something not to happen:
	// a server that reads on takes all 64 MiB well within it.
	require.NoError(t, conn.SetWriteDeadline(time.Now().Add(time.Minute)))
	var written int64
	chunk := bytes.Repeat([]byte("x"), 1<<20)
	_, err = io.WriteString(conn, `{"process_id":"flood","source":0,"data":"`)
	for err == nil && written < 64<<20 {
		var n int
		n, err = conn.Write(chunk)
		written += int64(n)
	}
	require.Error(t, err, "the connection is closed before 64 MiB")
	assert.Less(t, written, int64(32<<20), "closed after about 8 MiB, and what the sockets buffer: %d bytes", written)
	assert.Equal(t, 1.0, metricValue(t, g, "jetway_concourse_garden_oversized_messages_total"))

	stdin := strings.Repeat("0123456789abcdef", 4<<20/16)
	var stdout bytes.Buffer
	p, err := c.Run(garden.ProcessSpec{ID: "request", Path: "wc", Args: []string{"-c"}},
		garden.ProcessIO{Stdin: strings.NewReader(stdin), Stdout: &stdout, Stderr: io.Discard})
	require.NoError(t, err)
	status, err := p.Wait()
	require.NoError(t, err)
	assert.Equal(t, 0, status)
	assert.Equal(t, "4194304", strings.TrimSpace(stdout.String()), "4 MiB of stdin in one message, whole")
	assert.Equal(t, 1.0, metricValue(t, g, "jetway_concourse_garden_oversized_messages_total"))
}

// TestConcourseGardenInfoLimitsAndRefusals: Garden's Info, BulkInfo and
// limits calls, through Garden's own client, answer as Garden's server
// does: the container active with its pod's IP, its processes and
// properties; an unknown handle's entry a ContainerNotFoundError; the
// limits Create was given. A call jetway does not serve (NetIn,
// StreamOut, Metrics) is an error naming it, and the worker serves on.
func TestConcourseGardenInfoLimitsAndRefusals(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const name = "cwinfo"
	_, _, gc := gardenOfTarget(ctx, t, name)
	limits := garden.Limits{CPU: garden.CPULimits{LimitInShares: 512}, Memory: garden.MemoryLimits{LimitInBytes: 100 << 20}}
	c, err := gc.Create(garden.ContainerSpec{Handle: "cwinfo-1", RootFSPath: "docker:///busybox", Limits: limits,
		Properties: garden.Properties{"user": "root"}})
	require.NoError(t, err)
	defer func() { assert.NoError(t, gc.Destroy("cwinfo-1")) }()
	p, err := c.Run(garden.ProcessSpec{ID: "hello", Path: "true"}, garden.ProcessIO{Stdout: io.Discard, Stderr: io.Discard})
	require.NoError(t, err)
	status, err := p.Wait()
	require.NoError(t, err)
	require.Equal(t, 0, status)

	pods := containerPods(ctx, t, clusters[0].Client.CoreV1().Pods(name), "cwinfo-1")
	require.Len(t, pods, 1)
	info, err := c.Info()
	require.NoError(t, err)
	assert.Equal(t, "active", info.State)
	assert.Equal(t, pods[0].Status.PodIP, info.ContainerIP, "the pod's IP")
	assert.NotEmpty(t, info.ContainerIP)
	assert.Equal(t, []string{"hello"}, info.ProcessIDs)
	assert.Equal(t, "root", info.Properties["user"])

	bulk, err := gc.BulkInfo([]string{"cwinfo-1", "no-such"})
	require.NoError(t, err)
	assert.Equal(t, info, bulk["cwinfo-1"].Info)
	assert.Nil(t, bulk["cwinfo-1"].Err)
	require.NotNil(t, bulk["no-such"].Err)
	assert.ErrorAs(t, bulk["no-such"].Err.Err, &garden.ContainerNotFoundError{})

	cpu, err := c.CurrentCPULimits()
	require.NoError(t, err)
	assert.Equal(t, limits.CPU, cpu)
	mem, err := c.CurrentMemoryLimits()
	require.NoError(t, err)
	assert.Equal(t, limits.Memory, mem)
	disk, err := c.CurrentDiskLimits()
	require.NoError(t, err)
	assert.Zero(t, disk, "none given")

	_, _, err = c.NetIn(8080, 8080)
	assert.ErrorContains(t, err, "do not serve Garden's POST /containers/cwinfo-1/net/in")
	_, err = c.StreamOut(garden.StreamOutSpec{Path: "/etc"})
	assert.ErrorContains(t, err, "do not serve Garden's GET /containers/cwinfo-1/files")
	_, err = c.Metrics()
	assert.ErrorContains(t, err, "do not serve Garden's GET /containers/cwinfo-1/metrics")
	_, err = gc.Lookup("cwinfo-1")
	assert.NoError(t, err, "the worker serves on")
}

// gardenOfTarget starts a gateway with target name on the first cluster,
// and serves its worker's Garden API: the gateway, the server and
// Garden's own client of it.
func gardenOfTarget(ctx context.Context, t *testing.T, name string) (*gateway, *httptest.Server, gclient.Client) {
	t.Helper()
	dir := t.TempDir()
	placeTarget(ctx, t, clusters[0], dir, name, "{}\n", "")
	g := startGateway(t, dir, gatewayOptions{state: newState(t)})
	g.waitTarget(t, name, 30*time.Second, inState("running"))
	srv := httptest.NewServer(g.containers.API(name))
	t.Cleanup(srv.Close)
	return g, srv, gclient.New(gconn.New("tcp", strings.TrimPrefix(srv.URL, "http://")))
}
