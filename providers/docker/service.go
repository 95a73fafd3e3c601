package docker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/kloud-dev/kloud/provider"
)

// The Docker API proxy: what terraform's Docker provider talks to instead of the daemon. It is
// served by kloud's process at provider.HandlerPrefix(Name) + "v1/<token>/" and forwards to the
// daemon (Options.Host) only:
//
//	GET|HEAD /_ping, GET /version                       (the client's handshake)
//	POST /containers/create                              a machine of the token (createAllowed)
//	GET /containers/{id}/json, POST .../start|stop|kill|wait|restart, PUT|HEAD .../archive,
//	DELETE /containers/{id}                              the token's stack's containers only
//	POST /containers/{id}/update                         resource limits only (proxyupdate.go)
//	GET /images/{name}/json                              kloud's machine image only
//	GET /images/json                                     filtered to kloud's machine image
//	GET /containers/json                                 filtered to the token's stack's containers
//	GET /networks/{id}                                   kloud's machine network only
//
// each with an optional /v1.NN version prefix. Everything else is 403 with a message naming the
// call. A container is the stack's when its labels say kloud_stack = the token's stack and
// kloud_instance = this kloud; the daemon is asked before every such call.

// maxCreateBody bounds a container create request.
const maxCreateBody = 1 << 20

var (
	versionRE   = regexp.MustCompile(`^/v1\.[0-9]{1,3}(/.*)$`)
	containerRE = regexp.MustCompile(`^/containers/([A-Za-z0-9][A-Za-z0-9_.-]{0,127})(/json|/start|/stop|/kill|/wait|/restart|/archive|/update)?$`)
	imageRE     = regexp.MustCompile(`^/images/(.{1,256})/json$`)
	networkRE   = regexp.MustCompile(`^/networks/([A-Za-z0-9][A-Za-z0-9_.-]{0,127})$`)
)

func (d *Docker) handler() http.Handler {
	network, addr, err := dialTarget(d.host)
	if err != nil {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "docker provider: "+err.Error(), http.StatusServiceUnavailable)
		})
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var dl net.Dialer
			return dl.DialContext(ctx, network, addr)
		},
		MaxIdleConns:    16,
		IdleConnTimeout: 30 * time.Second,
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = "docker"
			pr.Out.Host = "docker"
			pr.Out.URL.Path = pr.In.Context().Value(restKey{}).(string)
			pr.Out.URL.RawPath = ""
			pr.Out.Header.Del("Authorization")
			pr.Out.Header.Del("Cookie")
		},
		Transport:     tr,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			rest, _ := r.Context().Value(restKey{}).(string) // the path without the token
			d.log.Warn("docker provider: proxy to the daemon", "path", rest, "err", err)
			http.Error(w, "docker provider: the Docker daemon did not answer: "+err.Error(), http.StatusBadGateway)
		},
	}
	prefix := provider.HandlerPrefix(Name) + "v1/"
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest, ok := strings.CutPrefix(r.URL.Path, prefix)
		if !ok {
			http.NotFound(w, r)
			return
		}
		tok, rest, _ := strings.Cut(rest, "/")
		rest = "/" + rest
		t, err := d.parseToken(tok)
		if err != nil {
			http.Error(w, "docker provider: "+err.Error(), http.StatusUnauthorized)
			return
		}
		inner := rest
		if m := versionRE.FindStringSubmatch(rest); m != nil {
			inner = m[1]
		}
		ctx := r.Context()
		if err := d.authorize(ctx, t, r, inner); err != nil {
			d.log.Warn("docker provider: refused a Docker API call", "stack", t.Stack, "method", r.Method, "path", inner, "err", err)
			var ae *apiError
			if errors.As(err, &ae) {
				writeAPIError(w, ae.code, "kloud: "+ae.msg)
				return
			}
			writeAPIError(w, http.StatusForbidden, "kloud: "+err.Error())
			return
		}
		d.serveNetworked(w, r.WithContext(context.WithValue(ctx, restKey{}, rest)), inner, rp)
	})
}

