package concourse

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/volumes"
)

// A stock worker started with --certs-dir registers that folder as its
// certs_path; the web node then makes, once per worker, a volume that
// imports it, and mounts it read-only at /etc/ssl/certs in every resource
// container (a check's, a get's, a put's), so that resources trust the
// installation's CAs. A target whose target.yaml names a ConfigMap
// (concourse.certs) registers CertsPath, and the volume that imports it
// is made in the target's holder of the ConfigMap's keys, one file each.

// CertsPath is the certs_path a target with concourse.certs registers: a
// name, not a folder of any machine's.
const CertsPath = "/jetway/resource-certs"

// maxCerts bounds the CA bundle a ConfigMap gives (a ConfigMap is at most
// 1 MiB anyway).
const maxCerts = 1 << 20

// certsImport says whether a volume create request imports CertsPath.
func certsImport(body []byte) bool {
	var req volumes.CreateRequest
	return json.Unmarshal(body, &req) == nil && req.Strategy != nil &&
		req.Strategy.Type == volumes.StrategyImport && req.Strategy.Path == CertsPath
}

// createCerts makes the volume of create request body, which imports
// CertsPath, in target's holder (send): an empty volume, into which the
// files of the target's certs ConfigMap are streamed.
func (h *Holder) createCerts(ctx context.Context, target string, send volumeSender, body []byte) (json.RawMessage, error) {
	archive, err := h.certsArchive(ctx, target)
	if err != nil {
		return nil, err
	}
	var req map[string]any
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, fmt.Errorf("the certs volume's create: %w", err)
	}
	req["strategy"] = map[string]string{"type": volumes.StrategyEmpty}
	empty, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	vol, err := h.post(ctx, target, send, empty)
	if err != nil {
		return nil, err
	}
	var v volumes.Volume
	if err := json.Unmarshal(vol, &v); err != nil {
		return nil, fmt.Errorf("the certs volume of %s: %w", target, err)
	}
	resp, err := send.call(ctx, http.MethodPut, "/volumes/"+url.PathEscape(v.Handle)+"/stream-in", url.Values{"path": {"."}},
		http.Header{"Content-Encoding": {volumes.Raw}}, archive)
	if err != nil {
		return nil, fmt.Errorf("the certs volume of %s: %w", target, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusNoContent {
		return nil, fmt.Errorf("the certs volume of %s: %s", target, answerError(resp.StatusCode, b))
	}
	return vol, nil
}

// certsArchive is a tar of the files of target's certs ConfigMap: each
// key a file of its value, readable by all, as CA bundles are.
func (h *Holder) certsArchive(ctx context.Context, target string) ([]byte, error) {
	t, err := h.Targets.Target(target)
	if err != nil {
		return nil, err
	}
	name := t.Config.Meta.Concourse.Certs
	if name == "" {
		return nil, fmt.Errorf("worker %s has no CA certificates to give (concourse.certs in its target.yaml)", target)
	}
	ctx, cancel := context.WithTimeout(ctx, recordTimeout)
	defer cancel()
	cm, err := t.Core.ConfigMaps(t.Namespace()).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("the CA certificates of worker %s (concourse.certs): ConfigMap %s/%s: %w", target, t.Namespace(), name, err)
	}
	files := map[string][]byte{}
	for k, v := range cm.Data {
		files[k] = []byte(v)
	}
	maps.Copy(files, cm.BinaryData)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, k := range slices.Sorted(maps.Keys(files)) {
		if err := tw.WriteHeader(&tar.Header{Name: k, Mode: 0o644, Size: int64(len(files[k])), ModTime: cm.CreationTimestamp.Time,
			Typeflag: tar.TypeReg}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(files[k]); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if buf.Len() > maxCerts {
		return nil, fmt.Errorf("the CA certificates of worker %s: ConfigMap %s/%s holds %d bytes; at most %d are given", target, t.Namespace(), name, buf.Len(), maxCerts)
	}
	return buf.Bytes(), nil
}
