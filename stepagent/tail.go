package stepagent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// tailPoll backs up fsnotify: how long tail waits without an event before
// it looks again (and checks the supervisor is alive).
const tailPoll = 200 * time.Millisecond

// skipBuffer is what skipping reads the log through: two whole frames, so
// a log of any size is skipped in this much memory.
const skipBuffer = 2 * (HeaderSize + MaxPayload)

// TailOptions say where TailFrom starts.
type TailOptions struct {
	// Offset is a frame boundary of the log and Events the number of
	// event frames before it: a position the caller knows (0 and 0 are
	// the log's start).
	Offset int64
	Events int
	// Skip is how many event frames to skip from there, with the other
	// frames before the last of them; below zero, every event frame the
	// log holds now (start from its current end).
	Skip int
}

// Validate reports every problem of o at once.
func (o TailOptions) Validate() error {
	var errs []error
	if o.Offset < 0 {
		errs = append(errs, fmt.Errorf("offset %d is negative", o.Offset))
	}
	if o.Events < 0 {
		errs = append(errs, fmt.Errorf("events %d is negative", o.Events))
	}
	return errors.Join(errs...)
}

// TailFrom writes the log to out from the position o names, after
// skipping o.Skip event frames: first one KindPosition frame saying where
// that is (the log's end, if the log ends before that many event frames
// exist), then every frame from there on as the log grows, and, once the
// step has ended and the log is all out, a KindStatus trailer. It returns
// ErrNotPrepared or ErrNotStarted when there is nothing to follow, an
// error when o.Offset is past the log's end, and ctx's error once ctx
// ends. Skipping reads the log through a buffer of skipBuffer bytes.
func TailFrom(ctx context.Context, root string, o TailOptions, out io.Writer) error {
	if err := o.Validate(); err != nil {
		return fmt.Errorf("tail: %w", err)
	}
	if _, err := ReadSpec(root); err != nil {
		return err
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer w.Close()
	if err := w.Add(Path(root, "run")); err != nil {
		return err
	}
	t := &tailer{out: out, pos: Position{Offset: o.Offset, Events: o.Events}, skip: o.Skip}
	defer t.close()
	polled := false
	for {
		if err := t.advance(root); err != nil {
			return err
		}
		st, done, err := ReadStatus(root)
		if err != nil {
			return err
		}
		if done && t.pos.Offset >= st.LogSize {
			return t.finish(st)
		}
		// Is anyone writing? Asked only when nothing happened for a while:
		// it costs a lock round trip, and output does not wait for it.
		if !done && polled {
			if err := checkSupervisor(root); err != nil {
				return err
			}
		}
		if polled, err = next(ctx, w); err != nil {
			return err
		}
	}
}

// tailer is one TailFrom's reading of the log.
type tailer struct {
	out io.Writer
	log *os.File // nil until the log exists
	// pos is where the reading stands; once the position frame is out
	// (sent), only its offset is kept.
	pos  Position
	skip int // event frames still to skip; below zero, all the log holds
	sent bool
	r    *bufio.Reader // skipping's, made once
}

func (t *tailer) close() {
	if t.log != nil {
		t.log.Close()
	}
}

// advance reads what the log holds now: skipping, until the position
// frame is out, then copying.
func (t *tailer) advance(root string) error {
	if t.log == nil {
		log, err := os.Open(Path(root, LogFile))
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		t.log = log
	}
	if !t.sent {
		if err := t.seek(); err != nil || !t.sent {
			return err
		}
	}
	n, err := copyFrom(t.log, t.pos.Offset, t.out)
	t.pos.Offset += n
	return err
}

// seek skips what there is to skip of the log as it is now, and sends the
// position once it stands where the output starts: in the log, with no
// event frame left to skip.
func (t *tailer) seek() error {
	fi, err := t.log.Stat()
	if err != nil {
		return err
	}
	end := fi.Size()
	if t.pos.Offset > end {
		return nil // not in the log yet, or never (see finish)
	}
	if err := t.skipTo(end); err != nil {
		return err
	}
	if t.skip > 0 {
		return nil // the event frames to skip are still to come
	}
	return t.sendPosition()
}

// skipTo skips frames up to end over the event frames still to skip,
// stopping at a frame not whole yet. A frame's payload is never held:
// only its header is read.
func (t *tailer) skipTo(end int64) error {
	if t.skip == 0 {
		return nil
	}
	section := io.NewSectionReader(t.log, t.pos.Offset, end-t.pos.Offset)
	if t.r == nil {
		t.r = bufio.NewReaderSize(section, skipBuffer)
	} else {
		t.r.Reset(section)
	}
	for t.skip != 0 {
		f, n, err := readHeader(t.r)
		if err == nil {
			_, err = t.r.Discard(n)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("skip the log at offset %d: %w", t.pos.Offset, err)
		}
		t.pos.Offset += HeaderSize + int64(n)
		if IsEvent(f.Kind) {
			t.pos.Events++
			if t.skip > 0 {
				t.skip--
			}
		}
	}
	return nil
}

// sendPosition writes the KindPosition frame, which carries no time: the
// same position reads the same from any tail.
func (t *tailer) sendPosition() error {
	b, _ := json.Marshal(t.pos)
	t.sent = true
	return WriteFrameAt(t.out, KindPosition, time.Time{}, b)
}

// finish ends a tail at the log's end: the position, if the log ended
// before it was found, and the trailer, stamped with the step's end.
func (t *tailer) finish(st Status) error {
	if t.pos.Offset > st.LogSize {
		return fmt.Errorf("offset %d is past the log's end, %d", t.pos.Offset, st.LogSize)
	}
	if !t.sent {
		if err := t.sendPosition(); err != nil {
			return err
		}
	}
	b, _ := json.Marshal(st)
	return WriteFrameAt(t.out, KindStatus, st.FinishedAt, b)
}

// next waits for the log to grow or the status to appear (true: neither
// did within tailPoll).
func next(ctx context.Context, w *fsnotify.Watcher) (bool, error) {
	timer := time.NewTimer(tailPoll)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case ev := <-w.Events:
			switch filepath.Base(ev.Name) {
			case filepath.Base(LogFile), filepath.Base(StatusFile):
				drain(w.Events)
				return false, nil
			}
		case err := <-w.Errors:
			return false, err
		case <-timer.C:
			return true, nil
		}
	}
}

// drain drops the events already queued: one look at the log covers them.
func drain(ch <-chan fsnotify.Event) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

// copyFrom copies what f holds from offset to its current end.
func copyFrom(f *os.File, offset int64, out io.Writer) (int64, error) {
	return io.Copy(out, io.NewSectionReader(f, offset, 1<<62))
}

// checkSupervisor: with no supervisor alive and no status, a step that
// started lost its supervisor (it is reported lost, never run again); one
// that never started is for run to start.
func checkSupervisor(root string) error {
	return ifNoSupervisor(root, func() error {
		if exists(Path(root, StatusFile)) {
			return nil
		}
		if !exists(Path(root, StartedFile)) {
			return ErrNotStarted
		}
		return writeStatus(root, lost(root))
	})
}