type restKey struct{}

// readBody reads a container request's body (at most maxCreateBody bytes).
func readBody(r *http.Request, what string) ([]byte, error) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxCreateBody+1))
	if err != nil {
		return nil, err
	}
	if len(body) > maxCreateBody {
		return nil, &apiError{http.StatusRequestEntityTooLarge, "container " + what + " request too large"}
	}
	return body, nil
}

// setBody gives r the checked body to forward.
func setBody(r *http.Request, body []byte) {
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
}

type apiError struct {
	code int
	msg  string
}

func (e *apiError) Error() string { return e.msg }

// writeAPIError answers as the daemon does ({"message": ...}), so the client shows the message.
func writeAPIError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]string{"message": msg})
}

// authorize decides whether the call may go to the daemon; for a create it also replaces r's
// body with the checked bytes.
func (d *Docker) authorize(ctx context.Context, t *token, r *http.Request, path string) error {
	switch {
	case path == "/_ping" && (r.Method == http.MethodGet || r.Method == http.MethodHead),
		path == "/version" && r.Method == http.MethodGet:
		return nil
	case path == "/containers/create" && r.Method == http.MethodPost:
		body, err := readBody(r, "create")
		if err != nil {
			return err
		}
		image, err := d.ensureImage(ctx)
		if err != nil {
			return err
		}
		if err := d.createAllowed(t, body, image); err != nil {
			return err
		}
		if err := d.createLimits(ctx, body); err != nil {
			return err
		}
		setBody(r, body)
		return nil
	}
	if path == "/containers/json" && r.Method == http.MethodGet {
		// It lists containers to find the one it made: it sees the stack's only.
		q := r.URL.Query()
		f := map[string]map[string]bool{}
		if raw := q.Get("filters"); raw != "" {
			if err := json.Unmarshal([]byte(raw), &f); err != nil {
				var old map[string][]string // the pre-1.22 form
				if json.Unmarshal([]byte(raw), &old) != nil {
					return &apiError{http.StatusBadRequest, "bad filters"}
				}
				for k, vs := range old {
					f[k] = map[string]bool{}
					for _, v := range vs {
						f[k][v] = true
					}
				}
			}
		}
		if f["label"] == nil {
			f["label"] = map[string]bool{}
		}
		f["label"][LabelStack+"="+t.Stack] = true
		f["label"][LabelInstance+"="+d.instance] = true
		b, _ := json.Marshal(f)
		q.Set("filters", string(b))
		r.URL.RawQuery = q.Encode()
		return nil
	}
	if m := containerRE.FindStringSubmatch(path); m != nil {
		op := m[2]
		if op == "/update" && r.Method == http.MethodPost {
			return d.updateAllowed(ctx, t, r, m[1])
		}
		okMethod := map[string][]string{
			"": {http.MethodDelete}, "/json": {http.MethodGet}, "/archive": {http.MethodPut, http.MethodHead},
			"/start": {http.MethodPost}, "/stop": {http.MethodPost}, "/kill": {http.MethodPost},
			"/wait": {http.MethodPost}, "/restart": {http.MethodPost},
		}[op]
		if !slices.Contains(okMethod, r.Method) {
			return fmt.Errorf("%s %s is not a call kloud's docker machines need", r.Method, path)
		}
		if op == "/start" || op == "/restart" || op == "/archive" {
			if t.expired() {
				return errors.New("this stack's docker token has expired: build the stack again")
			}
		}
		return d.ownContainer(ctx, t, m[1])
	}
	if path == "/images/json" && r.Method == http.MethodGet {
		// The Docker provider lists the local images to find the one it runs: it sees kloud's only.
		image, err := d.ensureImage(ctx)
		if err != nil {
			return err
		}
		f, _ := json.Marshal(map[string]map[string]bool{"reference": {image: true}})
		r.URL.RawQuery = url.Values{"filters": {string(f)}}.Encode()
		return nil
	}
	if m := imageRE.FindStringSubmatch(path); m != nil && r.Method == http.MethodGet {
		image, err := d.ensureImage(ctx)
		if err != nil {
			return err
		}
		cli, err := d.Client()
		if err != nil {
			return err
		}
		want, err := cli.ImageInspect(ctx, image)
		if err != nil {
			return fmt.Errorf("kloud's machine image %s: %w", image, err)
		}
		if m[1] == image || m[1] == want.ID || strings.TrimPrefix(want.ID, "sha256:") == m[1] {
			return nil
		}
		return &apiError{http.StatusNotFound, fmt.Sprintf("no such image: %s (docker machines run kloud's image)", m[1])}
	}
	if m := networkRE.FindStringSubmatch(path); m != nil && r.Method == http.MethodGet {
		if m[1] == d.opts.Network {
			return nil
		}
		cli, err := d.Client()
		if err != nil {
			return err
		}
		n, err := cli.NetworkInspect(ctx, d.opts.Network, client.NetworkInspectOptions{})
		if err == nil && n.Network.ID == m[1] {
			return nil
		}
		return &apiError{http.StatusNotFound, "network " + m[1] + " not found"}
	}
	return fmt.Errorf("%s %s is not a call kloud's docker machines need", r.Method, path)
}

