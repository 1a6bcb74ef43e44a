// Command tlsrecv is the receiving end of the agent benchmark's floor
// (integration/bench BenchmarkAgent): what an agent does with an input's
// bytes, without the mesh. It serves PUT /volumes/{handle}/stream-in over
// TLS 1.3 with mesh certificates (the mesh's own server settings: a
// client certificate from the mesh CA required) and streams each body
// into a volume server of its own on loopback (package volumes, as each
// of an agent's steps has), counting and hashing the bytes on the way, as
// the agent does with an input (agent/volumes.go putVolume). It answers
// 200 with {"bytes": N, "sha256": "...", "seconds": S}, S from the
// request's headers to the volume server's answer.
//
// It prints "listening ADDR" once it accepts, and serves until SIGTERM or
// SIGINT.
package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/mesh"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/volumes"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to accept on")
	ca := flag.String("ca", "", "the mesh CA (PEM)")
	cert := flag.String("cert", "", "this receiver's mesh certificate (PEM)")
	key := flag.String("key", "", "its key (PEM)")
	dir := flag.String("dir", "", "root of the volumes")
	flag.Parse()
	if err := run(*listen, *ca, *cert, *key, *dir); err != nil {
		fmt.Fprintf(os.Stderr, "tlsrecv: %v\n", err)
		os.Exit(1)
	}
}

func run(listen, ca, cert, key, dir string) error {
	id, err := mesh.LoadIdentity(ca, cert, key)
	if err != nil {
		return err
	}
	token := rand.Text()
	vs, err := volumes.Start(dir, ownership.TokenHash(token))
	if err != nil {
		return err
	}
	defer vs.Kill()
	cfg := id.ServerConfig()
	cfg.NextProtos = []string{"http/1.1"}
	ln, err := tls.Listen("tcp", listen, cfg)
	if err != nil {
		return err
	}
	r := &receiver{vs: vs, token: token, client: &http.Client{Transport: &http.Transport{Proxy: nil, DisableCompression: true}}}
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /volumes/{handle}/stream-in", r.streamIn)
	srv := &http.Server{Handler: mux}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Printf("listening %s\n", ln.Addr())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	select {
	case <-ctx.Done():
		return srv.Close()
	case err := <-served:
		return err
	}
}

type receiver struct {
	vs     *volumes.Server
	token  string // vs's
	client *http.Client
}

// streamIn makes the volume and streams the body into it.
func (rc *receiver) streamIn(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	handle := r.PathValue("handle")
	if err := os.MkdirAll(rc.vs.Path(handle), 0o755); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	u := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", rc.vs.Port()),
		Path: "/volumes/" + url.PathEscape(handle) + "/stream-in", RawQuery: r.URL.RawQuery}
	digest := steppod.NewDigest(r.Body)
	req, err := http.NewRequestWithContext(r.Context(), http.MethodPut, u.String(), digest)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	req.Header.Set("Content-Encoding", cmp.Or(r.Header.Get("Content-Encoding"), volumes.Raw))
	req.Header.Set("Authorization", "Bearer "+rc.token)
	resp, err := rc.client.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		http.Error(w, fmt.Sprintf("stream-in: %s: %s", resp.Status, body), http.StatusBadGateway)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	in := digest.Input("")
	_ = json.NewEncoder(w).Encode(map[string]any{"bytes": in.Bytes, "sha256": in.SHA256,
		"seconds": time.Since(start).Seconds()})
}
