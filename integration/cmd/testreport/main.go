// Command testreport reads `go test -json` on stdin and prints what plain
// `go test` would (each failed test's output, a line per package), writes
// every line of output to a log file, and ends with a summary: the slowest
// tests, the failed ones with the lines that say why (not the logs they
// dump after), and for a package that timed out the tests that
// were still running. `make test` pipes the suite through it because CI
// shows only the tail of a run: the summary is what is left to read when
// the suite hits its -timeout, and it names the test that held it.
//
//	go test -json ./... | testreport -log bin/test.log
//
// It exits 1 when any test or package failed, or when a line was not JSON
// (a build failure prints such lines; they are passed through as they are).
package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// keptLines bounds what is kept of one test's output until it ends: a
// test that logs without end (a goroutine dump is ~10k lines) keeps its
// last lines, which hold why it failed.
const keptLines = 2000

// whyLines bounds the lines of a failed test the summary repeats under its
// name: t.Error's own lines and testify's block, not the logs a test dumps
// after them, which would push them out of the tail CI shows.
const whyLines = 40

// location matches the line t.Log or t.Error starts with ("    x_test.go:12: ").
var location = regexp.MustCompile(`^ +[\w.-]+\.go:\d+: `)

// why reports whether a line of a test's output says why it failed: a
// t.Error line, or a line of testify's block (indented, then a tab).
func why(l string) bool {
	return location.MatchString(l) || strings.HasPrefix(strings.TrimLeft(l, " "), "\t")
}

func main() {
	logPath := flag.String("log", "", "file to write every line of output to")
	slowest := flag.Int("slowest", 15, "how many of the slowest tests the summary names")
	flag.Parse()
	var log io.Writer = io.Discard
	if *logPath != "" {
		f, err := os.Create(*logPath)
		if err != nil {
			fmt.Fprintf(os.Stderr, "testreport: %v\n", err)
			os.Exit(2)
		}
		defer f.Close()
		log = f
	}
	r := newReport(os.Stdout, log)
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		r.line(sc.Bytes())
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintf(os.Stderr, "testreport: reading go test's output: %v\n", err)
		r.failed = true
	}
	r.summary(*slowest, *logPath)
	if r.failed {
		os.Exit(1)
	}
}

type key struct{ pkg, test string }

type result struct {
	key
	elapsed time.Duration
	why     []string // for a failed test, why: see whyLines
}

type report struct {
	out, log io.Writer
	running  map[key][]string // output of each test (and package) not yet ended
	why      map[key][]string // why each failed test failed, by top-level test
	done     []result         // top-level tests that passed or failed
	fails    []result
	timeouts []string // "running tests:" blocks of packages that timed out
	failed   bool
}

func newReport(out, log io.Writer) *report {
	return &report{out: out, log: log, running: map[key][]string{}, why: map[key][]string{}}
}

func (r *report) line(b []byte) {
	var e event
	if len(b) == 0 || b[0] != '{' || json.Unmarshal(b, &e) != nil {
		// Not an event: a build error or a line of make's.
		fmt.Fprintf(r.out, "%s\n", b)
		fmt.Fprintf(r.log, "%s\n", b)
		if strings.HasPrefix(string(b), "FAIL") {
			r.failed = true
		}
		return
	}
	k := key{e.Package, e.Test}
	switch e.Action {
	case "build-output": // a compile error, go vet's report: printed as it comes
		io.WriteString(r.out, e.Output)
		io.WriteString(r.log, e.Output)
	case "build-fail":
		r.failed = true
	case "output":
		io.WriteString(r.log, e.Output)
		out := append(r.running[k], e.Output)
		if len(out) > keptLines {
			out = slices.Delete(out, 0, len(out)-keptLines)
		}
		r.running[k] = out
	case "pass", "skip":
		r.end(k, e, false)
	case "fail":
		r.end(k, e, true)
	}
}

// end prints what plain go test prints when a test or package ends: a
// failed test's output, and a package's result line.
func (r *report) end(k key, e event, failed bool) {
	out := r.running[k]
	delete(r.running, k)
	elapsed := time.Duration(e.Elapsed * float64(time.Second))
	if k.test != "" {
		if failed {
			r.failed = true
			r.out.Write([]byte(strings.Join(out, "")))
		}
		// A failed subtest's reasons go to its top-level test, which
		// ends after it.
		top, _, sub := strings.Cut(k.test, "/")
		if failed {
			tk := key{k.pkg, top}
			for _, l := range out {
				if len(r.why[tk]) < whyLines && why(l) {
					r.why[tk] = append(r.why[tk], l)
				}
			}
		}
		if !sub {
			res := result{key: k, elapsed: elapsed, why: r.why[k]}
			delete(r.why, k)
			r.done = append(r.done, res)
			if failed {
				r.fails = append(r.fails, res)
			}
		}
		return
	}
	// A package: its own output is its ok/FAIL line, and when it failed
	// outside a test (TestMain, a panic, a timeout) what it printed.
	if failed {
		r.failed = true
		if block := runningTests(out); block != "" {
			r.timeouts = append(r.timeouts, k.pkg+"\n"+block)
		}
	}
	for _, l := range out {
		if failed || !strings.HasPrefix(l, "PASS") {
			io.WriteString(r.out, l)
		}
	}
}

// runningTests returns the block a test binary prints when it times out:
// "panic: test timed out after 1h0m0s" and the tests still running.
func runningTests(out []string) string {
	var b strings.Builder
	in := false
	for _, l := range out {
		switch {
		case strings.HasPrefix(l, "panic: test timed out"):
			in = true
			b.WriteString(l)
		case in && (strings.HasPrefix(l, "running tests:") || strings.HasPrefix(l, "\t")):
			b.WriteString(l)
		case in:
			return b.String()
		}
	}
	return b.String()
}

func (r *report) summary(n int, logPath string) {
	fmt.Fprintf(r.out, "\n=== slowest tests\n")
	slices.SortFunc(r.done, func(a, b result) int { return cmp.Compare(b.elapsed, a.elapsed) })
	for _, res := range r.done[:min(n, len(r.done))] {
		fmt.Fprintf(r.out, "%8s  %s %s\n", res.elapsed.Round(time.Second), short(res.pkg), res.test)
	}
	for k := range r.running {
		if k.test != "" && !strings.Contains(k.test, "/") {
			fmt.Fprintf(r.out, "=== never ended: %s %s\n", short(k.pkg), k.test)
			r.failed = true
		}
	}
	for _, t := range r.timeouts {
		fmt.Fprintf(r.out, "=== timed out: %s", t)
	}
	if len(r.fails) > 0 {
		fmt.Fprintf(r.out, "=== failed\n")
		for _, res := range r.fails {
			fmt.Fprintf(r.out, "%8s  %s %s\n", res.elapsed.Round(time.Second), short(res.pkg), res.test)
			io.WriteString(r.out, strings.Join(res.why, ""))
		}
	}
	if logPath != "" {
		fmt.Fprintf(r.out, "=== every line of output: %s\n", logPath)
	}
}

// short drops the module path every package shares.
func short(pkg string) string {
	return strings.TrimPrefix(pkg, "github.com/jetway-ci/jetway/")
}
