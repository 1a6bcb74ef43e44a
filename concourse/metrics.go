package concourse

import (
	"cmp"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the registrations' Prometheus metrics. A nil *Metrics
// records nothing.
type Metrics struct {
	registrations *prometheus.GaugeVec
	heartbeats    prometheus.Counter
	failures      prometheus.Counter
	commands      *prometheus.CounterVec
	sweeps        *prometheus.CounterVec
	rebalances    *prometheus.CounterVec
	destroys      *prometheus.CounterVec
	copies        prometheus.Counter
	copiedBytes   prometheus.Counter
	copySeconds   prometheus.Histogram
	linkedCopies  prometheus.Counter
	refusals      prometheus.Counter
	podRefusals   *prometheus.CounterVec
	pullCreds     *prometheus.CounterVec
	containers    *prometheus.CounterVec
	garden        *prometheus.CounterVec
	moves         *prometheus.CounterVec
	movedBytes    *prometheus.CounterVec
	moveSeconds   *prometheus.HistogramVec
	oversized     prometheus.Counter
	holders       *prometheus.CounterVec
	holds         *prometheus.CounterVec
	p2ps          *prometheus.CounterVec
	p2pBytes      *prometheus.CounterVec
}

// transferBuckets are the copies' and moves' durations' buckets, 10 ms
// to about 3 minutes: an empty volume's move to a GiB's copy on a slow
// disk.
var transferBuckets = prometheus.ExponentialBuckets(0.01, 4, 8)

// NewMetrics registers the metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		registrations: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "jetway_concourse_registrations",
			Help: "Targets this gateway registers with the Concourse web node, by state (registering, running, landed, failing).",
		}, []string{"state"}),
		heartbeats: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetway_concourse_heartbeats_total",
			Help: "Heartbeats of this gateway's registrations: the TSA's, or its own over the REST API.",
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetway_concourse_registration_failures_total",
			Help: "Registrations that failed or broke (the TSA unreachable, a key refused, the session cut); each is tried again with backoff.",
		}),
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetway_concourse_commands_total",
			Help: "TSA commands this gateway ran (land-worker, retire-worker, delete-worker), by result (ok, error).",
		}, []string{"command", "result"}),
		rebalances: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetway_concourse_rebalances_total",
			Help: "Registrations made again through another TSA (concourse-rebalance-interval), by result (ok; error: it stayed where it was).",
		}, []string{"result"}),
		sweeps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetway_concourse_sweeps_total",
			Help: "Garbage-collection rounds with the web node (report what the worker holds, ask what to destroy), by kind (containers, volumes) and result (ok, error).",
		}, []string{"kind", "result"}),
		destroys: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetway_concourse_destroyed_total",
			Help: "What the web node named to destroy, by kind (containers, volumes) and result: destroyed, not-ours (jetway did not make it: left alone), error.",
		}, []string{"kind", "result"}),
		copies: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetway_concourse_volume_copies_total",
			Help: "Copy-on-write volumes (and imports of another volume) the web node made for which the volume holder copied bytes of their parent's files: those it could not hard-link (on another filesystem, or with too many links).",
		}),
		copiedBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetway_concourse_volume_copied_bytes_total",
			Help: "Bytes of files those copies copied.",
		}),
		linkedCopies: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetway_concourse_volume_linked_copies_total",
			Help: "Copy-on-write volumes (and imports of another volume) the web node made that share their parent's files by hard links in the volume holder: no byte copied for those. A volume with files of both kinds counts here and in jetway_concourse_volume_copies_total.",
		}),
		copySeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "jetway_concourse_volume_copy_seconds",
			Help:    "Time each of those copies took: the web node's volume create, from the gateway's call to the holder's answer.",
			Buckets: transferBuckets,
		}),
		refusals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetway_concourse_refused_connections_total",
			Help: "Connections to the REST-registered workers' listeners closed because they came from outside concourse-web-node-networks.",
		}),
	}
	m.podRefusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "jetway_concourse_pods_refused_total",
		Help: "Times jetway refused to use a pod under the name of a volume holder or of a container's pod, by reason: unsealed (no seal of jetway's), unbound (sealed, but not bound to the UID jetway's create returned: planted with a copied seal, or made before pods were bound).",
	}, []string{"reason"})
	m.pullCreds = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "jetway_concourse_pull_credentials_total",
		Help: "Registry credentials from the pipeline, by event: kept (written beside a get's output), not_kept (writing them failed: the image pulls without them), used (a container's pod got a pull secret of them), refused (a credential file jetway did not write, or for another image).",
	}, []string{"event"})
	m.containers = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "jetway_concourse_containers_total",
		Help: "Containers the web node made (event created) and destroyed (destroyed) on jetway's workers: their pods.",
	}, []string{"event"})
	m.garden = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "jetway_concourse_garden_calls_total",
		Help: "The web node's Garden calls to jetway's workers, by call and result (ok, or error).",
	}, []string{"call", "result"})
	m.moves = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "jetway_concourse_volume_moves_total",
		Help: "Volumes copied between the volume holder and a container's pod: into the pod before its first process (direction in), and out of the pod that holds one when it is first read, or when its container is released (out).",
	}, []string{"direction"})
	m.movedBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "jetway_concourse_volume_moved_bytes_total",
		Help: "Bytes those moves carried (tar, unencoded).",
	}, []string{"direction"})
	m.moveSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "jetway_concourse_volume_move_seconds",
		Help:    "Time each of those moves took, from its stream's start to its end (its retries included).",
		Buckets: transferBuckets,
	}, []string{"direction"})
	m.oversized = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "jetway_concourse_garden_oversized_messages_total",
		Help: "Messages on a Garden process's connection (stdin, window size, signal) past their cap of 8 MiB: each closed its client's connection.",
	})
	m.holders = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "jetway_concourse_volume_holders_replaced_total",
		Help: "Volume holder pods replaced, by reason: evicted, or failed (its node lost, its container ended), deleted (one whose volumes are on a claim, made again), storage (its storage setting changed); and whether the volumes it held were lost (an emptyDir's) or kept (on its claim).",
	}, []string{"reason", "volumes"})
	m.holds = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "jetway_concourse_volume_holds_total",
		Help: "Volumes a process wrote, left in its container's pod instead of copied back, by outcome: held (after a process), settled (copied back once: read, or its container released), dropped (destroyed unread: never copied back), lost (its pod gone first).",
	}, []string{"outcome"})
	m.p2ps = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "jetway_concourse_p2p_streams_total",
		Help: "Volumes the web node asked a worker to push to another worker (stream-p2p-out) that jetway carried, by path (p2p: pod to pod within a target; relay: through this gateway's port-forwards, between targets; mesh: through the gateway of the mesh that owns the destination; push: the source's holder pushed straight to another worker's stream-in URL, a stock worker's) and result (ok, error: the web node then relays it).",
	}, []string{"path", "result"})
	m.p2pBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "jetway_concourse_p2p_stream_bytes_total",
		Help: "Bytes of those streams (tar, as encoded on the way), by path.",
	}, []string{"path"})
	reg.MustRegister(m.p2ps, m.p2pBytes)
	reg.MustRegister(m.registrations, m.heartbeats, m.failures, m.commands, m.sweeps, m.rebalances, m.destroys, m.copies, m.copiedBytes, m.copySeconds,
		m.linkedCopies, m.refusals, m.podRefusals, m.pullCreds, m.containers, m.garden, m.moves, m.movedBytes, m.moveSeconds, m.oversized, m.holders, m.holds)
	return m
}

