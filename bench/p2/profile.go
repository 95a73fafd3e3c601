package p2

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"runtime"
	rpprof "runtime/pprof"
	"sync"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kontrol"
)

// ServeKontrol runs kontrol alone in this process: a kite with kloud's identity, authenticator
// and heartbeat (10s/10s) and kontrol's methods, keys and revocations in files of the data dir
// (as kloud kept them before the store), the admin key in dataDir/admin.key, and the debug
// handlers. It separates what kite and kontrol cost per connection from what the rest of kloud
// (the store) does. It prints "kloud (kontrol only) listening on ADDR" to out.
func ServeKontrol(ctx context.Context, dataDir string, out, logw io.Writer) error {
	log := slog.New(slog.NewTextHandler(logw, nil))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("serve kontrol: %w", err)
	}
	defer ln.Close()
	url := "http://" + ln.Addr().String() + "/kite"
	ring, err := kitekey.LoadOrCreateFileKeyring(filepath.Join(dataDir, "kontrol", "keys.json"))
	if err != nil {
		return fmt.Errorf("serve kontrol: %w", err)
	}
	revs, err := kontrol.OpenFileRevocations(filepath.Join(dataDir, "kontrol", "revocations.json"))
	if err != nil {
		return fmt.Errorf("serve kontrol: %w", err)
	}
	isAdmin := func(u string) bool { return u == "admin" }
	k, err := kite.New(kite.Options{
		Identity:      kite.Identity{Name: "kloud", Username: "kloud"},
		Authenticator: &kitekey.Authenticator{Verifier: &kitekey.Verifier{Keys: ring.Keyring, Issuer: "kontrol", Revoked: revs}, IsAdmin: isAdmin},
		Logger:        log,
		PingInterval:  10 * time.Second,
		PingTimeout:   10 * time.Second,
	})
	if err != nil {
		return fmt.Errorf("serve kontrol: %w", err)
	}
	ko, err := kontrol.New(kontrol.Options{Kite: k, Keyring: ring.Keyring, Revocations: revs, URL: url, IsAdmin: isAdmin, Logger: log})
	if err != nil {
		return fmt.Errorf("serve kontrol: %w", err)
	}
	key, _, err := ko.CreateKey("admin", "")
	if err != nil {
		return fmt.Errorf("serve kontrol: %w", err)
	}
	if err := kitekey.WriteFile(filepath.Join(dataDir, adminKeyFile), key); err != nil {
		return fmt.Errorf("serve kontrol: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/kite", k)
	DebugHandlers(mux.Handle)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(out, "kloud (kontrol only) listening on %s\n", ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve kontrol: %w", err)
	case <-ctx.Done():
	}
	k.Close()
	srv.Close()
	return nil
}

// DebugHandlers adds, for the memory and CPU breakdown of Options.Profile (on any in-process
// server: ServeKontrol, package kloudserver):
//
//   - /debug/pprof/ (net/http/pprof),
//   - /debug/bench/memstats: runtime.MemStats and the number of goroutines, as JSON,
//   - /debug/bench/cpu/start?file=F and /debug/bench/cpu/stop: a CPU profile into F.
func DebugHandlers(handle func(pattern string, h http.Handler)) {
	handle("/debug/pprof/", http.HandlerFunc(pprof.Index))
	handle("/debug/bench/memstats", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(MemStats{MemStats: ms, Goroutines: runtime.NumGoroutine()})
	}))
	var cpuMu sync.Mutex
	var cpuFile *os.File
	handle("/debug/bench/cpu/start", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cpuMu.Lock()
		defer cpuMu.Unlock()
		f, err := os.Create(r.URL.Query().Get("file"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if err := rpprof.StartCPUProfile(f); err != nil {
			f.Close()
			http.Error(w, err.Error(), http.StatusConflict)
			return
		}
		cpuFile = f
	}))
	handle("/debug/bench/cpu/stop", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cpuMu.Lock()
		defer cpuMu.Unlock()
		if cpuFile != nil {
			rpprof.StopCPUProfile()
			cpuFile.Close()
			cpuFile = nil
		}
	}))
}

// MemStats is what /debug/bench/memstats returns.
type MemStats struct {
	runtime.MemStats
	Goroutines int
}

// profiler talks to a ServeKloud process.
type profiler struct {
	base string // http://addr
	dir  string
	hc   *http.Client
}

func (p *profiler) get(ctx context.Context, path string, w io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+path, nil)
	if err != nil {
		return err
	}
	resp, err := p.hc.Do(req)
	if err != nil {
		return fmt.Errorf("profile %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("profile %s: %s: %s", path, resp.Status, b)
	}
	_, err = io.Copy(w, resp.Body)
	return err
}

func (p *profiler) memStats(ctx context.Context) (MemStats, error) {
	var buf jsonBuf
	if err := p.get(ctx, "/debug/bench/memstats", &buf); err != nil {
		return MemStats{}, err
	}
	var ms MemStats
	if err := json.Unmarshal(buf.b, &ms); err != nil {
		return MemStats{}, fmt.Errorf("profile memstats: %w", err)
	}
	return ms, nil
}

func (p *profiler) save(ctx context.Context, path, file string) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	defer f.Close()
	return p.get(ctx, path, f)
}

type jsonBuf struct{ b []byte }

func (j *jsonBuf) Write(p []byte) (int, error) { j.b = append(j.b, p...); return len(p), nil }
