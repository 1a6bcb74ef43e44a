package concourse

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// noDeadlines is a connection that takes no deadline, as an SSH channel.
type noDeadlines struct{ net.Conn }

func (noDeadlines) SetDeadline(time.Time) error      { return errors.New("deadline not supported") }
func (noDeadlines) SetReadDeadline(time.Time) error  { return errors.New("deadline not supported") }
func (noDeadlines) SetWriteDeadline(time.Time) error { return errors.New("deadline not supported") }

// pipeListener accepts the server ends of pipes its dial makes.
type pipeListener struct {
	conns  chan net.Conn
	closed chan struct{}
}

func (l *pipeListener) dial() net.Conn {
	c, s := net.Pipe()
	l.conns <- noDeadlines{s}
	return c
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}
func (l *pipeListener) Close() error   { close(l.closed); return nil }
func (l *pipeListener) Addr() net.Addr { return &net.TCPAddr{} }

// Garden's Run hijacks its connection: net/http does so only once its
// background read ended, by a read deadline an SSH channel does not take.
func TestHijackOnConnectionsWithoutDeadlines(t *testing.T) {
	ln := &pipeListener{conns: make(chan net.Conn), closed: make(chan struct{})}
	hijacked := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		conn, br, err := http.NewResponseController(w).Hijack()
		if !assert.NoError(t, err) {
			return
		}
		close(hijacked)
		defer conn.Close()
		line, _ := br.ReadString('\n')
		_, _ = io.WriteString(conn, "echo "+line)
	})}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(deadlineListener{ln}) }()
	defer func() { srv.Close(); <-done }()

	c := ln.dial()
	defer c.Close()
	_, err := io.WriteString(c, "POST /run HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
	require.NoError(t, err)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	select {
	case <-hijacked:
	case <-time.After(10 * time.Second):
		t.Fatal("the hijack never happened")
	}
	_, err = io.WriteString(c, "stdin\n")
	require.NoError(t, err)
	line, err := br.ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "echo stdin\n", line)
}

// A read past its deadline fails, and what arrives later is read next.
func TestReadDeadlinesKeepTheData(t *testing.T) {
	a, b := net.Pipe()
	c := withDeadlines(noDeadlines{a})
	defer c.Close()
	defer b.Close()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(20*time.Millisecond)))
	buf := make([]byte, 16)
	_, err := c.Read(buf)
	assert.ErrorIs(t, err, os.ErrDeadlineExceeded)
	go func() { _, _ = b.Write([]byte("late")) }()
	require.NoError(t, c.SetReadDeadline(time.Time{}))
	n, err := c.Read(buf)
	require.NoError(t, err)
	assert.Equal(t, "late", string(buf[:n]))
	b.Close()
	_, err = c.Read(buf)
	assert.ErrorIs(t, err, io.EOF)
}
