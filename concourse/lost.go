package concourse

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/steppod"
)

// A container's pod can go without the web node asking: a node drain
// evicts it, the kubelet evicts it under pressure, pod garbage collection
// removes it once it ended or its node is lost, someone deletes it. A
// stock worker's container goes only with its worker. Such a container
// is lost (containerState.Lost), as a sweep or a process first finds:
//   - the sweep stops reporting it, so the web node marks it missing and,
//     past its --gc-missing-grace-period (5m by default), forgets it and
//     makes a new one when it next needs one (a check's container an hour
//     later);
//   - a Run or an Attach on it, and a process following it, fail at once
//     naming why, instead of waiting for a pod that never comes;
//   - past LostGrace its record, and its ended pod if that is still
//     listed, are deleted (Pods.Release), since the web node, which never
//     asks to destroy a container it forgot, will not.

// DefaultLostGrace is how long a lost container's record is kept after it
// was found lost, so that a call on it names why: well past the web
// node's --gc-missing-grace-period default (5m).
const DefaultLostGrace = time.Hour

// maxLostMessage bounds what the pod says in why a container is lost.
const maxLostMessage = 256

// lostWhy says why p, container ct's pod as listed or read, will never run
// a process of ct's again, "" if it may. verdict is the pod key's about p
// (ownership.Key.Verdict): a pod jetway did not make under ct's pod's name
// replaced it.
func lostWhy(verdict string, p *corev1.Pod) string {
	switch {
	case p == nil:
		return "was deleted"
	case verdict != "":
		return "was replaced by a pod jetway did not make (" + verdict + ")"
	case p.DeletionTimestamp != nil:
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
				return "is being deleted (" + podMessage(c.Reason, c.Message) + ")"
			}
		}
		return "is being deleted"
	case p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded:
		return "has ended (" + podMessage(string(p.Status.Phase), p.Status.Reason, p.Status.Message) + ")"
	}
	return ""
}

// podMessage is the non-empty parts (a phase, a reason, the pod's own
// message), as one phrase, bounded.
func podMessage(parts ...string) string {
	m := strings.Join(slices.DeleteFunc(parts, func(p string) bool { return p == "" }), ": ")
	if len(m) > maxLostMessage {
		m = strings.ToValidUTF8(m[:maxLostMessage], "") + "…"
	}
	return m
}

// lost says why ct's pod will never run a process of ct's again, "" if it
// may: its pod as listed, or read from the API server where the list has
// none (a list a moment behind does not lose a container). A container
// younger than createTimeout whose pod is not there yet is being made
// (its record comes first), unless made says it was.
func (w clusterWorker) lost(ctx context.Context, ct *Container, made bool) (string, error) {
	making := !made && time.Since(ct.Created) < createTimeout
	p := w.t.CachedPod(ct.Pod)
	if p == nil {
		if making {
			return "", nil // its pod is not made yet
		}
		ctx, cancel := context.WithTimeout(ctx, recordTimeout)
		defer cancel()
		got, err := w.t.Core.Pods(w.t.Namespace()).Get(ctx, ct.Pod, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return lostWhy("", nil), nil
		case err != nil:
			return "", fmt.Errorf("container %s: read its pod %s/%s: %w", ct.Handle(), w.t.Namespace(), ct.Pod, err)
		}
		p = got
	}
	verdict := w.opts.Key.Verdict(w.t.Name(), p)
	if making && verdict != "" {
		return "", nil // made, not bound yet
	}
	return lostWhy(verdict, p), nil
}

// lostError is the error of a call on ct, lost because its pod is why:
// steppod.ErrPodGone, so that a process following it ends at once.
func lostError(ct *Container, why string) error {
	return podGoneError("container " + ct.Handle() + " is lost: its pod " + ct.Pod + " " + why)
}

// podGoneError is an error that is steppod.ErrPodGone, saying only itself.
type podGoneError string

func (e podGoneError) Error() string        { return string(e) }
func (e podGoneError) Is(target error) bool { return target == steppod.ErrPodGone }

// lostError is the error of a call on ct if it is recorded lost, else nil.
func (c *Container) lostError() error {
	if c.state.Lost.IsZero() {
		return nil
	}
	return lostError(c, c.state.LostWhy)
}

// markLost records ct lost for why, once, counting and logging it.
func (s *ContainerRecords) markLost(ctx context.Context, ct *Container, why string, m *Metrics, log func(msg string, args ...any)) error {
	first := false
	err := s.Change(ctx, ct.Target, ct.Handle(), func(rc *Container) error {
		if rc.state.Lost.IsZero() {
			rc.state.Lost, rc.state.LostWhy, first = time.Now().UTC(), why, true
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("record container %s lost: %w", ct.Handle(), err)
	}
	ct.state.Lost, ct.state.LostWhy = time.Now().UTC(), why
	if first {
		m.container("lost")
		log("container lost: its pod is gone; it is no longer reported, so the web node forgets it", "target", ct.Target,
			"handle", ct.Handle(), "pod", ct.Pod, "why", why)
	}
	return nil
}
