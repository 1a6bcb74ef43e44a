// Package cli is the step agent's command line: what the step-agent
// binary runs in a step pod, and what an agent's machine runs for a web
// node's processes (the gateway's hidden step-agent command). See package
// stepagent for its commands and the files it keeps.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/jetway-ci/jetway/internal/tarsafe"
	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/volumes"
)

// usage names the commands and their flags.
const usage = `usage: step-agent COMMAND [--run NAME] [flags]
  prepare --spec-bytes S
  run [--spec-bytes S] [--inputs-bytes B] [--offset O --events E] [--skip N|all]
  tail [--offset O --events E] [--skip N|all]
  abort | forget --run NAME | serve | serve-daemon | supervise
  install DEST [VOLUME...] | pid1 | volumes [--listen ADDR] [--max-extract-bytes N] [--max-extract-entries N] [--capacity BYTES [--capacity-of claim]] [--link-copies]
    (volumes serves the holder of the token whose SHA-256 $JETWAY_VOLUMES_TOKEN_SHA256 holds)`

// capacityOrigin is where a volume sidecar's --capacity comes from: only
// a Concourse volume holder's sidecar gets one (steppod.HolderPod); with
// --capacity-of claim, its PersistentVolumeClaim's size.
const (
	capacityOrigin = "the size limit of the volume holder's emptyDir: the target's steps.volumeHolder.size " +
		"in its target.yaml, else the gateway's volume-holder-size"
	claimCapacityOrigin = "the size of the volume holder's PersistentVolumeClaim: the target's steps.volumeHolder.storage.size " +
		"in its target.yaml, else its steps.volumeHolder.size, else the gateway's volume-holder-size, as the claim was made"
)

// Main runs the command args name (args[0]) and returns its exit code,
// having said on stderr what failed.
func Main(args []string) int {
	if len(args) < 1 {
		return fail(stepagent.ExitUsage, errors.New(usage))
	}
	if err := dispatch(args[0], args[1:]); err != nil {
		code := 1
		switch {
		case errors.Is(err, stepagent.ErrSpecDiffers):
			code = stepagent.ExitSpecDiffers
		case errors.Is(err, stepagent.ErrNotPrepared):
			code = stepagent.ExitNotPrepared
		case errors.Is(err, stepagent.ErrNotStarted):
			code = stepagent.ExitNotStarted
		case errors.Is(err, errUsage):
			code = stepagent.ExitUsage
		}
		return fail(code, err)
	}
	return 0
}

var errUsage = errors.New("usage")

func fail(code int, err error) int {
	fmt.Fprintln(os.Stderr, "step-agent:", err)
	return code
}

