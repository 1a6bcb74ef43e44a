// Package concourse starts a real Concourse v8.2.5 web node for tests: a
// private PostgreSQL cluster (Debian's package), `concourse web` with its
// ATC API and TSA on loopback, keys made by `concourse generate-key`, and
// fly logged in as a local user of team main. jetway's registration is
// tested against it, unmodified (docs/testing.md, issue 28). It also
// starts a stock Concourse containerd worker registered with it
// (stock.go), the reference jetway's benchmarks compare with (issue 41).
package concourse

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/jetway-ci/jetway/integration/cluster"
)

// Environment variables naming the binaries; the Makefile sets them from
// CONCOURSE_BIN and FLY_BIN.
const (
	EnvConcourseBin = "JETWAY_CONCOURSE_BIN"
	EnvFlyBin       = "JETWAY_FLY_BIN"
)

// ErrMissing means a binary the web node needs is not there.
var ErrMissing = errors.New("concourse web node prerequisites missing")

// The local user fly logs in as, a member of team main.
const (
	User     = "test"
	Password = "test"
	Team     = "main"
)

// Client is an OAuth client of the web node that the web node takes for a
// worker: its client_credentials tokens may register workers over the REST
// API (`--add-client` and `--system-claim-value`).
type Client struct {
	ID, Secret string
}

// Options configure one web node. The zero value is a web node with one
// authorized worker key and no REST client.
type Options struct {
	// ConcourseBin and FlyBin are the binaries; default $JETWAY_CONCOURSE_BIN
	// and $JETWAY_FLY_BIN, else ../shared/concourse/bin/{concourse,fly}
	// beside this module's root.
	ConcourseBin, FlyBin string
	// PostgresBinDir holds initdb, postgres and createdb; default
	// $JETWAY_POSTGRES_BIN_DIR, else the newest /usr/lib/postgresql/*/bin.
	PostgresBinDir string
	// Clients may register workers over the REST API.
	Clients []Client
	// HeartbeatInterval is the TSA's --tsa-heartbeat-interval (the web
	// node's default, 30 s, when zero); a worker's TTL is twice it.
	HeartbeatInterval time.Duration
	// GCInterval, when set, is both --gc-interval and
	// --component-runner-interval (defaults 30 s and 10 s). The garbage
	// collector's worker collector is what turns a landing worker landed
	// and deletes a retiring one, so with the defaults `fly land-worker`
	// takes up to 40 s to reach the worker.
	GCInterval time.Duration
	// NoP2P runs the web node without --enable-p2p-volume-streaming: it
	// relays every volume between two workers itself.
	NoP2P bool
	// Args are more flags for `concourse web`.
	Args []string
}

// WebNode is a running web node. Stop it when done (ForTest does).
type WebNode struct {
	// URL is the ATC's, http://127.0.0.1:<port>; fly's target `local`.
	URL string
	// TSAAddr is the TSA's SSH address, 127.0.0.1:<port>.
	TSAAddr string
	// TSAPublicKey is the path of the TSA's public host key, one
	// authorized_keys line (what jetway's --concourse-tsa-public-key takes).
	TSAPublicKey string
	// WorkerKey is the path of a private key the TSA authorizes, as
	// `concourse generate-key -t ssh` writes it: PEM typed "PRIVATE KEY"
	// around PKCS#1 DER (ParseWorkerKey reads it); jetway's
	// --concourse-worker-key takes it. WorkerPublicKey is its public half.
	WorkerKey, WorkerPublicKey string
	// Clients are Options.Clients.
	Clients []Client
	// Dir holds everything: keys, logs, PostgreSQL's data, fly's HOME.
	Dir string

	concourseBin, flyBin string
	keysDir              string
	pg                   *postgres
	web                  *process

	keysMu   sync.Mutex // authorized keys file and its reload
	stopOnce sync.Once
}

// StartupTimeout bounds Start in tests.
const StartupTimeout = 2 * time.Minute

// Start brings up PostgreSQL and a web node and logs fly in. On error
// nothing is left running. Its folder is under $JETWAY_CLUSTER_DIR when
// set, so that integration/leftovers.sh sees a process left behind.
func Start(ctx context.Context, opts Options) (*WebNode, error) {
	concourseBin, flyBin, pgBin, err := binaries(opts)
	if err != nil {
		return nil, err
	}
	root := os.Getenv(cluster.EnvWorkDir)
	if root != "" {
		if err := os.MkdirAll(root, 0o755); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp(root, "jetway-concourse-")
	if err != nil {
		return nil, err
	}
	// PostgreSQL runs as another user, in a folder below this one.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	w := &WebNode{Dir: dir, Clients: opts.Clients, concourseBin: concourseBin, flyBin: flyBin,
		keysDir: filepath.Join(dir, "keys")}
	if err := w.start(ctx, pgBin, opts); err != nil {
		err = fmt.Errorf("start concourse web node: %w", err)
		if w.web != nil {
			err = fmt.Errorf("%w; last lines of web.log:\n%s", err, indent(w.web.logTail(30)))
		}
		w.Stop()
		return nil, err
	}
	return w, nil
}

func (w *WebNode) start(ctx context.Context, pgBin string, opts Options) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() (err error) {
		w.pg, err = startPostgres(gctx, pgBin, filepath.Join(w.Dir, "pg"), "concourse")
		return err
	})
	g.Go(func() error { return w.generateKeys(gctx) })
	if err := g.Wait(); err != nil {
		return err
	}
	if err := w.startWeb(ctx, opts); err != nil {
		return err
	}
	if out, err := w.Fly("login", "-c", w.URL, "-u", User, "-p", Password, "-n", Team); err != nil {
		return fmt.Errorf("fly login: %w\n%s", err, out)
	}
	return nil
}

