package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
)

// taskConfig is a Concourse task for `gateway execute` to try: it writes
// a file into its output, which execute downloads.
const taskConfig = `platform: linux
image_resource:
  type: registry-image
  source: {repository: busybox}
outputs:
- name: out
run:
  path: sh
  args: [-c, 'date > out/now; echo "wrote out/now: $(cat out/now)"']
`

// tryNext writes the task config and prints commands to paste into
// another terminal while the gateway runs.
func (d *demo) tryNext(tgts []target) error {
	taskPath := filepath.Join(d.o.dir, "task.yml")
	if err := os.WriteFile(taskPath, []byte(taskConfig), 0o644); err != nil {
		return err
	}
	a, b := tgts[0], tgts[1]
	gw := func(args ...string) string {
		return strings.Join(append([]string{d.gateway()}, d.cli(args...)...), " ")
	}
	commands := [][2]string{
		{gw("workers"), "the workers table again"},
		{gw("land", b.name), "no new steps on " + b.name + ": landing, then landed"},
		{gw("resume", b.name), b.name + " takes steps again"},
		{gw("place", "--tag", b.tag), "where a step tagged " + b.tag + " would run, and why not elsewhere"},
		{gw("execute", "-c", display(taskPath), "--tag", a.tag, "-o", "out="+display(filepath.Join(d.o.dir, "out"))),
			"a task config, as fly execute runs it"},
		{gw("retire", a.name), "delete " + a.name + "'s step pods and forget it, for good"},
		{"curl -s " + d.base + "/api/v1/steps/" + readHandle + "/events", "the second step's events"},
		{"curl -s " + d.base + "/api/v1/targets", "each target's health in detail"},
		{"curl -s " + d.base + "/metrics | grep ^jetway_", "the gateway's metrics"},
	}
	tw := tabwriter.NewWriter(d.story.w, 0, 4, 2, ' ', 0)
	for _, c := range commands {
		fmt.Fprintf(tw, "%s%s\t# %s\n", indent, c[0], c[1])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	d.story.line("")
	d.story.line("fly (8.2.x) works too, with a bearer token: there is no `fly login` here, and with")
	d.story.line("--no-auth any token passes. Add to ~/.flyrc, then run fly -t demo workers:")
	d.story.line("  targets: {demo: {api: %s, team: main, token: {type: bearer, value: demo}}}", d.base)
	return nil
}
