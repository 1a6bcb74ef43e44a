package concourse

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/jetway-ci/jetway/internal/capped"
	"github.com/jetway-ci/jetway/wire"
)

// The addresses forward-worker names for its two forwards. The TSA opens a
// port of its own for each and records it as the worker's; these only have
// to match between the command and the forward requests.
const (
	gardenForward       = "0.0.0.0:7777"
	baggageclaimForward = "0.0.0.0:7788"
)

// TSA reaches a web node's TSA.
type TSA struct {
	// Addrs are the host:port of each of the web node's TSAs (its web
	// nodes', each of which runs one): a connection tries them in turn,
	// from a random one, as a stock worker tries its --tsa-host's.
	Addrs []string
	// HostKeys are the TSA host keys accepted (--concourse-tsa-public-key).
	HostKeys []ssh.PublicKey
	// Key is the worker key the TSA authorizes (--concourse-worker-key).
	Key ssh.Signer
	// Timeout bounds dialing and the SSH handshake; default 10 s.
	Timeout time.Duration
}

// Event is what forward-worker writes on stdout: "registered" once, then
// "heartbeated" at each heartbeat the TSA made.
type Event struct {
	Type string `json:"event"`
	// command, on "registered", runs a one-shot command for the worker
	// over the registration's own connection (nil: Web.Command).
	command func(ctx context.Context, command string) ([]byte, error)
}

// ErrHostKey: the TSA presented a host key not among HostKeys.
var ErrHostKey = errors.New("the TSA's host key is not the one configured (--concourse-tsa-public-key)")

// dial connects to one of the TSAs, trying each in turn from a random
// one, and authenticates with the worker key; it returns the connection
// and the TSA's address, or why each failed.
func (t TSA) dial(ctx context.Context) (*ssh.Client, string, error) {
	if len(t.Addrs) == 0 {
		return nil, "", errors.New("no TSA address (concourse-tsa)")
	}
	var errs []error
	for _, i := range rand.Perm(len(t.Addrs)) {
		c, err := t.dialOne(ctx, t.Addrs[i])
		if err == nil {
			return c, t.Addrs[i], nil
		}
		if ctx.Err() != nil {
			return nil, "", err
		}
		errs = append(errs, err)
	}
	return nil, "", errors.Join(errs...)
}

// dialOne connects to the TSA at addr and authenticates.
func (t TSA) dialOne(ctx context.Context, addr string) (*ssh.Client, error) {
	timeout := t.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := (&net.Dialer{KeepAlive: 15 * time.Second}).DialContext(dctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("reach the TSA at %s: %w", addr, err)
	}
	// The handshake has no context of its own: a deadline on the
	// connection bounds it.
	_ = conn.SetDeadline(time.Now().Add(timeout))
	cfg := &ssh.ClientConfig{
		User: "jetway", // the TSA ignores it: the key is the identity
		Auth: []ssh.AuthMethod{ssh.PublicKeys(t.Key)},
		HostKeyCallback: func(_ string, _ net.Addr, key ssh.PublicKey) error {
			for _, k := range t.HostKeys {
				if k.Type() == key.Type() && bytes.Equal(k.Marshal(), key.Marshal()) {
					return nil
				}
			}
			return ErrHostKey
		},
		Timeout: timeout,
	}
	c, chans, reqs, err := ssh.NewClientConn(conn, addr, cfg)
	if err != nil {
		conn.Close()
		if errors.Is(err, ErrHostKey) {
			return nil, fmt.Errorf("TSA at %s: %w", addr, ErrHostKey)
		}
		return nil, fmt.Errorf("TSA at %s: SSH handshake (is the worker key in its --tsa-authorized-keys?): %w", addr, err)
	}
	_ = conn.SetDeadline(time.Time{})
	return ssh.NewClient(c, chans, reqs), nil
}

// maxStderr bounds what is kept of a command's stderr for its error.
const maxStderr = 4 << 10

