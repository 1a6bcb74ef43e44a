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
	require.NoError(t, fs.Parse(args))
	return Load(fs)
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
	c, err := load(t, nil, map[string]string{"JETWAY_SHUTDOWN_TIMEOUT": "3s"}, "concourse-version: 7.14.0\n")
	require.NoError(t, err)
	assert.Equal(t, 3*time.Second, c.ShutdownTimeout)
	assert.Equal(t, "7.14.0", c.ConcourseVersion)
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
		c := Default()
		c.Listen = addr
		if ok {
			assert.NoError(t, c.Validate(), addr)
		} else {
			assert.ErrorContains(t, c.Validate(), "listen: ", addr)
		}
	}
}
