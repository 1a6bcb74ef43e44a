// Command pause is the sandbox ("pause") container of the real test node's
// pods (integration/cluster): it holds the pod's namespaces, reaps the
// children it inherits as the pod's first process, and exits on SIGINT or
// SIGTERM. No registry is reachable from the test machines, so `make
// node-images` packs it into the image containerd's sandbox_image names.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
