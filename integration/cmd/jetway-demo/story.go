package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// indent is where a section's lines start, under its title.
const indent = "   "

// story prints the demo's narrative: numbered sections, indented lines
// under them, commands as a shell shows them.
type story struct{ w io.Writer }

// section starts part n; more are lines of explanation under the title.
func (s *story) section(n int, title string, more ...string) {
	fmt.Fprintf(s.w, "\n%d. %s\n", n, title)
	for _, m := range more {
		fmt.Fprintln(s.w, indent+m)
	}
}

// line prints one indented line; "" an empty one.
func (s *story) line(format string, args ...any) {
	if format == "" {
		fmt.Fprintln(s.w)
		return
	}
	fmt.Fprintf(s.w, indent+format+"\n", args...)
}

// command prints a command line before it runs.
func (s *story) command(args ...string) {
	fmt.Fprintln(s.w, indent+"$ "+strings.Join(args, " "))
}

// block prints text (a command's output), every line indented.
func (s *story) block(text string) {
	for l := range strings.Lines(text) {
		fmt.Fprint(s.w, indent+indent+l)
	}
	if text != "" && !strings.HasSuffix(text, "\n") {
		fmt.Fprintln(s.w)
	}
}

// say prints a sentence outside the sections, after an empty line.
func (s *story) say(format string, args ...any) {
	fmt.Fprintf(s.w, "\n"+format+"\n", args...)
}

// then prints a sentence right under the last.
func (s *story) then(format string, args ...any) {
	fmt.Fprintf(s.w, format+"\n", args...)
}

// output prints a step's output, "| " before every line, as it comes in
// chunks that may end anywhere in a line.
type output struct {
	w       io.Writer
	midLine bool
}

func (o *output) Write(p []byte) (int, error) {
	for l := range strings.Lines(string(p)) {
		if !o.midLine {
			fmt.Fprint(o.w, indent+"| ")
		}
		fmt.Fprint(o.w, l)
		o.midLine = !strings.HasSuffix(l, "\n")
	}
	return len(p), nil
}

// end finishes a last line without a newline.
func (o *output) end() {
	if o.midLine {
		fmt.Fprintln(o.w)
		o.midLine = false
	}
}

// display is a path as the user would type it: relative to the current
// folder when it is inside it.
func display(path string) string {
	abs, err := filepath.Abs(path)
	if err != nil {
		return path
	}
	wd, err := os.Getwd()
	if err != nil {
		return path
	}
	rel, err := filepath.Rel(wd, abs)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return abs
	}
	return rel
}
