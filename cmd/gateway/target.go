package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	"github.com/jetway-ci/jetway/internal/atomicfile"
	"github.com/jetway-ci/jetway/internal/provision"
	"github.com/jetway-ci/jetway/targets"
)

// Defaults of the targets Secret the Helm chart mounts at the targets dir.
const (
	defaultTargetsSecret    = "jetway-targets"
	defaultTargetsNamespace = "jetway"
)

func targetCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "target",
		Short: "Give jetway a namespace of a cluster (add), take it back (remove), or print the RBAC it needs",
		RunE:  helpOrUnknown,
	}
	cmd.AddCommand(targetAddCommand(), targetRemoveCommand(), targetRBACCommand())
	return cmd
}

// adminFlags are how `target add` and `remove` reach a cluster as its
// admin, resolved like kubectl: --kubeconfig, else $KUBECONFIG, else
// ~/.kube/config.
type adminFlags struct {
	kubeconfig, context, namespace string
	timeout                        time.Duration
}

func (f *adminFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.kubeconfig, "kubeconfig", "", "admin kubeconfig of the cluster (default: $KUBECONFIG, else ~/.kube/config)")
	cmd.Flags().StringVar(&f.context, "context", "", "context of the admin kubeconfig (default: its current context)")
	cmd.Flags().StringVar(&f.namespace, "namespace", "", "namespace the target runs steps in (required)")
	cmd.Flags().DurationVar(&f.timeout, "timeout", 2*time.Minute, "bound on the whole command")
}

// load resolves the admin credentials and the cluster they reach.
func (f *adminFlags) load() (*rest.Config, provision.Cluster, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = f.kubeconfig
	loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: f.context})
	admin, err := loader.ClientConfig()
	if err != nil {
		return nil, provision.Cluster{}, usageError{fmt.Errorf("admin kubeconfig: %w", err)}
	}
	admin.Timeout = 30 * time.Second
	raw, err := loader.RawConfig()
	if err != nil {
		return nil, provision.Cluster{}, usageError{fmt.Errorf("admin kubeconfig: %w", err)}
	}
	name := f.context
	if name == "" {
		name = raw.CurrentContext
	}
	var cluster *clientcmdapi.Cluster
	if c := raw.Contexts[name]; c != nil {
		cluster = raw.Clusters[c.Cluster]
	}
	c, err := provision.ClusterOf(admin, cluster)
	return admin, c, err
}

// outputFlags say where a target entry goes: a targets directory, or a
// Secret manifest on stdout.
type outputFlags struct {
	dir                         string
	secret                      bool
	secretName, secretNamespace string
}

func (f *outputFlags) register(cmd *cobra.Command, verb string) {
	cmd.Flags().StringVar(&f.dir, "out", "", "targets directory to "+verb+" the entry DIR/NAME/{kubeconfig,target.yaml} in")
	cmd.Flags().BoolVar(&f.secret, "secret", false, "print the targets Secret manifest, for: kubectl apply --server-side --field-manager jetway-target-NAME -f -")
	cmd.Flags().StringVar(&f.secretName, "secret-name", defaultTargetsSecret, "name of the targets Secret (the Helm chart's targets.secretName)")
	cmd.Flags().StringVar(&f.secretNamespace, "secret-namespace", defaultTargetsNamespace, "namespace jetway is installed in, where the targets Secret is")
}

// egressFlag is --egress-deny of `target add` and `target rbac`.
type egressFlag []string

func (f *egressFlag) register(cmd *cobra.Command) {
	var defaults []string
	for _, p := range provision.DefaultEgressDeny() {
		defaults = append(defaults, p.String())
	}
	cmd.Flags().StringArrayVar((*[]string)(f), "egress-deny", defaults,
		"`CIDR` or IP address the target's step pods may not reach (repeatable; the default: the cloud metadata addresses); "+
			"none: no egress rules. Needs a network plugin that enforces NetworkPolicies (docs/operations.md)")
}

func (f egressFlag) parse() ([]netip.Prefix, error) {
	deny, err := provision.ParseEgressDeny(f)
	if err != nil {
		return nil, usageError{err}
	}
	return deny, nil
}

