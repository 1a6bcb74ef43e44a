package streams

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"k8s.io/apimachinery/pkg/types"

	"github.com/jetway-ci/jetway/targets"
)

// boundPod is the pod a request is made to, as podRequest found it.
type boundPod struct {
	target *targets.Target
	name   string
	uid    types.UID
}

type boundPodKey struct{}

// withBoundPod is ctx saying that its request is to the pod b names.
func withBoundPod(ctx context.Context, b boundPod) context.Context {
	return context.WithValue(ctx, boundPodKey{}, b)
}

// podBound is a transport whose requests to a pod (withBoundPod) end,
// with an error that says why, once the target's watch shows the pod
// gone, rather than wait for a kubelet that may never end their streams
// (targets.Target.WhilePod).
type podBound struct{ next http.RoundTripper }

func (b podBound) RoundTrip(req *http.Request) (*http.Response, error) {
	bp, ok := req.Context().Value(boundPodKey{}).(boundPod)
	if !ok {
		return b.next.RoundTrip(req)
	}
	ctx, stop := bp.target.WhilePod(req.Context(), bp.name, bp.uid)
	resp, err := b.next.RoundTrip(req.WithContext(ctx))
	if err != nil {
		stop()
		return nil, podGone(ctx, err)
	}
	resp.Body = &podBoundBody{ReadCloser: resp.Body, ctx: ctx, stop: stop}
	return resp, nil
}

// podGone is err, or, if the request's pod is gone, why.
func podGone(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); errors.Is(cause, targets.ErrPodGone) {
		return fmt.Errorf("%w (%v)", cause, err)
	}
	return err
}

// podBoundBody is a bound request's answer: its pod's watch ends when it
// is closed.
type podBoundBody struct {
	io.ReadCloser
	ctx  context.Context
	stop context.CancelFunc
}

func (b *podBoundBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		err = podGone(b.ctx, err)
	}
	return n, err
}

func (b *podBoundBody) Close() error {
	err := b.ReadCloser.Close()
	b.stop()
	return err
}