func dispatch(cmd string, args []string) error {
	root := stepagent.RootDir()
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	specBytes := fs.Int("spec-bytes", -1, "bytes of spec JSON on stdin")
	inputBytes := fs.Int("inputs-bytes", 0, "bytes of inputs JSON on stdin, after the spec")
	stdin := fs.Bool("stdin", false, "run: the rest of stdin is the process's (a spec with stdin_stream)")
	var tail stepagent.TailOptions
	fs.Int64Var(&tail.Offset, "offset", 0, "log offset to tail from: a frame boundary")
	fs.IntVar(&tail.Events, "events", 0, "event frames in the log before --offset")
	fs.Var((*skipFlag)(&tail.Skip), "skip", "event frames to skip from --offset, or all of them the log holds")
	listen := fs.String("listen", ":7788", "volume sidecar address")
	var limits tarsafe.Limits
	fs.Int64Var(&limits.Bytes, "max-extract-bytes", 0, "volumes: bytes of file contents one stream-in may write (0: the default, 32 GiB)")
	fs.IntVar(&limits.Entries, "max-extract-entries", 0, "volumes: files, folders and links one stream-in may write (0: the default, 1048576)")
	fs.BoolVar(&limits.Owners, "owners", false, "volumes: give each file streamed in the numeric owner and group its archive names, "+
		"and keep setuid and setgid (takes CAP_CHOWN, CAP_FOWNER, CAP_FSETID)")
	fs.BoolVar(&limits.Devices, "devices", false, "volumes: write the device nodes and FIFOs an archive holds (a device takes CAP_MKNOD); "+
		"without it they are refused, naming the entry")
	capacity := fs.Int64("capacity", 0, "volumes: bytes the volumes may take on disk, counted as the kubelet counts an emptyDir; "+
		"a write past it, less a margin, is refused (0: no bound). Only for a sidecar that alone writes its folder")
	capacityOf := fs.String("capacity-of", "", "volumes: what --capacity is, for the error that refuses a write: "+
		"claim (a PersistentVolumeClaim's size); empty: an emptyDir's size limit")
	linkCopies := fs.Bool("link-copies", false, "volumes: make a cow volume, and an import of another volume, of hard links to its parent's files, "+
		"not copies. Only for a sidecar that alone writes its folder: a process writing a file in place would write every volume linking it")
	imagesListen := fs.String("images-listen", "", fmt.Sprintf("volumes: also serve volumes' folders as OCI images, read-only, by digest, to pulls "+
		"with a ticket the token's holder registered, on this address and nothing else there (a Concourse volume holder's :%d); empty: not at all. "+
		"Only for a sidecar that alone writes its folder: an image's digest is kept until the sidecar writes its volume", stepagent.ImagePort))
	run := fs.String("run", "", "a run of a sandbox pod: its folder under runs/ is the root")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if err := tail.Validate(); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if *run != "" {
		var err error
		if root, err = stepagent.RunRoot(root, *run); err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
	}
	switch cmd {
	case "install":
		if fs.NArg() < 1 {
			return fmt.Errorf("%w: install DEST [VOLUME...]", errUsage)
		}
		return stepagent.Install(fs.Arg(0), fs.Args()[1:]...)
	case "pid1":
		stepagent.Pid1()
		return nil
	case "prepare":
		return prepare(root, *specBytes)
	case "run":
		if *specBytes >= 0 {
			if err := prepare(root, *specBytes); err != nil {
				return err
			}
		}
		inputs, err := stepagent.ReadStdin(*inputBytes)
		if err != nil {
			return err
		}
		if err := stepagent.Start(root, inputs); err != nil {
			return err
		}
		if *stdin {
			// The rest of stdin is the process's (Spec.StdinStream),
			// streamed while the log is.
			go func() { _ = stepagent.StreamStdin(root, os.Stdin) }()
		}
		return stepagent.TailFrom(context.Background(), root, tail, os.Stdout)
	case "tail":
		return stepagent.TailFrom(context.Background(), root, tail, os.Stdout)
	case "abort":
		return stepagent.Abort(root)
	case "serve":
		return stepagent.Connect(root, os.Stdin, os.Stdout)
	case "serve-daemon":
		return stepagent.Daemon(root)
	case "forget":
		if *run == "" {
			return fmt.Errorf("%w: forget needs --run", errUsage)
		}
		return stepagent.Forget(root)
	case "supervise":
		return stepagent.Supervise(root)
	case "volumes":
		origin := capacityOrigin
		switch *capacityOf {
		case "":
		case "claim":
			origin = claimCapacityOrigin
		default:
			return fmt.Errorf("%w: --capacity-of %q: want claim, or none", errUsage, *capacityOf)
		}
		return serveVolumes(*listen, *imagesListen, root, limits, volumes.Capacity{Bytes: *capacity, Origin: origin}, *linkCopies)
	}
	return fmt.Errorf("%w: unknown command %q\n%s", errUsage, cmd, usage)
}

// skipFlag is --skip: a number of event frames, or all (-1).
type skipFlag int

// String is the flag's value as Set reads it.
func (s *skipFlag) String() string {
	if *s < 0 {
		return "all"
	}
	return strconv.Itoa(int(*s))
}

// Set reads a number of event frames, or all.
func (s *skipFlag) Set(v string) error {
	if v == "all" {
		*s = -1
		return nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return fmt.Errorf("%q is neither a number of event frames nor all", v)
	}
	*s = skipFlag(n)
	return nil
}

func prepare(root string, n int) error {
	if n < 0 {
		return fmt.Errorf("%w: --spec-bytes is required", errUsage)
	}
	raw, err := stepagent.ReadStdin(n)
	if err != nil {
		return err
	}
	return stepagent.Prepare(root, raw)
}

// serveVolumes runs the volume sidecar until TERM or INT.
func serveVolumes(addr, imagesAddr, root string, limits tarsafe.Limits, capacity volumes.Capacity, linkCopies bool) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	hash := os.Getenv(stepagent.TokenHashEnv)
	if hash == "" {
		return fmt.Errorf("%w: volumes serves only the holder of a token: $%s must hold its SHA-256", errUsage, stepagent.TokenHashEnv)
	}
	s, err := volumes.Listen(addr, root, hash, capacity)
	if err != nil {
		return err
	}
	s.SetLimits(limits)
	s.SetLinkCopies(linkCopies)
	fmt.Fprintf(os.Stderr, "step-agent: serving volumes of %s on %s\n", root, addr)
	if imagesAddr != "" {
		if _, err := s.ServeImages(imagesAddr); err != nil {
			return errors.Join(err, s.Kill())
		}
		fmt.Fprintf(os.Stderr, "step-agent: serving volumes' images on %s\n", imagesAddr)
	}
	<-ctx.Done()
	return s.Kill()
}
