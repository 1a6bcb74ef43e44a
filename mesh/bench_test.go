//go:build linux

package mesh

// BenchmarkMesh is `make bench-mesh`: real Mesh members (New, Start, mutual
// TLS 1.3 with test-CA identities) on loopback against plain TLS 1.3
// connections with the same certificates, both through a delay proxy, in
// one run. It prints a table at the end; docs/mesh.md says which settings
// it chose and why.
//
//	go test -run '^$' -bench BenchmarkMesh -benchtime 1x -timeout 30m ./mesh/
//
// MESH_BENCH_BYTES (e.g. 256MiB) shrinks the transfers, MESH_BENCH_ROUNDS
// (default 2) sets how many mesh/TLS pairs each throughput case runs (the
// medians are reported), MESH_BENCH_INFLIGHT (e.g. 32MiB) changes the
// link's window. To measure what each setting gains: MESH_BENCH_POOL sets
// Options.BulkConns (-1: none), MESH_BENCH_BULK_WINDOW and
// MESH_BENCH_CALL_WINDOW set the streams' windows.

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/internal/delayproxy"
	"github.com/jetway-ci/jetway/internal/meshtest"
)

const (
	benchPiece   = 128 << 10 // the plain TLS sender's Write
	benchRead    = 256 << 10 // every receiver's Read
	benchCalls   = 200       // calls in the latency case
	benchWarm    = 10        // of them, not counted: the bulk streams ramp up
	benchMaxCall = 15 * time.Second
	benchBulk    = 4 // volume streams beside the calls: 2 up, 2 down
)

// benchLink is what the delay proxy models: a one-way delay, and the bytes
// in flight a direction of one connection may hold, which plays the TCP
// window (delayproxy.WithMaxInFlight).
type benchLink struct {
	name     string
	oneWay   time.Duration
	inFlight int64
}

// The default window, 2 MiB in flight per direction, is what a TCP
// connection gets from Linux's default tcp_rmem limit (6 MiB: a ~4 MiB
// window), as gateways run unless an operator raises it: one connection
// carries ~105 MB/s at RTT 40 ms, so eight carry eight times that.
func benchLinks(b *testing.B) []benchLink {
	inFlight := envSize(b, "MESH_BENCH_INFLIGHT", 2<<20)
	return []benchLink{
		{"rtt=0", 0, inFlight},
		{"rtt=40ms", 20 * time.Millisecond, inFlight},
	}
}

// benchResult is one row of the table.
type benchResult struct {
	link, kase       string
	mesh, plain      float64 // MB/s
	ratio, cpu       float64 // mesh/TLS rate, CPU per byte
	p50, p99, idle50 float64 // calls in ms: with bulk, without
	bulkMBs          float64
}

func BenchmarkMesh(b *testing.B) {
	n := envSize(b, "MESH_BENCH_BYTES", 1<<30)
	pool = int(envSize(b, "MESH_BENCH_POOL", 0))
	if w := envSize(b, "MESH_BENCH_BULK_WINDOW", 0); w > 0 {
		defer func(old uint32) { bulkWindow = old }(bulkWindow)
		bulkWindow = uint32(w)
	}
	if w := envSize(b, "MESH_BENCH_CALL_WINDOW", 0); w > 0 {
		defer func(old uint32) { callWindow = old }(callWindow)
		callWindow = uint32(w)
	}
	rounds := int(envSize(b, "MESH_BENCH_ROUNDS", 2))
	var rows []benchResult
	for _, l := range benchLinks(b) {
		b.Run(l.name, func(b *testing.B) {
			env := startBenchEnv(b, l)
			for _, k := range []int{1, 8} {
				b.Run(fmt.Sprintf("streams=%d", k), func(b *testing.B) {
					r := env.throughput(b, k, n, rounds)
					r.link, r.kase = l.name, fmt.Sprintf("%d stream(s), %s", k, sizeName(n))
					rows = append(rows, r)
				})
			}
			b.Run("calls", func(b *testing.B) {
				r := env.calls(b)
				r.link, r.kase = l.name, "call with 4 volume streams"
				rows = append(rows, r)
			})
		})
	}
	printTable(rows, benchLinks(b)[0].inFlight)
}

