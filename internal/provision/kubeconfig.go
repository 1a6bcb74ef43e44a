package provision

import (
	"encoding/json"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/jetway-ci/jetway/targets"
)

// Cluster is how a target kubeconfig reaches the API server: what the
// admin kubeconfig says, with its CA inline.
type Cluster struct {
	Server        string
	CAData        []byte
	TLSServerName string
	ProxyURL      string
	Insecure      bool
}

// ClusterOf takes the API server's address and CA from the admin's client
// configuration, reading a CA file so that the target carries it inline.
func ClusterOf(admin *rest.Config, raw *clientcmdapi.Cluster) (Cluster, error) {
	c := Cluster{Server: admin.Host, CAData: admin.TLSClientConfig.CAData,
		TLSServerName: admin.TLSClientConfig.ServerName, Insecure: admin.TLSClientConfig.Insecure}
	if raw != nil {
		c.ProxyURL = raw.ProxyURL
	}
	if len(c.CAData) == 0 && admin.TLSClientConfig.CAFile != "" {
		ca, err := os.ReadFile(admin.TLSClientConfig.CAFile)
		if err != nil {
			return c, fmt.Errorf("admin kubeconfig: read the cluster's CA: %w", err)
		}
		c.CAData = ca
	}
	return c, nil
}

// Kubeconfig is the target entry's kubeconfig: one context named after
// the target, in its namespace, with the token. meta, when not nil, rides
// in the context's `jetway` extension (the Secret form has no room for a
// target.yaml beside it).
func Kubeconfig(c Cluster, a Access, token string, meta *targets.Metadata) ([]byte, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[a.Target] = &clientcmdapi.Cluster{Server: c.Server, CertificateAuthorityData: c.CAData,
		TLSServerName: c.TLSServerName, ProxyURL: c.ProxyURL, InsecureSkipTLSVerify: c.Insecure}
	cfg.AuthInfos[a.AccountName()] = &clientcmdapi.AuthInfo{Token: token}
	ctx := &clientcmdapi.Context{Cluster: a.Target, AuthInfo: a.AccountName(), Namespace: a.Namespace}
	if meta != nil {
		raw, err := json.Marshal(meta)
		if err != nil {
			return nil, err
		}
		ctx.Extensions = map[string]runtime.Object{targets.ExtensionName: &runtime.Unknown{Raw: raw, ContentType: runtime.ContentTypeJSON}}
	}
	cfg.Contexts[a.Target] = ctx
	cfg.CurrentContext = a.Target
	return clientcmd.Write(*cfg)
}