func targetAddCommand() *cobra.Command {
	var (
		admin     adminFlags
		out       outputFlags
		egress    egressFlag
		meta      targets.Metadata
		opts      provision.AddOptions
		checkWait time.Duration
	)
	cmd := &cobra.Command{
		Use:   "add NAME",
		Short: "Create jetway's service account, Role, binding and token in a namespace, and write the target entry",
		Long: "add creates, with the admin credentials of --kubeconfig, a service account in --namespace, a Role holding\n" +
			"exactly what jetway needs (see `gateway target rbac`), its binding and a token, then writes the target\n" +
			"entry (a kubeconfig with the CA inline, and target.yaml) into --out DIR, or prints a Secret manifest with\n" +
			"--secret, and checks the target as `gateway check` does. Running it again brings the Role and the\n" +
			"NetworkPolicy up to date and issues a new token: that is how a token is rotated.\n\n" +
			"The NetworkPolicy lets into the target's step pods only their volume sidecars' port, from the target's\n" +
			"own step pods, and lets them reach anything but the --egress-deny addresses (and, always, DNS and the\n" +
			"target's own step pods' sidecars). Hermetic step pods (Concourse's `hermetic: true`) have a NetworkPolicy\n" +
			"of their own instead, letting them reach nothing but those sidecars. Both are enforced only by a network\n" +
			"plugin that enforces policies.",
		Args: exactlyOneName("add"),
	}
	admin.register(cmd)
	out.register(cmd, "write")
	egress.register(cmd)
	cmd.Flags().StringVar(&meta.Team, "team", "", "Concourse team the target belongs to (default: every team's)")
	cmd.Flags().StringArrayVar(&meta.Tags, "tag", nil, "`TAG`: a tag of the target, for steps' tags: (repeatable)")
	cmd.Flags().BoolVar(&opts.CreateNamespace, "create-namespace", false, "create the namespace if it does not exist (remove deletes it again)")
	cmd.Flags().DurationVar(&opts.TokenDuration, "token-duration", provision.DefaultTokenDuration,
		"lifetime of the token (TokenRequest; the API server may cap it); run add again to rotate it")
	cmd.Flags().BoolVar(&opts.LongLivedToken, "long-lived-token", false, "use a service-account-token Secret that never expires instead")
	cmd.Flags().DurationVar(&checkWait, "check-timeout", 30*time.Second, "how long the final check may wait for the new permissions to take effect")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		a := provision.Access{Target: args[0], Namespace: admin.namespace}
		if err := checkTargetFlags(a, out, true); err != nil {
			return err
		}
		if opts.LongLivedToken && cmd.Flags().Changed("token-duration") {
			return usageError{errors.New("--token-duration and --long-lived-token exclude each other: a long-lived token has no duration")}
		}
		deny, err := egress.parse()
		if err != nil {
			return err
		}
		opts.EgressDeny = deny
		meta.Namespace = a.Namespace
		if err := validEntry(a, meta); err != nil {
			return usageError{err}
		}
		cfg, cluster, err := admin.load()
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), admin.timeout)
		defer cancel()
		progress := cmd.ErrOrStderr()
		opts.Progress = func(line string) { fmt.Fprintln(progress, line) }
		creds, err := provision.Add(ctx, cfg, a, opts)
		if err != nil {
			return err
		}
		if out.secret {
			return addSecret(ctx, cmd.OutOrStdout(), progress, a, meta, cluster, creds, out, checkWait)
		}
		return addToDir(ctx, cmd.OutOrStdout(), progress, a, meta, cluster, creds, out.dir, checkWait)
	}
	return cmd
}

// exactlyOneName wants the target's name and nothing else.
func exactlyOneName(verb string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != 1 {
			return usageError{fmt.Errorf("target %s takes exactly one argument, the target's name", verb)}
		}
		return nil
	}
}

func checkTargetFlags(a provision.Access, out outputFlags, needOutput bool) error {
	if a.Namespace == "" {
		return usageError{errors.New("--namespace is required")}
	}
	if err := a.Validate(); err != nil {
		return usageError{err}
	}
	if out.dir != "" && out.secret {
		return usageError{errors.New("--out and --secret exclude each other: the entry goes to one place")}
	}
	if needOutput && out.dir == "" && !out.secret {
		return usageError{errors.New("say where the target entry goes: --out DIR or --secret")}
	}
	return nil
}

