package steppod

import (
	"cmp"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Failure is why Kubernetes says a step pod cannot run (or finish) its
// step, in Kubernetes' own words.
type Failure struct {
	Reason, Message string
	// Transient failures (an image pull refused for a passing reason) end
	// the step only after the image-pull grace.
	Transient bool
}

// PodFailure reads a step pod's status as a kubelet, the scheduler and the
// node controller write it, and says whether the step cannot go on.
func PodFailure(p *corev1.Pod) (Failure, bool) {
	checks := []func(*corev1.Pod) (Failure, bool){oomKilled, phaseFailed, disrupted, deleting, unschedulable, waitingFailure, containerEnded, nodeNotReady}
	for _, check := range checks {
		if f, ok := check(p); ok {
			return f, true
		}
	}
	return Failure{}, false
}

func allStatuses(p *corev1.Pod) []corev1.ContainerStatus {
	return append(append([]corev1.ContainerStatus(nil), p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...)
}

// oomKilled: any container of the pod, the sidecar included.
func oomKilled(p *corev1.Pod) (Failure, bool) {
	for _, cs := range allStatuses(p) {
		for _, st := range []corev1.ContainerState{cs.State, cs.LastTerminationState} {
			if t := st.Terminated; t != nil && t.Reason == "OOMKilled" {
				code := t.ExitCode
				if code == 0 {
					code = 137
				}
				return Failure{Reason: "OOMKilled", Message: fmt.Sprintf("container %q: OOMKilled (%d)", cs.Name, code)}, true
			}
		}
	}
	return Failure{}, false
}

// phaseFailed: evicted, node lost, or failed for another reason.
func phaseFailed(p *corev1.Pod) (Failure, bool) {
	if p.Status.Phase != corev1.PodFailed && p.Status.Reason != "NodeLost" {
		return Failure{}, false
	}
	reason := p.Status.Reason
	if reason == "" {
		reason = "PodFailed"
	}
	msg := p.Status.Message
	if msg == "" {
		msg = "the pod failed"
	}
	return Failure{Reason: reason, Message: msg}, true
}

// disrupted: the pod is about to go (taint eviction, preemption, pod GC).
func disrupted(p *corev1.Pod) (Failure, bool) {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
			return Failure{Reason: cmp.Or(c.Reason, "DisruptionTarget"), Message: c.Message}, true
		}
	}
	return Failure{}, false
}

// PodDeleted: the pod was deleted by someone else than its owner.
var PodDeleted = Failure{Reason: "PodDeleted", Message: "the step's pod was deleted by someone else"}

// PodReplaced: the pod of the step's name is not the one the step had (its
// UID differs): the step's was deleted, and another made in its place.
// PodNotBound: the pod of the step's name is not bound to jetway's create
// (ownership.Key.Bound): made by someone else, its seal copied.
var PodNotBound = Failure{Reason: "PodNotBound", Message: "the pod of the step's name is not the one jetway made (not bound to jetway's create: planted, its seal copied); jetway gave it nothing"}

var PodReplaced = Failure{Reason: "PodReplaced", Message: "the step's pod was deleted and another pod made under its name; jetway gave it nothing"}

// deleting: the pod is being deleted. A kubelet stops its containers
// first (TERM to each container's first process, the agent's pid1, which
// exits 0), so the containers' ends say less than the deletion does.
func deleting(p *corev1.Pod) (Failure, bool) {
	return PodDeleted, p.DeletionTimestamp != nil
}

func unschedulable(p *corev1.Pod) (Failure, bool) {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return Failure{Reason: "Unschedulable", Message: c.Message}, true
		}
	}
	return Failure{}, false
}

// permanentPull are signs, in a kubelet's image pull message, of a pull
// that cannot succeed by waiting: the image or the right to it is missing,
// or its name is wrong.
var permanentPull = []string{
	"not found", "manifest unknown", "name unknown", "unauthorized", "authentication required",
	"denied", "forbidden", "invalid reference format", "repository does not exist",
}

// waitingFailure: a container that cannot start.
func waitingFailure(p *corev1.Pod) (Failure, bool) {
	for _, cs := range allStatuses(p) {
		w := cs.State.Waiting
		if w == nil {
			continue
		}
		msg := fmt.Sprintf("container %q: %s", cs.Name, w.Message)
		switch w.Reason {
		case "ErrImagePull", "ImagePullBackOff":
			low := strings.ToLower(w.Message)
			transient := true
			for _, sign := range permanentPull {
				if strings.Contains(low, sign) {
					transient = false
				}
			}
			return Failure{Reason: w.Reason, Message: msg, Transient: transient}, true
		case "InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError", "CreateContainerError", "RunContainerError":
			return Failure{Reason: w.Reason, Message: msg}, true
		}
	}
	return Failure{}, false
}

// containerEnded: a container of a step pod never ends while the step
// runs (the step container idles after the process, the sidecar serves),
// so one that did took the step with it. An init container that failed
// did too.
func containerEnded(p *corev1.Pod) (Failure, bool) {
	for _, cs := range p.Status.InitContainerStatuses {
		if t := cs.State.Terminated; t != nil && t.ExitCode != 0 {
			return Failure{Reason: cmp.Or(t.Reason, "Error"), Message: fmt.Sprintf("init container %q exited %d: %s", cs.Name, t.ExitCode, t.Message)}, true
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil {
			return Failure{Reason: cmp.Or(t.Reason, "ContainerExited"), Message: fmt.Sprintf("container %q exited %d: %s", cs.Name, t.ExitCode, t.Message)}, true
		}
	}
	return Failure{}, false
}

// nodeNotReady: a running pod whose containers all run and say they are
// ready, but which is not Ready, was marked so by the node controller (it
// flips the pod's condition alone): its node stopped reporting.
func nodeNotReady(p *corev1.Pod) (Failure, bool) {
	if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) == 0 {
		return Failure{}, false
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Running == nil || !cs.Ready {
			return Failure{}, false
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionFalse {
			return Failure{Reason: "NodeNotReady", Message: fmt.Sprintf("node %s stopped reporting: the pod is not Ready (%s)", p.Spec.NodeName, cmp.Or(c.Message, c.Reason))}, true
		}
	}
	return Failure{}, false
}

// terminated reports whether a pod's container has ended.
func Terminated(p *corev1.Pod, name string) bool {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == name {
			return cs.State.Terminated != nil
		}
	}
	return false
}
