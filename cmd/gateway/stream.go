package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/jetway-ci/jetway/api"
	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/wire"
)

func streamCommand() *cobra.Command {
	var (
		flags              apiFlags
		from, to, encoding string
		size               string
	)
	cmd := &cobra.Command{
		Use:   "stream --from TARGET/POD/HANDLE[:PATH] --to TARGET/POD/HANDLE[:PATH]",
		Short: "Copy a volume path between step pods, showing progress",
		Args:  noArgs,
	}
	flags.register(cmd)
	cmd.Flags().StringVar(&from, "from", "", "source: target/pod/volume-handle[:path]")
	cmd.Flags().StringVar(&to, "to", "", "destination: target/pod/volume-handle[:path]")
	cmd.Flags().StringVar(&encoding, "encoding", "zstd", "raw, gzip or zstd")
	cmd.Flags().StringVar(&size, "size", "", "expected size (e.g. 1Gi) for a progress bar and ETA")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		req := wire.StreamRequest{Encoding: encoding}
		var err error
		if req.From, err = parseEndpoint("from", from); err != nil {
			return usageError{err}
		}
		if req.To, err = parseEndpoint("to", to); err != nil {
			return usageError{err}
		}
		var total int64
		if size != "" {
			q, err := resource.ParseQuantity(size)
			if err != nil {
				return usageError{fmt.Errorf("--size %q: %v", size, err)}
			}
			total = q.Value()
		}
		body, _ := json.Marshal(req)
		hreq, err := http.NewRequestWithContext(cmd.Context(), http.MethodPost, strings.TrimRight(flags.url, "/")+"/api/v1/streams", bytes.NewReader(body))
		if err != nil {
			return err
		}
		hreq.Header.Set("Content-Type", "application/json")
		hreq.Header.Set("Accept", api.NDJSON)
		if flags.token != "" {
			hreq.Header.Set("Authorization", "Bearer "+flags.token)
		}
		resp, err := http.DefaultClient.Do(hreq)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			return fmt.Errorf("POST /api/v1/streams: %s: %s", resp.Status, strings.TrimSpace(string(b)))
		}
		return followStream(resp.Body, cmd.OutOrStdout(), cmd.ErrOrStderr(), total)
	}
	return cmd
}

// parseEndpoint reads target/pod/handle[:path].
func parseEndpoint(flag, s string) (wire.Endpoint, error) {
	ref, path, _ := strings.Cut(s, ":")
	parts := strings.Split(ref, "/")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return wire.Endpoint{}, fmt.Errorf("--%s %q is not target/pod/handle[:path]", flag, s)
	}
	return wire.Endpoint{Target: parts[0], Pod: parts[1], Handle: parts[2], Path: path}, nil
}

// followStream renders the NDJSON progress lines and the outcome.
func followStream(body io.Reader, stdout, stderr io.Writer, total int64) error {
	live := false
	if f, ok := stderr.(*os.File); ok {
		live = term.IsTerminal(int(f.Fd()))
	}
	var lastPrinted time.Time
	sc := bufio.NewScanner(body)
	for sc.Scan() {
		var line api.ProgressLine
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			return fmt.Errorf("bad progress line %q: %v", sc.Text(), err)
		}
		switch {
		case line.Result != nil:
			if live {
				fmt.Fprint(stderr, "\r\033[K")
			}
			fmt.Fprintln(stdout, summary(*line.Result))
			return nil
		case line.Error != "":
			if live {
				fmt.Fprint(stderr, "\r\033[K")
			}
			switch {
			case line.Side != "" && line.Gateway != "":
				return fmt.Errorf("stream failed on the %s side (mesh member %s): %s", line.Side, line.Gateway, line.Error)
			case line.Side != "":
				return fmt.Errorf("stream failed on the %s side: %s", line.Side, line.Error)
			}
			return fmt.Errorf("stream failed: %s", line.Error)
		case live:
			fmt.Fprintf(stderr, "\r\033[K%s", progressText(line.Bytes, line.Seconds, total))
		case time.Since(lastPrinted) >= 5*time.Second:
			fmt.Fprintln(stderr, progressText(line.Bytes, line.Seconds, total))
			lastPrinted = time.Now()
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("stream answer cut: %w", err)
	}
	return fmt.Errorf("stream answer ended without a result")
}

// progressText renders bytes, rate and, when the total is known, a bar and
// the time left.
func progressText(n int64, seconds float64, total int64) string {
	rate := 0.0
	if seconds > 0 {
		rate = float64(n) / seconds
	}
	text := fmt.Sprintf("%9s  %9s/s", humanBytes(float64(n)), humanBytes(rate))
	if total <= 0 {
		return text
	}
	frac := min(float64(n)/float64(total), 1)
	const width = 24
	filled := int(frac * width)
	bar := strings.Repeat("=", filled) + strings.Repeat(" ", width-filled)
	eta := "?"
	if rate > 0 {
		eta = (time.Duration(float64(total-n)/rate) * time.Second).Round(time.Second).String()
		if n >= total {
			eta = "0s"
		}
	}
	return fmt.Sprintf("%s  [%s] %3.0f%%  ETA %s", text, bar, frac*100, eta)
}

func summary(r wire.StreamResult) string {
	if r.Mode == streams.ModeP2P {
		if r.SHA256 == "" {
			return fmt.Sprintf("pushed directly pod to pod (p2p) in %.1fs", r.Seconds)
		}
		return fmt.Sprintf("pushed directly pod to pod (p2p) in %.1fs, %d bytes, sha256 %s", r.Seconds, r.Bytes, r.SHA256)
	}
	rate := 0.0
	if r.Seconds > 0 {
		rate = float64(r.Bytes) / r.Seconds
	}
	how := "streamed"
	if r.Mode == streams.ModeMesh {
		how = "streamed across the mesh"
	}
	return fmt.Sprintf("%s %s in %.1fs (%s/s), sha256 %s", how, humanBytes(float64(r.Bytes)), r.Seconds, humanBytes(rate), r.SHA256)
}

func humanBytes(n float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for n >= 1024 && i < len(units)-1 {
		n /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f %s", n, units[i])
	}
	return fmt.Sprintf("%.1f %s", n, units[i])
}
