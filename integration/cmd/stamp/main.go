// Command stamp prints the time as nanoseconds since the Unix epoch, as
// GNU `date +%s%N` does; busybox's date cannot. The real test node's base
// image holds it (`make node-images`): the step benchmarks time a
// process's start and exit with it.
package main

import (
	"fmt"
	"time"
)

func main() { fmt.Println(time.Now().UnixNano()) }
