package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/jetway-ci/jetway/mesh"
)

// Token is one bearer token the API accepts. An admin sees and acts on
// every target; a team token sees global targets and its team's, and acts
// only on its team's.
type Token struct {
	Name  string `json:"name"`
	Token string `json:"token"`
	Admin bool   `json:"admin,omitempty"`
	Team  string `json:"team,omitempty"`
}

// identity is who a request is from; its token value is not kept.
type identity struct {
	name  string
	admin bool
	team  string
}

// sees reports whether the identity may see a target of team (""=global).
func (id identity) sees(team string) bool { return id.admin || team == "" || team == id.team }

// owns reports whether the identity may act on a target of team.
func (id identity) owns(team string) bool { return id.admin || (team != "" && team == id.team) }

// parseTokens validates b, the content of the tokens file path:
//
//	tokens:
//	- {name: ops, token: ..., admin: true}
//	- {name: main-ci, token: ..., team: main}
//
// Errors name the entry, never the token value.
func parseTokens(path string, b []byte) ([]Token, error) {
	var file struct {
		Tokens []Token `json:"tokens"`
	}
	if err := yaml.UnmarshalStrict(b, &file); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(file.Tokens) == 0 {
		return nil, fmt.Errorf("%s: no tokens", path)
	}
	var errs []error
	names, values := map[string]bool{}, map[string]bool{}
	for i, t := range file.Tokens {
		where := fmt.Sprintf("tokens[%d] (%q)", i, t.Name)
		switch {
		case t.Name == "":
			errs = append(errs, fmt.Errorf("tokens[%d]: name is required", i))
		case names[t.Name]:
			errs = append(errs, fmt.Errorf("%s: name is repeated", where))
		}
		switch {
		case len(t.Token) < 16:
			errs = append(errs, fmt.Errorf("%s: token must have at least 16 characters", where))
		case values[t.Token]:
			errs = append(errs, fmt.Errorf("%s: token is the same as another entry's", where))
		}
		if t.Admin == (t.Team != "") {
			errs = append(errs, fmt.Errorf("%s: give exactly one of admin: true or team", where))
		}
		names[t.Name], values[t.Token] = true, true
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return file.Tokens, nil
}

type identityKey struct{}

// authenticate resolves the bearer token to an identity, or answers 401.
// With no tokens configured (--no-auth) every request is an admin.
func (s *Server) authenticate(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, ok := s.identify(r)
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="jetway"`)
			writeJSON(w, http.StatusUnauthorized, errorBody{Error: "not authorized: give a valid bearer token"})
			return
		}
		next(w, r.WithContext(context.WithValue(r.Context(), identityKey{}, id)))
	}
}

func (s *Server) identify(r *http.Request) (identity, bool) {
	if _, fromPeer := mesh.Peer(r.Context()); fromPeer {
		return meshIdentity(r)
	}
	if s.opts.NoAuth {
		return identity{name: "anonymous", admin: true}, true
	}
	given, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || given == "" {
		return identity{}, false
	}
	// Compare fixed-size digests with every token, so timing tells neither
	// which token matched nor how long any token is.
	digest := sha256.Sum256([]byte(given))
	var found *Token
	set := s.tokens.Load()
	for i := range set.tokens {
		if constantTimeCompare(digest[:], set.digests[i][:]) == 1 {
			found = &set.tokens[i]
		}
	}
	if found == nil {
		return identity{}, false
	}
	return identity{name: found.Name, admin: found.Admin, team: found.Team}, true
}

// tokenDigests hashes the configured tokens once, for identify.
// tokenSet is the tokens the API accepts and their digests, in order.
type tokenSet struct {
	tokens  []Token
	digests [][sha256.Size]byte
}

// SetTokens replaces the tokens the API accepts (the tokens file
// changed): a request authenticated after it returns is judged by them.
func (s *Server) SetTokens(tokens []Token) {
	set := &tokenSet{tokens: slices.Clone(tokens), digests: make([][sha256.Size]byte, len(tokens))}
	for i, t := range tokens {
		set.digests[i] = sha256.Sum256([]byte(t.Token))
	}
	s.tokens.Store(set)
}

// constantTimeCompare is subtle's, a variable so a test can see what is
// compared.
var constantTimeCompare = subtle.ConstantTimeCompare

func requestIdentity(r *http.Request) identity {
	id, _ := r.Context().Value(identityKey{}).(identity)
	return id
}

type errorBody struct {
	Error string `json:"error"`
}
