// Package config turns flags, JETWAY_* environment variables and an optional
// YAML file into one validated Config. Precedence: flags > environment >
// file > defaults. viper stays inside this package.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/jetway-ci/jetway/internal/buildinfo"
	"github.com/jetway-ci/jetway/internal/tarsafe"
	"github.com/jetway-ci/jetway/selection"
)

// Config is everything `gateway run` needs. Each field's mapstructure tag is
// its key: the flag name, the YAML key, and (upper-cased, dashes as
// underscores, prefixed JETWAY_) the environment variable.
type Config struct {
	Listen string `mapstructure:"listen" help:"HTTP address of the API, /metrics and the probes"`
	// ConcourseVersion is what /api/v1/info reports: a released fly refuses
	// a server whose major.minor differs from its own.
	ConcourseVersion string        `mapstructure:"concourse-version" help:"Concourse version reported by /api/v1/info; match your fly's major.minor"`
	ShutdownTimeout  time.Duration `mapstructure:"shutdown-timeout" help:"bound on a graceful shutdown after SIGTERM or SIGINT"`
	LogLevel         string        `mapstructure:"log-level" help:"log level: debug, info, warn or error"`

	TargetsDir    string        `mapstructure:"targets-dir" help:"directory with one kubeconfig (file or folder) per target, usually a Secret mount"`
	TargetsResync time.Duration `mapstructure:"targets-resync" help:"re-read the targets directory this often even without file events"`

	HealthInterval    time.Duration `mapstructure:"health-interval" help:"time between health checks of one target (jittered by 10%)"`
	HealthTimeout     time.Duration `mapstructure:"health-timeout" help:"bound on one health check (readiness probe and permission reviews); default 5s, or health-interval when shorter"`
	HealthConcurrency int           `mapstructure:"health-concurrency" help:"health checks in flight at once, across all targets"`
	StallAfter        int           `mapstructure:"stall-after" help:"consecutive failed checks before a running target stalls"`

	AllowExecPlugins   bool `mapstructure:"allow-exec-plugins" help:"accept kubeconfigs whose user runs an exec credential plugin"`
	AllowAuthProviders bool `mapstructure:"allow-auth-providers" help:"accept kubeconfigs whose user has an auth-provider"`
	AllowInsecureTLS   bool `mapstructure:"allow-insecure-tls" help:"accept kubeconfigs that set insecure-skip-tls-verify"`
	AllowExternalFiles bool `mapstructure:"allow-external-files" help:"accept kubeconfigs referencing files outside the targets directory"`

	Installation string        `mapstructure:"installation" help:"name of this jetway installation; labels everything it creates, so installations sharing a namespace never touch each other's objects"`
	LandTimeout  time.Duration `mapstructure:"land-timeout" help:"after this long landing, the API and logs name the step pods still holding a target"`
	GCGrace      time.Duration `mapstructure:"gc-grace" help:"finished step pods are deleted this long after they end, even without a sync"`

	// MaxStreams bounds the volume streams running at once (each holds a
	// 1 MiB buffer and two port-forward streams); past it the API answers
	// 429 with Retry-After. 0 means no bound.
	MaxStreams int `mapstructure:"max-streams" help:"volume streams running at once; past it POST /api/v1/streams answers 429 (0: no bound)"`
	// StreamStallTimeout aborts a volume stream that moves no bytes for
	// this long.
	StreamStallTimeout time.Duration `mapstructure:"stream-stall-timeout" help:"abort a volume stream that moves no bytes for this long (a dead volume server behind a port-forward that stays open)"`

	// Placement, with Concourse's names and defaults: a chain is a comma
	// list of strategies, the first the primary key (selection.ParseChain).
	PlacementStrategy selection.Chain `mapstructure:"placement-strategy" help:"placement strategy chain for steps with inputs (task, put): comma list of volume-locality, fewest-build-containers, limit-active-tasks, limit-active-containers, limit-active-volumes, or random alone"`
	// NoInputPlacementStrategy nil means the same as PlacementStrategy;
	// Load resolves it, so a loaded Config always has it set.
	NoInputPlacementStrategy     selection.Chain `mapstructure:"no-input-placement-strategy" help:"placement strategy chain for steps without inputs (get); empty: the same as placement-strategy"`
	CheckPlacementStrategy       selection.Chain `mapstructure:"check-placement-strategy" help:"placement strategy chain for check steps"`
	MaxActiveTasksPerTarget      int             `mapstructure:"max-active-tasks-per-target" help:"task steps at once on one target under limit-active-tasks; a target's own maxActiveTasks wins when set (0: no limit)"`
	MaxActiveContainersPerTarget int             `mapstructure:"max-active-containers-per-target" help:"unfinished step pods on one target under limit-active-containers (0: no limit)"`
	MaxActiveVolumesPerTarget    int             `mapstructure:"max-active-volumes-per-target" help:"step pod volumes on one target under limit-active-volumes (0: no limit)"`

	// Steps.
	StepAgentImage  string        `mapstructure:"step-agent-image" help:"image holding jetway's step agent (make image builds it; push it to a registry the targets pull from): mounted or copied into every step pod (step-agent-mount), and its volume sidecar"`
	StepAgentMount  string        `mapstructure:"step-agent-mount" help:"how a step pod gets the step agent: auto (per target: image-volume when every node its step pods may land on reports kubelet 1.36+ and containerd 2.1+ or CRI-O 1.31+, and the target may list nodes; init-container otherwise), init-container (an init container copies it; any runtime) or image-volume (an image volume, no init container: a step starts faster; needs Kubernetes 1.36, or 1.33 with the ImageVolume gate, and containerd 2.1+ or CRI-O 1.31+ on every node)"`
	ImagePullGrace  time.Duration `mapstructure:"image-pull-grace" help:"how long a step's image pull may fail for a passing reason (rate limit, registry 5xx) before the step errors; pulls that cannot succeed fail at once"`
	StepKillGrace   time.Duration `mapstructure:"step-kill-grace" help:"time between TERM and KILL when a step is aborted or times out"`
	ResourceDir     string        `mapstructure:"resource-dir" help:"where resource images keep their check, in and out scripts"`
	CheckSandboxTTL time.Duration `mapstructure:"check-sandbox-ttl" help:"how long an idle check sandbox (the warm pod of checks with a reuse_key) is kept"`
	// What one archive streamed into a step pod may write (its sidecar
	// refuses more, naming the limit and the entry).
	ExtractMaxBytes   Bytes `mapstructure:"extract-max-bytes" help:"bytes of file contents one archive streamed into a step's volume may write (32Gi, 500Mi); more is refused, naming the limit and the entry"`
	ExtractMaxEntries int   `mapstructure:"extract-max-entries" help:"files, folders and links one archive streamed into a step's volume may write"`
	// What every step pod gets unless its target's target.yaml (steps:)
	// says otherwise (docs/steps.md, "Limits"); 0 is none.
	StepVolumeSizeLimit         Bytes  `mapstructure:"step-volume-size-limit" help:"size limit of a step pod's emptyDir (its build dir, inputs and outputs): past it the kubelet evicts the pod (0: none)"`
	StepEphemeralStorageRequest Bytes  `mapstructure:"step-ephemeral-storage-request" help:"ephemeral-storage request of a step's container (its writable layer and logs) (0: none)"`
	StepDefaultCPURequest       string `mapstructure:"step-default-cpu-request" help:"cpu request of a step that asks for no cpu (a quantity: 100m, 1) (0: none)"`
	StepDefaultMemoryRequest    Bytes  `mapstructure:"step-default-memory-request" help:"memory request of a step that asks for no memory (0: none)"`
	StepCheckCPURequest         string `mapstructure:"step-check-cpu-request" help:"cpu request of a Concourse check container, which idles between checks (a quantity: 10m) (0: none)"`
	StepCheckMemoryRequest      Bytes  `mapstructure:"step-check-memory-request" help:"memory request of a Concourse check container (0: none)"`
	VolumeHolderSize            Bytes  `mapstructure:"volume-holder-size" help:"size limit of a Concourse volume holder's emptyDir (or its claim's size with volume-holder-storage-class), which keeps every volume of the web node's on a target: its sidecar refuses a write past it, so no upload gets it evicted (0: none; a target's steps.volumeHolder.size wins)"`
	VolumeHolderStorageClass    string `mapstructure:"volume-holder-storage-class" help:"StorageClass of a PersistentVolumeClaim (ReadWriteOnce, volume-holder-size big) that keeps a Concourse volume holder's volumes instead of an emptyDir, so that a holder made again keeps them; empty: an emptyDir (a target's steps.volumeHolder.storage wins; docs/concourse.md)"`

	// Step state (docs/steps.md, "Ownership"): where the installation's
	// step records, gateway Leases and placer Lease live.
	StateKubeconfig string `mapstructure:"state-kubeconfig" help:"kubeconfig of the cluster that keeps the installation's step records and the gateways' leases (docs/steps.md); empty: the cluster the gateway runs in, through its service account"`
	StateNamespace  string `mapstructure:"state-namespace" help:"namespace of the step records and leases; empty: the state-kubeconfig context's namespace, or the gateway's own namespace in a cluster"`

	// Mesh (docs/mesh.md): set mesh-listen or mesh-peers to join one.
	MeshListen      string        `mapstructure:"mesh-listen" help:"address to accept mesh peers on (host:port); empty: accept none (a gateway that only dials out is a full member)"`
	MeshPeers       []string      `mapstructure:"mesh-peers" help:"mesh peers to dial: host:port, or dns:NAME:PORT for every address NAME resolves to (a headless Service), resolved again every 30s"`
	MeshCA          string        `mapstructure:"mesh-ca" help:"PEM file of the mesh CA: peers must present a certificate it issued"`
	MeshCert        string        `mapstructure:"mesh-cert" help:"PEM file of this gateway's mesh certificate (its CN, else first DNS name, is its mesh name); re-read when it changes"`
	MeshKey         string        `mapstructure:"mesh-key" help:"PEM file of the mesh certificate's key; re-read when it changes"`
	MeshName        string        `mapstructure:"mesh-name" help:"this gateway's mesh name; default: its certificate's; when given it must match it"`
	MeshStallAfter  time.Duration `mapstructure:"mesh-stall-after" help:"how long a lost peer's targets keep their last state before they are listed stalled"`
	MeshLeaveOnStop bool          `mapstructure:"mesh-leave-on-stop" help:"on shutdown, tell peers this gateway leaves for good, so they forget it at once (for names that never return, e.g. pod names)"`

	// Concourse (docs/concourse.md): register the targets as workers of a
	// web node, through its TSA (concourse-tsa) or its REST API
	// (concourse-url with a client), one of the two. With the TSA,
	// concourse-url is where the web node's worker version is read.
	ConcourseTSA           string        `mapstructure:"concourse-tsa" help:"host:port of the Concourse web node's TSA, or of each web node's, comma-separated, tried in turn from a random one: every running target this gateway registers becomes one of its workers (docs/concourse.md); empty: none"`
	ConcourseTSAPublicKey  string        `mapstructure:"concourse-tsa-public-key" help:"file of the TSA's host public key(s), authorized_keys form (concourse web --tsa-host-key's .pub)"`
	ConcourseWorkerKey     string        `mapstructure:"concourse-worker-key" help:"file of the worker private key the TSA authorizes (its public key in concourse web --tsa-authorized-keys)"`
	ConcourseSweepInterval time.Duration `mapstructure:"concourse-sweep-interval" help:"how often each registered worker runs its garbage collection rounds with the web node: reports its containers and volumes, destroys what the web node no longer wants, releases kept pods (a stock worker's --sweep-interval)"`
	ConcourseRebalance     time.Duration `mapstructure:"concourse-rebalance-interval" help:"how often each registration through the TSA is made again on a new connection, to another of concourse-tsa's addresses where there are several, as a stock worker's --rebalance-interval; the one before drains (0: never)"`
	ConcourseDrain         time.Duration `mapstructure:"concourse-connection-drain-timeout" help:"how long a registration left by a rebalance drains (the web node's connections through it end) before it is closed, as a stock worker's --connection-drain-timeout"`
	ConcourseLostGrace     time.Duration `mapstructure:"concourse-lost-grace" help:"how long a container whose pod went on its own (a drain, an eviction, a deletion) is kept, no longer reported, so that the web node's calls on it name why: past it its record and ended pod are deleted; keep it above the web node's --gc-missing-grace-period (docs/concourse.md)"`
	ConcourseKeepGrace     time.Duration `mapstructure:"concourse-keep-grace" help:"how long the pod of a container the web node destroyed is kept for the volumes it still holds (written by its processes, not yet read): past it they are copied into the volume holder and the pod is deleted (docs/concourse.md)"`
	ConcourseBundledTypes  bool          `mapstructure:"concourse-bundled-resource-types" help:"also offer Concourse v8.2.5's bundled base resource types (git, time, registry-image, ...) at the versions it bundles, as Docker Hub's concourse/<type>-resource images, but those concourse-resource-types maps"`
	ConcourseResourceTypes string        `mapstructure:"concourse-resource-types" help:"YAML file mapping each base resource type the workers offer to an image reference (registry-image: docker.io/concourse/registry-image-resource:1.14.2), or to {image, version, privileged, unique_version_history} as a stock worker's resource_metadata.json says them"`
	// Registering over the REST API instead, where the web node reaches
	// the gateway directly.
	ConcourseURL              string   `mapstructure:"concourse-url" help:"external URL of the Concourse web node: with concourse-client-id, concourse-client-secret-file and concourse-worker-address, the targets register through its REST API instead of its TSA; with concourse-tsa, jetway reads the web node's worker version there first and registers nothing it would never use (docs/concourse.md); empty: none"`
	ConcourseClientID         string   `mapstructure:"concourse-client-id" help:"ID of the web node's client that registers workers (concourse web --add-client ID:SECRET --system-claim-value ID)"`
	ConcourseClientSecretFile string   `mapstructure:"concourse-client-secret-file" help:"file holding that client's secret (read at start; never logged)"`
	ConcourseWorkerAddress    string   `mapstructure:"concourse-worker-address" help:"host name or IP the web node reaches this gateway at (a pod's IP); the gateway listens there on two ports per registered target, picked by the kernel, for the worker's Garden and volume API"`
	ConcourseWebNodeNetworks  []string `mapstructure:"concourse-web-node-networks" help:"CIDRs (or IPs) the web node calls the workers from, required with concourse-url's REST registration: the workers' Garden and volume listeners, which take no credential (an unmodified web node sends none), accept connections only from these and from this gateway (0.0.0.0/0,::/0 accepts anyone who reaches them)"`
	ConcourseInsecure         bool     `mapstructure:"concourse-insecure" help:"allow an http:// concourse-url for the REST registration: the client secret, and the tokens it buys, then travel unencrypted (a web node reached over a network you trust alone)"`

	AuthTokensFile string `mapstructure:"auth-tokens-file" help:"YAML file of API bearer tokens: tokens: [{name, token, admin: true | team: NAME}]"`
	NoAuth         bool   `mapstructure:"no-auth" help:"serve the API without authentication (only for local experiments)"`
}

