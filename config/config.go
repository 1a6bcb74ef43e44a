// Package config turns flags, JETWAY_* environment variables and an optional
// YAML file into one validated Config. Precedence: flags > environment >
// file > defaults. viper stays inside this package.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"strconv"
	"strings"
	"time"
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
}

// WorkerVersion is the Concourse worker API version jetway implements; fly
// v8 accepts workers reporting 2.5.
const WorkerVersion = "2.5"

// Default returns the configuration used where nothing else is said.
func Default() Config {
	return Config{
		Listen:           ":8080",
		ConcourseVersion: "8.2.5",
		ShutdownTimeout:  15 * time.Second,
		LogLevel:         "info",
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
	if len(probs) == 0 {
		return nil
	}
	return &Error{Problems: probs}
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
