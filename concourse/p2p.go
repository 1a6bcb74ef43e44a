package concourse

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/jetway-ci/jetway/internal/httpjson"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/volumes"
	"github.com/jetway-ci/jetway/wire"
)

// A web node with --enable-p2p-volume-streaming streams a volume between
// two workers by asking the destination for its p2p URL (GET /p2p-url),
// building from its scheme and host a stream-in URL of the destination's
// volume (<url>/volumes/<handle>/stream-in?path=...), and asking the
// source to push there (PUT /volumes/<handle>/stream-p2p-out). A jetway
// worker's p2p URL names no address: its host names the target and the
// installation under p2pDomain, which never resolves (RFC 6761's
// .invalid). The gateway that serves the source reads it and carries the
// volume itself (Holder.Stream), from the pod that holds it (or the
// source's holder) into the destination's holder: through the gateway's
// port-forwards between its targets, over the mesh when another gateway
// owns the destination. The web node relays no byte. A source that is
// not jetway's (a stock worker) fails at once to resolve the host, and
// the web node relays that stream as it does any p2p stream that fails;
// to a destination that is not jetway's, the pod pushes itself
// (pushOut).
const p2pDomain = "jetway-p2p.invalid"

// p2pURL is target's p2p URL in installation.
func p2pURL(target, installation string) string {
	return "http://" + target + "." + installation + "." + p2pDomain
}

// p2pDestination is where a stream-in URL built from a p2pURL points: the
// target, and its volume handle and path.
type p2pDestination struct {
	target, handle, path string
	// limit is the web node's bound on what the volume takes, in MB, if it
	// has one (--streaming-size-limitation).
	limit string
}

// parseP2PStreamIn reads a stream-in URL the web node built from a p2pURL
// of installation's, or says what is wrong with it.
func parseP2PStreamIn(raw, installation string) (p2pDestination, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return p2pDestination{}, fmt.Errorf("streamInURL: %w", err)
	}
	target, ok := strings.CutSuffix(u.Hostname(), "."+installation+"."+p2pDomain)
	if !ok || len(validation.IsDNS1123Label(target)) > 0 {
		return p2pDestination{}, fmt.Errorf("streamInURL %s is not a jetway worker's of installation %s (its host is not <target>.%s.%s): %w",
			u.Redacted(), installation, installation, p2pDomain, errNotJetway)
	}
	rest, ok := strings.CutPrefix(u.EscapedPath(), "/volumes/")
	handle, op, _ := strings.Cut(rest, "/")
	if handle, err = url.PathUnescape(handle); !ok || err != nil || handle == "" || op != "stream-in" {
		return p2pDestination{}, fmt.Errorf("streamInURL %s is not a volume's stream-in (/volumes/<handle>/stream-in)", u.Redacted())
	}
	return p2pDestination{target: target, handle: handle, path: webNodePath(u.Query().Get("path")), limit: u.Query().Get("limit")}, nil
}

// errNotJetway: a stream-in URL is another worker's (a stock worker's
// baggageclaim): the source's holder pushes to it itself.
var errNotJetway = errors.New("not a jetway worker's")

// webNodePath is a volume path as the web node gives it, cleaned: "." when empty.
func webNodePath(p string) string {
	if p == "" {
		return "."
	}
	return path.Clean(p)
}

// p2pTimeout bounds one p2p stream: as long as a move, which carries the
// same bytes (the web node bounds it too, with --p2p-volume-streaming-timeout).
const p2pTimeout = moveTimeout

// serveP2P adds the p2p routes of target's volume API to mux.
func (h *Holder) serveP2P(mux *http.ServeMux, target string) {
	mux.HandleFunc("GET /p2p-url", func(w http.ResponseWriter, r *http.Request) {
		if _, err := h.clusterTarget(target); err != nil {
			httpjson.Write(w, http.StatusNotImplemented, httpjson.Error(err))
			return
		}
		// The web node's client parses the whole body as the URL.
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, p2pURL(target, h.Pod().Installation))
	})
	mux.HandleFunc("PUT /volumes/{handle}/stream-p2p-out", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		dst, err := parseP2PStreamIn(q.Get("streamInURL"), h.Pod().Installation)
		if errors.Is(err, errNotJetway) {
			h.pushOut(w, r, target)
			return
		}
		if err != nil {
			httpjson.Write(w, http.StatusBadRequest, httpjson.Error(err))
			return
		}
		if _, err := h.StreamP2P(r.Context(), target, r.PathValue("handle"), webNodePath(q.Get("path")), dst); err != nil {
			httpjson.Write(w, http.StatusInternalServerError, httpjson.Error(err))
			return
		}
		// The web node's client reads the body to its end and takes
		// anything but "ok" for the error.
		_, _ = io.WriteString(w, "ok")
	})
}

// clusterTarget checks target is a cluster target of this gateway's,
// whose volumes live in its holder: an agent's volumes are not streamed
// peer to peer (the web node relays them).
func (h *Holder) clusterTarget(target string) (clusterWorker, error) {
	w, err := h.worker(target)
	if err != nil {
		return clusterWorker{}, err
	}
	cw, ok := w.(clusterWorker)
	if !ok {
		return clusterWorker{}, fmt.Errorf("worker %s is an agent: jetway streams only its cluster targets' volumes peer to peer; "+
			"the web node relays an agent's", target)
	}
	return cw, nil
}

