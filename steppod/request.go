package steppod

import (
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"io"
	"slices"
	"time"

	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/wire"
)

// AgentSpec is the step r as the step agent runs it (r validated). Inputs and
// outputs are volumes named after them.
func AgentSpec(r *wire.Request) stepagent.Spec {
	timeout, _ := time.ParseDuration(r.Timeout) // validated: empty or positive
	sp := stepagent.Spec{
		Handle: r.Handle, Path: r.Run.Path, Args: r.Run.Args, Dir: r.Run.Dir, User: r.Run.User,
		Stdin: []byte(r.Stdin), Timeout: stepagent.Duration(timeout),
	}
	for name, v := range r.Run.Env {
		sp.Env = append(sp.Env, name+"="+v)
	}
	slices.Sort(sp.Env)
	for _, in := range r.Inputs {
		sp.Volumes = append(sp.Volumes, stepagent.Volume{Handle: InputVolume(in.Name), Path: in.Path})
	}
	for _, out := range r.Outputs {
		sp.Volumes = append(sp.Volumes, stepagent.Volume{Handle: OutputVolume(out.Name), Path: out.Path})
	}
	return sp
}

// InputVolume and OutputVolume are the handles of a step's volumes in its
// pod's sidecar (or on an agent).
func InputVolume(name string) string  { return "input-" + name }
func OutputVolume(name string) string { return "output-" + name }

// OutputVolumes are a step's outputs as volumes of its pod.
func OutputVolumes(outs []wire.Output, target, pod string) []wire.Volume {
	var vs []wire.Volume
	for _, o := range outs {
		vs = append(vs, wire.Volume{Name: o.Name, Target: target, Pod: pod, Handle: OutputVolume(o.Name)})
	}
	return vs
}

// Digest counts and hashes (SHA-256) the bytes read through it: what a
// step's input event reports of them, on a cluster and on an agent.
type Digest struct {
	r io.Reader
	h hash.Hash
	n int64
}

// NewDigest reads r through a Digest.
func NewDigest(r io.Reader) *Digest { return &Digest{r: r, h: sha256.New()} }

func (d *Digest) Read(p []byte) (int, error) {
	n, err := d.r.Read(p)
	d.n += int64(n)
	d.h.Write(p[:n])
	return n, err
}

// Input is input name's bytes and SHA-256, as read so far.
func (d *Digest) Input(name string) wire.InputDigest {
	return wire.InputDigest{Name: name, Bytes: d.n, SHA256: hex.EncodeToString(d.h.Sum(nil))}
}
