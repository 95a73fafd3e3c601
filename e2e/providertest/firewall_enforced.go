package providertest

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient/webterm"
	"github.com/kloud-dev/kloud/klient/webterm/webtermtest"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
)

// The firewall's enforcement (firewall.go tests its API). What it takes:
const (
	// otherUser owns the second stack, of one machine: another user of the suite's team.
	otherUser = "conformance-other"
	// fwPort is where the listener in the stack's first machine accepts.
	fwPort = 8077
	// fwTry bounds one connection attempt; a blocked port costs this much (its SYN is dropped).
	fwTry = 2 * time.Second
	// fwApply bounds how long a rule change takes to be enforced (rules may apply
	// asynchronously: the allowed case is polled, the blocked one too after a change). Each
	// poll starts a process in a machine: on a host loaded thirty times over (CI) one minute of
	// them did not connect once.
	fwApply = 2 * time.Minute
	// fwNet is a network none of the test's machines is in (TEST-NET-1, RFC 5737).
	fwNet = "192.0.2.0/24"
)

// fwScript is the listener and the probes, run by python3 in the machines (cloud-init, which
// every kloud machine runs, needs it: no other tool is assumed). "serve PORT LOG" accepts TCP on
// PORT and answers each connection with a line naming the caller's address, and appends each UDP
// datagram to PORT, with its source, to LOG (a UDP answer could not come back: the filter is
// stateless and the prober's machine has no rule for it); "probe IP PORT SECONDS" connects and
// prints "ok:" and the answer, or "no:" and why not; "send IP PORT DATA" sends one datagram;
// "spoof IP PORT DATA SRC" sends it from a raw socket with source address SRC (needs root).
const fwScript = `import socket, sys, threading
if sys.argv[1] == "serve":
    def udp():
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        u.bind(("", int(sys.argv[2])))
        while True:
            b, a = u.recvfrom(200)
            with open(sys.argv[3], "a") as f:
                f.write(b.decode(errors="replace") + " from " + a[0] + "\n")
    threading.Thread(target=udp, daemon=True).start()
    s = socket.create_server(("", int(sys.argv[2])))
    while True:
        c, a = s.accept()
        try:
            c.sendall(("listener saw " + a[0] + "\n").encode())
        except OSError:
            pass
        c.close()
if sys.argv[1] == "send":
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.sendto(sys.argv[4].encode(), (sys.argv[2], int(sys.argv[3])))
    print("sent")
    sys.exit()
if sys.argv[1] == "spoof":
    import struct
    dst, port, data, src = sys.argv[2], int(sys.argv[3]), sys.argv[4].encode(), sys.argv[5]
    udp = struct.pack("!HHHH", 40000, port, 8 + len(data), 0) + data
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0, socket.inet_aton(src), socket.inet_aton(dst))
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW).sendto(ip + udp, (dst, 0))
    print("sent")
    sys.exit()
try:
    c = socket.create_connection((sys.argv[2], int(sys.argv[3])), timeout=float(sys.argv[4]))
    c.settimeout(float(sys.argv[4]))
    print("ok:" + c.recv(200).decode().strip())
except Exception as e:
    print("no:" + repr(e))
`

