package concourse

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strings"
	"time"

	"code.cloudfoundry.org/garden"
	corev1 "k8s.io/api/core/v1"

	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/volumes"
	"github.com/jetway-ci/jetway/wire"
)

// What a process writes stays where it wrote it until someone reads it.
// After each process of a container on a cluster target, each writable
// mount's volume is held by the container's pod (volumes.Held): the
// holder keeps where its files are, not a copy of them. The first read
// of a held volume (the web node's stream-out or stream-in, a volume
// made from it, a container that mounts it, an image's file read from
// it) settles it first: the pod's files are copied into the holder once
// (Holder.settle), and the volume is the holder's again. A volume the web
// node destroys while held (a copy of a task's input, which nobody reads
// after the task; an output nothing used) is never copied back.
//
// So that a held volume outlives its container, a container the web node
// destroys while its pod holds volumes is kept (containerState.Kept): it
// is gone to the web node at once, but its pod stays until the volumes
// it holds are destroyed or, past KeepGrace, settled (Pods.Release at
// each sweep). A held volume whose pod is gone (evicted, its node lost)
// is lost: it is dropped, and not reported at the next sweep, so that
// the web node makes it again; a read of it fails naming the pod.

// DefaultKeepGrace is how long a destroyed container's pod is kept for
// the volumes it holds before they are copied back: long enough for the
// web node to destroy the volumes it made for the container alone
// (its GC marks them at its next round once the container is gone, and
// the next volume sweep destroys them), so that those are never copied.
const DefaultKeepGrace = 3 * time.Minute

// hold records, for each of ct's writable mounts whose volume the holder
// keeps, that its files are now in ct's pod: nothing is copied. The
// container's record says first that it holds volumes, so that
// destroying it keeps its pod.
func (c *Containers) hold(ctx context.Context, t *targets.Target, ct *Container) error {
	p := t.CachedPod(ct.Pod)
	if p == nil {
		return fmt.Errorf("container %s: its pod %s/%s is gone: what its process wrote is lost", ct.Handle(), t.Namespace(), ct.Pod)
	}
	holds := map[string]volumes.Held{}
	for i, bm := range ct.Spec.BindMounts {
		if !writtenBack(bm) {
			continue
		}
		handle := path.Base(bm.SrcPath)
		v, err := c.Holder.Volume(ctx, ct.Target, handle)
		if err := c.wentWithHolder(ct, bm, err); err != nil {
			return err
		}
		if errors.Is(err, errVolumeNotFound) || (err == nil && v.Path != bm.SrcPath) {
			continue // not the holder's: left in the pod, as a stock worker's host path would be
		}
		if err != nil {
			return fmt.Errorf("container %s: volume %s: %w", ct.Handle(), handle, err)
		}
		// A mount others are nested in is checked only when read: it is
		// mostly a task's build dir, which the web node never reads, and
		// where a task may leave what no copy takes (a socket).
		if !holdsMounts(ct.Spec.BindMounts, bm) {
			if err := c.Holder.check(ctx, ct, mountVolume(i)); err != nil {
				return fmt.Errorf("container %s: volume %s cannot be copied out of its pod (%s): %w", ct.Handle(), handle, bm.DstPath, err)
			}
		}
		h := volumes.Held{Pod: ct.Pod, UID: string(p.UID), Mount: mountVolume(i), Container: ct.Handle()}
		if v.Held == nil || *v.Held != h {
			holds[handle] = h
		}
	}
	if len(holds) == 0 {
		return nil
	}
	if !ct.state.Holds {
		err := c.Records.Change(ctx, ct.Target, ct.Handle(), func(rc *Container) error {
			rc.state.Holds = true
			return nil
		})
		if err != nil {
			return err
		}
		ct.state.Holds = true
	}
	for handle, h := range holds {
		if err := c.Holder.setHeld(ctx, ct.Target, handle, h); err != nil {
			return fmt.Errorf("container %s: volume %s: %w", ct.Handle(), handle, err)
		}
		c.Metrics.held("held")
	}
	return nil
}

