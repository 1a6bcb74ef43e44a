// Package bench holds jetway's benchmarks against real local clusters;
// the Makefile's bench-* targets run them (bench-targets, bench-streams,
// bench-steps, bench-agent). They start their own clusters and real
// gateway processes, so they are not part of `make test`.
package bench
