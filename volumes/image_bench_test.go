package volumes

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkImageDigest makes the image of a volume's rootfs (one file of
// 200 MiB, as BenchmarkConcourseBuiltImage's) from scratch each time:
// the layer's digest is one reading pass of the folder as a tar. It
// reports its rate, and its time over reading the same file and hashing
// it (the floor of any digest of those bytes), alternating the two:
//
//	go test -run '^$' -bench ImageDigest -benchtime 5x ./volumes/
func BenchmarkImageDigest(b *testing.B) {
	s, base := benchServer(b, Capacity{})
	volume(b, base, "img")
	rootfs := filepath.Join(s.Path("img"), "rootfs")
	total := writeTree(b, rootfs, 1, 200<<20, 0)
	file := ""
	require.NoError(b, filepath.Walk(rootfs, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			file = p
		}
		return err
	}))
	body, _ := json.Marshal(ImageRequest{Path: "rootfs", TicketSHA256: testTokenHash(), Expires: time.Now().Add(time.Hour)})
	var digest, floor time.Duration
	for b.Loop() {
		s.images.forget("img")
		start := time.Now()
		resp, answer := do(b, http.MethodPost, base+"/volumes/img/image", nil, bytes.NewReader(body))
		require.Equal(b, http.StatusOK, resp.StatusCode, "%s", answer)
		digest += time.Since(start)

		start = time.Now()
		f, err := os.Open(file)
		require.NoError(b, err)
		h := sha256.New()
		_, err = io.Copy(h, f)
		require.NoError(b, err)
		f.Close()
		floor += time.Since(start)
	}
	b.ReportMetric(float64(total)/1e6/digest.Seconds()*float64(b.N), "digest-MB/s")
	b.ReportMetric(digest.Seconds()/floor.Seconds(), "digest/read+sha256")
}
