// Package ownership names the labels on everything jetway creates in a
// target namespace, so one installation touches only its own objects.
package ownership

import (
	"k8s.io/apimachinery/pkg/labels"
)

const (
	// WorkerLabel names the target (Concourse worker) an object belongs to.
	WorkerLabel = "org.concourse-ci.worker"
	// InstallationLabel names the jetway installation that created it.
	InstallationLabel = "jetway-ci.dev/installation"
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
