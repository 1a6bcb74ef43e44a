package volumes

import (
	"bufio"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"

	"github.com/jetway-ci/jetway/internal/tarsafe"
)

// Encodings, as in Accept-Encoding / Content-Encoding.
const (
	Raw  = "raw"
	Gzip = "gzip"
	Zstd = "zstd"
	S2   = "s2"
)

// volume resolves a request's volume, as the folder that holds it and
// the path inside it, or answers 404.
func (s *Server) volume(w http.ResponseWriter, r *http.Request) (base, sub string, ok bool) {
	handle := r.PathValue("handle")
	base = s.Path(handle)
	if !s.exists(handle) {
		fail(w, http.StatusNotFound, "volume %q not found", handle)
		return "", "", false
	}
	// A step's volumes are symlinks to folders of its build dir: serve
	// the folder itself.
	base, err := filepath.EvalSymlinks(base)
	if err != nil {
		fail(w, http.StatusNotFound, "volume %q not found", handle)
		return "", "", false
	}
	// The path is inside the volume, even with a leading slash (fly's
	// uploads stream in at "/").
	sub = strings.TrimLeft(filepath.FromSlash(r.URL.Query().Get("path")), "/")
	if sub == "" {
		sub = "."
	}
	if !filepath.IsLocal(sub) {
		fail(w, http.StatusBadRequest, "path %q leaves the volume", r.URL.Query().Get("path"))
		return "", "", false
	}
	return base, filepath.Clean(sub), true
}