// Default returns the configuration used where nothing else is said.
func Default() Config {
	return Config{
		Listen:           ":8080",
		ConcourseVersion: "8.2.5",
		ShutdownTimeout:  15 * time.Second,
		LogLevel:         "info",

		TargetsDir:    "/etc/jetway/targets",
		TargetsResync: 30 * time.Second,

		HealthInterval:    10 * time.Second,
		HealthTimeout:     5 * time.Second,
		HealthConcurrency: 64,
		StallAfter:        3,

		Installation: "jetway",
		LandTimeout:  30 * time.Minute,
		GCGrace:      10 * time.Minute,

		MaxStreams:         64,
		StreamStallTimeout: 10 * time.Second,

		StepAgentImage:  "ghcr.io/jetway-ci/step-agent:" + buildinfo.String(),
		StepAgentMount:  "auto",
		ImagePullGrace:  2 * time.Minute,
		StepKillGrace:   10 * time.Second,
		ResourceDir:     "/opt/resource",
		CheckSandboxTTL: 10 * time.Minute,

		ExtractMaxBytes:   Bytes(tarsafe.DefaultMaxBytes),
		ExtractMaxEntries: tarsafe.DefaultMaxEntries,

		// A step pod's limits (docs/steps.md, "Limits"): room for a
		// large checkout and build, requests that make a step Burstable
		// without reserving much of a node.
		StepVolumeSizeLimit:         10 << 30,
		StepEphemeralStorageRequest: 1 << 30,
		StepDefaultCPURequest:       "100m",
		StepDefaultMemoryRequest:    256 << 20,
		StepCheckCPURequest:         "10m",
		StepCheckMemoryRequest:      32 << 20,
		// The holder keeps every volume of a target: a few builds'
		// artifacts, caches and images.
		VolumeHolderSize: 20 << 30,

		MeshStallAfter: 30 * time.Second,

		// concourse.DefaultKeepGrace: time for the next step of a build
		// to read what the last one wrote, straight from its pod.
		ConcourseKeepGrace: 3 * time.Minute,
		// concourse.DefaultLostGrace: past the web node's missing grace.
		ConcourseLostGrace:    time.Hour,
		ConcourseBundledTypes: true,
		ConcourseRebalance:    4 * time.Hour,
		ConcourseDrain:        time.Hour,
		// concourse.DefaultSweepInterval, a stock worker's.
		ConcourseSweepInterval: 30 * time.Second,

		PlacementStrategy:      selection.Chain{selection.VolumeLocality},
		CheckPlacementStrategy: selection.Chain{selection.Random},
	}
}

