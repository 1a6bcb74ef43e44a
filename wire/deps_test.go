package wire

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/jetway-ci/jetway/internal/golist"
)

// wire is a leaf: it imports the standard library alone, so whatever
// imports it (the Go client above all) gets nothing of the gateway's
// dependencies.
func TestWireImportsOnlyTheStandardLibrary(t *testing.T) {
	const self = "github.com/jetway-ci/jetway/wire"
	assert.Equal(t, []string{self}, golist.Deps(t, self, true), "wire imports these beyond the standard library")
}
