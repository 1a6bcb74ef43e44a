package steps

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/targets"
)

// A session is one long exec into a sandbox pod (step-agent serve) that
// carries its checks: a check sends a request and reads its log, muxed
// with the others', instead of opening an exec of its own. The session's
// exec is the expensive part of a check (an upgrade through the API
// server to the kubelet); a warm check then costs its process alone. A
// check whose session breaks goes on by the exec path, from the last
// byte it had.
type session struct {
	in     *io.PipeWriter // frames to the agent
	wmu    sync.Mutex     // one request at a time on in
	cancel context.CancelFunc

	mu   sync.Mutex
	runs map[string]*io.PipeWriter // each run's log, as it comes
	err  error                     // why the session ended; nil while it runs
}

// sessionPing keeps a session alive: the agent ends one silent for
// stepagent.ServeIdle.
const sessionPing = stepagent.ServeIdle / 3

// sessions are the sessions open into check sandboxes, by target/pod.
type sessions struct {
	*gateway
	mu   sync.Mutex
	ctx  context.Context // start's; nil before
	open map[string]*session
	wg   sync.WaitGroup
}

func newSessions(g *gateway) *sessions { return &sessions{gateway: g, open: map[string]*session{}} }

// start lets sessions open until ctx ends; each ends with it.
func (ss *sessions) start(ctx context.Context) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.ctx = ctx
}

// wait returns once every session has ended, after start's ctx did and
// nothing opens one any more.
func (ss *sessions) wait() { ss.wg.Wait() }

// get is the live session into a sandbox pod, opened if there is none.
func (ss *sessions) get(t *targets.Target, pod string) (*session, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.ctx == nil || ss.ctx.Err() != nil {
		return nil, errNotRunning
	}
	k := t.Name() + "/" + pod
	if s := ss.open[k]; s != nil && s.alive() {
		return s, nil
	}
	ctx, cancel := context.WithCancel(ss.ctx)
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	s := &session{in: inW, cancel: cancel, runs: map[string]*io.PipeWriter{}}
	ss.open[k] = s
	ss.wg.Go(func() {
		err := ss.opts.ExecStream(ctx, t, pod, agent("serve"), inR, outW)
		outW.CloseWithError(cmp.Or(err, errors.New("the session's exec ended")))
	})
	ss.wg.Go(func() {
		err := s.demux(outR)
		s.end(err)
		inR.CloseWithError(err) // the exec's stdin copier returns
		outR.CloseWithError(err)
		ss.mu.Lock()
		if ss.open[k] == s {
			delete(ss.open, k)
		}
		ss.mu.Unlock()
		ss.opts.Logger.Debug("sandbox session ended", "target", t.Name(), "pod", pod, "error", err.Error())
	})
	ss.wg.Go(func() { s.ping(ctx) })
	return s, nil
}

// close ends the session into a sandbox pod, if one is open.
func (ss *sessions) close(target, pod string) {
	ss.mu.Lock()
	s := ss.open[target+"/"+pod]
	ss.mu.Unlock()
	if s != nil {
		s.close(errors.New("sandbox deleted"))
	}
}

func (s *session) alive() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err == nil
}

// close ends the session; its runs' readers get err.
func (s *session) close(err error) {
	s.end(err)
	s.cancel()
}

// end records why the session ended and ends every run's log with it.
func (s *session) end(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return
	}
	s.err = err
	for run, w := range s.runs {
		w.CloseWithError(fmt.Errorf("sandbox session: %w", err))
		delete(s.runs, run)
	}
}

func (s *session) ping(ctx context.Context) {
	t := time.NewTicker(sessionPing)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			s.close(ctx.Err())
			return
		case <-t.C:
			s.wmu.Lock()
			err := stepagent.WriteFrame(s.in, stepagent.KindPing, nil)
			s.wmu.Unlock()
			if err != nil {
				s.close(err)
				return
			}
		}
	}
}

// demux hands each chunk of log to its run, until the agent's output ends.
func (s *session) demux(out io.Reader) error {
	for {
		f, err := stepagent.ReadFrame(out)
		if err != nil {
			return err
		}
		if len(f.Payload) == 0 || len(f.Payload) < 1+int(f.Payload[0]) {
			return fmt.Errorf("sandbox session: %w: a muxed frame without its run", stepagent.ErrFrame)
		}
		run, chunk := string(f.Payload[1:1+f.Payload[0]]), f.Payload[1+f.Payload[0]:]
		s.mu.Lock()
		w := s.runs[run]
		s.mu.Unlock()
		if w == nil {
			continue // a run that gave up reading
		}
		switch f.Kind {
		case stepagent.KindMux:
			if _, err := w.Write(chunk); err != nil {
				s.forget(run) // its reader is done
			}
		case stepagent.KindRunError:
			w.CloseWithError(fmt.Errorf("step agent: %s", chunk))
			s.forget(run)
		}
	}
}

// start asks the agent for a run and returns its log's reader, which the
// caller closes (then forget) when done with it.
func (s *session) start(run string, spec, inputs []byte) (*io.PipeReader, error) {
	r, w := io.Pipe()
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return nil, s.err
	}
	s.runs[run] = w
	s.mu.Unlock()
	head, _ := json.Marshal(stepagent.Request{Run: run, SpecBytes: len(spec), InputsBytes: len(inputs)})
	s.wmu.Lock()
	err := stepagent.WriteFrame(s.in, stepagent.KindRequest, head)
	if err == nil {
		_, err = s.in.Write(append(spec[:len(spec):len(spec)], inputs...))
	}
	s.wmu.Unlock()
	if err != nil {
		s.close(err)
		return nil, err
	}
	return r, nil
}

// forget drops a run's reader.
func (s *session) forget(run string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w := s.runs[run]; w != nil {
		w.CloseWithError(io.ErrClosedPipe)
		delete(s.runs, run)
	}
}

// viaSession runs a check through its sandbox's session; false when the
// session could not carry it to its end (the caller goes on by exec, from
// r.offset).
func (r *runner) viaSession(ctx context.Context) (stepagent.Status, bool) {
	t, err := r.target()
	if err != nil {
		return stepagent.Status{}, false
	}
	spec, err := r.spec(ctx)
	if err != nil {
		return stepagent.Status{}, false
	}
	s, err := r.k.sessions.get(t, r.placed.Pod)
	if err != nil {
		return stepagent.Status{}, false
	}
	log, err := s.start(r.placed.Run, spec, []byte("[]"))
	if err != nil {
		return stepagent.Status{}, false
	}
	stop := context.AfterFunc(ctx, func() { log.CloseWithError(ctx.Err()) })
	defer stop()
	st, done, err := r.follower(ctx).Read(log)
	log.Close()
	s.forget(r.placed.Run)
	if !done {
		r.log.Debug("check's session broke; going on by exec", "offset", r.offset, "error", fmt.Sprint(err))
		return st, false
	}
	r.tail.end(false)
	return st, true
}
