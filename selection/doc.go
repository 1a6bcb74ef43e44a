// Package selection places steps on targets with Concourse's rules: running
// targets only, team targets before global ones, tags, platform, and the
// chained placement strategies. It decides over plain values and imports no
// Kubernetes client. Its code arrives with the placement work; this comment
// records the package's place in the layout.
package selection
