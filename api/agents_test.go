package api

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/mesh"
	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// Agents a knows besides gateway b: mac (team main), mac-global (no
// team), and c, a member a has lost.
var meshAgents = append(append(announcedBy("mac", true, targets.Status{Name: "mac", Meta: targets.Metadata{Team: "main"}}),
	announcedBy("mac-global", true, targets.Status{Name: "mac-global"})...),
	announcedBy("c", false, targets.Status{Name: "c-main", Meta: targets.Metadata{Team: "main"}})...)

const (
	mainCaller  = `{"name":"main-ci","team":"main"}`
	otherCaller = `{"name":"other-ci","team":"other"}`
	adminCaller = `{"name":"ops","admin":true}`
)

// fromAgent sends h a request agent made over the mesh for caller.
func fromAgent(h http.Handler, agent, method, path, caller, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if caller != "" {
		req.Header.Set(CallerHeader, caller)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req.WithContext(mesh.WithPeerKind(req.Context(), agent, mesh.KindAgent)))
	return rec
}

// streamOutOf is the body of a stream-out of target's pod a.
func streamOutOf(target string) string {
	return `{"from": {"target": "` + target + `", "pod": "a", "handle": "h"}, "encoding": "raw"}`
}

func TestAgentsMayOnlyAskForVolumes(t *testing.T) {
	a, sa, _ := meshStreams(t, meshAgents...)
	for _, call := range [][2]string{
		{http.MethodGet, "/api/v1/workers"},
		{http.MethodGet, "/api/v1/targets/global"},
		{http.MethodPut, "/api/v1/workers/global/land"},
		{http.MethodPost, "/api/v1/streams"},
		{http.MethodPost, "/api/v1/steps"},
		{http.MethodGet, "/metrics"},
		{http.MethodGet, meshStreamOutPath},
	} {
		rec := fromAgent(a, "mac", call[0], call[1], mainCaller, streamOutOf("global"))
		assert.Equal(t, http.StatusForbidden, rec.Code, "%s %s", call[0], call[1])
		assert.JSONEq(t, `{"error": "agents may only ask for volumes (PUT /api/v1/mesh/stream-out)"}`, rec.Body.String())
	}
	assert.Empty(t, sa.sent)

	rec := fromAgent(a, "mac", http.MethodPut, meshStreamOutPath, mainCaller, streamOutOf("global"))
	assert.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	assert.Equal(t, []streams.Caller{{Team: "main"}}, sa.sent, "a sends its own source as the caller")
}

func TestTheCallerAnAgentNamesIsCheckedAgainstItsTeam(t *testing.T) {
	for name, tt := range map[string]struct {
		agent, caller string
		code          int
		err           string
	}{
		"its team's caller":            {agent: "mac", caller: mainCaller, code: http.StatusOK},
		"another team's caller":        {agent: "mac", caller: otherCaller, code: http.StatusForbidden, err: "agent mac acts only for callers of its own team"},
		"an admin":                     {agent: "mac", caller: adminCaller, code: http.StatusForbidden, err: "agent mac named an admin as its caller"},
		"an admin, for a global agent": {agent: "mac-global", caller: adminCaller, code: http.StatusForbidden, err: "agent mac-global named an admin as its caller"},
		"any team, for a global agent": {agent: "mac-global", caller: otherCaller, code: http.StatusOK},
		"an agent that announced none": {agent: "mac-new", caller: mainCaller, code: http.StatusForbidden, err: "agent mac-new announced no target of its own here yet"},
		"no caller":                    {agent: "mac", code: http.StatusUnauthorized, err: "not authorized"},
	} {
		t.Run(name, func(t *testing.T) {
			a, sa, _ := meshStreams(t, meshAgents...)
			rec := fromAgent(a, tt.agent, http.MethodPut, meshStreamOutPath, tt.caller, streamOutOf("global"))
			assert.Equal(t, tt.code, rec.Code, rec.Body.String())
			if tt.err != "" {
				assert.Contains(t, rec.Body.String(), tt.err)
				assert.NotContains(t, rec.Body.String(), "other", "nothing about other teams")
				assert.Empty(t, sa.sent)
			}
		})
	}
}

