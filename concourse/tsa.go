package concourse

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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
	// Rebalance, if set, is how often Forward registers a worker again
	// on a new connection (--rebalance-interval); Drain bounds how long
	// the one before drains (default DefaultDrain).
	Rebalance, Drain time.Duration
}

// Event is what forward-worker writes on stdout: "registered" once, then
// "heartbeated" at each heartbeat the TSA made.
type Event struct {
	Type string `json:"event"`
	// command, on "registered", runs a one-shot command for the worker
	// over the registration's own connection (nil: Web.Command).
	command func(ctx context.Context, command string) ([]byte, error)
	// From, To and Err are Forward's own events': "rebalanced" (the
	// TSAs' addresses) and "rebalance-failed".
	From, To string `json:"-"`
	Err      error  `json:"-"`
}

// ErrHostKey: the TSA presented a host key not among HostKeys.
var ErrHostKey = errors.New("the TSA's host key is not the one configured (--concourse-tsa-public-key)")

// dial connects to one of the TSAs, trying each in turn from a random
// one, and authenticates with the worker key; it returns the connection
// and the TSA's address, or why each failed.
func (t TSA) dial(ctx context.Context) (*ssh.Client, string, error) {
	return t.dialAvoiding(ctx, "")
}

// dialAvoiding is dial, trying avoid last where there are other
// addresses.
func (t TSA) dialAvoiding(ctx context.Context, avoid string) (*ssh.Client, string, error) {
	if len(t.Addrs) == 0 {
		return nil, "", errors.New("no TSA address (concourse-tsa)")
	}
	order := rand.Perm(len(t.Addrs))
	if i := slices.IndexFunc(order, func(i int) bool { return t.Addrs[i] == avoid }); i >= 0 && len(order) > 1 {
		order = append(slices.Delete(order, i, i+1), order[i]) // the others first
	}
	var errs []error
	for _, i := range order {
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
	sess, stderr, err := start(c, command, w, out)
	if err != nil {
		return err
	}
	defer sess.Close()
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
	return finish(err, stderr, command)
}

// start starts command for worker w on c, its JSON on stdin, stdout to
// out; stderr keeps the start of what it writes there.
func start(c *ssh.Client, command string, w wire.Worker, out io.Writer) (sess *ssh.Session, stderr *capped.Buffer, err error) {
	sess, err = c.NewSession()
	if err != nil {
		return nil, nil, fmt.Errorf("%s: open a session: %w", verb(command), err)
	}
	payload, _ := json.Marshal(w)
	sess.Stdin = bytes.NewReader(payload)
	sess.Stdout = out
	stderr = &capped.Buffer{Limit: maxStderr}
	sess.Stderr = stderr
	if err := sess.Start(command); err != nil {
		sess.Close()
		return nil, nil, fmt.Errorf("%s: %w", verb(command), err)
	}
	return sess, stderr, nil
}

// finish is the error of command, which ended with err: one naming its
// status and stderr if it ended with a status other than 0.
func finish(err error, stderr *capped.Buffer, command string) error {
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
//
// Every Rebalance (if set), it registers the worker again on a new
// connection, to another of Addrs where there are several, as a stock
// worker's --rebalance-interval does, and drains the one before: the TSA
// takes no new connection through it and ends its forward-worker once
// the web node's connections through it ended (a process's output, a
// volume's stream), or past Drain, when it is closed. A rebalance that
// fails keeps the registration it had.
func (t TSA) Forward(ctx context.Context, w wire.Worker, garden, baggageclaim http.Handler, on func(Event)) error {
	return t.ForwardLive(ctx, func() wire.Worker { return w }, garden, baggageclaim, on)
}

// ForwardLive is Forward of the worker as worker says it is now: a
// rebalance registers it as it is then, and a worker that is not running
// (landing, retiring) is not rebalanced, as a stock worker's drain stops
// its rebalancing.
func (t TSA) ForwardLive(ctx context.Context, worker func() wire.Worker, garden, baggageclaim http.Handler, on func(Event)) error {
	w := worker()
	var current atomic.Pointer[ssh.Client]
	command := func(ctx context.Context, command string) ([]byte, error) {
		out := &capped.Buffer{Limit: 1 << 20}
		err := run(ctx, current.Load(), command, w, out)
		return out.Bytes(), err
	}
	reg, err := t.register(ctx, "", w, garden, baggageclaim, on, command)
	if err != nil {
		return err
	}
	current.Store(reg.c)
	dctx, stopDrains := context.WithCancel(ctx)
	var drains sync.WaitGroup
	var draining atomic.Int32
	defer drains.Wait()
	defer stopDrains()
	var rebalance <-chan time.Time
	if t.Rebalance > 0 {
		tick := time.NewTicker(t.Rebalance)
		defer tick.Stop()
		rebalance = tick.C
	}
	for {
		select {
		case err := <-reg.done:
			reg.close()
			return err
		case <-ctx.Done():
			reg.interrupt()
			return ctx.Err()
		case <-rebalance:
			if draining.Load() >= maxDraining {
				continue // the ones before still drain: as a stock worker, no more
			}
			now := worker()
			if now.State != "" && now.State != "running" {
				continue // draining: its registration stays until the web node releases it
			}
			next, err := t.register(ctx, reg.addr, now, garden, baggageclaim, on, command)
			if err != nil {
				if on != nil {
					on(Event{Type: "rebalance-failed", Err: err})
				}
				continue
			}
			old := reg
			reg = next
			current.Store(reg.c)
			if on != nil {
				on(Event{Type: "rebalanced", From: old.addr, To: reg.addr})
			}
			draining.Add(1)
			drains.Go(func() {
				defer draining.Add(-1)
				old.drain(dctx, cmp.Or(t.Drain, DefaultDrain))
			})
		}
	}
}

// DefaultDrain is how long a registration left by a rebalance drains, as
// a stock worker's --connection-drain-timeout.
const DefaultDrain = time.Hour

// maxDraining bounds the registrations draining at once, as a stock
// worker's (5 active in all).
const maxDraining = 4

// registration is one connection to a TSA with forward-worker running on
// it: the worker's APIs served through its forwards.
type registration struct {
	c        *ssh.Client
	addr     string
	sess     *ssh.Session
	servers  []*http.Server
	done     chan error // forward-worker's end, once
	stop     context.CancelFunc
	wg       sync.WaitGroup
	shutdown sync.Once
}

// register connects to a TSA (another than avoid, where there is one)
// and starts forward-worker there.
func (t TSA) register(ctx context.Context, avoid string, w wire.Worker, garden, baggageclaim http.Handler, on func(Event),
	command func(context.Context, string) ([]byte, error)) (*registration, error) {
	c, addr, err := t.dialAvoiding(ctx, avoid)
	if err != nil {
		return nil, err
	}
	rctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	r := &registration{c: c, addr: addr, done: make(chan error, 1), stop: stop}
	serve := func(fwd string, h http.Handler) error {
		ln, err := c.Listen("tcp", fwd)
		if err != nil {
			return fmt.Errorf("TSA at %s: forward %s: %w", addr, fwd, err)
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: time.Minute}
		r.servers = append(r.servers, srv)
		// The SSH channels take no read deadline, which Garden's
		// hijacked connections need.
		r.wg.Go(func() { _ = srv.Serve(deadlineListener{ln}) })
		return nil
	}
	if err := serve(gardenForward, garden); err != nil {
		r.close()
		return nil, err
	}
	if err := serve(baggageclaimForward, baggageclaim); err != nil {
		r.close()
		return nil, err
	}
	r.wg.Go(func() { keepalive(rctx, c) })

	pr, pw := io.Pipe()
	r.wg.Go(func() {
		dec := json.NewDecoder(pr)
		for {
			var e Event
			if err := dec.Decode(&e); err != nil {
				_, _ = io.Copy(io.Discard, pr)
				return
			}
			if e.Type == "registered" {
				// The sweeps' commands ride the registration's connection
				// (the TSA takes any number of sessions on one): no
				// handshake each.
				e.command = command
			}
			if on != nil {
				on(e)
			}
		}
	})
	sess, stderr, err := start(c, "forward-worker --garden "+gardenForward+" --baggageclaim "+baggageclaimForward, w, pw)
	if err != nil {
		pw.Close()
		r.close()
		return nil, err
	}
	r.sess = sess
	r.wg.Go(func() {
		err := finish(sess.Wait(), stderr, "forward-worker")
		pw.Close()
		r.done <- err
	})
	return r, nil
}

// interrupt ends the registration at once: forward-worker interrupted,
// the connection closed.
func (r *registration) interrupt() {
	_ = r.sess.Signal(ssh.SIGINT)
	r.close()
}

// drain interrupts forward-worker, so that the TSA takes no new
// connection through this registration and ends it once those open
// ended; its servers close their idle connections. Past within, or when
// ctx ends, it is closed whatever is still open.
func (r *registration) drain(ctx context.Context, within time.Duration) {
	_ = r.sess.Signal(ssh.SIGINT)
	sctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for _, srv := range r.servers {
		go func() { _ = srv.Shutdown(sctx) }() // idle ones closed; the rest as they end
	}
	select {
	case <-r.done:
	case <-sctx.Done():
	}
	r.close()
}

// close closes the registration's servers and connection and waits for
// what it ran.
func (r *registration) close() {
	r.shutdown.Do(func() {
		r.stop()
		for _, srv := range r.servers {
			srv.Close()
		}
		if r.sess != nil {
			r.sess.Close()
		}
		r.c.Close()
		r.wg.Wait()
	})
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
