package kite

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// HandshakeParams are the params of kite.handshake.
type HandshakeParams struct {
	Kite Identity `json:"kite"`
	Auth Auth     `json:"auth"`
}

// HandshakeResult is the result of kite.handshake.
type HandshakeResult struct {
	Kite     Identity `json:"kite"`
	Username string   `json:"username"`
}

// SystemInfo is the result of kite.systemInfo.
type SystemInfo struct {
	Hostname    string    `json:"hostname"`
	OS          string    `json:"os"`
	Arch        string    `json:"arch"`
	Uname       string    `json:"uname"`
	NumCPU      int       `json:"numCPU"`
	MemoryTotal uint64    `json:"memoryTotal"`
	MemoryUsage uint64    `json:"memoryUsage"`
	DiskTotal   uint64    `json:"diskTotal"`
	DiskUsage   uint64    `json:"diskUsage"`
	HomeDir     string    `json:"homeDir"`
	Uptime      int64     `json:"uptime"` // seconds since boot
	Load        []float64 `json:"load"`   // 1, 5, 15 minute averages
	Time        time.Time `json:"time"`
}

func (k *Kite) builtins() {
	k.HandleFunc("kite.ping", func(context.Context, *Request) (any, error) { return "pong", nil }, Public())
	k.Handle("kite.handshake", HandlerFunc(k.handshake), Public())
	gate := k.opts.GateBuiltins
	if gate == nil {
		gate = func(h Handler) Handler { return h }
	}
	k.Handle("kite.systemInfo", gate(HandlerFunc(func(context.Context, *Request) (any, error) { return ReadSystemInfo(), nil })))
	k.Handle("kite.methods", gate(HandlerFunc(func(context.Context, *Request) (any, error) { return k.Methods(), nil })))
}

func (k *Kite) handshake(ctx context.Context, r *Request) (any, error) {
	res, reason, err := k.handshakeOnce(ctx, r)
	if err != nil && k.opts.Observer != nil {
		k.opts.Observer.HandshakeRejected(reason)
	}
	return res, err
}

// handshakeOnce runs kite.handshake; a rejection comes with its reason (Reject*).
func (k *Kite) handshakeOnce(ctx context.Context, r *Request) (any, string, error) {
	c := r.Conn
	if c.dialed {
		return nil, RejectRepeated, fmt.Errorf("kite.handshake is sent by the dialing side: %w", ErrState)
	}
	if c.ready.Load() {
		return nil, RejectRepeated, fmt.Errorf("handshake already done: %w", ErrState)
	}
	var p HandshakeParams
	if err := r.Bind(&p); err != nil {
		return nil, RejectInvalid, err
	}
	if p.Auth.Type == "" || p.Auth.Key == "" {
		return nil, RejectInvalid, fmt.Errorf("kite.handshake: auth.type and auth.key are required: %w", ErrAuth)
	}
	if err := p.Kite.Validate(false); err != nil {
		return nil, RejectInvalid, fmt.Errorf("kite.handshake: %s: %w", err.Error(), ErrInvalidParams)
	}
	if k.opts.Authenticator == nil {
		return nil, RejectCredential, fmt.Errorf("this kite accepts no credentials: %w", ErrAuth)
	}
	pr, err := k.opts.Authenticator.Authenticate(ctx, k.opts.Identity, p.Auth)
	if err != nil {
		return nil, RejectCredential, err
	}
	peer := p.Kite
	peer.Username = pr.Username // the key proves the username; the claim is ignored
	if pr.KiteID != "" {
		peer.ID = pr.KiteID
	}
	c.mu.Lock()
	c.peer, c.principal = peer, pr
	c.mu.Unlock()
	if k.opts.OnHandshake != nil {
		if err := k.opts.OnHandshake(ctx, c); err != nil {
			c.mu.Lock()
			c.peer, c.principal = Identity{}, nil
			c.mu.Unlock()
			return nil, RejectRefused, err
		}
	}
	c.ready.Store(true)
	c.log = c.log.With("peer", peer.String())
	return HandshakeResult{Kite: k.opts.Identity, Username: pr.Username}, "", nil
}

// ReadSystemInfo reports this host's resources.
func ReadSystemInfo() SystemInfo {
	si := SystemInfo{OS: runtime.GOOS, Arch: runtime.GOARCH, NumCPU: runtime.NumCPU(), Time: time.Now().UTC()}
	si.Hostname, _ = os.Hostname()
	si.HomeDir, _ = os.UserHomeDir()
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		si.Uname = fmt.Sprintf("%s %s %s", unix.ByteSliceToString(u.Sysname[:]), unix.ByteSliceToString(u.Release[:]), unix.ByteSliceToString(u.Machine[:]))
	}
	var s unix.Sysinfo_t
	if unix.Sysinfo(&s) == nil {
		unit := uint64(s.Unit)
		si.MemoryTotal = s.Totalram * unit
		si.MemoryUsage = (s.Totalram - s.Freeram - s.Bufferram) * unit
		si.Uptime = s.Uptime
		for _, l := range s.Loads {
			si.Load = append(si.Load, float64(l)/65536)
		}
	}
	var fs unix.Statfs_t
	if unix.Statfs("/", &fs) == nil {
		si.DiskTotal = fs.Blocks * uint64(fs.Bsize)
		si.DiskUsage = (fs.Blocks - fs.Bfree) * uint64(fs.Bsize)
	}
	return si
}
