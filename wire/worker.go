package wire

// Worker is a Concourse worker's JSON, atc.Worker of Concourse v8.2.5,
// with the fields jetway sets. It is what jetway sends the web node for
// each target it registers (the TSA's forward-worker and its other
// commands read it on stdin; concourse) and what GET /api/v1/workers
// answers, which `fly workers` reads (api). Keys fly and the TSA do not
// know are ignored by them.
type Worker struct {
	// GardenAddr is the worker's Garden address: the TSA's forward when
	// registering, a stable name of the target's API server and namespace
	// (k8s://host:port/namespace) in the API; fly requires it non-empty.
	GardenAddr      string `json:"addr"`
	BaggageclaimURL string `json:"baggageclaim_url"`
	// HTTPProxyURL, HTTPSProxyURL and NoProxy are what the web node gives
	// the worker's containers as http_proxy, https_proxy and no_proxy:
	// in a registration only (they may hold a proxy's credentials).
	HTTPProxyURL  string `json:"http_proxy_url,omitempty"`
	HTTPSProxyURL string `json:"https_proxy_url,omitempty"`
	NoProxy       string `json:"no_proxy,omitempty"`
	// CertsPath, when set, makes the web node give the worker's resource
	// containers a volume imported from it at /etc/ssl/certs.
	CertsPath        *string        `json:"certs_path,omitempty"`
	ActiveContainers int            `json:"active_containers"`
	ActiveVolumes    int            `json:"active_volumes"`
	ActiveTasks      int            `json:"active_tasks"`
	ResourceTypes    []ResourceType `json:"resource_types"`
	Platform         string         `json:"platform"`
	Tags             []string       `json:"tags"`
	Team             string         `json:"team"`
	Name             string         `json:"name"`
	// Version must be WorkerVersion: a web node places nothing on a worker
	// of another (atc/worker/pool.go), and fly lists it as outdated.
	Version   string `json:"version"`
	StartTime int64  `json:"start_time"`
	Ephemeral bool   `json:"ephemeral"`
	// State is the target's state in the API (running, landing, landed,
	// retiring, stalled, ...). The web node keeps a worker's state itself,
	// so a registration sends none.
	State string `json:"state,omitempty"`
}

// WorkerVersion is the Concourse worker API version jetway implements:
// the one Concourse v8 places work on, and fly v8 accepts.
const WorkerVersion = "2.5"

// ResourceType is a base resource type a worker offers
// (atc.WorkerResourceType): its image is what the operator mapped it to
// (--concourse-resource-types).
type ResourceType struct {
	Type                 string `json:"type"`
	Image                string `json:"image"`
	Version              string `json:"version"`
	Privileged           bool   `json:"privileged"`
	UniqueVersionHistory bool   `json:"unique_version_history"`
}
