package volumes

import (
	"archive/tar"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
)

// Capacity bounds what a server's volumes take on its disk, so that the
// server refuses a write rather than let its folder grow past what holds
// it: the kubelet evicts a pod whose emptyDir takes more than its
// sizeLimit, and with a volume holder go every team's volumes on the
// target.
//
// It counts as the kubelet counts an emptyDir: the blocks of every file,
// folder and link under the root, a file with several links once. The
// server measures them once as it starts, then charges each write before
// it makes it and gives back what it removes, so it must be the only
// writer of its root (a volume holder's sidecar is; a step pod's is not:
// its step writes there too). A volume is charged its folders, names and
// links; files' contents are charged as they are written, and given back
// only when their last link goes, as their blocks are: a cow volume of
// hard links takes its parent's contents no second time, and keeps them
// on the disk when its parent is destroyed (SetLinkCopies).
type Capacity struct {
	// Bytes the volumes may take; 0: no bound and no accounting.
	Bytes int64
	// Origin says where Bytes is set, for the error that refuses a write.
	Origin string
}

// CapacityError is a write refused because the volumes would take more
// than their capacity, less the margin.
type CapacityError struct {
	Need, Used, Capacity, Margin int64
	Origin                       string
}

func (e *CapacityError) Error() string {
	msg := fmt.Sprintf("no room for %s more: the volumes take %s of their capacity of %s (%d bytes), "+
		"%s of which stays free for what the filesystem adds; nothing of it was kept",
		sizeText(e.Need), sizeText(e.Used), sizeText(e.Capacity), e.Capacity, sizeText(e.Margin))
	if e.Origin != "" {
		msg += "; the capacity is " + e.Origin
	}
	return msg
}

// sizeText is n bytes as a person reads them.
func sizeText(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d bytes", n)
}

// marginOf is what the server keeps free of a capacity: what its
// account does not see before a write. Each entry is charged, before it
// is written, its contents in whole blocks, a block per folder (also
// one an archive leaves out) and per link too long for its inode, and
// twice its name's entry in its folder (ext4's 8 bytes and the name
// rounded to 4; a folder's blocks are about half full once they split).
// Left over: the index blocks of large files (ext4's extent blocks:
// under 0.3% of a file even at one block per extent), a metadata file's
// new copy beside the old one (atomicfile), and the blocks a folder
// keeps after its entries went (ext4 never shrinks a folder). 1/64 of
// the capacity (160 MiB of the default 10 GiB), at least 1 MiB, at most
// half.
func marginOf(capacity int64) int64 {
	return min(max(capacity/64, 1<<20), capacity/2)
}

// inlineLink is the length of a link's target from which ext4 keeps it
// in a block of its own rather than in its inode.
const inlineLink = 60

// space is a server's account of its disk: a nil *space accounts
// nothing (no capacity).
type space struct {
	capacity, margin, block int64
	origin                  string

	mu   sync.Mutex
	used int64              // bytes charged: the start's walk, and every change since
	vols map[string]*charge // by handle

	// links is held while a file's links are counted and one removed,
	// or one added (unlink, link).
	links sync.Mutex
}

// charge is what one volume is charged: its folders, names and links
// (files; not its files' contents, which other volumes may share), and
// its metadata.
type charge struct{ files, meta int64 }

// newSpace measures what root holds, for a server of capacity c; nil
// without a capacity.
func newSpace(root string, c Capacity) (*space, error) {
	if c.Bytes <= 0 {
		return nil, nil
	}
	// The server's own folders are made now, to be measured with the rest.
	for _, dir := range []string{"volumes", "meta"} {
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			return nil, err
		}
	}
	sp := &space{capacity: c.Bytes, margin: marginOf(c.Bytes), origin: c.Origin, block: blockSize(root),
		vols: map[string]*charge{}}
	if err := sp.measure(root); err != nil {
		return nil, fmt.Errorf("measure the volumes under %s: %w", root, err)
	}
	return sp, nil
}

// measure charges what root holds, as the kubelet counts it, each
// volume's folders, links and metadata to the volume (its files'
// contents to no volume: their last link frees them).
func (sp *space) measure(root string) error {
	return walkDisk(root, func(p string, n int64, file bool) {
		sp.used += n
		rel, _ := filepath.Rel(root, p)
		parts := strings.SplitN(filepath.ToSlash(rel), "/", 3)
		switch {
		case file && parts[0] == "volumes":
		case len(parts) >= 2 && parts[0] == "volumes" && validHandle(parts[1]):
			sp.of(parts[1]).files += n
		case len(parts) == 2 && parts[0] == "meta" && strings.HasSuffix(parts[1], ".json"):
			if h := strings.TrimSuffix(parts[1], ".json"); validHandle(h) {
				sp.of(h).meta += n
			}
		}
	})
}