// streamIn extracts a tar into the volume path. It extracts into a
// temporary folder and moves it in place only once the whole stream
// arrived, so a truncated stream never lands; nor does one past the
// request's limit (baggageclaim's limit query), refused with a 403, nor
// one past the volumes' capacity (or the disk's), refused with a 507 at
// the first entry that does not fit.
func (s *Server) streamIn(w http.ResponseWriter, r *http.Request) {
	if !s.holds(r) && !s.useTicket(r) {
		unauthorized(w)
		return
	}
	base, sub, ok := s.volume(w, r)
	if !ok {
		return
	}
	q := r.URL.Query().Get("limit")
	limit, err := streamLimit(q)
	if err != nil {
		fail(w, http.StatusBadRequest, "stream-in: %v", err)
		return
	}
	in := &limitedReader{r: r.Body, left: limit}
	c := s.space.claim(r.PathValue("handle"))
	defer c.drop()
	// Its image, if one was made, was of other files: before (so that
	// none made meanwhile is kept) and after.
	s.images.forget(r.PathValue("handle"))
	defer s.images.forget(r.PathValue("handle"))
	if code, err := s.land(base, sub, r.Header.Get("Content-Encoding"), in, c); err != nil {
		if in.past {
			// Decoders may replace the reader's error: ask it.
			code, err = http.StatusForbidden, fmt.Errorf("the stream goes past its limit of %s MB (%d bytes)", q, limit)
		}
		fail(w, code, "stream-in: %v", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// land extracts the tar stream in, encoded as enc says, into a new
// folder of the volume base, then moves what it holds into the path sub
// of the volume, as baggageclaim extracts into the volume: what sub held
// beside it stays, and a folder at sub stays the same folder (a
// container's mount of it sees what lands). sub is reached only inside
// the volume (an os.Root): a step can make links in its volumes, and a
// path through one that leaves the volume is refused. If the stream
// fails, it says why and the status to answer; the volume is as it was.
// What it writes is claimed of c before it is written, and kept for the
// volume, less what it replaced, once it landed.
func (s *Server) land(base, sub, enc string, in io.Reader, c *claim) (int, error) {
	vol, err := os.OpenRoot(base)
	if err != nil {
		return http.StatusInternalServerError, err
	}
	defer vol.Close()
	// The folders up to sub, and the one the stream lands in.
	if err := c.folders(missingFolders(vol, filepath.Dir(sub)) + 1); err != nil {
		return http.StatusInsufficientStorage, err
	}
	if err := vol.MkdirAll(filepath.Dir(sub), 0o755); err != nil {
		return http.StatusBadRequest, fmt.Errorf("path %q cannot be reached inside the volume (a link out of it?): %w", sub, err)
	}
	body, err := decoder(enc, in)
	if err != nil {
		return http.StatusBadRequest, err
	}
	defer body.Close()
	tmp, err := os.MkdirTemp(base, ".stream-in-")
	if err != nil {
		return http.StatusInternalServerError, err
	}
	defer os.RemoveAll(tmp)
	// Whoever the step runs as may read and write what lands (the
	// sidecar runs as its own user).
	if err := os.Chmod(tmp, 0o777); err != nil {
		return http.StatusInternalServerError, err
	}
	if _, err := tarsafe.Extract(body, tmp, s.extractLimits(c)); err != nil {
		// A refused entry is a bad archive for this volume; no room, or
		// an entry the sidecar may not write, is final too.
		return cmp.Or(finalStatus(err), http.StatusBadRequest), err
	}
	// The tar ended; the encoded stream and the request body must end
	// there too, completely: a cut connection fails here, not silently.
	if _, err := io.Copy(io.Discard, body); err != nil {
		return http.StatusBadRequest, err
	}
	if _, err := io.Copy(io.Discard, in); err != nil {
		return http.StatusBadRequest, err
	}
	landed := filepath.Base(tmp)
	fi, err := vol.Lstat(sub)
	var freed int64 // what it replaced
	switch {
	case errors.Is(err, fs.ErrNotExist):
		err = vol.Rename(landed, sub)
	case err != nil:
		return http.StatusBadRequest, fmt.Errorf("path %q cannot be reached inside the volume (a link out of it?): %w", sub, err)
	case fi.IsDir():
		freed, err = mergeInto(vol, landed, sub, c)
	default: // a file or a link: replaced
		if freed, err = c.remove(vol, sub); err == nil {
			err = vol.Rename(landed, sub)
		}
	}
	if err != nil {
		return http.StatusInternalServerError, err
	}
	c.keep(freed)
	return 0, nil
}

// mergeInto moves each entry of the volume's folder src into its folder
// dst: a folder into a folder of the same name entry by entry, anything
// else in place of what dst has of that name (a link is replaced, never
// followed). The root's mode is taken as the tar set it. It returns the
// bytes c was charged for what it replaced: the entries of dst, and
// src's folders, emptied, which go with the temporary folder.
func mergeInto(vol *os.Root, src, dst string, c *claim) (int64, error) {
	if fi, err := vol.Lstat(src); err == nil {
		_ = vol.Chmod(dst, fi.Mode().Perm())
	}
	d, err := vol.Open(src)
	if err != nil {
		return 0, err
	}
	entries, err := d.ReadDir(-1)
	d.Close()
	if err != nil {
		return 0, err
	}
	freed := c.folderBytes()
	for _, e := range entries {
		from, to := filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())
		if e.IsDir() {
			if fi, err := vol.Lstat(to); err == nil && fi.IsDir() {
				n, err := mergeInto(vol, from, to, c)
				freed += n
				if err != nil {
					return freed, err
				}
				continue
			}
		}
		n, err := c.remove(vol, to)
		freed += n
		if err != nil {
			return freed, err
		}
		if err := vol.Rename(from, to); err != nil {
			return freed, err
		}
	}
	return freed, nil
}

// noLimit is a stream-in without a limit.
const noLimit = math.MaxInt64 - 1

// streamLimit reads stream-in's limit query, as baggageclaim's client
// sends it: the MB (MiB) the request body may carry, a float ("%f"),
// where 0 or nothing means no limit.
func streamLimit(q string) (int64, error) {
	if q == "" {
		return noLimit, nil
	}
	mb, err := strconv.ParseFloat(q, 64)
	if err != nil || mb < 0 || math.IsNaN(mb) {
		return 0, fmt.Errorf("limit %q is not a number of MB", q)
	}
	if b := mb * (1 << 20); mb > 0 && b < noLimit {
		return int64(b), nil
	}
	return noLimit, nil
}

// limitedReader reads at most left bytes of r; a byte more is an error,
// and past records that it came.
type limitedReader struct {
	r    io.Reader
	left int64
	past bool
}

var errPastLimit = errors.New("the stream goes past its limit")

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.past {
		return 0, errPastLimit
	}
	if int64(len(p)) > l.left+1 {
		p = p[:l.left+1]
	}
	n, err := l.r.Read(p)
	if int64(n) > l.left {
		l.past = true
		return int(l.left), errPastLimit
	}
	l.left -= int64(n)
	return n, err
}

func (s *Server) streamOut(w http.ResponseWriter, r *http.Request) {
	base, sub, ok := s.volume(w, r)
	if !ok {
		return
	}
	vol, err := os.OpenRoot(base)
	if err != nil {
		fail(w, http.StatusNotFound, "volume %q not found", r.PathValue("handle"))
		return
	}
	defer vol.Close()
	if _, err := vol.Lstat(sub); err != nil {
		// The words baggageclaim's client compares to tell a missing
		// file from a missing volume (a web node reads an image's
		// metadata.json, which may be absent).
		fail(w, http.StatusNotFound, "no such file or directory")
		return
	}
	enc := r.Header.Get("Accept-Encoding")
	var sink io.Writer = w
	if rate := s.rate.Load(); rate > 0 {
		sink = &throttled{ctx: r.Context(), w: w, rate: rate, start: time.Now()}
	}
	client := &failingWriter{w: sink}
	out, err := Encoder(enc, client)
	if err != nil {
		fail(w, http.StatusBadRequest, "%v", err)
		return
	}
	trailer := r.Header.Get(AcceptErrorTrailer) != ""
	if trailer {
		w.Header().Set("Trailer", ErrorTrailer)
	}
	w.Header().Set("Content-Encoding", encodingName(enc))
	w.WriteHeader(http.StatusOK)
	err = writeTar(out, vol, sub)
	if err == nil {
		err = out.Close()
	}
	switch {
	case err == nil:
	case !trailer || client.err != nil:
		panic(http.ErrAbortHandler) // cut the response: no clean end
	default: // the volume failed, not the client: say why
		w.Header().Set(ErrorTrailer, errorTrailer(writeStatus(err), fmt.Sprintf("volume %s: %v", r.PathValue("handle"), err)))
	}
}

// streamP2POut pushes the volume path straight to another server's
// stream-in URL. A push that fails for what the volume holds, or that
// the destination refuses for what the archive holds, answers that
// failure's own status (failure.go); any other failure of the push, 502.
func (s *Server) streamP2POut(w http.ResponseWriter, r *http.Request) {
	base, sub, ok := s.volume(w, r)
	if !ok {
		return
	}
	vol, err := os.OpenRoot(base)
	if err != nil {
		fail(w, http.StatusNotFound, "volume %q not found", r.PathValue("handle"))
		return
	}
	defer vol.Close()
	target := r.URL.Query().Get("streamInURL")
	enc := encodingName(r.URL.Query().Get("encoding"))
	pr, pw := io.Pipe()
	written := make(chan struct{})
	sent := &hashingWriter{w: pw, h: sha256.New()}
	push := &failingWriter{w: sent}
	var archiveErr error // the volume's failure, not the push's; read once written is closed
	go func() {
		defer close(written)
		out, err := Encoder(enc, push)
		if err == nil {
			// The tar's headers and small files go in writes of up
			// to 64 KiB, not one each; a larger write (a file's
			// contents, 1 MiB at a time) passes as it is.
			buf := bufio.NewWriterSize(out, 64<<10)
			err = writeTar(buf, vol, sub)
			if err == nil {
				err = buf.Flush()
			}
		}
		if err == nil {
			err = out.Close()
		}
		if push.err == nil {
			archiveErr = err
		}
		pw.CloseWithError(err)
	}()
	// Whatever the push's outcome, the writer stops once nobody reads.
	stop := func() { pr.Close(); <-written }
	defer stop()
	req, err := http.NewRequestWithContext(r.Context(), http.MethodPut, target, pushBody{pr})
	if err != nil {
		fail(w, http.StatusBadRequest, "streamInURL: %v", err)
		return
	}
	req.Header.Set("Content-Encoding", enc)
	if a := r.Header.Get(StreamInAuthorization); a != "" {
		req.Header.Set("Authorization", a)
	}
	resp, err := s.Client.Do(req)
	if err == nil {
		defer resp.Body.Close()
	}
	if err != nil || resp.StatusCode != http.StatusNoContent {
		stop()
		failPush(w, r.PathValue("handle"), target, resp, err, archiveErr)
		return
	}
	// The destination took the whole stream: say what it was.
	answer(w, http.StatusOK, P2PResult{Bytes: sent.n, SHA256: hex.EncodeToString(sent.h.Sum(nil))})
}

// failPush answers a push of volume handle to target that failed (err,
// or the destination's answer resp): the destination's refusal of what
// the archive holds as its own (passedOn), else the volume's own failure
// (archiveErr: a file the server may not read), else a 502.
func failPush(w http.ResponseWriter, handle, target string, resp *http.Response, err, archiveErr error) {
	switch {
	case resp != nil:
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		if passedOn(resp.StatusCode) {
			fail(w, resp.StatusCode, "the destination refused the push: %s", errorMessage(b))
			return
		}
		fail(w, http.StatusBadGateway, "stream to %s: %s: %s", target, resp.Status, strings.TrimSpace(string(b)))
	case archiveErr != nil:
		fail(w, writeStatus(archiveErr), "volume %s: %v", handle, archiveErr)
	default:
		fail(w, http.StatusBadGateway, "stream to %s: %v", target, err)
	}
}

// pushChunk is the chunk a push sends its stream in: the HTTP client
// takes each whole from the writer (pushBody), which then reads and
// hashes the next while the client sends it; 1 MiB, as the archive
// copies files' contents (BenchmarkMove).
const pushChunk = 1 << 20

// pushBody is a push's request body: the HTTP client copies it through
// a buffer of pushChunk (its own is 32 KiB), so that a write of the
// archive's is taken in one read.
type pushBody struct{ r io.Reader }

func (b pushBody) Read(p []byte) (int, error) { return b.r.Read(p) }

func (b pushBody) WriteTo(w io.Writer) (int64, error) {
	return io.CopyBuffer(w, b.r, make([]byte, pushChunk))
}

// P2PResult is stream-p2p-out's answer: the encoded bytes the destination
// accepted, and their SHA-256.
type P2PResult struct {
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
}

// hashingWriter counts and hashes what passes.
type hashingWriter struct {
	w io.Writer
	h hash.Hash
	n int64
}

func (hw *hashingWriter) Write(p []byte) (int, error) {
	n, err := hw.w.Write(p)
	hw.h.Write(p[:n])
	hw.n += int64(n)
	return n, err
}

func encodingName(enc string) string {
	if enc == "" {
		return Raw
	}
	return enc
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// Encoder writes to w in the encoding enc names (Raw, Gzip, Zstd or S2;
// "" is Raw), as stream-out answers; Close ends the encoding.
func Encoder(enc string, w io.Writer) (io.WriteCloser, error) {
	switch encodingName(enc) {
	case Raw:
		return nopWriteCloser{w}, nil
	case Gzip:
		return gzip.NewWriterLevel(w, gzip.DefaultCompression)
	case Zstd:
		return zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedFastest))
	case S2:
		// One goroutine, the caller's: a concurrent s2 writer keeps a
		// goroutine until Close, which a cut stream never calls.
		return s2.NewWriter(w, s2.WriterConcurrency(1)), nil
	}
	return nil, fmt.Errorf("unsupported encoding %q (raw, gzip, zstd, s2)", enc)
}

