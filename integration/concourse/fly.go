package concourse

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jetway-ci/jetway/wire"
)

// FlyTarget is the name fly knows the web node by, in its own HOME.
const FlyTarget = "local"

// Fly runs fly against the web node (`fly -t local ARGS...`), logged in as
// User, and returns its standard output; an error carries its standard
// error.
func (w *WebNode) Fly(args ...string) (string, error) {
	return w.FlyContext(context.Background(), args...)
}

// FlyContext is Fly, killing fly when ctx ends (fly execute waits for its
// build).
func (w *WebNode) FlyContext(ctx context.Context, args ...string) (string, error) {
	home := filepath.Join(w.Dir, "home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, w.flyBin, append([]string{"-t", FlyTarget}, args...)...)
	cmd.Env = append(webEnv(), "HOME="+home)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("fly %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Workers lists the web node's workers with `fly workers --json` (rows
// of atc.Worker, the shape jetway registers them with), failing
// the test if fly fails.
func (w *WebNode) Workers(tb testing.TB) []wire.Worker {
	tb.Helper()
	out, err := w.Fly("workers", "--json")
	if err != nil {
		tb.Fatal(err)
	}
	var workers []wire.Worker
	if err := json.Unmarshal([]byte(out), &workers); err != nil {
		tb.Fatalf("parse fly workers --json: %v\n%s", err, out)
	}
	return workers
}

// ClientToken is an access token of c (client_credentials grant at
// /sky/issuer/token), for the REST API's worker endpoints:
// `POST /api/v1/workers?ttl=60s` with `Content-Type: application/json`.
func (w *WebNode) ClientToken(ctx context.Context, c Client) (string, error) {
	form := url.Values{"grant_type": {"client_credentials"}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL+"/sky/issuer/token", strings.NewReader(form.Encode()))
	if err != nil {
		return "", err
	}
	req.SetBasicAuth(c.ID, c.Secret)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Close = true // no idle connection outlives the call
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("token for client %s: %w", c.ID, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("token for client %s: %s: %s", c.ID, resp.Status, body)
	}
	var tok struct {
		AccessToken string `json:"access_token"`
	}
	if err := json.Unmarshal(body, &tok); err != nil || tok.AccessToken == "" {
		return "", fmt.Errorf("token for client %s: no access_token in %s", c.ID, body)
	}
	return tok.AccessToken, nil
}
