package capped

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestBufferKeepsTheStart(t *testing.T) {
	b := &Buffer{Limit: 5}
	n, err := b.Write([]byte("abc"))
	assert.NoError(t, err)
	assert.Equal(t, 3, n)
	n, err = b.Write([]byte("defgh"))
	assert.NoError(t, err)
	assert.Equal(t, 5, n, "a write past the limit is taken whole, and dropped")
	assert.Equal(t, "abcde", b.String())
}

func TestBytesIsACopyOfWhatWasKept(t *testing.T) {
	b := &Buffer{Limit: 3}
	_, _ = b.Write([]byte("abcdef"))
	got := b.Bytes()
	assert.Equal(t, []byte("abc"), got)
	got[0] = 'x'
	assert.Equal(t, "abc", b.String(), "changing the copy changes nothing kept")
}