// run runs command for worker w on c, its JSON on stdin, stdout to out. A
// command ending with a status other than 0 fails with its stderr. When
// ctx ends the command is interrupted and its session closed.
func run(ctx context.Context, c *ssh.Client, command string, w wire.Worker, out io.Writer) error {
	sess, err := c.NewSession()
	if err != nil {
		return fmt.Errorf("%s: open a session: %w", verb(command), err)
	}
	defer sess.Close()
	payload, _ := json.Marshal(w)
	sess.Stdin = bytes.NewReader(payload)
	sess.Stdout = out
	stderr := &capped.Buffer{Limit: maxStderr}
	sess.Stderr = stderr
	if err := sess.Start(command); err != nil {
		return fmt.Errorf("%s: %w", verb(command), err)
	}
	done := make(chan error, 1)
	go func() { done <- sess.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = sess.Signal(ssh.SIGINT)
		sess.Close() // the connection stays: it may carry other sessions
		<-done
		return ctx.Err()
	}
	var exit *ssh.ExitError
	if errors.As(err, &exit) {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = exit.Error()
		}
		return fmt.Errorf("%s: the TSA answered status %d: %s", verb(command), exit.ExitStatus(), msg)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", verb(command), err)
	}
	return nil
}

func verb(command string) string { v, _, _ := strings.Cut(command, " "); return v }

// Command runs a one-shot TSA command (land-worker, retire-worker,
// delete-worker, report-containers H..., sweep-containers, ...) for worker
// w on a connection of its own, and returns its stdout.
func (t TSA) Command(ctx context.Context, command string, w wire.Worker) ([]byte, error) {
	c, _, err := t.dial(ctx)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	out := &capped.Buffer{Limit: 1 << 20}
	if err := run(ctx, c, command, w, out); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// Forward registers worker w and keeps it registered: forward-worker, with
// the web node's connections to the worker's Garden and volume APIs
// served by garden and baggageclaim through the SSH connection's own
// forwards. on is called with each event forward-worker reports. It
// returns nil when the TSA ended the registration with status 0 (the web
// node landed or retired the worker), ctx's error when ctx ended (the
// connection is closed: the web node stalls the worker unless another
// gateway registers it), else why the registration broke.
func (t TSA) Forward(ctx context.Context, w wire.Worker, garden, baggageclaim http.Handler, on func(Event)) error {
	c, addr, err := t.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	tsa := addr
	serve := func(addr string, h http.Handler) (*http.Server, error) {
		ln, err := c.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("TSA at %s: forward %s: %w", tsa, addr, err)
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: time.Minute}
		// The SSH channels take no read deadline, which Garden's
		// hijacked connections need.
		wg.Go(func() { _ = srv.Serve(deadlineListener{ln}) })
		return srv, nil
	}
	gs, err := serve(gardenForward, garden)
	if err != nil {
		return err
	}
	defer gs.Close()
	bs, err := serve(baggageclaimForward, baggageclaim)
	if err != nil {
		return err
	}
	defer bs.Close()
	kctx, stopKeepalive := context.WithCancel(ctx)
	defer stopKeepalive()
	wg.Go(func() { keepalive(kctx, c) })

	pr, pw := io.Pipe()
	wg.Go(func() {
		dec := json.NewDecoder(pr)
		for {
			var e Event
			if err := dec.Decode(&e); err != nil {
				_, _ = io.Copy(io.Discard, pr)
				return
			}
			if e.Type == "registered" {
				// The sweeps' commands ride this connection (the TSA takes
				// any number of sessions on one): no handshake each.
				e.command = func(ctx context.Context, command string) ([]byte, error) {
					out := &capped.Buffer{Limit: 1 << 20}
					err := run(ctx, c, command, w, out)
					return out.Bytes(), err
				}
			}
			if on != nil {
				on(e)
			}
		}
	})
	err = run(ctx, c, "forward-worker --garden "+gardenForward+" --baggageclaim "+baggageclaimForward, w, pw)
	pw.Close()
	return err
}

// keepalive sends a request every 5 s, as Concourse's worker does, and
// closes the connection when one gets no answer within a minute: a TSA
// gone without a word is noticed.
func keepalive(ctx context.Context, c *ssh.Client) {
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		answered := make(chan error, 1)
		go func() {
			_, _, err := c.SendRequest("keepalive", true, []byte("sup"))
			answered <- err
		}()
		timer := time.NewTimer(time.Minute)
		select {
		case err := <-answered:
			timer.Stop()
			if err != nil {
				c.Close()
				return
			}
		case <-timer.C:
			c.Close()
			<-answered
			return
		case <-ctx.Done():
			timer.Stop()
			c.Close()
			<-answered
			return
		}
	}
}