func (m *Metrics) set(regs map[string]Registration) {
	if m == nil {
		return
	}
	counts := map[string]int{StateRegistering: 0, StateRunning: 0, StateLanded: 0, StateFailing: 0}
	for _, r := range regs {
		counts[r.State]++
	}
	for state, n := range counts {
		m.registrations.WithLabelValues(state).Set(float64(n))
	}
}

func (m *Metrics) heartbeat() {
	if m != nil {
		m.heartbeats.Inc()
	}
}

func (m *Metrics) failed() {
	if m != nil {
		m.failures.Inc()
	}
}

func (m *Metrics) command(command string, err error) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.commands.WithLabelValues(command, result).Inc()
}

func (m *Metrics) swept(kind string, err error) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.sweeps.WithLabelValues(kind, result).Inc()
}

func (m *Metrics) rebalance(result string) {
	if m != nil {
		m.rebalances.WithLabelValues(result).Inc()
	}
}

func (m *Metrics) destroyed(kind, result string) {
	if m != nil {
		m.destroys.WithLabelValues(kind, result).Inc()
	}
}

// held counts a volume held by a pod, settled, dropped or lost (held.go).
func (m *Metrics) held(outcome string) {
	if m == nil {
		return
	}
	m.holds.WithLabelValues(outcome).Inc()
}

