package steppod

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func runningPod() *corev1.Pod {
	return &corev1.Pod{
		Spec: corev1.PodSpec{NodeName: "node-1"},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning,
			Conditions: []corev1.PodCondition{
				{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
				{Type: corev1.PodReady, Status: corev1.ConditionTrue},
			},
			ContainerStatuses: []corev1.ContainerStatus{
				{Name: StepContainer, Ready: true, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}},
				{Name: SidecarContainer, Ready: true, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}},
			},
		},
	}
}

func waiting(reason, msg string) func(p *corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Status.Phase = corev1.PodPending
		p.Status.ContainerStatuses[0].State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}
	}
}

func TestPodFailure(t *testing.T) {
	tests := []struct {
		name      string
		change    func(p *corev1.Pod)
		failed    bool
		reason    string
		message   string
		transient bool
	}{
		{name: "running", change: func(*corev1.Pod) {}},
		{name: "pending, not yet scheduled", change: func(p *corev1.Pod) {
			p.Status = corev1.PodStatus{Phase: corev1.PodPending}
		}},
		{name: "unschedulable", change: func(p *corev1.Pod) {
			p.Status = corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{
				Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable,
				Message: "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."}}}
		}, failed: true, reason: "Unschedulable", message: "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."},
		{name: "pull: not found", change: waiting("ErrImagePull", `failed to pull and unpack image "docker.io/library/nope:1": docker.io/library/nope:1: not found`),
			failed: true, reason: "ErrImagePull"},
		{name: "pull: unauthorized", change: waiting("ImagePullBackOff", `Back-off pulling image "reg/x": 401 Unauthorized`),
			failed: true, reason: "ImagePullBackOff"},
		{name: "pull: rate limited", change: waiting("ErrImagePull", `429 Too Many Requests - Server message: toomanyrequests: You have reached your pull rate limit`),
			failed: true, reason: "ErrImagePull", transient: true},
		{name: "pull: registry 503", change: waiting("ErrImagePull", `unexpected status code 503 Service Unavailable`),
			failed: true, reason: "ErrImagePull", transient: true},
		{name: "invalid image name", change: waiting("InvalidImageName", `couldn't parse image name "A:B:C"`),
			failed: true, reason: "InvalidImageName"},
		{name: "container creating", change: waiting("ContainerCreating", "")},
		{name: "oom in the sidecar", change: func(p *corev1.Pod) {
			p.Status.ContainerStatuses[1].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "OOMKilled", ExitCode: 137}}
		}, failed: true, reason: "OOMKilled", message: `container "volumes": OOMKilled (137)`},
		{name: "oom in the step", change: func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodFailed
			p.Status.ContainerStatuses[0].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "OOMKilled", ExitCode: 137}}
		}, failed: true, reason: "OOMKilled", message: `container "step": OOMKilled (137)`},
		{name: "evicted", change: func(p *corev1.Pod) {
			p.Status.Phase, p.Status.Reason, p.Status.Message = corev1.PodFailed, "Evicted", "The node was low on resource: ephemeral-storage."
		}, failed: true, reason: "Evicted", message: "The node was low on resource: ephemeral-storage."},
		{name: "node lost", change: func(p *corev1.Pod) {
			p.Status.Reason, p.Status.Message = "NodeLost", "Node node-1 which was running pod x is unresponsive"
		}, failed: true, reason: "NodeLost"},
		{name: "node not ready", change: func(p *corev1.Pod) {
			p.Status.Conditions[1].Status = corev1.ConditionFalse
		}, failed: true, reason: "NodeNotReady"},
		{name: "starting: a container not ready yet", change: func(p *corev1.Pod) {
			p.Status.Conditions[1].Status = corev1.ConditionFalse
			p.Status.ContainerStatuses[1].Ready = false
		}},
		{name: "taint eviction", change: func(p *corev1.Pod) {
			p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.DisruptionTarget,
				Status: corev1.ConditionTrue, Reason: "DeletionByTaintManager", Message: "Taint manager: deleting due to NoExecute taint"})
		}, failed: true, reason: "DeletionByTaintManager"},
		{name: "deleted: the containers stop on their kubelet's TERM", change: func(p *corev1.Pod) {
			p.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)}
			p.Status.ContainerStatuses[0].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Completed"}}
		}, failed: true, reason: "PodDeleted", message: "the step's pod was deleted by someone else"},
		{name: "step container ended", change: func(p *corev1.Pod) {
			p.Status.ContainerStatuses[0].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Error", ExitCode: 2}}
		}, failed: true, reason: "Error", message: `container "step" exited 2: `},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := runningPod()
			tt.change(p)
			f, failed := PodFailure(p)
			assert.Equal(t, tt.failed, failed, "%+v", f)
			assert.Equal(t, tt.reason, f.Reason)
			if tt.message != "" {
				assert.Equal(t, tt.message, f.Message)
			}
			assert.Equal(t, tt.transient, f.Transient)
		})
	}
}
