// Package ownership names the labels on everything jetway creates in a
// target namespace, so one installation touches only its own objects; and,
// since labels are anyone's to write, says which pods are jetway's: those
// sealed with the installation's pod key and bound to the UID jetway's
// own create returned (seal.go, bind.go).
package ownership

import (
	"k8s.io/apimachinery/pkg/labels"
)

const (
	// WorkerLabel names the target (Concourse worker) an object belongs to.
	WorkerLabel = "org.concourse-ci.worker"
	// InstallationLabel names the jetway installation that created it.
	InstallationLabel = "jetway-ci.dev/installation"
	// TeamLabel names the Concourse team a step pod runs for. A team's
	// token may stream only from and to pods with its team here; a pod
	// without it is for admins alone.
	TeamLabel = "jetway-ci.dev/team"
	// OwnerLabel names the gateway (its identity) that drives a step pod
	// or a check sandbox: the only one that changes or deletes it.
	OwnerLabel = "jetway-ci.dev/owner"
)

// Labels are the ownership labels of an object created for target by
// installation.
func Labels(target, installation string) map[string]string {
	return map[string]string{WorkerLabel: target, InstallationLabel: installation}
}

// Selector matches exactly the objects Labels marks.
func Selector(target, installation string) string {
	return labels.SelectorFromSet(Labels(target, installation)).String()
}