// NoInputChain is the chain of steps without inputs: no-input-placement-strategy,
// or placement-strategy when that is not set.
func (c Config) NoInputChain() selection.Chain {
	if c.NoInputPlacementStrategy == nil {
		return c.PlacementStrategy
	}
	return c.NoInputPlacementStrategy
}

// Limits are the per-target limits of the limit-active-* strategies.
func (c Config) Limits() selection.Limits {
	return selection.Limits{
		ActiveTasks:      c.MaxActiveTasksPerTarget,
		ActiveContainers: c.MaxActiveContainersPerTarget,
		ActiveVolumes:    c.MaxActiveVolumesPerTarget,
	}
}

// Error lists every invalid key of a configuration.
type Error struct {
	Problems []Problem
}

// Problem is one invalid key and what is wrong with it.
type Problem struct {
	Key     string
	Message string
}

func (e *Error) Error() string {
	parts := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		parts[i] = p.Key + ": " + p.Message
	}
	return "invalid configuration: " + strings.Join(parts, "; ")
}

// ErrInvalid matches every *Error with errors.Is.
var ErrInvalid = errors.New("invalid configuration")

// Is reports ErrInvalid as a match, so callers need not know the type.
func (e *Error) Is(target error) bool { return target == ErrInvalid }

var versionPattern = regexp.MustCompile(`^\d+\.\d+\.\d+([-+][0-9A-Za-z.-]+)?$`)

