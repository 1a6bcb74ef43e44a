package stepagent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jetway-ci/jetway/wire"
)

// defaultPath is the process's PATH when neither the image nor the step
// gives one.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// defaultKillGrace is the time between TERM and KILL when a spec names none.
const defaultKillGrace = 10 * time.Second

// openLock opens run/lock, which the live supervisor holds.
func openLock(root string) (*os.File, error) {
	return os.OpenFile(Path(root, LockFile), os.O_RDWR|os.O_CREATE, 0o644)
}

// tryLock takes f's lock if no one holds it.
func tryLock(f *os.File) (bool, error) {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return false, nil
	}
	return err == nil, err
}

// Supervise runs the prepared step once: it holds run/lock while it
// lives, writes the inputs, a started frame and the process's output to
// the log, and last status.json. A step that ever started is never
// started again: a supervisor finding it started but not ended reports it
// lost.
func Supervise(root string) error {
	lock, err := openLock(root)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	_ = lock.Truncate(0)
	_, _ = lock.WriteAt([]byte(strconv.Itoa(os.Getpid())), 0)
	if exists(Path(root, StatusFile)) || exists(Path(root, AbortFile)) && !exists(Path(root, StartedFile)) {
		return finishUnstarted(root)
	}
	if exists(Path(root, StartedFile)) {
		return writeStatus(root, lost(root))
	}
	sp, err := ReadSpec(root)
	if err != nil {
		return err
	}
	log, err := os.OpenFile(Path(root, LogFile), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	if err := writeInputs(root, log); err != nil {
		return err
	}
	setSubreaper()
	return run(root, sp, log)
}

// lostStatus ends a step whose process started under a supervisor that
// died: whether the process ran to its end, and how, is unknown, so it is
// never run again. (The supervisor is the pod's step agent, or a
// `gateway agent`'s: the message names neither.)
var lostStatus = Status{Reason: ReasonLost, Message: "the step's supervisor died before its process ended"}

// lost is the status of a step whose supervisor died: OOMKilled when the
// kernel killed processes in the container at its memory limit since the
// step's process started (the supervisor, a process of the container too,
// may be its choice), else lost.
func lost(root string) Status {
	b, err := os.ReadFile(Path(root, StartedFile))
	var started Started
	if err != nil || json.Unmarshal(b, &started) != nil || oomKills(cgroupFS) <= started.OOMKills {
		return lostStatus
	}
	return Status{Reason: ReasonOOMKilled, ExitStatus: 137, Signal: syscall.SIGKILL.String(),
		Message: "the kernel killed the step's supervisor and its process: their container reached its memory limit"}
}

// finishUnstarted ends a step aborted before its process started.
func finishUnstarted(root string) error {
	if exists(Path(root, StatusFile)) {
		return nil
	}
	return writeStatus(root, Status{Reason: ReasonAborted, ExitStatus: 0, Message: "aborted before the process started"})
}

func writeInputs(root string, log io.Writer) error {
	b, err := os.ReadFile(Path(root, InputsFile))
	if errors.Is(err, os.ErrNotExist) || err == nil && len(b) == 0 {
		return nil
	}
	if err != nil {
		return err
	}
	var inputs []wire.InputDigest
	if err := json.Unmarshal(b, &inputs); err != nil {
		return fmt.Errorf("inputs: %w", err)
	}
	for _, in := range inputs {
		p, _ := json.Marshal(in)
		if err := WriteFrame(log, KindInput, p); err != nil {
			return err
		}
	}
	return nil
}

// writeStatus writes status.json last, with the log's final size.
func writeStatus(root string, st Status) error {
	if fi, err := os.Stat(Path(root, LogFile)); err == nil {
		st.LogSize = fi.Size()
	}
	if st.FinishedAt.IsZero() {
		st.FinishedAt = time.Now().UTC()
	}
	b, _ := json.Marshal(st)
	return writeAtomic(Path(root, StatusFile), b)
}

// command builds the process: the image's environment (the agent's,
// without jetway's own variables) with the step's on top, its working
// dir in the build dir, its stdin, its user, its own process group.
func command(root string, sp Spec) (*exec.Cmd, error) {
	env := environ(sp.Env)
	bin, err := lookPath(sp.Path, env)
	if err != nil {
		return nil, err
	}
	dir := workDir(root, sp.Dir)
	if filepath.IsAbs(sp.Dir) {
		// As Garden does (Concourse's SetupCwd): a web node's process
		// may name a working dir its container lacks, such as
		// /tmp/build/check of fly intercept into a check container.
		if err := os.MkdirAll(dir, 0o777); err != nil {
			return nil, fmt.Errorf("working dir %s: %w", sp.Dir, err)
		}
	}
	cmd := &exec.Cmd{Path: bin, Args: append([]string{sp.Path}, sp.Args...), Env: env, Dir: dir}
	if len(sp.Stdin) > 0 && !sp.StdinStream {
		cmd.Stdin = strings.NewReader(string(sp.Stdin))
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if sp.User != "" {
		cred, err := credential(sp.User)
		if err != nil {
			return nil, err
		}
		cmd.SysProcAttr.Credential = cred
	}
	return cmd, nil
}

// workDir is the process's working directory: dir in the build dir, or
// an absolute dir as it is (a Concourse web node's process, in its
// container's own mounts), under FSEnv's folder where it is set.
func workDir(root, dir string) string {
	if !filepath.IsAbs(dir) {
		return Path(root, filepath.Join(BuildDir, dir))
	}
	if fs := os.Getenv(FSEnv); fs != "" {
		return filepath.Join(fs, dir)
	}
	return dir
}

// environ is the process's environment.
func environ(step []string) []string {
	vars := map[string]string{}
	var order []string
	set := func(kv string) {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := vars[k]; !ok {
			order = append(order, k)
		}
		vars[k] = kv
	}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "JETWAY_") {
			set(kv)
		}
	}
	if _, ok := vars["PATH"]; !ok {
		set("PATH=" + defaultPath)
	}
	for _, kv := range step {
		set(kv)
	}
	out := make([]string, 0, len(order))
	for _, k := range order {
		out = append(out, vars[k])
	}
	return out
}

// lookPath finds the program as the process's PATH would.
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: %w in PATH %s", name, exec.ErrNotFound, path)
}

// credential resolves a uid[:gid] or a user name of the image.
func credential(spec string) (*syscall.Credential, error) {
	name, group, hasGroup := strings.Cut(spec, ":")
	uid, err := strconv.ParseUint(name, 10, 32)
	gid := uid
	if err != nil {
		u, lerr := user.Lookup(name)
		if lerr != nil {
			return nil, fmt.Errorf("user %q: %w", name, lerr)
		}
		uid, _ = strconv.ParseUint(u.Uid, 10, 32)
		gid, _ = strconv.ParseUint(u.Gid, 10, 32)
	}
	if hasGroup {
		if gid, err = strconv.ParseUint(group, 10, 32); err != nil {
			return nil, fmt.Errorf("user %q: group %q is not a number", spec, group)
		}
	}
	if os.Geteuid() != 0 && uint64(os.Geteuid()) != uid {
		return nil, fmt.Errorf("user %q: the step container runs as uid %d, which cannot switch users", spec, os.Geteuid())
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}