func printTable(rows []benchResult, inFlight int64) {
	var s strings.Builder
	fmt.Fprintf(&s, "\nBenchmarkMesh, link window %s in flight per direction (delayproxy), GOMAXPROCS %d, bulk sessions %d, windows %s (calls) and %s (bulk)\n\n",
		sizeName(inFlight), runtime.GOMAXPROCS(0), cmp.Or(pool, defaultBulkConns),
		sizeName(int64(callWindow)), sizeName(int64(bulkWindow)))
	fmt.Fprintln(&s, "| link | case | mesh MB/s | TLS MB/s | mesh/TLS | CPU/byte mesh/TLS |")
	fmt.Fprintln(&s, "|---|---|---|---|---|---|")
	for _, r := range rows {
		if r.p99 == 0 {
			fmt.Fprintf(&s, "| %s | %s | %.0f | %.0f | %.2f | %.2f |\n", r.link, r.kase, r.mesh, r.plain, r.ratio, r.cpu)
		}
	}
	fmt.Fprintln(&s, "\n| link | case | call p50 ms | call p99 ms | idle call p50 ms | bulk MB/s |")
	fmt.Fprintln(&s, "|---|---|---|---|---|---|")
	for _, r := range rows {
		if r.p99 != 0 {
			fmt.Fprintf(&s, "| %s | %s | %.1f | %.1f | %.1f | %.0f |\n", r.link, r.kase, r.p50, r.p99, r.idle50, r.bulkMBs)
		}
	}
	fmt.Print(s.String())
}

// benchEnv is a pair of members, src dialing dst through a delay proxy,
// and a plain TLS server with dst's certificate behind a second proxy.
type benchEnv struct {
	src, dst *Mesh
	srcID    *Identity
	tlsAddr  string // the plain server's proxy
	sunk     chan int64
}

func startBenchEnv(b *testing.B, l benchLink) *benchEnv {
	c := meshtest.NewCA(b, "bench-ca")
	ids := map[string]*Identity{}
	for _, name := range []string{"src", "dst"} {
		id, err := LoadIdentity(c.Files(b, c, b.TempDir(), name, time.Now().Add(2*time.Hour)))
		require.NoError(b, err)
		ids[name] = id
	}
	env := &benchEnv{srcID: ids["src"], sunk: make(chan int64, 16)}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	b.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	proxy := func(target string) string {
		p, err := delayproxy.Start(ctx, target, l.oneWay, delayproxy.WithMaxInFlight(l.inFlight))
		require.NoError(b, err)
		wg.Go(func() {
			<-ctx.Done()
			p.Close()
		})
		return p.Addr()
	}
	start := func(opts Options) *Mesh {
		m, err := New(opts)
		require.NoError(b, err)
		wg.Go(func() { _ = m.Start(ctx) })
		<-m.Ready()
		return m
	}
	env.dst = start(Options{Identity: ids["dst"], Listen: "127.0.0.1:0", HTTP: benchHandler()})
	env.src = start(Options{Identity: ids["src"], Peers: []string{proxy(env.dst.Addr().String())}, BulkConns: pool})

	ln, err := tls.Listen("tcp", "127.0.0.1:0", ids["dst"].ServerConfig())
	require.NoError(b, err)
	wg.Go(func() {
		<-ctx.Done()
		ln.Close()
	})
	wg.Go(func() { env.servePlain(ln, &wg) })
	env.tlsAddr = proxy(ln.Addr().String())

	deadline := time.Now().Add(20 * time.Second)
	for !env.ready() {
		require.True(b, time.Now().Before(deadline), "the mesh did not come up")
		select {
		case <-env.src.Changed():
		case <-time.After(10 * time.Millisecond):
		}
	}
	// A first transfer warms both paths up (TLS record sizes, windows).
	env.meshPut(b, 8<<20)
	return env
}

// pool is Options.BulkConns of the benchmark's members.
var pool int

// ready says src has its session with dst, and its bulk sessions.
func (e *benchEnv) ready() bool {
	s := e.src.session("dst")
	return s != nil && s.bulkSessions() == e.src.opts.BulkConns
}