// Validate reports every problem of c at once, or nil.
func (c Config) Validate() error {
	var probs []Problem
	add := func(key, format string, args ...any) {
		probs = append(probs, Problem{Key: key, Message: fmt.Sprintf(format, args...)})
	}
	if err := validateListen(c.Listen); err != nil {
		add("listen", "%v", err)
	}
	if !versionPattern.MatchString(c.ConcourseVersion) {
		add("concourse-version", "%q is not a version like 8.2.5", c.ConcourseVersion)
	}
	if c.ShutdownTimeout <= 0 {
		add("shutdown-timeout", "must be positive, got %s", c.ShutdownTimeout)
	}
	if _, err := ParseLogLevel(c.LogLevel); err != nil {
		add("log-level", "%v", err)
	}
	if info, err := os.Stat(c.TargetsDir); err != nil {
		add("targets-dir", "%v", err)
	} else if !info.IsDir() {
		add("targets-dir", "%s is not a directory", c.TargetsDir)
	}
	for key, d := range map[string]time.Duration{"targets-resync": c.TargetsResync, "health-interval": c.HealthInterval} {
		if d < 100*time.Millisecond {
			add(key, "must be at least 100ms, got %s", d)
		}
	}
	if c.HealthTimeout <= 0 || c.HealthTimeout > c.HealthInterval {
		add("health-timeout", "must be positive and at most health-interval (%s), got %s", c.HealthInterval, c.HealthTimeout)
	}
	if c.HealthConcurrency < 1 {
		add("health-concurrency", "must be at least 1, got %d", c.HealthConcurrency)
	}
	if c.StallAfter < 1 {
		add("stall-after", "must be at least 1, got %d", c.StallAfter)
	}
	if msgs := validation.IsDNS1123Label(c.Installation); len(msgs) > 0 {
		add("installation", "%q is not a DNS-1123 label: %s", c.Installation, strings.Join(msgs, "; "))
	}
	if c.LandTimeout <= 0 {
		add("land-timeout", "must be positive, got %s", c.LandTimeout)
	}
	if c.ConcourseSweepInterval < time.Second {
		add("concourse-sweep-interval", "must be at least 1s, got %s", c.ConcourseSweepInterval)
	}
	if c.ConcourseKeepGrace <= 0 {
		add("concourse-keep-grace", "must be positive, got %s", c.ConcourseKeepGrace)
	}
	if c.ConcourseLostGrace <= 0 {
		add("concourse-lost-grace", "must be positive, got %s", c.ConcourseLostGrace)
	}
	if c.ConcourseRebalance < 0 {
		add("concourse-rebalance-interval", "must not be negative, got %s (0: never)", c.ConcourseRebalance)
	}
	if c.ConcourseDrain <= 0 {
		add("concourse-connection-drain-timeout", "must be positive, got %s", c.ConcourseDrain)
	}
	if c.GCGrace < 0 {
		add("gc-grace", "must not be negative, got %s", c.GCGrace)
	}
	if strings.TrimSpace(c.StepAgentImage) == "" {
		add("step-agent-image", "required: the image holding jetway's step agent")
	}
	if c.StepAgentMount != "auto" && c.StepAgentMount != "init-container" && c.StepAgentMount != "image-volume" {
		// steppod.AgentMount's values (steps imports config).
		add("step-agent-mount", "must be auto, init-container or image-volume, got %q", c.StepAgentMount)
	}
	if c.ImagePullGrace < 0 {
		add("image-pull-grace", "must not be negative, got %s", c.ImagePullGrace)
	}
	if c.ExtractMaxBytes <= 0 {
		add("extract-max-bytes", "must be positive, got %s", c.ExtractMaxBytes)
	}
	if c.ExtractMaxEntries <= 0 {
		add("extract-max-entries", "must be positive, got %d", c.ExtractMaxEntries)
	}
	for _, size := range []struct {
		key string
		b   Bytes
	}{
		{"step-volume-size-limit", c.StepVolumeSizeLimit}, {"step-ephemeral-storage-request", c.StepEphemeralStorageRequest},
		{"step-default-memory-request", c.StepDefaultMemoryRequest}, {"volume-holder-size", c.VolumeHolderSize},
		{"step-check-memory-request", c.StepCheckMemoryRequest},
	} {
		if size.b < 0 {
			add(size.key, "must not be negative, got %s", size.b)
		}
	}
	for _, msg := range validation.IsDNS1123Subdomain(c.VolumeHolderStorageClass) {
		if c.VolumeHolderStorageClass != "" {
			add("volume-holder-storage-class", "%q is not a StorageClass name: %s", c.VolumeHolderStorageClass, msg)
		}
	}
	if c.VolumeHolderStorageClass != "" && c.VolumeHolderSize == 0 {
		add("volume-holder-size", "must be more than 0 with volume-holder-storage-class: it is the claim's size")
	}
	for _, cpu := range []struct{ key, q string }{
		{"step-default-cpu-request", c.StepDefaultCPURequest}, {"step-check-cpu-request", c.StepCheckCPURequest},
	} {
		if q, err := resource.ParseQuantity(cpu.q); err != nil || q.Sign() < 0 {
			add(cpu.key, "%q is not a cpu quantity like 100m or 1 (0: none)", cpu.q)
		}
	}
	if !strings.HasPrefix(c.ResourceDir, "/") {
		add("resource-dir", "must be an absolute path, got %q", c.ResourceDir)
	}
	if c.StateKubeconfig != "" {
		if info, err := os.Stat(c.StateKubeconfig); err != nil {
			add("state-kubeconfig", "%v", err)
		} else if info.IsDir() {
			add("state-kubeconfig", "%s is a directory, not a kubeconfig file", c.StateKubeconfig)
		}
	}
	if c.StateNamespace != "" {
		if msgs := validation.IsDNS1123Label(c.StateNamespace); len(msgs) > 0 {
			add("state-namespace", "%q is not a namespace name: %s", c.StateNamespace, strings.Join(msgs, "; "))
		}
	}
	if c.CheckSandboxTTL <= 0 {
		add("check-sandbox-ttl", "must be positive, got %s", c.CheckSandboxTTL)
	}
	if c.StepKillGrace <= 0 {
		add("step-kill-grace", "must be positive, got %s", c.StepKillGrace)
	}
	if c.StreamStallTimeout <= 0 {
		add("stream-stall-timeout", "must be positive, got %s", c.StreamStallTimeout)
	}
	if c.MaxStreams < 0 {
		add("max-streams", "must not be negative (0: no bound), got %d", c.MaxStreams)
	}
	probs = append(probs, c.placementProblems()...)
	probs = append(probs, c.meshProblems()...)
	probs = append(probs, c.concourseProblems()...)
	switch {
	case c.AuthTokensFile == "" && !c.NoAuth:
		add("auth-tokens-file", "required: name a tokens file, or pass --no-auth to serve without authentication")
	case c.AuthTokensFile != "" && c.NoAuth:
		add("no-auth", "contradicts auth-tokens-file; give one of them")
	}
	if len(probs) == 0 {
		return nil
	}
	return &Error{Problems: probs}
}