// ownContainer checks that container id is this kloud instance's and the token's stack's.
func (d *Docker) ownContainer(ctx context.Context, t *token, id string) error {
	_, _, err := d.stackContainer(ctx, t, id)
	return err
}

// stackContainer returns container id, checked to be this kloud instance's and the token's
// stack's (else a 404 error, as for a container that does not exist). found is false when the
// daemon did not show it (not found, or its error): the daemon answers the same to the real call.
func (d *Docker) stackContainer(ctx context.Context, t *token, id string) (c container.InspectResponse, found bool, err error) {
	cli, err := d.Client()
	if err != nil {
		return c, false, err
	}
	res, err := cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
	if err != nil {
		return c, false, nil
	}
	c = res.Container
	if c.Config == nil || c.Config.Labels[LabelInstance] != d.instance || c.Config.Labels[LabelStack] != t.Stack {
		return c, true, &apiError{http.StatusNotFound, "no such container: " + id}
	}
	return c, true, nil
}

// createAllowed checks a container create request (the Engine API's JSON: container.Config's
// fields, HostConfig and NetworkingConfig) against the allowlist: only the fields below may have
// a value other than their zero value, and some only kloud's values.
func (d *Docker) createAllowed(t *token, body []byte, image string) error {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return fmt.Errorf("container create: %w", err)
	}
	var bad []string
	refuse := func(f string) { bad = append(bad, f) }

	// The machine: kloud's labels, a machine the token lists.
	var labels map[string]string
	if raw, ok := top["Labels"]; ok && !isZero(raw) {
		if err := json.Unmarshal(raw, &labels); err != nil {
			return fmt.Errorf("container create: Labels: %w", err)
		}
	}
	if labels[LabelStack] != t.Stack || labels[LabelInstance] != d.instance {
		return fmt.Errorf("container create: labels %s and %s must name this stack and kloud", LabelStack, LabelInstance)
	}
	if !t.mayCreate(labels[LabelMachine]) {
		if t.expired() {
			return errors.New("container create: this stack's docker token has expired: build the stack again")
		}
		return fmt.Errorf("container create: machine %q is not one this build may create", labels[LabelMachine])
	}
	str := func(k string) string {
		var s string
		json.Unmarshal(top[k], &s)
		return s
	}
	if str("Image") != image {
		refuse("Image (must be kloud's machine image " + image + ")")
	}
	var ep []string
	json.Unmarshal(top["Entrypoint"], &ep)
	if !slices.Equal(ep, []string{BootPath}) {
		refuse("Entrypoint (must be " + BootPath + ")")
	}
	configOK := map[string]bool{
		"Hostname": true, "Domainname": true, "Env": true, "Cmd": true, "Image": true, "WorkingDir": true,
		"Entrypoint": true, "Labels": true, "StopSignal": true, "StopTimeout": true, "AttachStdin": true,
		"AttachStdout": true, "AttachStderr": true, "Tty": true, "OpenStdin": true, "StdinOnce": true,
		"ExposedPorts": true, "HostConfig": true, "NetworkingConfig": true,
	}
	for k, v := range top {
		if !configOK[k] && !isZero(v) {
			refuse(k)
		}
	}

	var hc map[string]json.RawMessage
	if raw, ok := top["HostConfig"]; ok && !isZero(raw) {
		if err := json.Unmarshal(raw, &hc); err != nil {
			return fmt.Errorf("container create: HostConfig: %w", err)
		}
	}
	hostOK := map[string]bool{
		"NetworkMode": true, "RestartPolicy": true, "Memory": true, "MemorySwap": true, "MemoryReservation": true,
		"MemorySwappiness": true, "NanoCpus": true, "CpuShares": true, "CpusetCpus": true, "CpuPeriod": true,
		"CpuQuota": true, "ShmSize": true, "Dns": true, "DnsOptions": true, "DnsSearch": true, "LogConfig": true,
		"Init": true, "AutoRemove": true, "Tmpfs": true, "PidsLimit": true, "ConsoleSize": true, "CapDrop": true,
		"IpcMode": true, "CgroupnsMode": true, "KernelMemory": true,
	}
	for k, v := range hc {
		// MaskedPaths and ReadonlyPaths: an empty list unmasks /proc and /sys; only null is unset.
		if !hostOK[k] && (!isZero(v) || ((k == "MaskedPaths" || k == "ReadonlyPaths") && !isNull(v))) {
			refuse("HostConfig." + k)
		}
	}
	hstr := func(k string) string {
		var s string
		json.Unmarshal(hc[k], &s)
		return s
	}
	if hstr("NetworkMode") != d.opts.Network {
		refuse("HostConfig.NetworkMode (must be kloud's network " + d.opts.Network + ")")
	}
	if m := hstr("IpcMode"); m != "" && m != "private" && m != "shareable" && m != "none" {
		refuse("HostConfig.IpcMode " + m)
	}
	if m := hstr("CgroupnsMode"); m != "" && m != "private" {
		refuse("HostConfig.CgroupnsMode " + m)
	}
	if raw, ok := hc["LogConfig"]; ok && !isZero(raw) {
		var lc struct {
			Type   string
			Config map[string]string
		}
		json.Unmarshal(raw, &lc)
		if lc.Type != "" && lc.Type != "json-file" && lc.Type != "local" {
			refuse("HostConfig.LogConfig.Type " + lc.Type)
		}
		for k := range lc.Config {
			if k != "max-size" && k != "max-file" {
				refuse("HostConfig.LogConfig.Config." + k)
			}
		}
	}
	if raw, ok := top["NetworkingConfig"]; ok && !isZero(raw) {
		var nc struct {
			EndpointsConfig map[string]json.RawMessage
		}
		json.Unmarshal(raw, &nc)
		for k := range nc.EndpointsConfig {
			if k != d.opts.Network {
				refuse("NetworkingConfig.EndpointsConfig." + k)
			}
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return fmt.Errorf("container create: kloud's docker machines may not set %s (they would reach the host)", strings.Join(bad, ", "))
	}
	return t.ownerLabels(labels) // token.go: the firewall trusts them
}

// isNull reports whether a JSON value is null.
func isNull(raw json.RawMessage) bool { return strings.TrimSpace(string(raw)) == "null" }

// isZero reports whether a JSON value is null, false, 0, "", [] or {}.
func isZero(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	switch s {
	case "", "null", "false", "0", `""`, "[]", "{}":
		return true
	}
	var f float64
	if json.Unmarshal(raw, &f) == nil {
		return f == 0
	}
	var a []any
	if json.Unmarshal(raw, &a) == nil {
		return len(a) == 0
	}
	var o map[string]json.RawMessage
	if json.Unmarshal(raw, &o) == nil {
		return len(o) == 0
	}
	return false
}
