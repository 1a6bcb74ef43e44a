package agentmount

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/jetway-ci/jetway/internal/backoff"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/targets"
)

// Targets are the targets to choose for: the registry.
type Targets interface {
	Snapshot() []targets.Status
	Target(name string) (*targets.Target, error)
	// Changed is closed at the next change of any target.
	Changed() <-chan struct{}
}

// Options configure a Chooser.
type Options struct {
	Targets Targets
	// Interval re-makes each target's decision this often (a node
	// replaced by one with an older runtime shows within it); default 5m.
	Interval time.Duration
	// Timeout bounds one target's List of nodes; default 10s.
	Timeout time.Duration
	// Concurrency bounds the Lists in flight; default 8.
	Concurrency int
	Logger      *slog.Logger
	Metrics     *Metrics
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Chooser keeps a decision per target; steppod.Build asks it
// (steppod.MountChooser). Its zero decision, before a target's first
// List, is the init container.
type Chooser struct {
	opts Options

	mu      sync.RWMutex
	choices map[string]choice
}

// choice is one target's decision, made with cfg at at.
type choice struct {
	cfg   *targets.Config
	mount steppod.AgentMount
	why   string
	at    time.Time
}

// New builds a Chooser; Start keeps its decisions.
func New(opts Options) *Chooser {
	if opts.Interval <= 0 {
		opts.Interval = 5 * time.Minute
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Second
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = 8
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Chooser{opts: opts, choices: make(map[string]choice)}
}

// AgentMount is the mount chosen for t's step pods: the init container
// until one was chosen with t's current configuration. It never blocks.
func (c *Chooser) AgentMount(t *targets.Target) steppod.AgentMount {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if ch, ok := c.choices[t.Name()]; ok && ch.cfg == t.Config {
		return ch.mount
	}
	return steppod.AgentInitContainer
}

// Start chooses for each target at once, for a new or reconfigured one
// when it shows, and again every Interval, until ctx ends.
func (c *Chooser) Start(ctx context.Context) error {
	timer := time.NewTimer(backoff.Jitter(c.opts.Interval, 0.1)) // the first refresh decides for all
	defer timer.Stop()
	all := false
	for {
		changed := c.opts.Targets.Changed()
		c.refresh(ctx, all)
		all = false
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-timer.C:
			all = true
			timer.Reset(backoff.Jitter(c.opts.Interval, 0.1))
		}
		// Targets change with each of their step pods: look at most
		// once a second.
		if backoff.Sleep(ctx, time.Second) != nil {
			return nil
		}
	}
}

// refresh decides again for each target (all), or for those without a
// decision made with their current configuration, and forgets the
// targets that are gone. It returns once every List ended.
func (c *Chooser) refresh(ctx context.Context, all bool) {
	var due []*targets.Target
	seen := make(map[string]bool)
	now := c.opts.Now()
	c.mu.RLock()
	for _, st := range c.opts.Targets.Snapshot() {
		seen[st.Name] = true
		t, err := c.opts.Targets.Target(st.Name)
		if err != nil || targets.IsAgent(st) {
			continue // no clients (an invalid entry, an agent's target): nothing to build pods with
		}
		if ch, ok := c.choices[st.Name]; all || !ok || ch.cfg != t.Config {
			due = append(due, t)
		}
	}
	c.mu.RUnlock()
	c.forget(seen)
	sem := make(chan struct{}, c.opts.Concurrency)
	var wg sync.WaitGroup
	for _, t := range due {
		select {
		case <-ctx.Done():
		case sem <- struct{}{}:
			wg.Go(func() {
				defer func() { <-sem }()
				mount, why := c.decide(ctx, t)
				if ctx.Err() == nil { // stopping: a cancelled List says nothing of the nodes
					c.record(t, mount, why, now)
				}
			})
		}
	}
	wg.Wait()
}

// decide lists the nodes t's step pods may land on (its nodeSelector's)
// and decides from them; the init container when it cannot list them.
func (c *Chooser) decide(ctx context.Context, t *targets.Target) (steppod.AgentMount, string) {
	ctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	defer cancel()
	// ResourceVersion "0": the API server's cache answers, not etcd.
	opts := metav1.ListOptions{ResourceVersion: "0"}
	if sel := t.Config.Meta.NodeSelector; len(sel) > 0 {
		opts.LabelSelector = labels.SelectorFromSet(sel).String()
	}
	nodes, err := t.Core.Nodes().List(ctx, opts)
	switch {
	case apierrors.IsForbidden(err):
		return steppod.AgentInitContainer, "may not list nodes"
	case err != nil:
		return steppod.AgentInitContainer, fmt.Sprintf("list nodes: %v", err)
	}
	return Decide(nodes.Items)
}

// record keeps t's decision, logging and counting a change.
func (c *Chooser) record(t *targets.Target, mount steppod.AgentMount, why string, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	name := t.Name()
	old, had := c.choices[name]
	if had && old.at.After(at) {
		return // a later refresh decided already
	}
	c.choices[name] = choice{cfg: t.Config, mount: mount, why: why, at: at}
	if had && old.mount == mount {
		return
	}
	c.opts.Logger.Info("step agent mount chosen", "target", name, "mount", mount, "why", why)
	c.opts.Metrics.chose(name, old.mount, mount)
}

// forget drops the decisions of targets not in seen.
func (c *Chooser) forget(seen map[string]bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for name, ch := range c.choices {
		if !seen[name] {
			delete(c.choices, name)
			c.opts.Metrics.forgot(name, ch.mount)
		}
	}
}
