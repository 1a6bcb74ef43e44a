package steps

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/jetway-ci/jetway/selection"
)

func TestPlacementChainByType(t *testing.T) {
	fewest, random := selection.Chain{selection.FewestBuildContainers}, selection.Chain{selection.Random}
	tests := []struct {
		name string
		opts PlacementOptions
		want map[string]selection.Chain
	}{
		{name: "unset: Concourse's defaults", want: map[string]selection.Chain{
			"task": selection.DefaultChain, "put": selection.DefaultChain, "get": selection.DefaultChain, "check": random,
			"check/nested": selection.DefaultChain}},
		{name: "no-input unset follows placement", opts: PlacementOptions{Strategy: fewest}, want: map[string]selection.Chain{
			"task": fewest, "put": fewest, "get": fewest, "check": random, "check/nested": fewest}},
		{name: "each set", opts: PlacementOptions{Strategy: fewest, NoInputStrategy: random, CheckStrategy: selection.DefaultChain},
			want: map[string]selection.Chain{"task": fewest, "put": fewest, "get": random, "check": selection.DefaultChain,
				"check/nested": random}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for key, want := range tt.want {
				typ, nested := strings.CutSuffix(key, "/nested")
				assert.Equal(t, want, tt.opts.Chain(typ, nested), key)
			}
		})
	}
}
