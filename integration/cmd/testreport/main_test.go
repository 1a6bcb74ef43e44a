package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReportPrintsFailuresAndNamesWhatTimedOut(t *testing.T) {
	const pkg = "github.com/jetway-ci/jetway/integration"
	in := strings.Join([]string{
		`{"Action":"start","Package":"` + pkg + `"}`,
		`{"Action":"run","Package":"` + pkg + `","Test":"TestFast"}`,
		`{"Action":"output","Package":"` + pkg + `","Test":"TestFast","Output":"=== RUN   TestFast\n"}`,
		`{"Action":"pass","Package":"` + pkg + `","Test":"TestFast","Elapsed":1.5}`,
		`{"Action":"output","Package":"` + pkg + `","Test":"TestBroken","Output":"    broken_test.go:9: the holder answered 500\n"}`,
		`{"Action":"output","Package":"` + pkg + `","Test":"TestBroken","Output":"    broken_test.go:12: \n"}`,
		`{"Action":"output","Package":"` + pkg + `","Test":"TestBroken","Output":"        \tError Trace:\t/x/broken_test.go:12\n"}`,
		`{"Action":"output","Package":"` + pkg + `","Test":"TestBroken","Output":"        \tError:      \tNot equal\n"}`,
		`{"Action":"output","Package":"` + pkg + `","Test":"TestBroken","Output":"    gateway_test.go:469: gateway replica-a logs:\n"}`,
		`{"Action":"output","Package":"` + pkg + `","Test":"TestBroken","Output":"        {\"msg\":\"serving http\"}\n"}`,
		`{"Action":"fail","Package":"` + pkg + `","Test":"TestBroken","Elapsed":42}`,
		`{"Action":"output","Package":"` + pkg + `","Test":"TestSub/one","Output":"    sub_test.go:5: one broke\n"}`,
		`{"Action":"fail","Package":"` + pkg + `","Test":"TestSub/one","Elapsed":1}`,
		`{"Action":"fail","Package":"` + pkg + `","Test":"TestSub","Elapsed":2}`,
		`{"Action":"output","Package":"` + pkg + `","Test":"TestHangs","Output":"=== RUN   TestHangs\n"}`,
		`{"Action":"output","Package":"` + pkg + `","Output":"panic: test timed out after 1h0m0s\n"}`,
		`{"Action":"output","Package":"` + pkg + `","Output":"running tests:\n"}`,
		`{"Action":"output","Package":"` + pkg + `","Output":"\tTestHangs (58m2s)\n"}`,
		`{"Action":"output","Package":"` + pkg + `","Output":"\n"}`,
		`{"Action":"output","Package":"` + pkg + `","Output":"goroutine 1 [running]:\n"}`,
		`{"Action":"fail","Package":"` + pkg + `","Elapsed":3600}`,
		`# github.com/jetway-ci/jetway/broken`,
		`{"ImportPath":"github.com/jetway-ci/jetway/api [github.com/jetway-ci/jetway/api.test]","Action":"build-output","Output":"api/x_test.go:3:1: syntax error\n"}`,
		`{"ImportPath":"github.com/jetway-ci/jetway/api [github.com/jetway-ci/jetway/api.test]","Action":"build-fail"}`,
	}, "\n")
	var out, log bytes.Buffer
	r := newReport(&out, &log)
	for l := range strings.Lines(in) {
		r.line([]byte(strings.TrimSuffix(l, "\n")))
	}
	r.summary(1, "bin/test.log")

	assert.True(t, r.failed)
	got := out.String()
	assert.Contains(t, got, "the holder answered 500", "a failed test's output is printed")
	assert.NotContains(t, got, "=== RUN   TestFast", "a passed test's output is not")
	assert.Contains(t, got, "# github.com/jetway-ci/jetway/broken", "lines that are not JSON pass through")
	assert.Contains(t, got, "api/x_test.go:3:1: syntax error\n", "a build's output is printed")
	summary := got[strings.Index(got, "=== slowest tests"):]
	assert.Contains(t, summary, "=== never ended: integration TestHangs\n")
	assert.Contains(t, summary, "     42s  integration TestBroken\n"+
		"    broken_test.go:9: the holder answered 500\n"+
		"    broken_test.go:12: \n"+
		"        \tError Trace:\t/x/broken_test.go:12\n"+
		"        \tError:      \tNot equal\n"+
		"    gateway_test.go:469: gateway replica-a logs:\n"+
		"      2s  integration TestSub\n"+
		"    sub_test.go:5: one broke\n"+
		"=== every line", "a failed test's reasons, not the logs it dumps, end the summary")
	assert.Contains(t, summary, "=== timed out: "+pkg+"\npanic: test timed out after 1h0m0s\nrunning tests:\n\tTestHangs (58m2s)\n=== failed\n")
	assert.NotContains(t, summary, "TestFast", "one slowest test asked for")
	assert.Contains(t, summary, "=== every line of output: bin/test.log")
	require.Contains(t, log.String(), "=== RUN   TestFast\n")
	assert.Contains(t, log.String(), "goroutine 1 [running]:\n")
}