func decoder(enc string, r io.Reader) (io.ReadCloser, error) {
	switch encodingName(enc) {
	case Raw:
		return io.NopCloser(r), nil
	case Gzip:
		return gzip.NewReader(r)
	case Zstd:
		d, err := zstd.NewReader(r)
		if err != nil {
			return nil, err
		}
		return d.IOReadCloser(), nil
	case S2:
		return io.NopCloser(s2.NewReader(r)), nil
	}
	return nil, fmt.Errorf("unsupported encoding %q (raw, gzip, zstd, s2)", enc)
}

// writeTar writes sub of the volume vol as a tar: a folder's contents by
// their paths inside it, or a file or link alone by its base name, with
// all a stock worker's tar carries (tarsafe.Writer: modes, numeric
// owners, times, hard links within sub, devices and FIFOs). It reads
// through vol, an os.Root, so no link leads it out of the volume (a step
// may make any link in its volumes, and an image's rootfs holds absolute
// ones): links are written as links, never followed. A failure names the
// entry it met (entryError).
func writeTar(w io.Writer, vol *os.Root, sub string) error {
	tw := tarsafe.NewWriter(w)
	top, err := vol.Lstat(sub)
	if err != nil {
		return err
	}
	if !top.IsDir() {
		// One file: a tar of it alone, by its base name, as
		// baggageclaim's `tar -C dir file` makes it.
		name := filepath.Base(sub)
		if err := tw.Add(vol, sub, name, top); err != nil {
			return entryError(name, err)
		}
		return tw.Close()
	}
	from := filepath.ToSlash(sub)
	err = fs.WalkDir(vol.FS(), from, func(p string, d fs.DirEntry, err error) error {
		name := p
		if from != "." {
			name = strings.TrimPrefix(p, from+"/")
		}
		if err != nil {
			return entryError(name, err) // a folder it may not read
		}
		if p == from {
			return nil
		}
		info, err := d.Info()
		if err == nil {
			err = tw.Add(vol, filepath.FromSlash(p), name, info)
		}
		if err != nil {
			return entryError(name, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// throttled writes at about rate bytes per second, until ctx ends.
type throttled struct {
	ctx   context.Context
	w     io.Writer
	rate  int64
	n     int64
	start time.Time
}

func (t *throttled) Write(p []byte) (int, error) {
	total := len(p)
	for len(p) > 0 {
		chunk := p[:min(len(p), 64<<10)]
		n, err := t.w.Write(chunk)
		t.n += int64(n)
		if err != nil {
			return n, err
		}
		if f, ok := t.w.(http.Flusher); ok {
			f.Flush()
		}
		if ahead := time.Duration(t.n*int64(time.Second)/t.rate) - time.Since(t.start); ahead > 0 {
			wait := time.NewTimer(ahead)
			select {
			case <-wait.C:
			case <-t.ctx.Done():
				wait.Stop()
				return total - len(p) + len(chunk), t.ctx.Err()
			}
		}
		p = p[len(chunk):]
	}
	return total, nil
}

// extractLimits are what one archive may write into a volume: the
// server's limits, each entry claimed of c (nil: none counted).
func (s *Server) extractLimits(c *claim) tarsafe.Limits {
	s.mu.Lock()
	limits := s.limits
	s.mu.Unlock()
	// A volume is mounted in a container, which resolves its links in
	// its own root: an image's rootfs is full of absolute ones. The
	// sidecar itself reads volumes only through an os.Root (writeTar).
	limits.ForeignLinks = true
	if c != nil {
		limits.Reserve = c.reserve
	}
	return limits
}