// MeshEnabled says the gateway joins a mesh.
func (c Config) MeshEnabled() bool { return c.MeshListen != "" || len(c.MeshPeers) > 0 }

// meshProblems checks the mesh settings; the files are read at start.
func (c Config) meshProblems() []Problem {
	var probs []Problem
	add := func(key, format string, args ...any) {
		probs = append(probs, Problem{Key: key, Message: fmt.Sprintf(format, args...)})
	}
	if !c.MeshEnabled() {
		for _, kv := range [][2]string{{"mesh-ca", c.MeshCA}, {"mesh-cert", c.MeshCert}, {"mesh-key", c.MeshKey}, {"mesh-name", c.MeshName}} {
			if kv[1] != "" {
				add(kv[0], "set, but no mesh-listen or mesh-peers: this gateway joins no mesh")
			}
		}
		return probs
	}
	for _, kv := range [][2]string{{"mesh-ca", c.MeshCA}, {"mesh-cert", c.MeshCert}, {"mesh-key", c.MeshKey}} {
		if kv[1] == "" {
			add(kv[0], "required to join a mesh")
		}
	}
	if c.MeshListen != "" {
		if _, _, err := net.SplitHostPort(c.MeshListen); err != nil {
			add("mesh-listen", "%q is not host:port", c.MeshListen)
		}
	}
	for _, p := range c.MeshPeers {
		host, port, err := net.SplitHostPort(strings.TrimPrefix(p, "dns:"))
		if err != nil || host == "" || port == "" {
			add("mesh-peers", "%q is neither host:port nor dns:NAME:PORT", p)
		}
	}
	if c.MeshStallAfter <= 0 {
		add("mesh-stall-after", "must be positive, got %s", c.MeshStallAfter)
	}
	return probs
}

