package cluster

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Every cluster's API server writes an audit log of the deletes of pods,
// with the pod as it was when deleted: which client (by its user agent)
// deleted which pod, and whose the pod said it was then.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
- level: RequestResponse
  verbs: ["delete"]
  resources: [{group: "", resources: ["pods"]}]
- level: None
`

// auditFlags write the policy into dir and name the API server's flags.
func auditFlags(dir string) ([]string, error) {
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
		return nil, err
	}
	return []string{"--audit-policy-file=" + policy, "--audit-log-path=" + filepath.Join(dir, "audit.log"),
		"--audit-log-format=json", "--audit-log-mode=blocking", "--audit-log-maxsize=0"}, nil
}

// PodDelete is one delete of a pod the API server did.
type PodDelete struct {
	Namespace, Name string
	UserAgent       string
	At              time.Time
	// Pod is the pod as it was deleted (its labels say whose it was),
	// nil when the delete failed.
	Pod *corev1.Pod
	// Code is the answer's status code.
	Code int
}

// PodDeletes reads the deletes of pods the cluster's API server did so
// far, in order.
func (c *Cluster) PodDeletes() ([]PodDelete, error) {
	f, err := os.Open(filepath.Join(c.dir, "audit.log"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []PodDelete
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var ev struct {
			Verb      string `json:"verb"`
			UserAgent string `json:"userAgent"`
			Stage     string `json:"stage"`
			ObjectRef struct {
				Namespace string `json:"namespace"`
				Name      string `json:"name"`
				Resource  string `json:"resource"`
			} `json:"objectRef"`
			ResponseStatus struct {
				Code int `json:"code"`
			} `json:"responseStatus"`
			ResponseObject json.RawMessage `json:"responseObject"`
			StageTimestamp time.Time       `json:"stageTimestamp"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("audit log of %s: %w", c.Name, err)
		}
		if ev.Verb != "delete" || ev.ObjectRef.Resource != "pods" || ev.Stage != "ResponseComplete" {
			continue
		}
		d := PodDelete{Namespace: ev.ObjectRef.Namespace, Name: ev.ObjectRef.Name, UserAgent: ev.UserAgent,
			At: ev.StageTimestamp, Code: ev.ResponseStatus.Code}
		var p corev1.Pod
		if ev.ResponseStatus.Code < 300 && json.Unmarshal(ev.ResponseObject, &p) == nil && p.Kind == "Pod" {
			d.Pod = &p
		}
		out = append(out, d)
	}
	return out, sc.Err()
}
