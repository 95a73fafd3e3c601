// Package oidctest starts a real OpenID Provider for tests: zitadel/oidc's example OP
// (github.com/zitadel/oidc/v3/example/server: its exampleop router with the login form, its
// in-memory storage, its op.Provider signing real RS256 ID tokens), on a loopback listener of
// the test process. What this package adds is configuration the example leaves to its users:
// the clients (kloud's redirect URI), the users, and a "groups" claim for each user, which the
// example's storage has no field for (groupsStorage adds it to the ID token and the userinfo
// answer; the OP signs it like every other claim). Nothing here mints or checks a token.
package oidctest

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/zitadel/oidc/v3/example/server/exampleop"
	"github.com/zitadel/oidc/v3/example/server/storage"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
	"golang.org/x/text/language"
)

// User is a user of the provider.
type User struct {
	ID       string // the subject (sub claim)
	Username string // what the login form takes; the preferred_username claim
	Password string
	Email    string
	Groups   []string // the groups claim
}

// Client is an OAuth client registered at the provider (a confidential web client: client
// secret by HTTP basic auth, authorization code flow, PKCE when the client sends a challenge).
type Client struct {
	ID, Secret   string
	RedirectURIs []string
}

// Options configure Start.
type Options struct {
	Clients []Client
	Users   []User
	// Addr to listen on (default 127.0.0.1:0).
	Addr string
}

// Provider is an OP on a loopback listener.
type Provider struct {
	// Issuer is the provider's issuer URL, http://127.0.0.1:PORT/ (discovery at
	// Issuer + ".well-known/openid-configuration").
	Issuer string
	t      testing.TB
	ln     net.Listener
	users  *userStore
}

// SetGroups changes the groups claim of the user with this subject for later logins.
func (p *Provider) SetGroups(subject string, groups []string) {
	p.users.mu.Lock()
	defer p.users.mu.Unlock()
	p.users.groups[subject] = groups
}

// Start starts the OP and stops it when the test ends.
func Start(t testing.TB, o Options) *Provider {
	t.Helper()
	p := Listen(t, o.Addr)
	p.Serve(o)
	return p
}

// Listen binds the OP's address (default 127.0.0.1:0), so its Issuer is known before the
// clients are (kloud's redirect URI names kloud's port); Serve starts it.
func Listen(t testing.TB, addr string) *Provider {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	p := &Provider{Issuer: "http://" + ln.Addr().String() + "/", t: t, ln: ln,
		users: &userStore{users: map[string]*storage.User{}, groups: map[string][]string{}}}
	t.Cleanup(func() { ln.Close() })
	return p
}

// Close closes the listener of a provider that was never served (a provider that is down).
func (p *Provider) Close() { p.ln.Close() }

// Serve starts serving with o's clients and users (o.Addr is ignored) until the test ends.
func (p *Provider) Serve(o Options) {
	us := p.users
	for _, u := range o.Users {
		us.add(u)
	}
	clients := map[string]*storage.Client{}
	for _, c := range o.Clients {
		// WebClient is the example's confidential client; it allows http redirect URIs (dev
		// mode), which a loopback test needs.
		clients[c.ID] = storage.WebClient(c.ID, c.Secret, c.RedirectURIs...)
	}
	st := &groupsStorage{Storage: storage.NewStorageWithClients(us, clients), users: us}
	// A nil logger: SetupServer would otherwise replace the process's default slog logger.
	router := exampleop.SetupServer(p.Issuer, st, nil, false)
	srv := &http.Server{Handler: router, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(p.ln)
	}()
	p.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
			srv.Close()
		}
		<-done
	})
}

// userStore implements the example storage's UserStore with the test's users.
type userStore struct {
	users  map[string]*storage.User // by ID; written before Serve only
	mu     sync.Mutex
	groups map[string][]string // by ID
}

func (s *userStore) add(u User) {
	s.users[u.ID] = &storage.User{ID: u.ID, Username: u.Username, Password: u.Password, FirstName: u.Username,
		LastName: "Test", Email: u.Email, EmailVerified: u.Email != "", PreferredLanguage: language.English}
	s.groups[u.ID] = u.Groups
}

func (s *userStore) GetUserByID(id string) *storage.User { return s.users[id] }

func (s *userStore) GetUserByUsername(name string) *storage.User {
	for _, u := range s.users {
		if u.Username == name {
			return u
		}
	}
	return nil
}

// ExampleClientID names the example's JWT-profile service user (unused here).
func (s *userStore) ExampleClientID() string { return storage.ServiceUserID }

// groupsStorage is the example's storage with a groups claim: in the ID token (made with
// SetUserinfoFromRequest) and in the userinfo answer (SetUserinfoFromToken).
type groupsStorage struct {
	*storage.Storage
	users *userStore
}

func (s *groupsStorage) addGroups(ui *oidc.UserInfo, subject string) {
	s.users.mu.Lock()
	g := s.users.groups[subject]
	s.users.mu.Unlock()
	if g != nil {
		ui.AppendClaims("groups", g)
	}
}

// SetUserinfoFromRequest implements op.CanSetUserinfoFromRequest (the ID token's claims).
func (s *groupsStorage) SetUserinfoFromRequest(ctx context.Context, ui *oidc.UserInfo, token op.IDTokenRequest, scopes []string) error {
	if err := s.Storage.SetUserinfoFromRequest(ctx, ui, token, scopes); err != nil {
		return err
	}
	s.addGroups(ui, token.GetSubject())
	return nil
}

// SetUserinfoFromToken implements op.Storage (the userinfo endpoint).
func (s *groupsStorage) SetUserinfoFromToken(ctx context.Context, ui *oidc.UserInfo, tokenID, subject, origin string) error {
	if err := s.Storage.SetUserinfoFromToken(ctx, ui, tokenID, subject, origin); err != nil {
		return err
	}
	s.addGroups(ui, ui.Subject)
	return nil
}
