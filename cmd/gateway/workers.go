package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/jetway-ci/jetway/api"
	"github.com/jetway-ci/jetway/lifecycle"
	"github.com/jetway-ci/jetway/wire"
)

// apiFlags are how CLI commands reach a running gateway.
type apiFlags struct {
	url, token string
}

func (f *apiFlags) register(cmd *cobra.Command) {
	url := os.Getenv("JETWAY_URL")
	if url == "" {
		url = "http://127.0.0.1:8080"
	}
	cmd.Flags().StringVar(&f.url, "url", url, "gateway URL (env JETWAY_URL)")
	cmd.Flags().StringVar(&f.token, "token", os.Getenv("JETWAY_TOKEN"), "API bearer token (env JETWAY_TOKEN)")
}

// get fetches path from the gateway into v.
func (f *apiFlags) get(ctx context.Context, path string, v any) error {
	_, err := f.do(ctx, http.MethodGet, path, v)
	return err
}

// do sends a bodiless request and decodes a 200 answer into v (if set); it
// returns the answer's header.
func (f *apiFlags) do(ctx context.Context, method, path string, v any) (http.Header, error) {
	status, header, body, err := f.send(ctx, method, path, nil)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("%s %s: %d %s: %s", method, path, status, http.StatusText(status), strings.TrimSpace(string(body)))
	}
	if v == nil {
		return header, nil
	}
	return header, json.Unmarshal(body, v)
}

// send sends a request, with in as its JSON body unless nil, and returns
// the answer's status, header and body, whatever the status.
func (f *apiFlags) send(ctx context.Context, method, path string, in any) (int, http.Header, []byte, error) {
	var reqBody io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return 0, nil, nil, err
		}
		reqBody = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(f.url, "/")+path, reqBody)
	if err != nil {
		return 0, nil, nil, err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if f.token != "" {
		req.Header.Set("Authorization", "Bearer "+f.token)
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return 0, nil, nil, fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	return resp.StatusCode, resp.Header, body, nil
}

// lifecycleCommand is `gateway land|retire|prune|resume NAME`: a PUT to
// path (with %s for the escaped name), then done and the name.
func lifecycleCommand(verb, path, done, short string) *cobra.Command {
	var flags apiFlags
	cmd := &cobra.Command{
		Use:   verb + " NAME",
		Short: short,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{fmt.Errorf("%s takes exactly one argument, the worker name", verb)}
			}
			return nil
		},
	}
	flags.register(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		header, err := flags.do(cmd.Context(), http.MethodPut, fmt.Sprintf(path, url.PathEscape(args[0])), nil)
		if err != nil {
			return err
		}
		fmt.Fprintf(cmd.OutOrStdout(), "%s '%s'%s\n", done, args[0], pruneScope(header.Get(api.PruneScopeHeader)))
		return nil
	}
	return cmd
}

// pruneScope explains how far a prune reached, from the API's header.
func pruneScope(scope string) string {
	switch scope {
	case lifecycle.PrunedEverywhere:
		return " (recorded in its cluster: every replica forgets it until its kubeconfig changes or it is resumed)"
	case lifecycle.PrunedHere:
		return " (its cluster did not answer: only this gateway replica forgets it, until it answers again)"
	case lifecycle.PrunedFromMesh:
		return " (the mesh forgets it, until its owner joins again)"
	}
	return ""
}

func workersCommand() *cobra.Command {
	var (
		flags  apiFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "workers",
		Short: "List targets as `fly workers` does",
		Args:  noArgs,
	}
	flags.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the worker JSON")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		var workers []wire.Worker
		if err := flags.get(cmd.Context(), "/api/v1/workers", &workers); err != nil {
			return err
		}
		out := cmd.OutOrStdout()
		if asJSON {
			enc := json.NewEncoder(out)
			enc.SetIndent("", "  ")
			return enc.Encode(workers)
		}
		printWorkers(out, workers, time.Now())
		return nil
	}
	return cmd
}

// printWorkers prints fly's table: running workers, then the stalled ones
// apart, as fly does.
func printWorkers(out io.Writer, workers []wire.Worker, now time.Time) {
	var live, stalled []wire.Worker
	for _, w := range workers {
		if w.State == "stalled" {
			stalled = append(stalled, w)
		} else {
			live = append(live, w)
		}
	}
	table(out, live, now)
	if len(stalled) > 0 {
		fmt.Fprintf(out, "\nthe following workers have not checked in recently:\n\n")
		table(out, stalled, now)
	}
}

func table(out io.Writer, workers []wire.Worker, now time.Time) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "name\tcontainers\tplatform\ttags\tteam\tstate\tversion\tage")
	for _, wk := range workers {
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", wk.Name, wk.ActiveContainers, wk.Platform,
			none(strings.Join(wk.Tags, ", ")), none(wk.Team), wk.State, wk.Version, age(wk.StartTime, now))
	}
	w.Flush()
}

func none(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// age renders how long ago a unix time was, as fly does: 3d, 5h, 12m, 40s.
func age(start int64, now time.Time) string {
	if start == 0 {
		return "n/a"
	}
	d := now.Sub(time.Unix(start, 0))
	switch {
	case d >= 24*time.Hour:
		return fmt.Sprintf("%dd", int(d.Hours()/24))
	case d >= time.Hour:
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	case d >= time.Minute:
		return fmt.Sprintf("%dm%ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%ds", int(d.Seconds()))
}
