package config

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/selection"
)

func load(t *testing.T, args []string, env map[string]string, file string) (Config, error) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	if file != "" {
		path := filepath.Join(t.TempDir(), "jetway.yaml")
		require.NoError(t, os.WriteFile(path, []byte(file), 0o600))
		args = append(args, "--config", path)
	}
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	RegisterFlags(fs)
	require.NoError(t, fs.Parse(append([]string{"--targets-dir", t.TempDir(), "--no-auth"}, args...)))
	return Load(fs)
}

func valid(t *testing.T) Config {
	c := Default()
	c.TargetsDir = t.TempDir()
	c.NoAuth = true
	return c
}

func TestLoadPrecedence(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		env    map[string]string
		file   string
		listen string
	}{
		{name: "default", listen: ":8080"},
		{name: "file", file: "listen: 127.0.0.1:1001\n", listen: "127.0.0.1:1001"},
		{name: "env over file", file: "listen: 127.0.0.1:1001\n",
			env: map[string]string{"JETWAY_LISTEN": "127.0.0.1:1002"}, listen: "127.0.0.1:1002"},
		{name: "flag over env", args: []string{"--listen", "127.0.0.1:1003"}, file: "listen: 127.0.0.1:1001\n",
			env: map[string]string{"JETWAY_LISTEN": "127.0.0.1:1002"}, listen: "127.0.0.1:1003"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := load(t, tt.args, tt.env, tt.file)
			require.NoError(t, err)
			assert.Equal(t, tt.listen, c.Listen)
		})
	}
}

func TestLoadDashedKeys(t *testing.T) {
	c, err := load(t, nil, map[string]string{"JETWAY_SHUTDOWN_TIMEOUT": "3s"}, "concourse-version: 7.14.0\nmax-streams: 8\n")
	require.NoError(t, err)
	assert.Equal(t, 3*time.Second, c.ShutdownTimeout)
	assert.Equal(t, "7.14.0", c.ConcourseVersion)
	assert.Equal(t, 8, c.MaxStreams)
	c, err = load(t, []string{"--max-streams", "0"}, nil, "")
	require.NoError(t, err)
	assert.Zero(t, c.MaxStreams)
}

func TestLoadReportsEveryBadKey(t *testing.T) {
	_, err := load(t,
		[]string{"--listen", "nonsense", "--log-level", "loud"},
		map[string]string{"JETWAY_SHUTDOWN_TIMEOUT": "soon"},
		"concourse-version: eight\nlisen: :9090\n")
	require.Error(t, err)
	require.ErrorIs(t, err, ErrInvalid)
	var cerr *Error
	require.True(t, errors.As(err, &cerr))
	keys := map[string]string{}
	for _, p := range cerr.Problems {
		keys[p.Key] = p.Message
	}
	assert.Len(t, keys, 5, "%v", cerr)
	assert.Contains(t, keys["listen"], `"nonsense" is not a host:port address`)
	assert.Contains(t, keys["log-level"], `"loud"`)
	assert.Contains(t, keys["shutdown-timeout"], `"soon" is not a duration`)
	assert.Contains(t, keys["concourse-version"], `"eight"`)
	assert.Contains(t, keys["lisen"], "unknown key")
}

