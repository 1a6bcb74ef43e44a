package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"

	"github.com/jetway-ci/jetway/wire"
)

// UploadInput sends dir's contents as the input name of a step that
// declared it {from: {upload: true}}; the gateway holds the call until
// the step's pod is ready for it. It answers the bytes and SHA-256 of the
// stream (a gzip-compressed tar) as the pod took them.
func (c *Client) UploadInput(ctx context.Context, team, handle, name, dir string) (wire.InputDigest, error) {
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return wire.InputDigest{}, fmt.Errorf("jetway: input %s: %s is not a directory", name, dir)
	}
	body := TarDir(dir)
	defer body.Close()
	var got wire.InputDigest
	err := c.call(ctx, http.MethodPut, "/api/v1/steps/"+url.PathEscape(handle)+"/inputs/"+url.PathEscape(name), gzipQuery(team), io.Reader(body), &got)
	return got, err
}

// DownloadOutput writes the output name of an ended step into dir
// (created if missing) and returns how many files it wrote.
func (c *Client) DownloadOutput(ctx context.Context, team, handle, name, dir string) (int, error) {
	resp, err := c.do(ctx, http.MethodGet, "/api/v1/steps/"+url.PathEscape(handle)+"/outputs/"+url.PathEscape(name), gzipQuery(team), nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := UntarLimited(resp.Body, dir, c.limit)
	if err != nil {
		return n, fmt.Errorf("jetway: output %s: %w", name, err)
	}
	return n, nil
}

// gzipQuery asks for a transfer of team's step as a gzip-compressed tar.
func gzipQuery(team string) url.Values {
	q := teamQuery(team)
	q.Set("encoding", "gzip")
	return q
}
