// Command kubelet-cluster starts the integration harness's one-node
// cluster with a real kubelet (integration/cluster, docs/testing.md) for a
// person to try jetway against: it prints the admin kubeconfig's path and
// the images the node holds, runs until interrupted, then stops everything
// and puts the machine back. `make kubelet-cluster` builds what it needs
// and runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/jetway-ci/jetway/integration/cluster"
)

func main() {
	name := flag.String("name", "kubelet", "the cluster's name (its node is node-NAME)")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), cluster.StartupTimeout)
	c, err := cluster.Start(ctx, cluster.Options{Name: *name, RealNode: true})
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubelet-cluster: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("cluster %s runs with node %s (IP %s)\n", c.Name, c.NodeName(), cluster.NodeIP)
	fmt.Printf("  admin kubeconfig: %s\n", c.AdminKubeconfig())
	fmt.Printf("  try: KUBECONFIG=%s bin/kubectl get nodes -o wide\n", c.AdminKubeconfig())
	fmt.Println("  images on the node (use imagePullPolicy: IfNotPresent; no registry is reachable):")
	for _, tarball := range cluster.NodeImages {
		fmt.Printf("    %s\n", c.NodeImage(tarball))
	}
	fmt.Println("  logs: containerd.log, kubelet.log and the control plane's beside the kubeconfig")
	fmt.Println("stop with Ctrl-C (or kill -TERM " + fmt.Sprint(os.Getpid()) + "): pods are deleted and the machine is put back")
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	<-sigs
	fmt.Println("stopping...")
	c.Stop()
	fmt.Println("stopped")
}