// TestExtractLimits: a step pod's extract limits default to tarsafe's,
// and must be positive.
func TestExtractLimits(t *testing.T) {
	c, err := load(t, nil, nil, "")
	require.NoError(t, err)
	assert.Equal(t, Bytes(32<<30), c.ExtractMaxBytes)
	assert.Equal(t, 1<<20, c.ExtractMaxEntries)
	c, err = load(t, []string{"--extract-max-bytes", "1Gi"}, map[string]string{"JETWAY_EXTRACT_MAX_ENTRIES": "5000"}, "")
	require.NoError(t, err)
	assert.Equal(t, Bytes(1<<30), c.ExtractMaxBytes)
	c, err = load(t, nil, nil, "extract-max-bytes: 1073741824\n")
	require.NoError(t, err)
	assert.Equal(t, Bytes(1<<30), c.ExtractMaxBytes)
	assert.Equal(t, 5000, c.ExtractMaxEntries)
	_, err = load(t, []string{"--extract-max-bytes", "0"}, map[string]string{"JETWAY_EXTRACT_MAX_ENTRIES": "-1"}, "")
	var cerr *Error
	require.ErrorAs(t, err, &cerr)
	keys := map[string]string{}
	for _, p := range cerr.Problems {
		keys[p.Key] = p.Message
	}
	assert.Equal(t, map[string]string{"extract-max-bytes": "must be positive, got 0", "extract-max-entries": "must be positive, got -1"}, keys)
	_, err = load(t, []string{"--extract-max-bytes", "lots"}, nil, "")
	assert.ErrorContains(t, err, `extract-max-bytes: "lots" is not a size like 32Gi or 1073741824`)
}

// TestStepPodLimits: a step pod's size limit and requests default to
// 10Gi, 1Gi, 100m and 256Mi; 0 turns one off, and none may be negative.
func TestStepPodLimits(t *testing.T) {
	c, err := load(t, nil, nil, "")
	require.NoError(t, err)
	assert.Equal(t, Bytes(10<<30), c.StepVolumeSizeLimit)
	assert.Equal(t, Bytes(1<<30), c.StepEphemeralStorageRequest)
	assert.Equal(t, "100m", c.StepDefaultCPURequest)
	assert.Equal(t, Bytes(256<<20), c.StepDefaultMemoryRequest)
	assert.Equal(t, "10m", c.StepCheckCPURequest)
	assert.Equal(t, Bytes(32<<20), c.StepCheckMemoryRequest)
	c, err = load(t, []string{"--step-volume-size-limit", "0", "--step-default-cpu-request", "1"},
		map[string]string{"JETWAY_STEP_DEFAULT_MEMORY_REQUEST": "1Gi"}, "step-ephemeral-storage-request: 2Gi\n")
	require.NoError(t, err)
	assert.Equal(t, Bytes(0), c.StepVolumeSizeLimit)
	assert.Equal(t, Bytes(2<<30), c.StepEphemeralStorageRequest)
	assert.Equal(t, "1", c.StepDefaultCPURequest)
	assert.Equal(t, Bytes(1<<30), c.StepDefaultMemoryRequest)
	_, err = load(t, []string{"--step-volume-size-limit", "-1Gi", "--step-default-cpu-request", "lots", "--step-check-cpu-request", "-1"},
		map[string]string{"JETWAY_STEP_DEFAULT_MEMORY_REQUEST": "-1", "JETWAY_STEP_CHECK_MEMORY_REQUEST": "-2"}, "")
	var cerr *Error
	require.ErrorAs(t, err, &cerr)
	keys := map[string]string{}
	for _, p := range cerr.Problems {
		keys[p.Key] = p.Message
	}
	assert.Equal(t, map[string]string{"step-volume-size-limit": "must not be negative, got -1Gi",
		"step-default-memory-request": "must not be negative, got -1",
		"step-default-cpu-request":    `"lots" is not a cpu quantity like 100m or 1 (0: none)`,
		"step-check-memory-request":   "must not be negative, got -2",
		"step-check-cpu-request":      `"-1" is not a cpu quantity like 100m or 1 (0: none)`}, keys)
}

func TestLoadMissingFile(t *testing.T) {
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	RegisterFlags(fs)
	require.NoError(t, fs.Parse([]string{"--config", filepath.Join(t.TempDir(), "absent.yaml")}))
	_, err := Load(fs)
	require.ErrorContains(t, err, "config: read ")
}