// validEntry reads a's entry as `gateway run` would, with a placeholder
// token, so that bad metadata is refused before the cluster is touched.
func validEntry(a provision.Access, meta targets.Metadata) error {
	kubeconfig, err := provision.Kubeconfig(provision.Cluster{Server: "https://127.0.0.1"}, a, "placeholder", &meta)
	if err != nil {
		return err
	}
	_, err = targets.ParseKubeconfig(a.Target, kubeconfig, targets.Policy{})
	return err
}

// readTarget reads name from a targets directory.
func readTarget(dir, name string) (targets.Result, error) {
	results, _, err := targets.NewSource(targets.SourceOptions{Dir: dir}, nil).Read()
	if err != nil {
		return targets.Result{}, err
	}
	res, ok := results[name]
	switch {
	case !ok:
		return res, fmt.Errorf("target %s is not in %s", name, dir)
	case res.Err != nil:
		return res, res.Err
	}
	return res, nil
}

func addToDir(ctx context.Context, stdout, progress io.Writer, a provision.Access, meta targets.Metadata,
	cluster provision.Cluster, creds provision.Credentials, dir string, checkWait time.Duration) error {
	kubeconfig, err := provision.Kubeconfig(cluster, a, creds.Token, nil)
	if err != nil {
		return err
	}
	if err := writeEntry(dir, a.Target, kubeconfig, meta); err != nil {
		return err
	}
	fmt.Fprintf(progress, "wrote %s\n", filepath.Join(dir, a.Target))
	res, err := readTarget(dir, a.Target)
	if err != nil {
		return err
	}
	return checkNew(ctx, stdout, a.Target, res, checkWait)
}

func addSecret(ctx context.Context, stdout, progress io.Writer, a provision.Access, meta targets.Metadata,
	cluster provision.Cluster, creds provision.Credentials, out outputFlags, checkWait time.Duration) error {
	kubeconfig, err := provision.Kubeconfig(cluster, a, creds.Token, &meta)
	if err != nil {
		return err
	}
	cfg, err := targets.ParseKubeconfig(a.Target, kubeconfig, targets.Policy{})
	if err != nil {
		return err
	}
	if err := checkNew(ctx, progress, a.Target, targets.Result{Config: cfg}, checkWait); err != nil {
		return err
	}
	return writeSecret(stdout, a.Target, out, kubeconfig)
}

// checkNew checks a new target as `gateway check` does, again while the
// new Role and binding may not have reached the API server's authorizer
// yet, and prints the row.
func checkNew(ctx context.Context, w io.Writer, name string, res targets.Result, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	var rows []checkRow
	for {
		rows = checkAll(ctx, map[string]targets.Result{name: res}, 10*time.Second, "")
		if rows[0].problem == "" || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	if printChecks(w, rows) > 0 {
		return fmt.Errorf("target %s is not usable yet: %s", name, rows[0].problem)
	}
	return nil
}

// writeEntry writes dir/name/kubeconfig and target.yaml, each replaced
// whole (a rename), so that a watching gateway never reads half a file.
func writeEntry(dir, name string, kubeconfig []byte, meta targets.Metadata) error {
	if _, err := os.Stat(filepath.Join(dir, name+".kubeconfig")); err == nil {
		return fmt.Errorf("%s already defines target %s; remove it first", filepath.Join(dir, name+".kubeconfig"), name)
	}
	folder := filepath.Join(dir, name)
	if err := os.MkdirAll(folder, 0o700); err != nil {
		return err
	}
	meta.Namespace = "" // the kubeconfig's context says it
	y, err := yaml.Marshal(meta)
	if err != nil {
		return err
	}
	for file, data := range map[string][]byte{"kubeconfig": kubeconfig, "target.yaml": y} {
		if err := atomicfile.Write(filepath.Join(folder, file), data, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// writeSecret prints the targets Secret with name's key, or with no key
// when kubeconfig is nil: applied server-side by the field manager
// jetway-target-NAME, the key is added, or removed, leaving the other
// targets' keys as they are.
func writeSecret(w io.Writer, name string, out outputFlags, kubeconfig []byte) error {
	s := corev1.Secret{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Name: out.secretName, Namespace: out.secretNamespace},
		Type:       corev1.SecretTypeOpaque,
	}
	if kubeconfig != nil {
		s.Data = map[string][]byte{name + ".kubeconfig": kubeconfig}
	}
	y, err := yaml.Marshal(s)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "# target %s; apply with:\n#   kubectl apply --server-side --field-manager %s -f -\n%s",
		name, fieldManager(name), removeCreationTimestamp(y))
	return err
}

// fieldManager is the server-side apply field manager of one target's key
// in the targets Secret.
func fieldManager(name string) string { return "jetway-target-" + name }

// removeCreationTimestamp drops the null creationTimestamp that metav1
// objects marshal, which kubectl would otherwise apply.
func removeCreationTimestamp(y []byte) string {
	return strings.Replace(string(y), "  creationTimestamp: null\n", "", 1)
}

func targetRemoveCommand() *cobra.Command {
	var (
		admin adminFlags
		out   outputFlags
	)
	cmd := &cobra.Command{
		Use:   "remove NAME",
		Short: "Delete what `target add NAME` created, and nothing else",
		Long: "remove deletes the token Secret, role binding, Role and service account `target add NAME` created in\n" +
			"--namespace, and the namespace when add created it (--create-namespace). Objects of those names that\n" +
			"add did not make are left alone and named. With --out DIR it deletes the entry DIR/NAME; with --secret\n" +
			"it prints the manifest that takes NAME's key out of the targets Secret.",
		Args: exactlyOneName("remove"),
	}
	admin.register(cmd)
	out.register(cmd, "delete")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		a := provision.Access{Target: args[0], Namespace: admin.namespace}
		if err := checkTargetFlags(a, out, false); err != nil {
			return err
		}
		cfg, _, err := admin.load()
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), admin.timeout)
		defer cancel()
		removed, err := provision.Remove(ctx, cfg, a)
		progress := cmd.ErrOrStderr()
		for _, what := range removed.Deleted {
			fmt.Fprintln(progress, "deleted "+what)
		}
		for _, what := range removed.Kept {
			fmt.Fprintln(progress, "left alone "+what+": `target add` did not make it")
		}
		if err != nil {
			return err
		}
		switch {
		case out.dir != "":
			return removeEntry(progress, out.dir, a.Target)
		case out.secret:
			return writeSecret(cmd.OutOrStdout(), a.Target, out, nil)
		}
		return nil
	}
	return cmd
}

