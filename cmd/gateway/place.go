package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/jetway-ci/jetway/api"
)

// placeCommand is `gateway place`: where would a step run now, and why
// not on every other target the token may see.
func placeCommand() *cobra.Command {
	var (
		flags  apiFlags
		req    api.PlacementRequest
		inputs []string
	)
	cmd := &cobra.Command{
		Use:   "place",
		Short: "Show where a step would run now and why every other target refuses it (creates nothing)",
		Args:  noArgs,
	}
	flags.register(cmd)
	f := cmd.Flags()
	f.StringVar(&req.Type, "type", "task", "step type: task, get, put or check (picks the configured strategy chain)")
	f.StringVar(&req.Team, "team", "", "the step's team (empty: global targets only; a team token must give its own)")
	f.StringArrayVar(&req.Tags, "tag", nil, "a tag the step needs (repeat for more)")
	f.StringVar(&req.Platform, "platform", "", "the step's platform (empty: any)")
	f.StringArrayVar(&inputs, "input-on", nil, "a target holding one of the step's inputs (repeat per input)")
	f.BoolVar(&req.Nested, "nested", false, "a check run inside a build (placed with no-input-placement-strategy)")
	f.StringVar(&req.Strategy, "strategy", "", "strategy chain overriding the configured one, e.g. fewest-build-containers,limit-active-tasks")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		for _, t := range inputs {
			req.Inputs = append(req.Inputs, api.PlacementInput{Target: t})
		}
		return place(cmd.Context(), cmd.OutOrStdout(), &flags, req)
	}
	return cmd
}

// place asks for a placement, then for the targets to describe in the
// table (the two answers may differ by a target landed in between).
func place(ctx context.Context, out io.Writer, flags *apiFlags, req api.PlacementRequest) error {
	const path = "/api/v1/placements"
	status, _, body, err := flags.send(ctx, http.MethodPost, path, req)
	if err != nil {
		return err
	}
	var answer api.Placement
	switch status {
	case http.StatusOK, http.StatusUnprocessableEntity, http.StatusServiceUnavailable:
		if err := json.Unmarshal(body, &answer); err != nil {
			return fmt.Errorf("POST %s: %d answer: %w", path, status, err)
		}
	default:
		return fmt.Errorf("POST %s: %d %s: %s", path, status, http.StatusText(status), apiMessage(body))
	}
	var ts []api.Target
	if err := flags.get(ctx, "/api/v1/targets", &ts); err != nil {
		return err
	}
	if answer.Target != "" {
		fmt.Fprintf(out, "target: %s\n\n", answer.Target)
	}
	printPlacement(out, answer, ts)
	if answer.Target == "" {
		return fmt.Errorf("no placement (%d %s): %s", status, http.StatusText(status), answer.Error)
	}
	return nil
}

// apiMessage is the "error" of a JSON error body, or the body itself.
func apiMessage(body []byte) string {
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		return e.Error
	}
	return strings.TrimSpace(string(body))
}

// printPlacement prints one row per target: the chosen one, the rest of
// the order, then the rejected ones by name, each with its verdict.
// Targets the decision did not see (new since) say so.
func printPlacement(out io.Writer, p api.Placement, ts []api.Target) {
	verdicts := map[string]string{}
	var names []string
	for i, name := range p.Order {
		verdicts[name] = "#" + strconv.Itoa(i+1)
		names = append(names, name)
	}
	if len(p.Order) > 0 {
		verdicts[p.Order[0]] = "chosen"
	}
	rejected := make([]string, 0, len(p.Rejected))
	for name, reason := range p.Rejected {
		verdicts[name] = reason
		rejected = append(rejected, name)
	}
	slices.Sort(rejected)
	names = append(names, rejected...)
	byName := map[string]api.Target{}
	for _, t := range ts {
		byName[t.Name] = t
		if _, ok := verdicts[t.Name]; !ok {
			verdicts[t.Name] = "not in the decision (new target?)"
			names = append(names, t.Name)
		}
	}

	if len(names) == 0 {
		fmt.Fprintln(out, "no targets visible to this token")
		return
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "name\tteam\ttags\tplatform\ttasks\tcontainers\tverdict")
	for _, name := range names {
		t, ok := byName[name]
		if !ok { // gone since the decision
			fmt.Fprintf(w, "%s\t?\t?\t?\t?\t?\t%s\n", name, verdicts[name])
			continue
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d\t%s\n", name, none(t.Team), none(strings.Join(t.Tags, ", ")),
			none(t.Platform), t.ActiveTasks, t.ActiveContainers, verdicts[name])
	}
	w.Flush()
}
