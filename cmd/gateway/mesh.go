package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/jetway-ci/jetway/mesh"
)

// meshCommand groups the mesh's own tools.
func meshCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "mesh",
		Short: "Mesh certificates: issue one replica's from the mesh CA",
		Args:  cobra.ArbitraryArgs,
		RunE:  helpOrUnknown,
	}
	cmd.AddCommand(meshIssueCommand())
	return cmd
}

// meshIssueCommand is `gateway mesh issue`: what the chart's init
// container runs (the image has no shell), so that each replica of one
// Deployment has a mesh name of its own from one shared CA.
func meshIssueCommand() *cobra.Command {
	var o mesh.IssueOptions
	cmd := &cobra.Command{
		Use:   "issue --ca-cert FILE --ca-key FILE --name NAME --out DIR [--agent --team TEAM|--global [--tag TAG]...]",
		Short: "Issue this member's mesh certificate and key from the mesh CA",
		Long: `Issue this member's mesh certificate from the mesh CA and write, into --out,
ca.crt (the CA's certificate), tls.crt and tls.key (ECDSA P-256, mode 0600),
each replaced atomically: what --mesh-ca, --mesh-cert and --mesh-key name.
The certificate's common name, its mesh name, is --name, also its first DNS
name; it serves client and server authentication, and is valid from 5
minutes ago for --valid-for, but never past the CA's end. It is a gateway's
(URI SAN urn:jetway:mesh:gateway), or with --agent an agent's
(urn:jetway:mesh:agent): a member runs only as the kind its certificate is
for. An agent's certificate also says what the agent is, as URI SANs:
the one team whose steps it runs (--team, urn:jetway:agent:team:TEAM) or
every team's (--global, urn:jetway:agent:global), and its tags (--tag,
urn:jetway:agent:tag:TAG). Gateways take an agent for what its
certificate says, whatever it announces: whoever holds the key is that
agent, and no more.`,
		Example: `  gateway mesh issue --ca-cert /etc/jetway/mesh-ca/tls.crt --ca-key /etc/jetway/mesh-ca/tls.key \
    --name "$POD_NAME" --dns "$POD_NAME" --dns jetway-mesh.ci.svc --out /etc/jetway/mesh
  gateway mesh issue --ca-cert ca.crt --ca-key ca.key --name mac-mini-1 --agent --team ios --tag mac --out ~/.jetway/mesh`,
		Args: noArgs,
	}
	f := cmd.Flags()
	f.StringVar(&o.CACert, "ca-cert", "", "PEM file of the mesh CA's certificate (required)")
	f.StringVar(&o.CAKey, "ca-key", "", "PEM file of the mesh CA's private key: PKCS#1, SEC 1 or PKCS#8, unencrypted (required)")
	f.StringVar(&o.Name, "name", "", "this member's mesh name: the certificate's common name and first DNS name (required)")
	f.StringArrayVar(&o.DNSNames, "dns", nil, "another DNS name of the certificate; repeat for more")
	f.DurationVar(&o.ValidFor, "valid-for", 8760*time.Hour, "how long the certificate is valid; cut at the CA's end")
	f.StringVar(&o.OutDir, "out", "", "directory to write ca.crt, tls.crt and tls.key into; made if missing (required)")
	f.BoolVar(&o.Agent, "agent", false, "issue an agent's certificate (for gateway agent) instead of a gateway's")
	f.StringVar(&o.Team, "team", "", "with --agent: the one team whose steps the agent runs (it or --global is required)")
	f.BoolVar(&o.Global, "global", false, "with --agent: the agent runs every team's steps, as a Concourse global worker")
	f.StringArrayVar(&o.Tags, "tag", nil, "with --agent: a tag of the agent's worker; repeat for more")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := o.Validate(); err != nil {
			return usageError{err}
		}
		issued, err := mesh.Issue(o)
		if err != nil {
			return err
		}
		leaf := issued.Certificate
		if issued.Capped {
			fmt.Fprintf(cmd.ErrOrStderr(), "gateway: mesh issue: the certificate is valid until %s only, when CA certificate %s expires; --valid-for %s reaches past it\n",
				leaf.NotAfter.Format(time.RFC3339), o.CACert, o.ValidFor)
		}
		what := o.Kind()
		if o.Agent {
			what += " (" + mesh.AgentScope{Team: o.Team, Global: o.Global, Tags: o.Tags}.String() + ")"
		}
		fmt.Fprintf(cmd.OutOrStdout(), "issued %s certificate %q (serial %x) valid until %s: %s, %s, %s\n",
			what, leaf.Subject.CommonName, leaf.SerialNumber, leaf.NotAfter.Format(time.RFC3339), issued.CACert, issued.Cert, issued.Key)
		return nil
	}
	return cmd
}
