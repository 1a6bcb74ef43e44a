package concourse

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/steppod"
)

// The web node keeps only the scheme and host of a worker's p2p URL and
// builds the stream-in URL itself (baggageclaim's client), adding a limit
// when it has one: what it builds from jetway's names the target, the
// volume and the path.
func TestP2PStreamInURLs(t *testing.T) {
	base, err := url.Parse(p2pURL("east-1", "prod"))
	require.NoError(t, err)
	assert.Equal(t, "east-1.prod."+p2pDomain, base.Host)
	built := base.Scheme + "://" + base.Host + "/volumes/a%2Fb-1/stream-in?" + url.Values{"path": {"./out/"}, "limit": {"10.5"}}.Encode()
	got, err := parseP2PStreamIn(built, "prod")
	require.NoError(t, err)
	assert.Equal(t, p2pDestination{target: "east-1", handle: "a/b-1", path: "out", limit: "10.5"}, got)
	got, err = parseP2PStreamIn(base.String()+"/volumes/v/stream-in", "prod")
	require.NoError(t, err)
	assert.Equal(t, ".", got.path, "no path is the volume's top")

	for raw, want := range map[string]string{
		// A stock worker's baggageclaim: the web node relays.
		"http://10.0.0.7:7788/volumes/v/stream-in?path=.": "is not a jetway worker's of installation prod",
		// Another installation's worker.
		"http://east-1.staging." + p2pDomain + "/volumes/v/stream-in": "is not a jetway worker's of installation prod",
		"http://Bad_Name.prod." + p2pDomain + "/volumes/v/stream-in":  "is not a jetway worker's",
		"http://east-1.prod." + p2pDomain + "/volumes/v/stream-out":   "is not a volume's stream-in",
		"http://east-1.prod." + p2pDomain + "/volumes//stream-in":     "is not a volume's stream-in",
		"http://east-1.prod." + p2pDomain + "/p2p-url":                "is not a volume's stream-in",
		"http://east-1.prod." + p2pDomain + "/volumes/%zz/stream-in":  "streamInURL",
		"://": "streamInURL",
	} {
		_, err := parseP2PStreamIn(raw, "prod")
		if assert.Error(t, err, raw) {
			assert.Contains(t, err.Error(), want, raw)
		}
	}
}

// A worker jetway does not keep volumes for gets no p2p URL, nor pushes
// a volume; a jetway stream-in URL that names no volume is refused naming
// it. Each before any volume is touched: the web node relays them.
func TestP2PRefusals(t *testing.T) {
	h := &Holder{Targets: noTargets{}, Pod: func() steppod.Options { return steppod.Options{Installation: "prod"} }}
	api := h.API("gone")

	rec := httptest.NewRecorder()
	api.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/p2p-url", nil))
	assert.Equal(t, http.StatusNotImplemented, rec.Code)
	assert.Contains(t, rec.Body.String(), "worker gone is neither a cluster target nor an agent")

	// A jetway worker's URL that names no volume's stream-in.
	rec = httptest.NewRecorder()
	q := url.Values{"path": {"."}, "encoding": {"gzip"}, "streamInURL": {p2pURL("east", "prod") + "/volumes/v/stream-out"}}
	api.ServeHTTP(rec, httptest.NewRequest(http.MethodPut, "/volumes/src/stream-p2p-out?"+q.Encode(), nil))
	assert.Equal(t, http.StatusBadRequest, rec.Code)
	assert.Contains(t, rec.Body.String(), "is not a volume's stream-in")

	// Another worker's (a stock worker's): the source's holder would push
	// to it, but there is none.
	rec = httptest.NewRecorder()
	q.Set("streamInURL", "http://10.0.0.7:7788/volumes/v/stream-in?path=.")
	api.ServeHTTP(rec, httptest.NewRequest(http.MethodPut, "/volumes/src/stream-p2p-out?"+q.Encode(), nil))
	assert.Equal(t, http.StatusNotImplemented, rec.Code)
	assert.Contains(t, rec.Body.String(), "worker gone is neither a cluster target nor an agent")

	rec = httptest.NewRecorder()
	q.Set("streamInURL", p2pURL("east", "prod")+"/volumes/v/stream-in?path=.")
	api.ServeHTTP(rec, httptest.NewRequest(http.MethodPut, "/volumes/src/stream-p2p-out?"+q.Encode(), nil))
	assert.Equal(t, http.StatusInternalServerError, rec.Code)
	assert.Contains(t, rec.Body.String(), "worker gone is neither a cluster target nor an agent", "the source is named")
}