// FirewallEnforced (capability "firewall"): the provider's firewall really blocks. A listener
// runs in the stack's first machine (started through its agent's terminal, as the owner: no
// provider hook); another user of the team gets a stack of one machine. With no rules the owner's
// other machine and kloud's host reach the listener and the other user's machine does not; a
// rule from "any" lets it in, and closing it keeps it out again (UDP: not by the TCP rule, by a
// UDP one until it is closed); "team" lets it in (same team); a CIDR holding its address lets it
// in, one that does not (and a rule on another port) do not; a datagram it sends with the
// address of the owner's other machine is dropped, though a rule opens the port to that address.
// The listener sees each prober's own address. The other user cannot open the port itself. The
// other stack is destroyed at the end; the machines are left with no rules, listener or files.
func (s *suite) testFirewallEnforced(t *testing.T) {
	s.needStack(t)
	if !s.caps[provider.CapFirewall] {
		_, err := s.cl.MachinePortsOpen(t.Context(), api.PortsParams{MachineID: s.machines[0].ID, Rules: []api.PortRule{{Port: fwPort}}})
		wantCode(t, "machine.ports.open of a provider without a firewall", err, kite.ErrState)
		s.needCap(t, provider.CapFirewall)
	}
	if len(s.machines) < 2 {
		t.Fatalf("needs the stack's two machines, it has %d", len(s.machines))
	}
	t0 := time.Now()
	target, sibling := s.machines[0], s.machines[1]
	ip := target.IPAddress
	if net.ParseIP(ip).To4() == nil {
		t.Fatalf("machine %s has no IPv4 address (%q): kloud records the resource's ip attribute", target.Label, ip)
	}
	// The other user's machine.
	other := s.otherStack(t)
	t.Logf("the other user's stack of one machine built: %s", since(t0))
	if net.ParseIP(other.IPAddress).To4() == nil {
		t.Fatalf("the other user's machine has no IPv4 address (%q)", other.IPAddress)
	}

	var err error
	srv := s.openShell(t, user, target)
	pid := srv.run(t, fmt.Sprintf("nohup python3 ~/kloud-fw.py serve %d ~/kloud-fw-udp.log >/dev/null 2>&1 </dev/null & echo pid:$!", fwPort))
	m := regexp.MustCompile(`pid:(\d+)`).FindStringSubmatch(pid)
	if m == nil {
		t.Fatalf("starting the listener in %s said %q", target.Label, pid)
	}
	t.Cleanup(func() { srv.run(t, "kill "+m[1]+"; rm -f ~/kloud-fw-udp.log") })
	// kloud's host reaches the machine with no rules (the documented default); this also waits
	// for the listener.
	addr := net.JoinHostPort(ip, strconv.Itoa(fwPort))
	var line string
	testutil.Eventually(t, fwApply, func() bool { line, err = dialLine(addr); return err == nil },
		"kloud's host cannot reach the listener at %s (machine %s): %v", addr, target.Label, lazy(func() string { return fmt.Sprint(err) }))
	t.Logf("kloud's host reaches %s: %q (listener up: %s)", addr, line, since(t0))

	own, stranger := s.openShell(t, user, sibling), s.openShell(t, otherUser, other)
	reaches := func(sh *shell) (bool, string) {
		out := sh.run(t, fmt.Sprintf("python3 ~/kloud-fw.py probe %s %d %g", ip, fwPort, fwTry.Seconds()))
		switch {
		case strings.Contains(out, "ok:listener saw"):
			return true, out
		case strings.Contains(out, "no:"):
			return false, out
		}
		t.Fatalf("the probe in %s said %q", sh.label, out)
		return false, ""
	}
	wantReach := func(sh *shell, why string) {
		t.Helper()
		t1 := time.Now()
		var out string
		testutil.Eventually(t, fwApply, func() bool { ok, o := reaches(sh); out = o; return ok }, "%s cannot reach %s (%s): %s", sh.label, addr, why, lazy(func() string { return out }))
		if !strings.Contains(out, "listener saw "+sh.addr+"\n") {
			t.Errorf("%s reaches %s, but the listener saw another source address than the machine's %s: %s", sh.label, addr, sh.addr, out)
		}
		t.Logf("%s reaches %s (%s): %s (after %s)", sh.label, addr, why, strings.TrimSpace(out), since(t1))
	}
	wantBlocked := func(sh *shell, why string) {
		t.Helper()
		t1 := time.Now()
		var out string
		testutil.Eventually(t, fwApply, func() bool { ok, o := reaches(sh); out = o; return !ok }, "%s reaches %s (%s): %s", sh.label, addr, why, lazy(func() string { return out }))
		t.Logf("%s is kept off %s (%s): %s (after %s)", sh.label, addr, why, strings.TrimSpace(out), since(t1))
	}
	// UDP: a datagram with a fresh token arrives in the listener's log, or does not.
	sent := 0
	// A spoofed one (src set) goes out of a raw socket, as root (the owner's sudo, kloud's
	// cloud-init gives it).
	udpFrom := func(sh *shell, src string) (bool, string) {
		sent++
		token := fmt.Sprintf("udp-token-%d", sent)
		cmd := fmt.Sprintf("python3 ~/kloud-fw.py send %s %d %s", ip, fwPort, token)
		if src != "" {
			cmd = fmt.Sprintf("sudo -n python3 ~/kloud-fw.py spoof %s %d %s %s", ip, fwPort, token, src)
		} else {
			src = sh.addr
		}
		if out := sh.run(t, cmd); !strings.Contains(out, "sent") {
			t.Fatalf("%s: %s: %s", sh.label, cmd, out)
		}
		var log string
		for deadline := time.Now().Add(fwTry); ; time.Sleep(200 * time.Millisecond) {
			log = srv.run(t, "cat ~/kloud-fw-udp.log 2>/dev/null")
			if strings.Contains(log, token+" from "+src+"\n") || time.Now().After(deadline) {
				break
			}
		}
		return strings.Contains(log, token+" from "+src+"\n"), log
	}
	udpArrives := func(sh *shell) (bool, string) { return udpFrom(sh, "") }
	wantUDP := func(sh *shell, arrives bool, why string) {
		t.Helper()
		t1 := time.Now()
		var log string
		testutil.Eventually(t, fwApply, func() bool { ok, l := udpArrives(sh); log = l; return ok == arrives },
			"UDP from %s to %s (%s): arrives %v, want %v; the listener's log:\n%s", sh.label, addr, why, !arrives, arrives, lazy(func() string { return log }))
		t.Logf("UDP from %s to %s (%s): arrives %v (after %s)", sh.label, addr, why, arrives, since(t1))
	}
	change := func(open bool, rules ...api.PortRule) {
		t.Helper()
		f, what := s.cl.MachinePortsClose, "close"
		if open {
			f, what = s.cl.MachinePortsOpen, "open"
		}
		if _, err := f(t.Context(), api.PortsParams{MachineID: target.ID, Rules: rules}); err != nil {
			t.Fatalf("machine.ports.%s %+v: %v", what, rules, err)
		}
	}
	t.Cleanup(func() { // whatever a failure left open
		ctx := context.WithoutCancel(t.Context())
		if res, err := s.cl.MachinePortsList(ctx, api.MachineRef{MachineID: target.ID}); err == nil && len(res.Rules) > 0 {
			s.cl.MachinePortsClose(ctx, api.PortsParams{MachineID: target.ID, Rules: res.Rules})
		}
	})

	// The default: the owner's machines and kloud, nobody else.
	wantReach(own, "the owner's other machine, no rules")
	wantUDP(own, true, "UDP from the owner's other machine, no rules")
	if ok, out := reaches(stranger); ok {
		t.Fatalf("another user's machine reaches %s with no rule: %s", addr, out)
	}
	// The other user may not open it.
	_, err = s.env.Client(otherUser).MachinePortsOpen(t.Context(), api.PortsParams{MachineID: target.ID, Rules: []api.PortRule{{Port: fwPort}}})
	if err == nil || !errors.Is(err, kite.ErrPermission) && !errors.Is(err, kite.ErrNotFound) {
		t.Errorf("machine.ports.open by another user of the owner's machine: %v, want refused (permission or not found)", err)
	}

	// Rules that do not cover the other machine let nothing in: a CIDR elsewhere, another port.
	// They are applied before "any" is, so once "any" is enforced, they are too.
	change(true, api.PortRule{Port: fwPort, From: fwNet}, api.PortRule{Port: fwPort + 1, From: provider.FromAny})
	change(true, api.PortRule{Port: fwPort, From: provider.FromAny})
	wantReach(stranger, "from any")
	if ok, log := udpArrives(stranger); ok {
		t.Fatalf("UDP from %s arrives at %s with only TCP open:\n%s", stranger.label, addr, log)
	}
	change(true, api.PortRule{Port: fwPort, Protocol: "udp", From: provider.FromAny})
	wantUDP(stranger, true, "udp from any")
	change(false, api.PortRule{Port: fwPort, Protocol: "udp", From: provider.FromAny})
	wantUDP(stranger, false, "udp closed")
	// Rules trust source addresses, so a machine must not send with another's: a datagram from
	// the other user's machine that claims the owner's other machine's address is dropped, though
	// a rule opens the port to that address (and one to its own, which lets its raw datagrams
	// with its own address in: the spoofing works, the firewall stops it).
	change(true, api.PortRule{Port: fwPort, Protocol: "udp", From: other.IPAddress}, api.PortRule{Port: fwPort, Protocol: "udp", From: sibling.IPAddress})
	var log string
	testutil.Eventually(t, fwApply, func() bool { ok, l := udpFrom(stranger, stranger.addr); log = l; return ok },
		"a raw UDP datagram from %s with its own address, to a port open to it, does not arrive:\n%s", stranger.label, lazy(func() string { return log }))
	if ok, log := udpFrom(stranger, sibling.IPAddress); ok {
		t.Errorf("a UDP datagram from %s claiming %s's address %s arrives at %s:\n%s", stranger.label, sibling.Label, sibling.IPAddress, addr, log)
	} else {
		t.Logf("a UDP datagram from %s claiming the address %s of the owner's %s is dropped", stranger.label, sibling.IPAddress, sibling.Label)
	}
	change(false, api.PortRule{Port: fwPort, Protocol: "udp", From: other.IPAddress}, api.PortRule{Port: fwPort, Protocol: "udp", From: sibling.IPAddress})
	change(false, api.PortRule{Port: fwPort, From: provider.FromAny})
	wantBlocked(stranger, "any closed; a rule for "+fwNet+" and one for another port left")

	change(true, api.PortRule{Port: fwPort, From: provider.FromTeam})
	wantReach(stranger, "from team, a user of the owner's team")
	change(false, api.PortRule{Port: fwPort, From: provider.FromTeam})
	wantBlocked(stranger, "team closed")

	change(true, api.PortRule{Port: fwPort, From: other.IPAddress})
	wantReach(stranger, "from its own address "+other.IPAddress)
	change(false, api.PortRule{Port: fwPort, From: other.IPAddress}, api.PortRule{Port: fwPort, From: fwNet}, api.PortRule{Port: fwPort + 1, From: provider.FromAny})
	wantBlocked(stranger, "every rule closed")
	if res, err := s.cl.MachinePortsList(t.Context(), api.MachineRef{MachineID: target.ID}); err != nil || len(res.Rules) != 0 {
		t.Errorf("machine.ports.list after closing every rule: %+v %v", res.Rules, err)
	}
	// The owner's other machine and kloud were never in question.
	wantReach(own, "the owner's other machine, after the rule changes")
	if _, err := dialLine(addr); err != nil {
		t.Errorf("kloud's host cannot reach %s after the rule changes: %v", addr, err)
	}
	t.Logf("firewall enforced: %s", since(t0))
}