// writtenBack reports whether a process's writes to bm are the volume's:
// not a read-only mount, not the web node's /scratch (a new empty volume
// each time, never read again). A mount others are nested in is written
// back too, with the empty folders its nested mounts were made on, as a
// stock worker's volume has them: it may be an output with an input
// under it (Concourse's nested volume mounts), which the next step reads.
// Mostly it is a task's build dir, which the web node never reads and
// destroys soon after its container, within the keep grace: held in the
// pod until then, it is never copied.
func writtenBack(bm garden.BindMount) bool {
	return bm.DstPath != scratchPath && bm.Mode != garden.BindMountModeRO
}

// check asks ct's pod whether its mount's files can be copied out, as
// the holder's stream-in would take them (volumes' check): what cannot
// fails the process's step now, naming the entry, not the step that
// reads the volume later.
func (h *Holder) check(ctx context.Context, ct *Container, mount string) error {
	ctx, cancel := context.WithTimeout(ctx, holderCall)
	defer cancel()
	resp, err := h.podSender(ct.Target, ct.Pod)(ctx, http.MethodGet, "/volumes/"+url.PathEscape(mount)+"/check", nil, nil, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNoContent {
		return nil
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return errors.New(answerError(resp.StatusCode, b))
}

// setHeld records h as where target's volume handle's files are.
func (h *Holder) setHeld(ctx context.Context, target, handle string, held volumes.Held) error {
	body, _ := json.Marshal(held)
	return h.expect(ctx, target, http.MethodPut, "/volumes/"+url.PathEscape(handle)+"/held", body, http.StatusNoContent)
}

// expect sends one call to target's holder and reads its answer: an
// error but for the status want.
func (h *Holder) expect(ctx context.Context, target, method, p string, body []byte, want int) error {
	ctx, cancel := context.WithTimeout(ctx, holderCall)
	defer cancel()
	send, err := h.volumes(target)
	if err != nil {
		return err
	}
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	resp, err := send(ctx, method, p, nil, http.Header{"Content-Type": {"application/json"}}, r)
	if err != nil {
		return fmt.Errorf("volume holder of %s: %w", target, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != want {
		return &holderAnswerError{code: resp.StatusCode, msg: answerError(resp.StatusCode, b)}
	}
	return nil
}

// holderAnswerError is a holder's answer other than the one expected.
type holderAnswerError struct {
	code int
	msg  string
}

func (e *holderAnswerError) Error() string { return e.msg }

// settle copies the files of target's volume handle back into the
// holder, once, if a pod holds them: before anything reads the volume.
// Callers at once for one volume share one copy; callers on other
// gateways are ordered by the holder (the second copy is refused and
// dropped). A volume whose pod is gone is destroyed, and the error names
// the pod.
func (h *Holder) settle(ctx context.Context, target, handle string) error {
	ch := h.settling.DoChan(target+"/"+handle, func() (any, error) {
		// One copy for all callers: it ends on its own bound, not on the
		// first caller's.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), moveTimeout)
		defer cancel()
		return nil, h.settleNow(ctx, target, handle)
	})
	select {
	case r := <-ch:
		return r.Err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *Holder) settleNow(ctx context.Context, target, handle string) error {
	v, err := h.Volume(ctx, target, handle)
	if errors.Is(err, errVolumeNotFound) {
		return nil // nothing to copy: the read answers for itself
	}
	if err != nil || v.Held == nil {
		return err
	}
	held := *v.Held
	t, err := h.Targets.Target(target)
	if err != nil {
		return err
	}
	if why := podGone(t, held); why != "" {
		return h.lose(ctx, target, handle, held, why)
	}
	tmp := handle + settlingMark + rand.Text()[:8]
	body, _ := json.Marshal(volumes.CreateRequest{Handle: tmp, Strategy: &volumes.Strategy{Type: volumes.StrategyEmpty}})
	if _, err := h.create(ctx, target, body); err != nil {
		return fmt.Errorf("volume %s: copy it out of the pod %s: %w", handle, held.Pod, err)
	}
	holder := steppod.HolderName(h.Pod().Installation)
	req := streams.Request{StreamRequest: wire.StreamRequest{
		From:     wire.Endpoint{Target: target, Pod: held.Pod, Handle: held.Mount, Path: "."},
		To:       wire.Endpoint{Target: target, Pod: holder, Handle: tmp, Path: "."},
		Encoding: volumes.Raw,
	}, Caller: streams.Caller{Admin: true}}
	start := time.Now()
	res, err := h.streamRetrying(ctx, req)
	if err == nil {
		body, _ = json.Marshal(volumes.SettleRequest{From: tmp, UID: held.UID})
		err = h.expect(ctx, target, http.MethodPost, "/volumes/"+url.PathEscape(handle)+"/settle", body, http.StatusNoContent)
	}
	if ae, ok := errors.AsType[*holderAnswerError](err); ok && ae.code == http.StatusConflict {
		err = nil // settled by another gateway first: this copy is not needed
		res.Bytes = -1
	}
	if err != nil || res.Bytes < 0 {
		if derr := h.Destroy(context.WithoutCancel(ctx), target, tmp); derr != nil {
			h.logger().Warn("a volume's copy not destroyed: the web node destroys it once reported", "target", target, "volume", tmp, "error", derr.Error())
		}
	}
	if remote, ok := errors.AsType[*streams.RemoteError](err); ok && remote.Final() {
		return fmt.Errorf("volume %s cannot be copied out of the pod %s of container %s (%s): %w", handle, held.Pod, held.Container, held.Mount, remote)
	}
	if err != nil {
		return fmt.Errorf("volume %s: copy it out of the pod %s of container %s: %w", handle, held.Pod, held.Container, err)
	}
	if res.Bytes >= 0 {
		h.Metrics.moved(false, res.Bytes, time.Since(start))
		h.Metrics.held("settled")
		h.logger().Debug("volume moved", "target", target, "volume", handle, "into_pod", false, "bytes", res.Bytes, "sha256", res.SHA256)
	}
	return nil
}

// settlingMark names the copy made to settle a volume: <handle><mark><random>.
const settlingMark = "-settle-"

// settlingOf is the volume the volume handle is a copy of, made to settle
// it, if it is one.
func settlingOf(handle string) (string, bool) {
	i := strings.LastIndex(handle, settlingMark)
	return handle[:max(i, 0)], i > 0
}

// reportable are the volumes of vols the sweep reports to the web node:
// all but the copies being made to settle a held volume, which the web
// node, not knowing them, would destroy mid-copy. Once the volume is
// settled or destroyed, a copy left over (its gateway stopped) is
// reported, and the web node destroys it.
func reportable(vols []volumes.Volume) []volumes.Volume {
	held := map[string]bool{}
	for _, v := range vols {
		held[v.Handle] = v.Held != nil
	}
	return slices.DeleteFunc(slices.Clone(vols), func(v volumes.Volume) bool {
		of, ok := settlingOf(v.Handle)
		return ok && held[of]
	})
}

// podGone says why the pod held names is gone, or "" if it may still
// answer (one being deleted serves until its containers stop).
func podGone(t *targets.Target, held volumes.Held) string {
	p := t.CachedPod(held.Pod)
	switch {
	case p == nil:
		return "deleted"
	case string(p.UID) != held.UID:
		return "replaced by another pod of its name"
	case p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded:
		return "ended: " + cmp.Or(p.Status.Reason, string(p.Status.Phase))
	}
	return ""
}

// errVolumeLost: a volume's files were in a pod that is gone.
var errVolumeLost = errors.New("volume lost")

// lose takes target's volume handle away, its files gone with the pod
// held names: the holder says why to whoever asks for it after.
func (h *Holder) lose(ctx context.Context, target, handle string, held volumes.Held, why string) error {
	h.Metrics.held("lost")
	reason := fmt.Sprintf("its files were in the pod %s of container %s, which is %s; the web node makes it again", held.Pod, held.Container, why)
	h.logger().Warn("volume lost with its pod", "target", target, "volume", handle, "pod", held.Pod, "why", why)
	body, _ := json.Marshal(volumes.LoseRequest{Why: reason})
	if err := h.expect(ctx, target, http.MethodPost, "/volumes/"+url.PathEscape(handle)+"/lose", body, http.StatusNoContent); err != nil {
		return err
	}
	return fmt.Errorf("volume %s is lost: %s: %w", handle, reason, errVolumeLost)
}

// heldBy are the volumes of target's holder held by pod (its UID),
// settled or not: from the holder's list.
func (h *Holder) heldBy(ctx context.Context, target, uid string) ([]string, error) {
	vols, err := h.list(ctx, target)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, v := range vols {
		if v.Held != nil && v.Held.UID == uid {
			out = append(out, v.Handle)
		}
	}
	return out, nil
}

// keep marks ct destroyed by the web node, its pod kept for the volumes
// it holds; it reports whether it did (false: nothing to keep, destroy
// it now).
func (s *ContainerRecords) keep(ctx context.Context, ct *Container) (bool, error) {
	if !ct.state.Holds || ct.Agent || !ct.state.Lost.IsZero() {
		return false, nil // a lost pod holds nothing any more
	}
	if !ct.state.Kept.IsZero() {
		return true, nil
	}
	return true, s.Change(ctx, ct.Target, ct.Handle(), func(rc *Container) error {
		rc.state.Kept = time.Now()
		return nil
	})
}

// Release destroys the pods of target's kept containers once they hold
// no volume: at once when the web node destroyed them all, past
// KeepGrace by settling the rest; and forgets its lost containers past
// LostGrace (lost.go). It runs at each sweep.
func (h Pods) Release(ctx context.Context, target string) error {
	if h.Records == nil {
		return nil
	}
	all, err := h.Records.List(ctx, target)
	if err != nil {
		return err
	}
	var errs []error
	for _, ct := range all {
		switch {
		case !ct.state.Lost.IsZero() && time.Since(ct.state.Lost) > cmpDuration(h.LostGrace, DefaultLostGrace):
			errs = append(errs, h.forget(ctx, ct))
		case !ct.state.Kept.IsZero() && h.Holder != nil:
			errs = append(errs, h.release(ctx, ct))
		}
	}
	return errors.Join(errs...)
}

// forget deletes lost container ct's pods jetway sealed, if any are
// still listed (one that ended), then its record.
func (h Pods) forget(ctx context.Context, ct *Container) error {
	t, err := listed(h.Targets, ct.Target)
	if err != nil {
		return err
	}
	if t != nil {
		if err := destroyPods(ctx, t, h.Key(), ct.Handle()); err != nil && !errors.Is(err, ErrNotOurs) {
			return fmt.Errorf("forget lost container %s: %w", ct.Handle(), err)
		}
	}
	if err := h.Records.Delete(ctx, ct.Target, ct.Handle()); err != nil {
		return fmt.Errorf("forget lost container %s: %w", ct.Handle(), err)
	}
	h.Metrics.container("destroyed")
	return nil
}

func (h Pods) release(ctx context.Context, ct *Container) error {
	t, err := listed(h.Targets, ct.Target)
	if err != nil || t == nil {
		return err
	}
	if p := t.CachedPod(ct.Pod); p != nil {
		handles, err := h.Holder.heldBy(ctx, ct.Target, string(p.UID))
		if err != nil {
			return err
		}
		if len(handles) > 0 && time.Since(ct.state.Kept) < cmpDuration(h.KeepGrace, DefaultKeepGrace) {
			return nil
		}
		for _, handle := range handles {
			if err := h.Holder.settle(ctx, ct.Target, handle); err != nil && !errors.Is(err, errVolumeLost) {
				return fmt.Errorf("release container %s: %w", ct.Handle(), err)
			}
		}
	}
	if err := destroyPods(ctx, t, h.Key(), ct.Handle()); err != nil && !errors.Is(err, ErrNotOurs) {
		return err
	}
	return h.Records.Delete(ctx, ct.Target, ct.Handle())
}
