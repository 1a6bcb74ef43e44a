package wire

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestContainerHandlesAreLabelValues(t *testing.T) {
	for _, h := range []string{"dbf66ad4-1e01-4cb9-986b-f97ece8187d7", "a", "cwc.1_x"} {
		assert.True(t, IsContainerHandle(h), h)
	}
	for _, h := range []string{"", "-a", "a-", "with space", strings.Repeat("a", 64), "a/b"} {
		assert.False(t, IsContainerHandle(h), h)
	}
}