// dialLine connects to addr from this host (kloud's) and reads the listener's line.
func dialLine(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, fwTry)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(fwTry))
	b, err := io.ReadAll(io.LimitReader(c, 200))
	if err != nil {
		return "", err
	}
	if !strings.HasPrefix(string(b), "listener saw ") {
		return "", fmt.Errorf("%s answered %q, not the listener", addr, b)
	}
	return strings.TrimSpace(string(b)), nil
}

// otherStack builds a stack of one machine (Template(1)) as otherUser, a new user of the suite's
// team (with their own credential and bootstrap when the provider takes them), destroys it when
// the test ends, and returns its machine.
func (s *suite) otherStack(t *testing.T) Machine {
	t.Helper()
	ctx := t.Context()
	if _, err := s.env.Client(kloud.Admin).UserAdd(ctx, api.UserAddParams{Username: otherUser, Team: team}); err != nil {
		t.Fatalf("user.add %s: %v", otherUser, err)
	}
	// The other user's suite: what it builds, its cleanup destroys.
	o := &suite{c: s.c, p: s.p, env: s.env, tf: s.tf, caps: s.caps, cl: s.env.Client(otherUser)}
	t.Cleanup(func() { o.cleanup(t) })
	var creds map[string]string
	if s.p.HasPart(provider.PartCredential) {
		if s.goodCred == "" {
			t.Skip("needs the good credential, which the Credential subtest did not add")
		}
		res, err := o.cl.CredentialAdd(ctx, api.CredentialAddParams{Provider: s.p.Name, Title: "other", Data: s.c.GoodCredential})
		if err != nil {
			t.Fatalf("credential.add as %s: %v", otherUser, err)
		}
		o.goodCred, creds = res.ID, map[string]string{s.p.Name: res.ID}
		if s.caps[provider.CapBootstrap] {
			b, err := o.cl.CredentialBootstrap(ctx, api.CredentialBootstrapParams{CredentialID: res.ID})
			if err != nil {
				t.Fatalf("credential.bootstrap as %s: %v", otherUser, err)
			}
			o.bootstrapped = true
			o.job(t, "bootstrap of "+otherUser+"'s credential", b.JobID)
		}
	}
	created := o.createAndBuild(t, otherUser, "conformance-other", s.c.Template(1), creds, 1)
	return o.waitMachine(t, created.Machines[0].Label, provider.Running, model.AgentConnected, agentTimeout)
}