// DiskUsage is what the folder root takes on its disk, as the kubelet
// counts an emptyDir before it evicts a pod past the emptyDir's
// sizeLimit (k8s.io/kubernetes pkg/volume/util/fs.DiskUsage): the blocks
// of every file, folder and link under it, a file with several links
// once.
func DiskUsage(root string) (int64, error) {
	if _, err := os.Lstat(root); err != nil {
		return 0, err
	}
	var n int64
	err := walkDisk(root, func(_ string, b int64, _ bool) { n += b })
	return n, err
}

// walkDisk tells visit what each file, folder and link under root takes
// on its disk (DiskUsage), and whether it is a regular file.
func walkDisk(root string, visit func(path string, n int64, file bool)) error {
	seen := map[uint64]bool{}
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil // gone since it was listed
		}
		if err != nil {
			return err
		}
		info, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		visit(p, diskBytes(info, seen), info.Mode().IsRegular())
		return nil
	})
}

// of is handle's charge, made if it has none; with sp.mu held, or before
// the server serves.
func (sp *space) of(handle string) *charge {
	c := sp.vols[handle]
	if c == nil {
		c = &charge{}
		sp.vols[handle] = c
	}
	return c
}

// setMeta charges handle's metadata file of size bytes in place of the
// one it had, or refuses it.
func (sp *space) setMeta(handle string, size int64) error {
	if sp == nil {
		return nil
	}
	n := roundUp(size, sp.block) + nameBytes(len(handle)+len(".json"))
	sp.mu.Lock()
	defer sp.mu.Unlock()
	c := sp.of(handle)
	if err := sp.fits(n - c.meta); err != nil {
		return err
	}
	sp.used += n - c.meta
	c.meta = n
	return nil
}