// An agent joined to a gets a source b owns: a asks b for it as the
// caller and copies it on, with the same trailers.
func TestAnAgentGetsAVolumeAnotherMemberOwns(t *testing.T) {
	a, sa, sb := meshStreams(t, meshAgents...)
	rec := fromAgent(a, "mac", http.MethodPut, meshStreamOutPath, mainCaller, streamOutOf("b-main"))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	assert.Equal(t, "the volume", rec.Body.String())
	assert.Equal(t, "10", rec.Result().Trailer.Get(trailerSent))
	assert.Equal(t, []streams.Caller{{Team: "main"}}, sb.sent, "b checks the caller's team")
	assert.Empty(t, sa.sent)

	t.Run("a failure at the owner is the trailer's", func(t *testing.T) {
		sb.sendErr = &streams.Error{Side: streams.SideSource, Err: assert.AnError}
		defer func() { sb.sendErr = nil }()
		rec := fromAgent(a, "mac", http.MethodPut, meshStreamOutPath, mainCaller, streamOutOf("b-main"))
		assert.Equal(t, http.StatusOK, rec.Code)
		assert.Equal(t, assert.AnError.Error(), rec.Result().Trailer.Get(trailerError))
		assert.Empty(t, rec.Result().Trailer.Get(trailerSent))
	})
	t.Run("a pod the owner does not find", func(t *testing.T) {
		body := strings.Replace(streamOutOf("b-main"), `"pod": "a"`, `"pod": "missing"`, 1)
		rec := fromAgent(a, "mac", http.MethodPut, meshStreamOutPath, mainCaller, body)
		assert.Equal(t, http.StatusNotFound, rec.Code, rec.Body.String())
		assert.Contains(t, rec.Body.String(), `pod \"missing\" not found on target \"b-main\"`)
	})
	for name, target := range map[string]string{
		"a source nobody owns":           "nowhere",
		"another team's source, unasked": "b-other",
	} {
		t.Run(name, func(t *testing.T) {
			sent := len(sb.sent)
			rec := fromAgent(a, "mac", http.MethodPut, meshStreamOutPath, mainCaller, streamOutOf(target))
			assert.Equal(t, http.StatusNotFound, rec.Code)
			assert.JSONEq(t, `{"error": "no such target: `+target+`"}`, rec.Body.String())
			assert.Len(t, sb.sent, sent)
		})
	}
	t.Run("an owner a cannot reach", func(t *testing.T) {
		rec := fromAgent(a, "mac", http.MethodPut, meshStreamOutPath, mainCaller, streamOutOf("c-main"))
		assert.Equal(t, http.StatusBadGateway, rec.Code)
		assert.Contains(t, rec.Body.String(), "worker c-main is owned by gateway c, which this gateway cannot reach")
	})
}

// An agent, which learns no routes, asks its gateway for its inputs'
// bytes, wherever they are; the gateway checks the caller.
func TestAnAgentAsksItsGatewayForItsInputs(t *testing.T) {
	a, _, sb := meshStreams(t, meshAgents...)
	mac := &fakeMesh{name: "mac", kind: mesh.KindAgent, members: map[string]http.Handler{"a": a}}
	open := MeshVolumes(mac, func() []string { return []string{"a"} })
	asMain := streams.Caller{Team: "main"}
	src, err := open(t.Context(), asMain, wire.Endpoint{Target: "b-main", Pod: "a", Handle: "h"}, "raw")
	require.NoError(t, err)
	body, err := io.ReadAll(src)
	src.Close()
	require.NoError(t, err)
	assert.Equal(t, "the volume", string(body))
	assert.Equal(t, []streams.Caller{{Team: "main"}}, sb.sent, "b checks the caller's team")

	_, err = open(t.Context(), asMain, wire.Endpoint{Target: "b-other", Pod: "a", Handle: "h"}, "raw")
	assert.ErrorIs(t, err, streams.ErrNotFound, "another team's volume is unknown")
	_, err = MeshVolumes(mac, func() []string { return nil })(t.Context(), asMain, wire.Endpoint{Target: "b-main"}, "raw")
	assert.ErrorContains(t, err, "no gateway to ask for target b-main's volume")
}

// A gateway's stream-out is for the sources the asked gateway owns: one
// it does not is never asked of another member.
func TestAGatewaysStreamOutIsNotCarriedOn(t *testing.T) {
	a, sa, sb := meshStreams(t, meshAgents...)
	req := httptest.NewRequest(http.MethodPut, meshStreamOutPath, strings.NewReader(streamOutOf("b-main")))
	req.Header.Set(CallerHeader, mainCaller)
	rec := httptest.NewRecorder()
	a.ServeHTTP(rec, req.WithContext(mesh.WithPeer(req.Context(), "b")))
	assert.Equal(t, []streams.Caller{{Team: "main"}}, sa.sent, "a's streamer answers, as before agents")
	assert.Empty(t, sb.sent)
}
