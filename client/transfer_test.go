package client

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/wire"
)

func TestUploadAndDownloadKeepTheTree(t *testing.T) {
	st := &scripted{view: wire.View{Handle: "s"}, dir: t.TempDir()}
	c := serve(t, st, nil)
	src := archiveTree(t)
	got, err := c.UploadInput(context.Background(), "", "s", "src", src)
	require.NoError(t, err)
	assert.Positive(t, got.Bytes)
	requireSameTree(t, src, filepath.Join(st.dir, "src"))

	out := filepath.Join(t.TempDir(), "out")
	n, err := c.DownloadOutput(context.Background(), "", "s", "src", out)
	require.NoError(t, err)
	assert.Equal(t, 3, n, "run.sh, note and big: links are not files")
	requireSameTree(t, src, out)

	_, err = c.DownloadOutput(context.Background(), "", "s", "missing", out)
	assert.ErrorIs(t, err, ErrNotFound)
	_, err = c.UploadInput(context.Background(), "", "s", "src", filepath.Join(src, "nope"))
	assert.ErrorContains(t, err, "nope is not a directory")
}

// TestDownloadStopsAtTheClientsLimit: Options.Downloads bounds what a
// downloaded output writes; past it the download fails naming the limit
// and the file.
func TestDownloadStopsAtTheClientsLimit(t *testing.T) {
	st := &scripted{view: wire.View{Handle: "s"}, dir: t.TempDir()}
	c := serve(t, st, nil)
	src := archiveTree(t)
	_, err := c.UploadInput(context.Background(), "", "s", "src", src)
	require.NoError(t, err)
	c.limit = Limits{Entries: 2}
	_, err = c.DownloadOutput(context.Background(), "", "s", "src", filepath.Join(t.TempDir(), "out"))
	assert.ErrorContains(t, err, "jetway: output src: untar into ")
	assert.ErrorContains(t, err, "goes past the limit of 2 entries an archive may write")
}