// StreamP2P carries path of source's volume handle into dst, from the
// source's holder to the destination's (a volume a pod still holds is
// settled into the holder first), and returns what it carried. Errors name
// the side that failed.
func (h *Holder) StreamP2P(ctx context.Context, source, handle, path string, dst p2pDestination) (wire.StreamResult, error) {
	ctx, cancel := context.WithTimeout(ctx, p2pTimeout)
	defer cancel()
	if _, err := h.clusterTarget(source); err != nil {
		return wire.StreamResult{}, err
	}
	from, err := h.p2pSource(ctx, source, handle, path)
	if err != nil {
		return wire.StreamResult{}, fmt.Errorf("volume %s of worker %s: %w", handle, source, err)
	}
	req := streams.Request{StreamRequest: wire.StreamRequest{
		From: from,
		To:   wire.Endpoint{Target: dst.target, Pod: steppod.HolderName(h.Pod().Installation), Handle: dst.handle, Path: dst.path},
		// What the destination holds is the same files whatever the
		// encoding on the way; between two holders zstd costs their
		// sidecars little and saves the link (and port-forward) the most.
		Encoding: volumes.Zstd,
		Limit:    dst.limit,
	}, Caller: streams.Caller{Admin: true}}
	// Tried once: both holders have long answered (a held volume's pod
	// too, its process done), and on a failure the web node relays the
	// volume itself, which is the retry.
	start := time.Now()
	res, err := h.Stream(ctx, req)
	h.Metrics.p2p(res.Mode, res.Bytes, err)
	if err != nil {
		h.logger().Warn("p2p stream failed; the web node relays it", "from", source, "volume", handle, "to", dst.target, "to_volume", dst.handle,
			"error", err.Error())
		var se *streams.Error
		if errors.As(err, &se) {
			side := source
			if se.Side == streams.SideDestination {
				side = dst.target
			}
			return res, fmt.Errorf("stream volume %s of worker %s into volume %s of worker %s: worker %s's side: %w",
				handle, source, dst.handle, dst.target, side, err)
		}
		return res, fmt.Errorf("stream volume %s of worker %s into volume %s of worker %s: %w", handle, source, dst.handle, dst.target, err)
	}
	h.logger().Info("p2p stream", "from", source, "volume", handle, "from_pod", from.Pod, "to", dst.target, "to_volume", dst.handle, "mode", res.Mode,
		"bytes", res.Bytes, "sha256", res.SHA256, "seconds", time.Since(start).Seconds())
	return res, nil
}

// p2pSource is where path of source's volume handle is read from for a
// p2p stream: the pod that holds it, if one does and is there (its files
// are not copied into the holder first, only to be read from there
// once), else the holder, the volume settled into it.
func (h *Holder) p2pSource(ctx context.Context, source, handle, path string) (wire.Endpoint, error) {
	v, err := h.Volume(ctx, source, handle)
	if err != nil {
		return wire.Endpoint{}, err
	}
	if v.Held != nil {
		t, err := h.Targets.Target(source)
		if err != nil {
			return wire.Endpoint{}, err
		}
		if podGone(t, *v.Held) == "" {
			return wire.Endpoint{Target: source, Pod: v.Held.Pod, Handle: v.Held.Mount, Path: path}, nil
		}
	}
	if err := h.settle(ctx, source, handle); err != nil {
		return wire.Endpoint{}, err
	}
	return wire.Endpoint{Target: source, Pod: steppod.HolderName(h.Pod().Installation), Handle: handle, Path: path}, nil
}

// pushOut serves a stream-p2p-out to a worker that is not jetway's (a
// stock worker's baggageclaim, its stream-in URL as the web node built
// it): the pod that holds the volume, or the source's holder, pushes it
// there itself, as a stock worker's baggageclaim would. It answers the
// web node as baggageclaim does ("ok"), or with the pod's error; the web
// node relays the volume then.
func (h *Holder) pushOut(w http.ResponseWriter, r *http.Request, target string) {
	if _, err := h.clusterTarget(target); err != nil {
		httpjson.Write(w, http.StatusNotImplemented, httpjson.Error(err))
		return
	}
	q := r.URL.Query()
	handle := r.PathValue("handle")
	from, err := h.p2pSource(r.Context(), target, handle, webNodePath(q.Get("path")))
	if err != nil {
		h.Metrics.p2p(p2pPush, 0, err)
		httpjson.Write(w, http.StatusInternalServerError, httpjson.Error(fmt.Errorf("volume %s of worker %s: %w", handle, target, err)))
		return
	}
	q.Set("path", from.Path)
	resp, err := h.Server(r.Context(), from.Target, from.Pod, http.MethodPut, "/volumes/"+url.PathEscape(from.Handle)+"/stream-p2p-out", q, nil, nil)
	if err != nil {
		h.Metrics.p2p(p2pPush, 0, err)
		httpjson.Write(w, http.StatusBadGateway, map[string]string{"error": fmt.Sprintf("volume %s of worker %s (pod %s): %v", handle, target, from.Pod, err)})
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		h.Metrics.p2p(p2pPush, 0, errors.New(resp.Status))
		answerWith(w, resp)
		return
	}
	var res volumes.P2PResult
	_ = json.NewDecoder(io.LimitReader(resp.Body, 4096)).Decode(&res)
	h.Metrics.p2p(p2pPush, res.Bytes, nil)
	h.logger().Info("p2p stream", "from", target, "volume", handle, "from_pod", from.Pod, "to", q.Get("streamInURL"), "mode", p2pPush,
		"bytes", res.Bytes, "sha256", res.SHA256)
	_, _ = io.WriteString(w, "ok")
}

// p2pPush is the path of a p2p stream the source's holder pushed to
// another worker's stream-in URL itself.
const p2pPush = "push"
