package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/jetway-ci/jetway/concourse"
	"github.com/jetway-ci/jetway/config"
	"github.com/jetway-ci/jetway/internal/kubecount"
	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/steps"
)

// stepState is the gateway's part in its installation's step state: the
// records, its Lease among the gateways', and its campaign for the placer
// Lease. unavailable says why there is none (steps are then refused).
type stepState struct {
	store   *steps.Store
	owners  *steps.Owners
	elector *steps.Elector
	// key seals the installation's pods and derives their sidecars'
	// tokens (ownership.Key); keys reads it from the state namespace.
	key  ownership.Key
	keys *ownership.KeyLoader
	// records are the web node's containers on cluster targets, kept in
	// the state namespace.
	records     *concourse.ContainerRecords
	unavailable string
}

// serviceAccountNamespace is where a pod finds its own namespace.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// newStepState connects to the state namespace of cfg, as identity.
func newStepState(cfg config.Config, identity string, reg prometheus.Registerer, logger *slog.Logger) (stepState, error) {
	rc, ns, err := stateConfig(cfg)
	if err != nil {
		return stepState{}, &config.Error{Problems: []config.Problem{{Key: "state-kubeconfig", Message: err.Error()}}}
	}
	if rc == nil {
		return stepState{unavailable: "no state namespace to keep them in: set state-kubeconfig, or run the gateway in a cluster with a service account (docs/steps.md)"}, nil
	}
	if ns == "" {
		return stepState{}, &config.Error{Problems: []config.Problem{{Key: "state-namespace", Message: "required: the state kubeconfig's context names no namespace"}}}
	}
	rc = rest.CopyConfig(rc)
	rc.UserAgent = "jetway/" + identity
	requests := &kubecount.Counts{}
	rc.Wrap(requests.Wrap)
	reg.MustRegister(kubecount.NewCollector("jetway_state_api", "the state namespace's API server", nil, func(yield func([]string, *kubecount.Counts)) { yield(nil, requests) }))
	log := logger.With("component", "steps", "state_namespace", ns)
	store, err := steps.NewStore(steps.StoreOptions{Config: rc, Namespace: ns, Installation: cfg.Installation, Logger: log})
	if err != nil {
		return stepState{}, err
	}
	owners, err := steps.NewOwners(steps.OwnersOptions{Config: rc, Namespace: ns, Installation: cfg.Installation,
		Identity: identity, Logger: log})
	if err != nil {
		return stepState{}, err
	}
	elector, err := steps.NewElector(steps.ElectorOptions{Config: rc, Namespace: ns, Installation: cfg.Installation,
		Identity: identity, Logger: log})
	if err != nil {
		return stepState{}, err
	}
	// The pod key and the web node's container records: every Garden
	// call reads or writes a record, so client-go's default 5 requests a
	// second would queue a pipeline's calls (as the step records' store).
	crc := rest.CopyConfig(rc)
	crc.QPS, crc.Burst = 100, 200
	client, err := kubernetes.NewForConfig(crc)
	if err != nil {
		return stepState{}, err
	}
	keys := ownership.NewKeyLoader(client.CoreV1(), ns, cfg.Installation, log)
	log.Info("steps are kept in the state namespace", "identity", identity)
	return stepState{store: store, owners: owners, elector: elector, keys: keys, key: keys.Key(),
		records: &concourse.ContainerRecords{Secrets: client.CoreV1().Secrets(ns), Installation: cfg.Installation}}, nil
}

// stateConfig reaches the state namespace: the state kubeconfig's
// cluster, or the one the gateway runs in; nil when there is neither.
func stateConfig(cfg config.Config) (*rest.Config, string, error) {
	if cfg.StateKubeconfig != "" {
		loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: cfg.StateKubeconfig}, &clientcmd.ConfigOverrides{})
		rc, err := loader.ClientConfig()
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", cfg.StateKubeconfig, err)
		}
		ns := cfg.StateNamespace
		if ns == "" {
			if ns, _, err = loader.Namespace(); err != nil {
				return nil, "", fmt.Errorf("%s: %w", cfg.StateKubeconfig, err)
			}
		}
		return rc, ns, nil
	}
	rc, err := rest.InClusterConfig()
	if errors.Is(err, rest.ErrNotInCluster) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("in-cluster configuration: %w", err)
	}
	ns := cfg.StateNamespace
	if ns == "" {
		b, err := os.ReadFile(serviceAccountNamespace)
		if err != nil {
			return nil, "", fmt.Errorf("the gateway's own namespace: %w", err)
		}
		ns = strings.TrimSpace(string(b))
	}
	return rc, ns, nil
}