// benchHandler serves dst's side of the mesh cases: a sink for uploads, a
// source for downloads, and a small call.
func benchHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /sink", func(w http.ResponseWriter, r *http.Request) {
		n, err := drain(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprint(w, n)
	})
	mux.HandleFunc("GET /source", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.FormatInt(1<<50, 10))
		rc := http.NewResponseController(w)
		for r.Context().Err() == nil {
			_ = rc.SetWriteDeadline(time.Now().Add(time.Second))
			if _, err := w.Write(benchPayload[:benchPiece]); err != nil {
				return
			}
		}
	})
	mux.HandleFunc("GET /call", func(w http.ResponseWriter, r *http.Request) {
		w.Write(benchPayload[:1<<10])
	})
	return mux
}

// benchPayload is what every sender sends.
var benchPayload = func() []byte {
	b := make([]byte, 1<<20)
	for i := range b {
		b[i] = byte(i * 7919 >> 3)
	}
	return b
}()

// payload reads n bytes of benchPayload, as a file would give them.
type payload struct{ n int64 }

func (p *payload) Read(b []byte) (int, error) {
	if p.n <= 0 {
		return 0, io.EOF
	}
	k := copy(b[:min(int64(len(b)), p.n)], benchPayload)
	p.n -= int64(k)
	return k, nil
}

// servePlain reads each plain TLS connection to its end, then answers one
// byte, as the mesh's sink answers its PUT.
func (e *benchEnv) servePlain(ln net.Listener, wg *sync.WaitGroup) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		wg.Go(func() {
			defer c.Close()
			n, err := drain(c)
			if err == nil {
				_, err = c.Write([]byte{1})
			}
			if err != nil {
				n = -1
			}
			e.sunk <- n
		})
	}
}

// transfer is one measured transfer of n bytes over k connections.
type transfer struct {
	rate, cpuPerByte float64
}

// throughput runs rounds pairs of a mesh and a plain TLS transfer of n
// bytes over k streams or connections, alternating their order, and
// reports the medians.
func (e *benchEnv) throughput(b *testing.B, k int, n int64, rounds int) benchResult {
	var mesh, plain, ratio, cpu []float64
	for i := range rounds {
		var m, p transfer
		if i%2 == 0 {
			m, p = e.meshTransfer(b, k, n), e.plainTransfer(b, k, n)
		} else {
			p, m = e.plainTransfer(b, k, n), e.meshTransfer(b, k, n)
		}
		mesh, plain = append(mesh, m.rate/1e6), append(plain, p.rate/1e6)
		ratio, cpu = append(ratio, m.rate/p.rate), append(cpu, m.cpuPerByte/p.cpuPerByte)
	}
	r := benchResult{mesh: median(mesh), plain: median(plain), ratio: median(ratio), cpu: median(cpu)}
	b.ReportMetric(r.mesh, "mesh-MB/s")
	b.ReportMetric(r.plain, "tls-MB/s")
	b.ReportMetric(r.ratio, "mesh/tls")
	b.ReportMetric(r.cpu, "cpu-mesh/tls")
	return r
}

func (e *benchEnv) meshTransfer(b *testing.B, k int, n int64) transfer {
	return measure(b, n, func() {
		var wg sync.WaitGroup
		for range k {
			wg.Go(func() { e.meshPut(b, n/int64(k)) })
		}
		wg.Wait()
	})
}

