package concourse

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A web node places work only on workers of its worker version, or a
// later one of the same major (atc/worker/pool.go); it registers any
// other without a word, and then never uses it. So when the web node's
// URL is known, a registrar reads its worker version first and registers
// nothing it would never use, saying why.

// Info is what a web node's /api/v1/info says of its versions.
type Info struct {
	Version       string `json:"version"`
	WorkerVersion string `json:"worker_version"`
}

// ReadInfo reads the web node's /api/v1/info at url.
func ReadInfo(ctx context.Context, client *http.Client, url string) (Info, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(url, "/")+"/api/v1/info", nil)
	if err != nil {
		return Info{}, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return Info{}, fmt.Errorf("read the web node's versions: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK {
		return Info{}, fmt.Errorf("read the web node's versions: GET %s/api/v1/info answered %s", url, resp.Status)
	}
	var info Info
	if err := json.Unmarshal(body, &info); err != nil || info.WorkerVersion == "" {
		return Info{}, fmt.Errorf("read the web node's versions: %s/api/v1/info has no worker_version: is it a Concourse web node?", url)
	}
	return info, nil
}

// Compatible reports whether a web node of worker version want places
// work on a worker of version have: the same version, or a later one of
// the same major.
func Compatible(have, want string) (bool, error) {
	h, err := components(have)
	if err != nil {
		return false, err
	}
	w, err := components(want)
	if err != nil {
		return false, err
	}
	for i := range max(len(h), len(w)) {
		a, b := at(h, i), at(w, i)
		switch {
		case a < b:
			return false, nil
		case a > b:
			return h[0] == w[0], nil
		}
	}
	return true, nil
}

func components(v string) ([]int, error) {
	var out []int
	for part := range strings.SplitSeq(v, ".") {
		n, err := strconv.Atoi(part)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%q is not a worker version like 2.5", v)
		}
		out = append(out, n)
	}
	return out, nil
}

func at(v []int, i int) int {
	if i < len(v) {
		return v[i]
	}
	return 0
}

// VersionError: the web node would never place work on jetway's workers.
type VersionError struct {
	URL  string
	Info Info
	// Have is the version jetway's workers register with.
	Have string
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("worker version mismatch: the web node at %s (Concourse %s) places work only on workers of version %s "+
		"or a later %s.x; jetway's workers are version %s, so none is registered: run a jetway that speaks worker version %s",
		e.URL, e.Info.Version, e.Info.WorkerVersion, major(e.Info.WorkerVersion), e.Have, e.Info.WorkerVersion)
}

func major(v string) string { m, _, _ := strings.Cut(v, "."); return m }

// versionCheck reads the web node's worker version at most once a
// minute for all the registrations of a registrar.
type versionCheck struct {
	url    string
	have   string
	client *http.Client

	mu   sync.Mutex
	at   time.Time
	last error
}

// check is nil when the web node places work on workers of version have,
// a *VersionError when it does not, or why its versions could not be
// read.
func (v *versionCheck) check(ctx context.Context) error {
	if v == nil {
		return nil
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.at.IsZero() && time.Since(v.at) < time.Minute {
		return v.last
	}
	info, err := ReadInfo(ctx, v.client, v.url)
	if err != nil {
		return err // not kept: tried again at the registration's next try
	}
	ok, err := Compatible(v.have, info.WorkerVersion)
	if err == nil && !ok {
		err = &VersionError{URL: v.url, Info: info, Have: v.have}
	}
	v.at, v.last = time.Now(), err
	return err
}