// concourseProblems checks the concourse-* settings: none, the TSA's, or
// the REST API's. The files are read at start.
func (c Config) concourseProblems() []Problem {
	var probs []Problem
	add := func(key, format string, args ...any) {
		probs = append(probs, Problem{Key: key, Message: fmt.Sprintf(format, args...)})
	}
	tsaKeys := [][2]string{{"concourse-tsa", c.ConcourseTSA}, {"concourse-tsa-public-key", c.ConcourseTSAPublicKey},
		{"concourse-worker-key", c.ConcourseWorkerKey}}
	// concourse-url goes with either: the REST API's address, or where
	// the TSA's web node says its worker version.
	restKeys := [][2]string{{"concourse-client-id", c.ConcourseClientID},
		{"concourse-client-secret-file", c.ConcourseClientSecretFile}, {"concourse-worker-address", c.ConcourseWorkerAddress}}
	tsa, rest := anySet(tsaKeys), anySet(restKeys)
	switch {
	case tsa && rest && c.ConcourseTSA == "":
		for _, kv := range tsaKeys {
			if kv[1] != "" {
				add(kv[0], "only with concourse-tsa, not with concourse-url (the REST API)")
			}
		}
		return probs
	case tsa && rest:
		for _, kv := range restKeys {
			if kv[1] != "" {
				add(kv[0], "only with concourse-url and without concourse-tsa (the REST API), not with the TSA's settings")
			}
		}
		return probs
	case rest || c.ConcourseURL != "" && !tsa:
		probs = append(probs, c.concourseRESTProblems()...)
	case tsa || c.ConcourseResourceTypes != "":
		probs = append(probs, c.concourseTSAProblems()...)
		if c.ConcourseURL != "" && !webURL(c.ConcourseURL) {
			add("concourse-url", "%q is not the web node's external URL (http:// or https://HOST[:PORT]), where jetway reads its worker version", c.ConcourseURL)
		}
	}
	if c.ConcourseResourceTypes != "" {
		if _, err := os.Stat(c.ConcourseResourceTypes); err != nil {
			add("concourse-resource-types", "%v", err)
		}
	}
	if len(c.ConcourseWebNodeNetworks) > 0 && c.ConcourseTSA != "" {
		add("concourse-web-node-networks", "only with concourse-url (the REST API): through the TSA the web node's calls come over the registration's own SSH connection")
	}
	if c.ConcourseInsecure && !rest {
		add("concourse-insecure", "only with concourse-url's REST registration (concourse-client-id, concourse-client-secret-file): nothing secret travels on concourse-url otherwise")
	}
	return probs
}

