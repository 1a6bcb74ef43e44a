package api

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultTokensCheck is how often a TokenFile reads its file again: a
// removed token stops working within it (plus the read).
const DefaultTokensCheck = time.Second

// TokenFile keeps the API's tokens those of the tokens file, so tokens
// rotate without a restart: it reads the file every Check and, when its
// content changed, gives the new tokens to Set. A file that does not load
// (half written, a bad entry) keeps the last good tokens; it is logged,
// and counted, once per change.
type TokenFile struct {
	path   string
	check  time.Duration
	set    func([]Token)
	logger *slog.Logger
	loads  *prometheus.CounterVec

	last []byte // the content last read, good or not
}

// TokenFileOptions configure a TokenFile. Set is required.
type TokenFileOptions struct {
	Path   string
	Check  time.Duration // default DefaultTokensCheck
	Set    func([]Token)
	Logger *slog.Logger
	// Registerer, if set, gets jetway_api_tokens_reloads_total{result}.
	Registerer prometheus.Registerer
}

// NewTokenFile reads the tokens file; its tokens are what the API starts
// with. Start watches it.
func NewTokenFile(opts TokenFileOptions) (*TokenFile, []Token, error) {
	f := &TokenFile{path: opts.Path, check: opts.Check, set: opts.Set, logger: opts.Logger,
		loads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetway_api_tokens_reloads_total",
			Help: "Changes of the tokens file read, by result (ok: its tokens are in use; error: the last good ones stay).",
		}, []string{"result"})}
	if f.check <= 0 {
		f.check = DefaultTokensCheck
	}
	if f.logger == nil {
		f.logger = slog.New(slog.DiscardHandler)
	}
	if opts.Registerer != nil {
		opts.Registerer.MustRegister(f.loads)
	}
	var err error
	if f.last, err = os.ReadFile(f.path); err != nil {
		return nil, nil, err
	}
	tokens, err := parseTokens(f.path, f.last)
	if err != nil {
		return nil, nil, err
	}
	return f, tokens, nil
}

// Start checks the file until ctx ends.
func (f *TokenFile) Start(ctx context.Context) error {
	tick := time.NewTicker(f.check)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			f.reload()
		}
	}
}

// reload reads the file and, if it changed, loads its tokens.
func (f *TokenFile) reload() {
	b, err := os.ReadFile(f.path)
	if err == nil && bytes.Equal(b, f.last) {
		return
	}
	if err != nil {
		b = nil // reported once, until the file is back
		if f.last == nil {
			return
		}
	}
	f.last = b
	var tokens []Token
	if err == nil {
		tokens, err = parseTokens(f.path, b)
	}
	if err != nil {
		f.loads.WithLabelValues("error").Inc()
		f.logger.Error("the tokens file changed but does not load; the last good tokens stay in use", "error", err.Error())
		return
	}
	f.set(tokens)
	f.loads.WithLabelValues("ok").Inc()
	f.logger.Info("tokens file reloaded", "tokens", len(tokens))
}
