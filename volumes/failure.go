package volumes

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"strconv"
	"strings"
	"syscall"
)

// A copy that fails for what a volume or an archive holds fails the same
// way the next time: a file the server may not read (a root-only folder,
// for a sidecar without the privilege), an entry the extractor refuses
// (a FIFO where none is taken, a link out, an archive past its limits),
// a disk or quota with no room. The server answers such a failure with a
// status a client must not retry (streams.RemoteError.Final), and a
// message naming the entry and why; anything else (a cut connection, a
// file gone while the walk passed) with one it may.

// StatusUnreadable answers a copy of a volume that holds an entry the
// server may not read or write (EACCES, EPERM).
const StatusUnreadable = http.StatusUnprocessableEntity

// finalStatus is the status of a copy that failed for err if the next try
// meets the same: 507 when there is no room (the volumes' capacity, the
// disk's, a quota's), StatusUnreadable for an entry the server may not
// read or write. 0 for any other failure.
func finalStatus(err error) int {
	_, full := errors.AsType[*CapacityError](err)
	switch {
	case full, errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return http.StatusInsufficientStorage
	case errors.Is(err, fs.ErrPermission):
		return StatusUnreadable
	}
	return 0
}

// writeStatus is the status of a failed write or copy: finalStatus's
// (507 is passed on by the gateway to the web node with the message),
// else 500.
func writeStatus(err error) int { return cmp.Or(finalStatus(err), http.StatusInternalServerError) }

// entryError names the entry a walk of a volume failed at, and why: a
// path error's operation and cause, without the path, which the entry
// names.
func entryError(name string, err error) error {
	if pe, ok := err.(*fs.PathError); ok {
		return fmt.Errorf("tar entry %q: %s: %w", name, pe.Op, pe.Err)
	}
	return fmt.Errorf("tar entry %q: %w", name, err)
}

// A stream-out's answer begins (200) before the archive is written, so a
// failure after that cannot be its status. A client that sends
// AcceptErrorTrailer gets it as the trailer ErrorTrailer instead: the
// archive stops there (without its end) and the body ends, then the
// trailer says "<status> <message>", the status an error answer would
// have had. Such a client must read the body to its end and take a
// body with that trailer as failed (StreamOutFailure). Any other client
// gets the connection cut: it sees no clean end.
const (
	AcceptErrorTrailer = "Accept-Error-Trailer"
	ErrorTrailer       = "Volume-Error"
)

// errorTrailer is ErrorTrailer's value for a failure of code saying msg,
// on one line.
func errorTrailer(code int, msg string) string {
	return strconv.Itoa(code) + " " + strings.Join(strings.Fields(strings.ToValidUTF8(msg, "?")), " ")
}

// StreamOutFailure is the failure a stream-out's trailers name, once its
// body has ended: its status and message, and whether there is one.
func StreamOutFailure(trailer http.Header) (code int, msg string, failed bool) {
	v := trailer.Get(ErrorTrailer)
	if v == "" {
		return 0, "", false
	}
	c, msg, _ := strings.Cut(v, " ")
	code, err := strconv.Atoi(c)
	if err != nil || code < 400 || code > 599 {
		return http.StatusBadGateway, v, true // not ours: a failure, that may pass
	}
	return code, msg, true
}

// passedOn reports whether a push's destination answered code for what
// the archive holds (its extractor's refusal, no room): stream-p2p-out
// answers it as its own, so that the gateway sees it as final; any other
// failure of the push is a 502.
func passedOn(code int) bool {
	switch code {
	case http.StatusBadRequest, http.StatusForbidden, StatusUnreadable, http.StatusInsufficientStorage:
		return true
	}
	return false
}

// errorMessage is an error answer's message: its JSON's "error", else
// its body.
func errorMessage(body []byte) string {
	var e errorBody
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		return e.Error
	}
	return strings.TrimSpace(string(body))
}

// failingWriter records the first error of its writer: what failed on the
// way to the client, not in the volume.
type failingWriter struct {
	w   io.Writer
	err error
}

func (f *failingWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if err != nil && f.err == nil {
		f.err = err
	}
	return n, err
}