// TSAAddrs are concourse-tsa's addresses: comma-separated, spaces around
// each dropped.
func (c Config) TSAAddrs() []string {
	var out []string
	for a := range strings.SplitSeq(c.ConcourseTSA, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// webURL reports whether s is an http or https URL with a host.
func webURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}

func anySet(keys [][2]string) bool {
	for _, kv := range keys {
		if kv[1] != "" {
			return true
		}
	}
	return false
}

func (c Config) concourseTSAProblems() []Problem {
	var probs []Problem
	addrs := c.TSAAddrs()
	if len(addrs) == 0 {
		addrs = []string{""}
	}
	for _, a := range addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			probs = append(probs, Problem{Key: "concourse-tsa", Message: fmt.Sprintf(
				"%q is not host:port (the web node's TSA, port 2222 by default; several comma-separated): with any concourse-* setting, it or concourse-url is required", a)})
		}
	}
	for _, f := range []struct{ key, path string }{{"concourse-tsa-public-key", c.ConcourseTSAPublicKey}, {"concourse-worker-key", c.ConcourseWorkerKey}} {
		if f.path == "" {
			probs = append(probs, Problem{Key: f.key, Message: "required with concourse-tsa"})
		} else if _, err := os.Stat(f.path); err != nil {
			probs = append(probs, Problem{Key: f.key, Message: err.Error()})
		}
	}
	return probs
}