// forget takes the volume handle out of the account, now that it is
// removed: its metadata is given back, and the bytes its files are
// charged are returned, for the caller to free once they are gone (a
// folder's; a link's folder stays, and its charge with it).
func (sp *space) forget(handle string, files bool) int64 {
	if sp == nil {
		return 0
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	c := sp.vols[handle]
	if c == nil {
		return 0
	}
	delete(sp.vols, handle)
	sp.used -= c.meta
	if !files {
		return 0
	}
	return c.files
}

// free gives back n bytes whose files are gone.
func (sp *space) free(n int64) {
	if sp == nil {
		return
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.used -= n
}

// fits says whether n more bytes fit, with sp.mu held.
func (sp *space) fits(n int64) error {
	if n <= 0 || sp.used+n <= sp.capacity-sp.margin {
		return nil
	}
	return &CapacityError{Need: n, Used: sp.used, Capacity: sp.capacity, Margin: sp.margin, Origin: sp.origin}
}

// claim begins a change of the volume handle (a stream-in, a copy, a new
// folder): what it writes is charged as it goes, and kept for the volume
// or given back once it ends.
func (sp *space) claim(handle string) *claim {
	if sp == nil {
		return nil
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return &claim{sp: sp, handle: handle, vol: sp.vols[handle], dir: "."}
}

// A claim is what one change takes of the space. A nil *claim takes
// nothing.
type claim struct {
	sp       *space
	handle   string
	vol      *charge // the volume's charge as the change began; nil: a new volume
	n        int64   // bytes taken for folders, names and links
	contents int64   // bytes taken for files' contents
	dir      string  // the folder of the last entry: folders an entry makes past it are charged
}

// take takes n bytes for folders, names and links and contents for
// files' contents, or refuses them if they do not fit: the change stops
// there, writing none of them.
func (c *claim) take(n, contents int64) error {
	if c == nil || n+contents <= 0 {
		return nil
	}
	sp := c.sp
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if err := sp.fits(n + contents); err != nil {
		return err
	}
	sp.used += n + contents
	c.n += n
	c.contents += contents
	return nil
}

// folders takes a block for each of n folders, and their names' room
// in their folders (as long as a name may be).
func (c *claim) folders(n int) error {
	if c == nil {
		return nil
	}
	return c.take(int64(n)*(c.sp.block+nameBytes(maxName)), 0)
}

// maxName is the longest name a folder holds (ext4's, xfs's).
const maxName = 255

// nameBytes is what a name of n bytes takes in its folder: ext4's 8
// bytes and the name rounded up to 4, twice, as a folder's blocks are
// about half full once they split.
func nameBytes(n int) int64 { return 2 * (8 + roundUp(int64(n), 4)) }

// entry takes what one entry of a change will take, before it is
// written: name is its path in the folder written into (slash-separated),
// size a regular file's, link a link's target. It charges a block for
// each folder above name past the previous entry's folder (an archive
// may leave its folders out: extraction makes them), so entries in walk
// order are charged each folder once.
func (c *claim) entry(name string, mode fs.FileMode, size int64, link string) error {
	if c == nil {
		return nil
	}
	name = path.Clean(name)
	if name == "." {
		return nil // the folder written into: there already
	}
	block := c.sp.block
	dir := path.Dir(name)
	n := newFolders(c.dir, dir, block) + nameBytes(len(path.Base(name)))
	var contents int64
	c.dir = dir
	switch {
	case mode.IsDir():
		n += block
		c.dir = name
	case mode.IsRegular():
		contents = roundUp(size, block)
	case mode&fs.ModeSymlink != 0 && len(link) >= inlineLink:
		n += block
	}
	return c.take(n, contents)
}

// reserve is entry for a tar header (tarsafe.Limits.Reserve).
func (c *claim) reserve(h *tar.Header) error {
	return c.entry(h.Name, h.FileInfo().Mode(), h.Size, h.Linkname)
}

// newFolders is what the folders of dir past those it shares with prev
// take (slash-separated, clean paths; "." is none): a block each, and
// their names.
func newFolders(prev, dir string, block int64) int64 {
	if dir == "." {
		return 0
	}
	d := strings.Split(dir, "/")
	var p []string
	if prev != "." {
		p = strings.Split(prev, "/")
	}
	i := 0
	for i < len(d) && i < len(p) && d[i] == p[i] {
		i++
	}
	var n int64
	for _, name := range d[i:] {
		n += block + nameBytes(len(name))
	}
	return n
}

// keep charges what the claim took for folders, names and links, less
// freed (what its change removed of them), to its volume, made if the
// change made it; what it took for contents stays charged until their
// last link goes. A volume removed meanwhile took what was written with
// it: the claim is given back, but for the contents, which that
// removal measured (removeAll).
func (c *claim) keep(freed int64) {
	if c == nil {
		return
	}
	sp := c.sp
	sp.mu.Lock()
	defer sp.mu.Unlock()
	vol := sp.vols[c.handle]
	if vol != c.vol {
		sp.used -= c.n
		c.n, c.contents = 0, 0
		return
	}
	if vol == nil {
		vol = sp.of(c.handle)
	}
	freed = min(max(freed, 0), vol.files+c.n)
	vol.files += c.n - freed
	sp.used -= freed
	c.n, c.contents = 0, 0
}

// drop gives back what the claim took and did not keep: its change
// failed, and what it wrote is removed (os.RemoveAll: a half-written
// file is given back whole). If its volume was removed meanwhile, that
// removal measured the contents (keep).
func (c *claim) drop() {
	if c == nil {
		return
	}
	sp := c.sp
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.used -= c.n
	if sp.vols[c.handle] == c.vol {
		sp.used -= c.contents
	}
	c.n, c.contents = 0, 0
}

// missingFolders counts the folders of the path dir (in vol) that are
// not there yet: what making it makes.
func missingFolders(vol *os.Root, dir string) int {
	n := 0
	for dir != "." && dir != string(filepath.Separator) {
		if _, err := vol.Lstat(dir); err == nil {
			break
		}
		n++
		dir = filepath.Dir(dir)
	}
	return n
}

// remove removes name of vol, and all it holds, for the claim's change,
// which replaces it: the contents of files whose last link it removed
// are given back at once, and what it freed of the volume's folders and
// links is returned, for keep. Without a claim it measures nothing.
func (c *claim) remove(vol *os.Root, name string) (int64, error) {
	if c == nil {
		return 0, vol.RemoveAll(name)
	}
	n, contents, err := c.sp.removeAll(vol, name)
	c.sp.free(contents)
	return n, err
}

// folderBytes is what a claim charged for a folder's own block.
func (c *claim) folderBytes() int64 {
	if c == nil {
		return 0
	}
	return c.sp.block
}

// roundUp is n rounded up to a multiple of unit.
func roundUp(n, unit int64) int64 {
	if n <= 0 {
		return 0
	}
	return (n + unit - 1) / unit * unit
}

// usedBytes is what the space has charged.
func (sp *space) usedBytes() int64 {
	if sp == nil {
		return 0
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return sp.used
}

// swap charges handle the files from is charged, and takes from out of
// the account: from's folder is handle's now. It returns what handle's
// old files were charged, to free once they are gone.
func (sp *space) swap(handle, from string) int64 {
	if sp == nil {
		return 0
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	c, f := sp.of(handle), sp.of(from)
	old := c.files
	c.files = f.files
	sp.used -= f.meta
	delete(sp.vols, from)
	return old
}