// meshPut sends n bytes with a volume stream's PUT.
func (e *benchEnv) meshPut(b *testing.B, n int64) {
	req, err := http.NewRequest(http.MethodPut, "http://dst/sink", &payload{n})
	require.NoError(b, err)
	req.ContentLength = n
	resp, err := e.src.BulkClient().Do(req)
	require.NoError(b, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(b, err)
	require.Equal(b, strconv.FormatInt(n, 10), string(body))
}

func (e *benchEnv) plainTransfer(b *testing.B, k int, n int64) transfer {
	conns := make([]*tls.Conn, k)
	cfg := e.srcID.ClientConfig()
	cfg.NextProtos = nil
	for i := range conns {
		c, err := net.Dial("tcp", e.tlsAddr)
		require.NoError(b, err)
		conns[i] = tls.Client(c, cfg)
		require.NoError(b, conns[i].Handshake())
		defer conns[i].Close()
	}
	return measure(b, n, func() {
		var wg sync.WaitGroup
		for _, c := range conns {
			wg.Go(func() {
				buf := make([]byte, benchPiece)
				_, err := io.CopyBuffer(struct{ io.Writer }{c}, &payload{n / int64(k)}, buf)
				require.NoError(b, err)
				require.NoError(b, c.CloseWrite())
				_, err = io.ReadFull(c, buf[:1])
				require.NoError(b, err)
			})
		}
		wg.Wait()
		for range k {
			require.Equal(b, n/int64(k), <-e.sunk)
		}
	})
}

// measure times f, which moves n bytes, and the CPU time the process spent
// meanwhile (senders, proxies and receivers alike).
func measure(b *testing.B, n int64, f func()) transfer {
	start, cpu := time.Now(), cpuTime(b)
	f()
	took := time.Since(start)
	return transfer{rate: float64(n) / took.Seconds(), cpuPerByte: (cpuTime(b) - cpu).Seconds() / float64(n)}
}

// calls times small API calls from src to dst, first alone, then while
// volume streams run both ways.
func (e *benchEnv) calls(b *testing.B) benchResult {
	idle := e.timeCalls(b, 50)
	ctx, stop := context.WithCancel(context.Background())
	var bulk sync.WaitGroup
	moved := make([]int64, benchBulk)
	for i := range benchBulk {
		bulk.Go(func() { moved[i] = e.bulk(ctx, i%2 == 0) })
	}
	start := time.Now()
	took := e.timeCalls(b, benchCalls)
	elapsed := time.Since(start)
	stop()
	bulk.Wait()
	var total int64
	for _, n := range moved {
		total += n
	}
	r := benchResult{p50: percentile(took, 0.5), p99: percentile(took, 0.99), idle50: percentile(idle, 0.5),
		bulkMBs: float64(total) / elapsed.Seconds() / 1e6}
	b.ReportMetric(r.p50, "p50-ms")
	b.ReportMetric(r.p99, "p99-ms")
	b.ReportMetric(r.idle50, "idle-p50-ms")
	b.ReportMetric(r.bulkMBs, "bulk-MB/s")
	return r
}

// timeCalls makes up to calls small GETs one after the other and returns
// their times in ms, less the first benchWarm.
func (e *benchEnv) timeCalls(b *testing.B, calls int) []float64 {
	var took []float64
	start := time.Now()
	for i := 0; i < calls && time.Since(start) < benchMaxCall; i++ {
		t := time.Now()
		resp, err := e.src.Client().Get("http://dst/call")
		require.NoError(b, err)
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.NoError(b, err)
		if i >= benchWarm {
			took = append(took, float64(time.Since(t))/float64(time.Millisecond))
		}
	}
	return took
}

// bulk runs one volume stream, an upload or a download, until ctx ends,
// and returns the bytes it moved.
func (e *benchEnv) bulk(ctx context.Context, upload bool) int64 {
	if upload {
		p := &payload{1 << 50}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPut, "http://dst/sink", p)
		req.ContentLength = p.n
		resp, err := e.src.BulkClient().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return 1<<50 - p.n
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://dst/source", nil)
	resp, err := e.src.BulkClient().Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	n, _ := drain(resp.Body)
	return n
}

// drain reads r to its end in benchRead pieces and counts the bytes.
func drain(r io.Reader) (int64, error) {
	buf := make([]byte, benchRead)
	var n int64
	for {
		k, err := r.Read(buf)
		n += int64(k)
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

func percentile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	v = slices.Sorted(slices.Values(v))
	return v[int(math.Ceil(p*float64(len(v))))-1]
}

func median(v []float64) float64 {
	v = slices.Sorted(slices.Values(v))
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// envSize reads a size (a count, or with KiB, MiB, GiB) from the
// environment.
func envSize(b *testing.B, name string, def int64) int64 {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	unit := int64(1)
	for suffix, u := range map[string]int64{"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30} {
		if rest, ok := strings.CutSuffix(s, suffix); ok {
			s, unit = rest, u
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	require.NoError(b, err, name)
	return n * unit
}

func sizeName(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return strconv.FormatInt(n>>30, 10) + " GiB"
	case n >= 1<<20:
		return strconv.FormatInt(n>>20, 10) + " MiB"
	}
	return strconv.FormatInt(n>>10, 10) + " KiB"
}