// shell is a terminal on a machine, opened through kloud's terminal endpoint as a user (bearer:
// a fresh kite key of theirs) the way a browser opens one: the suite's way of running commands
// in a machine of any provider, through its agent. The shell's echo is turned off, and each
// command's output ends with a mark the command line itself does not contain.
type shell struct {
	label string
	addr  string // the machine's address
	term  *webtermtest.Term
	n     int
	seen  int // how much of the output run has consumed
}

// openShell opens a terminal on m as username and puts fwScript in their home.
func (s *suite) openShell(t *testing.T, username string, m Machine) *shell {
	t.Helper()
	key, _, err := s.env.Server.Kontrol.CreateKey(username, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	u := "ws" + strings.TrimPrefix(s.env.URL, "http") + "/api/machines/" + m.ID + "/terminal?cols=250&rows=50"
	ws, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + key}}})
	if err != nil {
		status := "no response"
		if resp != nil {
			b, _ := io.ReadAll(resp.Body)
			status = resp.Status + " " + string(b)
		}
		t.Fatalf("open a terminal on %s as %s: %v (%s)", m.Label, username, err, status)
	}
	sh := &shell{label: fmt.Sprintf("%s's machine %s", username, m.Label), addr: m.IPAddress, term: webtermtest.NewTerm(ws)}
	t.Cleanup(func() { // the shell ends (a session would outlive the connection)
		sh.term.Type(t, "rm -f ~/kloud-fw.py; exit\r")
		if c := sh.term.Closed(t); c.Code != webterm.CloseEnded {
			t.Logf("%s: the terminal closed with %+v after exit", sh.label, c)
		}
		ws.CloseNow()
	})
	// No line editing, no echo, no prompt: the output is the commands' own.
	sh.run(t, "set +o emacs +o vi 2>/dev/null; stty -echo; PS1=; PS2=")
	sh.run(t, "echo "+base64.StdEncoding.EncodeToString([]byte(fwScript))+" | base64 -d > ~/kloud-fw.py")
	return sh
}

// run types cmd and returns its output (stdout and stderr, with \r\n as \n).
func (sh *shell) run(t *testing.T, cmd string) string {
	t.Helper()
	sh.n++
	// The mark is computed by the shell: the typed line holds "$((n+0))", the output n.
	mark := fmt.Sprintf("\n:kloud-end-%d:", sh.n)
	sh.term.Type(t, fmt.Sprintf("%s 2>&1; echo; echo :kloud-end-$((%d+0)):\r", cmd, sh.n))
	var out string
	testutil.Eventually(t, webtermtest.Wait+fwApply, func() bool {
		all := strings.ReplaceAll(sh.term.Output()[sh.seen:], "\r\n", "\n")
		i := strings.Index(all, mark)
		if i < 0 {
			return false
		}
		out = all[:i]
		sh.seen = len(sh.term.Output()) // nothing follows the mark but its newline (no prompt)
		return true
	}, "%s: no end of %q in:\n%s", sh.label, cmd, lazy(func() string { return sh.term.Output()[sh.seen:] }))
	return out
}

// lazy formats as what its function returns when the message is made (Eventually's arguments
// are evaluated before it polls).
type lazy func() string

func (l lazy) String() string { return l() }