// removeEntry deletes the files writeEntry wrote, and the folder once empty.
func removeEntry(progress io.Writer, dir, name string) error {
	folder := filepath.Join(dir, name)
	for _, file := range []string{"kubeconfig", "target.yaml"} {
		if err := os.Remove(filepath.Join(folder, file)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if err := os.Remove(folder); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%s holds files `target add` did not write; left alone: %w", folder, err)
	}
	fmt.Fprintf(progress, "deleted %s\n", folder)
	return nil
}

func targetRBACCommand() *cobra.Command {
	var (
		a      provision.Access
		egress egressFlag
	)
	cmd := &cobra.Command{
		Use:   "rbac",
		Short: "Print the service account, Role, RoleBinding and NetworkPolicies jetway needs in a namespace (for GitOps)",
		Long: "rbac prints what `target add` creates, as YAML to apply through your own tooling: a service account,\n" +
			"a Role holding exactly the permissions jetway checks (the one list `gateway check` reviews), its binding,\n" +
			"and a NetworkPolicy admitting to the target's step pods only their volume sidecars' port, from the\n" +
			"target's own step pods, and letting them reach anything but the --egress-deny addresses (and, always,\n" +
			"DNS and the target's own step pods' sidecars), and one letting hermetic step pods (Concourse's\n" +
			"`hermetic: true`) reach nothing but those sidecars; enforced only by a network plugin that enforces\n" +
			"policies (docs/operations.md).",
		Args: noArgs,
	}
	cmd.Flags().StringVar(&a.Namespace, "namespace", "", "namespace the target runs steps in (required)")
	cmd.Flags().StringVar(&a.Target, "name", "", "target `NAME`, as target add NAME names the objects: jetway-NAME (default: jetway)")
	egress.register(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := checkTargetFlags(a, outputFlags{}, false); err != nil {
			return err
		}
		deny, err := egress.parse()
		if err != nil {
			return err
		}
		sa, role, binding := a.Objects()
		objs := []any{sa, role, binding}
		for _, p := range a.NetworkPolicies(deny) {
			objs = append(objs, p)
		}
		for i, obj := range objs {
			y, err := yaml.Marshal(obj)
			if err != nil {
				return err
			}
			if i > 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "---")
			}
			fmt.Fprint(cmd.OutOrStdout(), removeCreationTimestamp(y))
		}
		return nil
	}
	return cmd
}
