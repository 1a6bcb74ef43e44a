// Package agentmount chooses, per target, how step pods get the step
// agent when the gateway runs with --step-agent-mount auto: an image
// volume when every node the target's step pods may land on reports a
// runtime and kubelet that mount one, an init container otherwise or when
// the gateway cannot tell (it may not list the target's nodes: listing
// nodes is not among the permissions a target requires). The Chooser
// keeps one decision per target, re-made every few minutes and when a
// target appears or is reconfigured, never while a step pod is built:
// steppod.Build reads the cached decision (docs/steps.md).
package agentmount
