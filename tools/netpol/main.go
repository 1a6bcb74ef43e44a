// Command netpol enforces NetworkPolicies on the real test node: the
// Kubernetes SIG Network's reference enforcer, kube-network-policies
// (nftables and an nfqueue of the node's own), run as a process of the
// harness with a kubeconfig rather than as a DaemonSet pod. The real node's
// bridge CNI plugin enforces none; this lets tests prove a policy
// (a hermetic step's) rather than only read it back.
//
// It runs until SIGINT or SIGTERM, then deletes its nftables table.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/kube-network-policies/pkg/networkpolicy"
)

func main() {
	var (
		kubeconfig, node, table string
		queue                   int
	)
	klog.InitFlags(nil)
	flag.StringVar(&kubeconfig, "kubeconfig", "", "the cluster's admin kubeconfig")
	flag.StringVar(&node, "node", "", "the node's name: the pods it enforces policies for")
	flag.StringVar(&table, "table", "jetway-netpol", "the nftables table (inet family) it fills, and deletes when it stops")
	flag.IntVar(&queue, "queue", 177, "the nfqueue number it decides packets from")
	flag.Parse()
	if err := run(kubeconfig, node, table, queue); err != nil {
		fmt.Fprintln(os.Stderr, "netpol:", err)
		os.Exit(1)
	}
}

func run(kubeconfig, node, table string, queue int) error {
	if kubeconfig == "" || node == "" {
		return fmt.Errorf("--kubeconfig and --node are required")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	factory := informers.NewSharedInformerFactory(client, 0)
	c, err := networkpolicy.NewController(client,
		factory.Networking().V1().NetworkPolicies(), factory.Core().V1().Namespaces(), factory.Core().V1().Pods(),
		nil, nil, nil, nil,
		networkpolicy.Config{QueueID: queue, NodeName: node, NFTableName: table, NRIdisabled: true})
	if err != nil {
		return err
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	return c.Run(ctx) // until ctx ends; it deletes its table on the way out
}