func TestValidateListen(t *testing.T) {
	for addr, ok := range map[string]bool{
		":8080": true, "127.0.0.1:0": true, "[::1]:80": true, "localhost:8080": true,
		"nonsense": false, "127.0.0.1": false, ":http": false, ":70000": false, "bad host!:80": false,
	} {
		c := valid(t)
		c.Listen = addr
		if ok {
			assert.NoError(t, c.Validate(), addr)
		} else {
			assert.ErrorContains(t, c.Validate(), "listen: ", addr)
		}
	}
}

func TestValidateTargetsAndAuth(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	tests := []struct {
		name   string
		mutate func(*Config)
		want   []string
	}{
		{name: "valid", mutate: func(*Config) {}},
		{name: "missing dir", mutate: func(c *Config) { c.TargetsDir = "/nonexistent/targets" },
			want: []string{"targets-dir: stat /nonexistent/targets: no such file or directory"}},
		{name: "dir is a file", mutate: func(c *Config) { c.TargetsDir = file }, want: []string{"is not a directory"}},
		{name: "no auth choice", mutate: func(c *Config) { c.NoAuth = false },
			want: []string{"auth-tokens-file: required", "--no-auth"}},
		{name: "both auth choices", mutate: func(c *Config) { c.AuthTokensFile = file }, want: []string{"no-auth: contradicts"}},
		{name: "health", mutate: func(c *Config) {
			c.HealthInterval, c.HealthTimeout, c.HealthConcurrency, c.StallAfter = time.Millisecond, time.Second, 0, 0
		}, want: []string{"health-interval: must be at least 100ms", "health-timeout: must be positive and at most",
			"health-concurrency: must be at least 1", "stall-after: must be at least 1"}},
		{name: "no stream bound", mutate: func(c *Config) { c.MaxStreams = 0 }},
		{name: "negative stream bound", mutate: func(c *Config) { c.MaxStreams = -1 },
			want: []string{"max-streams: must not be negative (0: no bound), got -1"}},
		{name: "no stall timeout", mutate: func(c *Config) { c.StreamStallTimeout = 0 },
			want: []string{"stream-stall-timeout: must be positive, got 0s"}},
		{name: "no keep grace", mutate: func(c *Config) { c.ConcourseKeepGrace, c.ConcourseSweepInterval = 0, time.Millisecond },
			want: []string{"concourse-keep-grace: must be positive, got 0s", "concourse-sweep-interval: must be at least 1s, got 1ms"}},
		{name: "no lost grace", mutate: func(c *Config) { c.ConcourseLostGrace = -time.Second },
			want: []string{"concourse-lost-grace: must be positive, got -1s"}},
		{name: "rebalance and drain", mutate: func(c *Config) { c.ConcourseRebalance, c.ConcourseDrain = -time.Second, 0 },
			want: []string{"concourse-rebalance-interval: must not be negative, got -1s (0: never)",
				"concourse-connection-drain-timeout: must be positive, got 0s"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid(t)
			tt.mutate(&c)
			err := c.Validate()
			if len(tt.want) == 0 {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestPlacementDefaults(t *testing.T) {
	c, err := load(t, nil, nil, "")
	require.NoError(t, err)
	assert.Equal(t, selection.Chain{selection.VolumeLocality}, c.PlacementStrategy)
	assert.Equal(t, selection.Chain{selection.VolumeLocality}, c.NoInputPlacementStrategy,
		"no-input-placement-strategy defaults to placement-strategy")
	assert.Equal(t, selection.Chain{selection.Random}, c.CheckPlacementStrategy)
	assert.Equal(t, selection.Limits{}, c.Limits(), "0: no limit")
	require.NoError(t, valid(t).Validate(), "Default is valid without a no-input chain")
}

func TestLoadPlacement(t *testing.T) {
	tests := []struct {
		name                    string
		args                    []string
		env                     map[string]string
		file                    string
		placement, noInput, chk selection.Chain
		limits                  selection.Limits
	}{
		{name: "no-input follows placement",
			args:      []string{"--placement-strategy", "fewest-build-containers,limit-active-tasks"},
			placement: selection.Chain{selection.FewestBuildContainers, selection.LimitActiveTasks},
			noInput:   selection.Chain{selection.FewestBuildContainers, selection.LimitActiveTasks},
			chk:       selection.Chain{selection.Random}},
		{name: "each set, env and file",
			env: map[string]string{"JETWAY_NO_INPUT_PLACEMENT_STRATEGY": "random",
				"JETWAY_MAX_ACTIVE_TASKS_PER_TARGET": "4"},
			file:      "check-placement-strategy: [limit-active-containers, fewest-build-containers]\nmax-active-containers-per-target: 20\nmax-active-volumes-per-target: 50\n",
			placement: selection.Chain{selection.VolumeLocality},
			noInput:   selection.Chain{selection.Random},
			chk:       selection.Chain{selection.LimitActiveContainers, selection.FewestBuildContainers},
			limits:    selection.Limits{ActiveTasks: 4, ActiveContainers: 20, ActiveVolumes: 50}},
		{name: "spaces after commas", args: []string{"--check-placement-strategy", "volume-locality, limit-active-volumes"},
			placement: selection.Chain{selection.VolumeLocality}, noInput: selection.Chain{selection.VolumeLocality},
			chk: selection.Chain{selection.VolumeLocality, selection.LimitActiveVolumes}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := load(t, tt.args, tt.env, tt.file)
			require.NoError(t, err)
			assert.Equal(t, tt.placement, c.PlacementStrategy)
			assert.Equal(t, tt.noInput, c.NoInputPlacementStrategy)
			assert.Equal(t, tt.chk, c.CheckPlacementStrategy)
			assert.Equal(t, tt.limits, c.Limits())
		})
	}
}

func TestLoadReportsEveryPlacementProblem(t *testing.T) {
	_, err := load(t,
		[]string{"--placement-strategy", "volume-locality,fastest", "--check-placement-strategy", "",
			"--max-active-tasks-per-target", "-1", "--max-active-volumes-per-target", "-3"},
		map[string]string{"JETWAY_NO_INPUT_PLACEMENT_STRATEGY": "random,volume-locality,volume-locality"},
		"max-active-containers-per-target: -2\n")
	var cerr *Error
	require.ErrorAs(t, err, &cerr)
	keys := map[string]string{}
	for _, p := range cerr.Problems {
		keys[p.Key] = p.Message
	}
	assert.Len(t, keys, 6, "%v", cerr)
	assert.Contains(t, keys["placement-strategy"], `unknown strategy "fastest"`)
	assert.Contains(t, keys["no-input-placement-strategy"], `strategy "volume-locality" given twice`)
	assert.Contains(t, keys["no-input-placement-strategy"], "random must be the only strategy")
	assert.Equal(t, "must name at least one strategy", keys["check-placement-strategy"])
	assert.Equal(t, "must not be negative (0: no limit), got -1", keys["max-active-tasks-per-target"])
	assert.Equal(t, "must not be negative (0: no limit), got -2", keys["max-active-containers-per-target"])
	assert.Equal(t, "must not be negative (0: no limit), got -3", keys["max-active-volumes-per-target"])
}

// A default that follows another setting follows it wherever that was set;
// only values the operator set are judged against each other.
func TestDerivedDefaultsFollowWhatTheyDeriveFrom(t *testing.T) {
	for _, tt := range []struct {
		name    string
		args    []string
		env     map[string]string
		file    string
		timeout time.Duration
		err     string
	}{
		{name: "neither set", timeout: 5 * time.Second},
		{name: "a short interval by flag", args: []string{"--health-interval", "2s"}, timeout: 2 * time.Second},
		{name: "by environment", env: map[string]string{"JETWAY_HEALTH_INTERVAL": "3s"}, timeout: 3 * time.Second},
		{name: "in the file", file: "health-interval: 1s\n", timeout: time.Second},
		{name: "a long interval keeps the default", args: []string{"--health-interval", "1m"}, timeout: 5 * time.Second},
		{name: "both set, fitting", args: []string{"--health-interval", "2s", "--health-timeout", "1s"}, timeout: time.Second},
		{name: "both set, not fitting", args: []string{"--health-interval", "2s", "--health-timeout", "5s"},
			err: "health-timeout: must be positive and at most health-interval (2s), got 5s"},
		{name: "the timeout alone, longer than the default interval", args: []string{"--health-timeout", "20s"},
			err: "health-timeout: must be positive and at most health-interval (10s), got 20s"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := load(t, tt.args, tt.env, tt.file)
			if tt.err != "" {
				assert.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.timeout, c.HealthTimeout)
		})
	}
}

// TestValidateConcourse: registering through the TSA or the REST API, one
// of them, each with what it needs; every problem names its key.
func TestValidateConcourse(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, []byte("x"), 0o600))
	tsa := func(c *Config) { c.ConcourseTSA, c.ConcourseTSAPublicKey, c.ConcourseWorkerKey = "ci:2222", file, file }
	rest := func(c *Config) {
		c.ConcourseURL, c.ConcourseClientID, c.ConcourseClientSecretFile, c.ConcourseWorkerAddress =
			"https://ci.example.com", "jetway", file, "10.1.2.3"
		c.ConcourseWebNodeNetworks = []string{"10.42.0.0/16"}
	}
	tests := []struct {
		name   string
		mutate func(*Config)
		want   []string
	}{
		{name: "none", mutate: func(*Config) {}},
		{name: "the TSA", mutate: tsa},
		{name: "several TSAs", mutate: func(c *Config) { tsa(c); c.ConcourseTSA = "web-0:2222, web-1:2222" }},
		{name: "several TSAs, one none", mutate: func(c *Config) { tsa(c); c.ConcourseTSA = "web-0:2222,web-1" },
			want: []string{`concourse-tsa: "web-1" is not host:port`}},
		{name: "the REST API", mutate: rest},
		{name: "the REST API at a host name", mutate: func(c *Config) { rest(c); c.ConcourseWorkerAddress = "jetway-0.jetway" }},
		{name: "both", mutate: func(c *Config) { tsa(c); rest(c) },
			want: []string{"concourse-client-id: only with concourse-url and without concourse-tsa", "concourse-client-secret-file: only with",
				"concourse-worker-address: only with"}},
		{name: "the TSA, its web node's URL for the worker version", mutate: func(c *Config) { tsa(c); c.ConcourseURL = "http://ci:8080" }},
		{name: "the TSA, a URL that is none", mutate: func(c *Config) { tsa(c); c.ConcourseURL = "ci:8080" },
			want: []string{`concourse-url: "ci:8080" is not the web node's external URL (http:// or https://HOST[:PORT]), where jetway reads its worker version`}},
		{name: "the TSA with a REST setting", mutate: func(c *Config) { tsa(c); c.ConcourseClientID = "jetway" },
			want: []string{"concourse-client-id: only with concourse-url"}},
		{name: "the REST API with a TSA setting", mutate: func(c *Config) { rest(c); c.ConcourseWorkerKey = file },
			want: []string{"concourse-worker-key: only with concourse-tsa, not with concourse-url"}},
		{name: "a REST setting alone", mutate: func(c *Config) { c.ConcourseWorkerAddress = "10.1.2.3" },
			want: []string{`concourse-url: "" is not the web node's external URL`, "concourse-client-id: required with concourse-url",
				"concourse-client-secret-file: required with concourse-url", "concourse-web-node-networks: required with concourse-url"}},
		{name: "the REST API, each wrong", mutate: func(c *Config) {
			c.ConcourseURL, c.ConcourseClientSecretFile, c.ConcourseWorkerAddress = "ci.example.com:443", "/nonexistent/secret", "10.1.2.3:7777"
		}, want: []string{`concourse-url: "ci.example.com:443" is not the web node's external URL`,
			"concourse-client-id: required", "concourse-client-secret-file: stat /nonexistent/secret",
			`concourse-worker-address: "10.1.2.3:7777" is neither an IP address nor a host name`,
			"concourse-web-node-networks: required with concourse-url"}},
		{name: "an unspecified worker address", mutate: func(c *Config) { rest(c); c.ConcourseWorkerAddress = "0.0.0.0" },
			want: []string{"concourse-worker-address: 0.0.0.0 is no address the web node can reach"}},
		{name: "the TSA, keys missing", mutate: func(c *Config) { c.ConcourseTSA = "ci:2222" },
			want: []string{"concourse-tsa-public-key: required with concourse-tsa", "concourse-worker-key: required with concourse-tsa"}},
		{name: "resource types with the REST API", mutate: func(c *Config) { rest(c); c.ConcourseResourceTypes = file }},
		{name: "the REST API from the web node's networks", mutate: func(c *Config) {
			rest(c)
			c.ConcourseWebNodeNetworks = []string{"10.0.0.0/8", " 192.168.1.7", "fd00::/8"}
		}},
		{name: "the REST API from everywhere", mutate: func(c *Config) { rest(c); c.ConcourseWebNodeNetworks = nil },
			want: []string{"concourse-web-node-networks: required with concourse-url: the workers' Garden and volume listeners take no credential"}},
		{name: "the REST API over http", mutate: func(c *Config) { rest(c); c.ConcourseURL = "http://ci.example.com" },
			want: []string{`concourse-url: "http://ci.example.com" is http://: the client secret, and the tokens it buys, would travel on it unencrypted; give the web node's https:// URL, or set concourse-insecure`}},
		{name: "the REST API over http, allowed", mutate: func(c *Config) { rest(c); c.ConcourseURL, c.ConcourseInsecure = "http://ci.example.com", true }},
		{name: "insecure with the TSA", mutate: func(c *Config) { tsa(c); c.ConcourseInsecure = true },
			want: []string{"concourse-insecure: only with concourse-url's REST registration"}},
		{name: "web node networks that are none", mutate: func(c *Config) { rest(c); c.ConcourseWebNodeNetworks = []string{"10.0.0.0/8", "ci.example.com"} },
			want: []string{`concourse-web-node-networks: "ci.example.com" is neither a CIDR (10.0.0.0/8) nor an IP`}},
		{name: "web node networks with the TSA", mutate: func(c *Config) { tsa(c); c.ConcourseWebNodeNetworks = []string{"10.0.0.0/8"} },
			want: []string{"concourse-web-node-networks: only with concourse-url (the REST API)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid(t)
			tt.mutate(&c)
			err := c.Validate()
			if len(tt.want) == 0 {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			var cerr *Error
			require.ErrorAs(t, err, &cerr)
			assert.Len(t, cerr.Problems, len(tt.want), "%v", err)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

// TestWebNodeNetworks: CIDRs are masked, an IP stands for itself alone.
func TestWebNodeNetworks(t *testing.T) {
	c := Config{ConcourseWebNodeNetworks: []string{"10.1.2.3/8", "192.168.1.7", "::ffff:10.0.0.1", "fd00::1/8"}}
	nets, err := c.WebNodeNetworks()
	require.NoError(t, err)
	var got []string
	for _, n := range nets {
		got = append(got, n.String())
	}
	assert.Equal(t, []string{"10.0.0.0/8", "192.168.1.7/32", "10.0.0.1/32", "fd00::/8"}, got)
}

func TestTSAAddrs(t *testing.T) {
	assert.Equal(t, []string{"web-0:2222", "web-1:2222"}, Config{ConcourseTSA: " web-0:2222 ,web-1:2222,"}.TSAAddrs())
	assert.Empty(t, Config{}.TSAAddrs())
}
