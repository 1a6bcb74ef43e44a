// Package bench holds jetway's benchmarks against real local clusters;
// `make bench-targets` runs them. They start their own clusters and a real
// gateway process, so they are not part of `make test`.
package bench
