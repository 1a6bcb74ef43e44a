// Command step-agent is what jetway runs inside a step pod: see package
// stepagent for its commands and the files it keeps, and package
// stepagent/cli for its command line.
package main

import (
	"os"

	"github.com/jetway-ci/jetway/stepagent/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:])) }
