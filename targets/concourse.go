package targets

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// ConcourseWorker is how a target registers as a Concourse worker beyond
// its team, tags and platform: the options a stock worker's flags set
// (`concourse:` in target.yaml).
type ConcourseWorker struct {
	// Ephemeral: the web node deletes the worker once it stalls, instead
	// of keeping it stalled (a stock worker's --ephemeral).
	Ephemeral bool `json:"ephemeral,omitempty"`
	// HTTPProxy, HTTPSProxy and NoProxy are what the web node gives the
	// worker's containers as http_proxy, https_proxy and no_proxy (a
	// stock worker's --http-proxy, --https-proxy and --no-proxy).
	HTTPProxy  string `json:"httpProxy,omitempty"`
	HTTPSProxy string `json:"httpsProxy,omitempty"`
	NoProxy    string `json:"noProxy,omitempty"`
	// Certs names a ConfigMap of the target's namespace whose keys are the
	// CA certificates the web node gives the worker's resource containers
	// (checks, gets, puts) at /etc/ssl/certs, each key a file (a stock
	// worker's --certs-dir).
	Certs string `json:"certs,omitempty"`
}

// validate names each proxy that is not an http or https URL with a host,
// without its credentials.
func (c ConcourseWorker) validate() error {
	var errs []error
	for _, p := range []struct{ key, value string }{{"httpProxy", c.HTTPProxy}, {"httpsProxy", c.HTTPSProxy}} {
		if p.value == "" {
			continue
		}
		u, err := url.Parse(p.value)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("concourse.%s is not a URL", p.key)) // err quotes it, credentials and all
		case u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
			errs = append(errs, fmt.Errorf("concourse.%s %q is not an http:// or https:// URL with a host", p.key, u.Redacted()))
		}
	}
	if c.Certs != "" {
		if msgs := validation.IsDNS1123Subdomain(c.Certs); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("concourse.certs %q is not a ConfigMap name: %s", c.Certs, strings.Join(msgs, "; ")))
		}
	}
	if strings.ContainsAny(c.NoProxy, " \t\n") {
		errs = append(errs, errors.New("concourse.noProxy is a comma-separated list of hosts, domains and CIDRs, without spaces"))
	}
	return errors.Join(errs...)
}
