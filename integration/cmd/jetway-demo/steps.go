package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/jetway-ci/jetway/client"
	"github.com/jetway-ci/jetway/wire"
)

// The story's two steps: the first's output is the second's input.
const (
	writeHandle = "write-greeting"
	readHandle  = "read-greeting"
	greeting    = "greeting"
)

// crossClusterSteps runs a task on a's target that writes a file into its
// output, then a task on b's whose input is that output, so that the
// gateway streams the file from the pod on a into the pod on b. The second
// must print what the first wrote.
func (d *demo) crossClusterSteps(ctx context.Context, a, b target) error {
	c, err := client.New(client.Options{URL: d.base})
	if err != nil {
		return err
	}
	d.story.line("(each request as curl would send it; the demo sends it with jetway's Go client")
	d.story.line("and follows the step's events)")
	clusterOf := map[string]string{a.name: a.cluster, b.name: b.cluster}

	write := task(writeHandle, a.tag,
		`echo "hello from `+a.cluster+`, written at $(date +%T)" > `+greeting+`/hello.txt; cat `+greeting+`/hello.txt`)
	write.Outputs = []wire.Output{{Name: greeting}}
	wrote, err := d.runStep(ctx, c, write, &stepPrinter{story: d.story, clusterOf: clusterOf},
		fmt.Sprintf("a task for a target tagged %s; its folder %s stays as an output:", a.tag, greeting))
	if err != nil {
		return err
	}

	read := task(readHandle, b.tag, `cat `+greeting+`/hello.txt`)
	read.Inputs = []wire.Input{{Name: greeting, From: wire.InputSource{Step: writeHandle, Output: greeting}}}
	got, err := d.runStep(ctx, c, read, &stepPrinter{story: d.story, clusterOf: clusterOf,
		from: "from " + writeHandle + "'s pod on " + a.cluster + ", through the gateway"},
		fmt.Sprintf("a task for a target tagged %s; its input %s is %s's output:", b.tag, greeting, writeHandle))
	if err != nil {
		return err
	}
	if got != wrote {
		return fmt.Errorf("%s printed %q, but %s wrote %q", readHandle, got, writeHandle, wrote)
	}
	d.story.line("%s read on %s the file %s wrote on %s.", readHandle, b.cluster, writeHandle, a.cluster)
	return nil
}

func task(handle, tag, script string) wire.Request {
	return wire.Request{Handle: handle, Type: "task", Tags: []string{tag}, Image: "busybox",
		Run: wire.Run{Path: "sh", Args: []string{"-c", script}}}
}

// runStep writes the step's request into the demo's folder, shows the curl
// command that would send it, runs it and tells its events; it returns
// what the step printed on stdout.
func (d *demo) runStep(ctx context.Context, c *client.Client, req wire.Request, p *stepPrinter, about string) (string, error) {
	path := filepath.Join(d.o.dir, "steps", req.Handle+".json")
	if err := writeJSON(path, req); err != nil {
		return "", err
	}
	d.story.line("")
	d.story.command("curl", "-s", d.base+"/api/v1/steps", "-d", "@"+display(path))
	d.story.line("  %s", about)
	d.story.line("  %s -c '%s'", req.Run.Path, req.Run.Args[1])
	p.out = &output{w: d.story.w}
	_, err := c.Run(ctx, req, p.event)
	p.out.end()
	if err != nil {
		return "", fmt.Errorf("step %s: %w", req.Handle, err)
	}
	return p.stdout.String(), nil
}

// writeJSON writes v as indented JSON, as a person would write a request.
func writeJSON(path string, v any) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // the scripts' > stays readable
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

// stepPrinter tells a step's events as they come.
type stepPrinter struct {
	story     *story
	out       *output
	clusterOf map[string]string // target -> cluster
	from      string            // where the step's inputs come from
	stdout    strings.Builder
}

func (p *stepPrinter) event(e wire.Event) {
	switch e.Type {
	case wire.EventStdout:
		p.stdout.Write(e.Output())
		_, _ = p.out.Write(e.Output())
		return
	case wire.EventStderr:
		_, _ = p.out.Write(e.Output())
		return
	}
	p.out.end()
	switch e.Type {
	case wire.EventWaiting:
		p.story.line("waiting: %s", e.Message)
	case wire.EventPlaced:
		p.story.line("placed on %s (%s), pod %s", e.Target, p.clusterOf[e.Target], e.Pod)
	case wire.EventInput:
		p.story.line("input %s: %d bytes (sha256 %.12s…) streamed in %s", e.Input, e.Bytes, e.SHA256, p.from)
	case wire.EventExited:
		if e.ExitStatus != nil {
			p.story.line("exited %d", *e.ExitStatus)
		}
	case wire.EventFailed:
		p.story.line("failed: %s: %s", e.Reason, e.Message)
	}
}