// copied counts a volume made of a copy of n bytes of its parent's files
// and links to linked of them, which took took.
func (m *Metrics) copied(n int64, linked int, took time.Duration) {
	if m == nil {
		return
	}
	if n > 0 {
		m.copies.Inc()
		m.copiedBytes.Add(float64(n))
		m.copySeconds.Observe(took.Seconds())
	}
	if linked > 0 {
		m.linkedCopies.Inc()
	}
}

// refused counts a connection refused at a worker's listener.
func (m *Metrics) refused() {
	if m == nil {
		return
	}
	m.refusals.Inc()
}

// podRefused counts a pod jetway refused to use (ownership.Key.Verdict).
// pullCredential counts an event of the registry credentials from the
// pipeline: kept, not_kept, used or refused.
func (m *Metrics) pullCredential(event string) {
	if m != nil {
		m.pullCreds.WithLabelValues(event).Inc()
	}
}

func (m *Metrics) podRefused(why string) {
	if m != nil {
		m.podRefusals.WithLabelValues(why).Inc()
	}
}

// holderReplaced counts a volume holder replaced, for reason, its
// volumes lost or kept (volumesLost, volumesKept).
func (m *Metrics) holderReplaced(reason, volumes string) {
	if m != nil {
		m.holders.WithLabelValues(reason, volumes).Inc()
	}
}

// What became of a replaced holder's volumes (the metric's volumes label).
const (
	volumesLost = "lost"
	volumesKept = "kept"
)

func (m *Metrics) container(event string) {
	if m != nil {
		m.containers.WithLabelValues(event).Inc()
	}
}

func (m *Metrics) gardenCall(call string, err error) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.garden.WithLabelValues(call, result).Inc()
}

// moved counts a move of n bytes in or out of a pod, which took took.
func (m *Metrics) moved(in bool, n int64, took time.Duration) {
	if m == nil {
		return
	}
	dir := "out"
	if in {
		dir = "in"
	}
	m.moves.WithLabelValues(dir).Inc()
	m.movedBytes.WithLabelValues(dir).Add(float64(n))
	m.moveSeconds.WithLabelValues(dir).Observe(took.Seconds())
}

// p2p counts a p2p stream that went by path (a streams mode; "" if it
// failed before it began) and carried n bytes.
func (m *Metrics) p2p(path string, n int64, err error) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	path = cmp.Or(path, "none")
	m.p2ps.WithLabelValues(path, result).Inc()
	m.p2pBytes.WithLabelValues(path).Add(float64(n))
}

// oversizedMessage counts a process connection closed for a message past
// its cap.
func (m *Metrics) oversizedMessage() {
	if m != nil {
		m.oversized.Inc()
	}
}