// webAttempts bounds the web node's starts: a port picked free may be
// taken before the web node binds it (a connection's source port).
const webAttempts = 3

func (w *WebNode) startWeb(ctx context.Context, opts Options) error {
	for attempt := 1; ; attempt++ {
		err := w.startWebOnce(ctx, opts)
		if err == nil || attempt == webAttempts || ctx.Err() != nil ||
			!strings.Contains(w.web.logTail(50), "address already in use") {
			return err
		}
		w.web.stop(syscall.SIGKILL, 0)
	}
}

func (w *WebNode) startWebOnce(ctx context.Context, opts Options) error {
	ports, err := freePorts(4)
	if err != nil {
		return err
	}
	api, debug, tsa, tsaDebug := ports[0], ports[1], ports[2], ports[3]
	w.URL = "http://127.0.0.1:" + strconv.Itoa(api)
	w.TSAAddr = "127.0.0.1:" + strconv.Itoa(tsa)
	args := []string{"web",
		"--postgres-socket", w.pg.socketDir, "--postgres-port", pgPort,
		"--postgres-user", "postgres", "--postgres-database", "concourse",
		"--session-signing-key", filepath.Join(w.keysDir, "session_signing_key"),
		"--tsa-host-key", filepath.Join(w.keysDir, "tsa_host_key"),
		"--tsa-authorized-keys", w.authorizedKeys(),
		"--bind-ip", "127.0.0.1", "--bind-port", strconv.Itoa(api),
		"--debug-bind-ip", "127.0.0.1", "--debug-bind-port", strconv.Itoa(debug),
		"--tsa-bind-ip", "127.0.0.1", "--tsa-bind-port", strconv.Itoa(tsa),
		"--tsa-debug-bind-ip", "127.0.0.1", "--tsa-debug-bind-port", strconv.Itoa(tsaDebug),
		"--peer-address", "127.0.0.1", "--external-url", w.URL,
		"--add-local-user", User + ":" + Password, "--main-team-local-user", User,
	}
	if !opts.NoP2P {
		args = append(args, "--enable-p2p-volume-streaming")
	}
	if len(opts.Clients) > 0 {
		// The flag replaces its default, the TSA's own client, which must
		// stay a system client for the TSA to register workers.
		args = append(args, "--system-claim-value", "concourse-worker")
		for _, c := range opts.Clients {
			args = append(args, "--add-client", c.ID+":"+c.Secret, "--system-claim-value", c.ID)
		}
	}
	if opts.HeartbeatInterval > 0 {
		args = append(args, "--tsa-heartbeat-interval", opts.HeartbeatInterval.String())
	}
	if opts.GCInterval > 0 {
		args = append(args, "--gc-interval", opts.GCInterval.String(),
			"--component-runner-interval", opts.GCInterval.String())
	}
	args = append(args, opts.Args...)
	w.web, err = startProcess("concourse web", filepath.Join(w.Dir, "web.log"), w.concourseBin, args, webEnv(), nil)
	if err != nil {
		return err
	}
	return w.waitReady(ctx)
}

// webEnv is the test's environment without CONCOURSE_* variables, which
// `concourse web` would take as flags.
func webEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CONCOURSE_") {
			env = append(env, kv)
		}
	}
	return env
}

// waitReady returns once the API answers /api/v1/info and the TSA accepts
// connections.
func (w *WebNode) waitReady(ctx context.Context) error {
	client := &http.Client{Timeout: 2 * time.Second}
	defer client.CloseIdleConnections()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if w.answers(ctx, client) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s/api/v1/info and the TSA: %w", w.URL, ctx.Err())
		case <-w.web.done:
			return errors.New("concourse web exited")
		case <-tick.C:
		}
	}
}

func (w *WebNode) answers(ctx context.Context, client *http.Client) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.URL+"/api/v1/info", nil)
	if err != nil {
		return false
	}
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false
	}
	conn, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, "tcp", w.TSAAddr)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

// Stop stops the web node (SIGTERM, as an operator would), then PostgreSQL
// (as `pg_ctl stop -m fast`), each killed if it takes over 10 s, and
// removes the folder unless $JETWAY_KEEP_CLUSTERS is 1. It is idempotent.
func (w *WebNode) Stop() {
	w.stopOnce.Do(func() {
		if w.web != nil {
			w.web.stop(syscall.SIGTERM, 10*time.Second)
		}
		w.pg.stop()
		if os.Getenv(cluster.EnvKeep) != "1" {
			_ = os.RemoveAll(w.Dir)
		}
	})
}

// Logs returns the last n lines of the web node's log and of PostgreSQL's.
func (w *WebNode) Logs(n int) string {
	return fmt.Sprintf("web.log:\n%s\npostgres.log:\n%s",
		indent(tail(filepath.Join(w.Dir, "web.log"), n)),
		indent(tail(filepath.Join(w.Dir, "pg", "postgres.log"), n)))
}

// freePorts picks n distinct free loopback ports below the ephemeral range
// (cluster.FreeAddr).
func freePorts(n int) ([]int, error) {
	seen := map[int]bool{}
	var ports []int
	for len(ports) < n {
		addr, err := cluster.FreeAddr()
		if err != nil {
			return nil, err
		}
		_, p, _ := net.SplitHostPort(addr)
		port, _ := strconv.Atoi(p)
		if !seen[port] {
			seen[port] = true
			ports = append(ports, port)
		}
	}
	return ports, nil
}

// PID is the web node's process ID (benchmarks read its CPU time).
func (w *WebNode) PID() int { return w.web.cmd.Process.Pid }