func (c Config) concourseRESTProblems() []Problem {
	var probs []Problem
	add := func(key, format string, args ...any) {
		probs = append(probs, Problem{Key: key, Message: fmt.Sprintf(format, args...)})
	}
	switch {
	case !webURL(c.ConcourseURL):
		add("concourse-url", "%q is not the web node's external URL (http:// or https://HOST[:PORT]): with concourse-client-id, concourse-client-secret-file or concourse-worker-address, it is required", c.ConcourseURL)
	case strings.HasPrefix(c.ConcourseURL, "http:") && !c.ConcourseInsecure:
		add("concourse-url", "%q is http://: the client secret, and the tokens it buys, would travel on it unencrypted; give the web node's https:// URL, or set concourse-insecure to allow it (a network you trust alone)", c.ConcourseURL)
	}
	if c.ConcourseClientID == "" {
		add("concourse-client-id", "required with concourse-url: the client of the web node's --add-client")
	}
	if c.ConcourseClientSecretFile == "" {
		add("concourse-client-secret-file", "required with concourse-url: a file holding the client's secret")
	} else if _, err := os.Stat(c.ConcourseClientSecretFile); err != nil {
		add("concourse-client-secret-file", "%v", err)
	}
	switch host := c.ConcourseWorkerAddress; {
	case host == "":
		add("concourse-worker-address", "required with concourse-url: the host name or IP the web node reaches this gateway at")
	case net.ParseIP(host) == nil && !isHostname(host):
		add("concourse-worker-address", "%q is neither an IP address nor a host name (no port: one is picked per target)", host)
	case net.ParseIP(host) != nil && net.ParseIP(host).IsUnspecified():
		add("concourse-worker-address", "%s is no address the web node can reach: give this gateway's own (a pod's IP)", host)
	}
	if nets, err := c.WebNodeNetworks(); err != nil {
		add("concourse-web-node-networks", "%v", err)
	} else if len(nets) == 0 {
		add("concourse-web-node-networks", "required with concourse-url: the workers' Garden and volume listeners take no credential "+
			"(an unmodified web node sends none), so they accept only the web node's networks (its pods' or nodes' CIDRs; 0.0.0.0/0,::/0 for anyone who reaches them)")
	}
	return probs
}

// WebNodeNetworks parses concourse-web-node-networks: each a CIDR, or an
// IP standing for itself alone.
func (c Config) WebNodeNetworks() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range c.ConcourseWebNodeNetworks {
		s = strings.TrimSpace(s)
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("%q is neither a CIDR (10.0.0.0/8) nor an IP", s)
		}
		out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return out, nil
}

// placementProblems checks the chains Load could parse and the limits. An
// unparseable chain is reported by Load (decode) and is nil here.
func (c Config) placementProblems() []Problem {
	var probs []Problem
	for _, ch := range []struct {
		key   string
		chain selection.Chain
	}{{"placement-strategy", c.PlacementStrategy}, {"check-placement-strategy", c.CheckPlacementStrategy}} {
		if len(ch.chain) == 0 {
			probs = append(probs, Problem{Key: ch.key, Message: "must name at least one strategy"})
		}
	}
	for _, l := range []struct {
		key string
		n   int
	}{
		{"max-active-tasks-per-target", c.MaxActiveTasksPerTarget},
		{"max-active-containers-per-target", c.MaxActiveContainersPerTarget},
		{"max-active-volumes-per-target", c.MaxActiveVolumesPerTarget},
	} {
		if l.n < 0 {
			probs = append(probs, Problem{Key: l.key, Message: fmt.Sprintf("must not be negative (0: no limit), got %d", l.n)})
		}
	}
	return probs
}

func validateListen(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not a host:port address", addr)
	}
	if host != "" && net.ParseIP(host) == nil && !isHostname(host) {
		return fmt.Errorf("%q: host %q is neither an IP address nor a host name", addr, host)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("%q: port %q is not a number from 0 to 65535", addr, port)
	}
	return nil
}

var hostnamePattern = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$`)

func isHostname(s string) bool { return len(s) <= 253 && hostnamePattern.MatchString(s) }

// ParseLogLevel maps a level name to its slog level.
func ParseLogLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("%q is not one of debug, info, warn, error", s)
	}
	return l, nil
}
