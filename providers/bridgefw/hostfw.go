package bridgefw

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"

	"github.com/google/nftables"
)

// The host's iptables (hostfw.go). With br_netfilter loaded and bridge-nf-call-iptables=1 (what
// a stock dockerd leaves behind, also after it stops), IPv4 frames between two ports of any
// bridge also traverse iptables' FORWARD chain, in and out device being the bridge; a FORWARD
// policy DROP (also a stock dockerd's, when it turned on ip_forward) then drops every frame
// between kloud's machines, whatever this package's table says. Kloud therefore keeps one rule
// of its own at the top of FORWARD in every iptables variant whose filter table exists in its
// network namespace (iptables-legacy and iptables-nft are hooked side by side: either may drop):
//
//	-A FORWARD -i <bridge> -o <bridge> -m comment --comment "kloud bridge <bridge>" -j ACCEPT
//
// It accepts only frames that entered and leave through kloud's own bridge, which this
// package's nftables table (bridge family, forward hook) has already filtered before
// br_netfilter hands them to iptables: the table stays the one that decides who reaches whom.
// Routed traffic never matches (kloud's bridges do not forward IPv4: providers/local/sandbox
// turns forwarding off on its bridge, and a Docker network's traffic to elsewhere leaves through
// another device). Table.Apply adds the rule when it is missing (idempotent, so a flushed FORWARD
// gets it back on the next rebuild), Table.Remove deletes it with the table. A variant whose
// filter table does not exist has nothing that drops; the rule is not put there (that would
// create the table).

// Forward is what the host's iptables do to frames within a bridge (HostForward).
type Forward struct {
	// Bridge is the bridge.
	Bridge string
	// BridgeNF: bridged IPv4 frames traverse iptables (bridge-nf-call-iptables is 1 in this
	// network namespace: br_netfilter is loaded and on).
	BridgeNF bool
	// Variants are the iptables variants with a filter table here.
	Variants []ForwardVariant
}

// ForwardVariant is one iptables variant's FORWARD chain.
type ForwardVariant struct {
	// Name is the command: iptables-legacy, iptables-nft (or iptables, where it is the only one).
	Name string
	// Policy is FORWARD's policy (ACCEPT, DROP), "" when it could not be read (Err; counted as
	// one that drops).
	Policy string
	// Accepts: kloud's rule for the bridge is in FORWARD.
	Accepts bool
	// Err: the chain could not be read or the rule not added.
	Err error
}

// Drops reports whether the host's iptables would drop frames within the bridge without kloud's
// rule: bridged frames traverse iptables and a FORWARD policy is not ACCEPT.
func (f Forward) Drops() bool {
	return f.BridgeNF && slices.ContainsFunc(f.Variants, func(v ForwardVariant) bool { return v.Policy != "ACCEPT" })
}

// Blocked reports whether frames within the bridge are dropped although kloud tried: a variant
// whose policy drops has no rule of kloud's.
func (f Forward) Blocked() bool {
	return f.BridgeNF && slices.ContainsFunc(f.Variants, func(v ForwardVariant) bool { return v.Policy != "ACCEPT" && !v.Accepts })
}

// String says what the host does and what kloud did about it, in a sentence.
func (f Forward) String() string {
	if !f.Drops() {
		if !f.BridgeNF {
			return fmt.Sprintf("bridged frames do not traverse iptables (bridge-nf-call-iptables is off or br_netfilter not loaded): the host's firewall leaves bridge %s alone", f.Bridge)
		}
		return fmt.Sprintf("bridged frames traverse iptables (bridge-nf-call-iptables=1) but no FORWARD policy drops: the host's firewall leaves bridge %s alone", f.Bridge)
	}
	var drop, ok, bad []string
	for _, v := range f.Variants {
		switch v.Policy {
		case "ACCEPT":
		case "":
			drop = append(drop, v.Name+" FORWARD unreadable")
		default:
			drop = append(drop, v.Name+" FORWARD policy "+v.Policy)
		}
		if v.Accepts {
			ok = append(ok, v.Name)
		} else if v.Err != nil {
			bad = append(bad, fmt.Sprintf("%s: %v", v.Name, v.Err))
		} else {
			bad = append(bad, v.Name+": no rule")
		}
	}
	s := fmt.Sprintf("the host's firewall would drop traffic between machines on bridge %s (bridge-nf-call-iptables=1 and %s, as a stock Docker daemon leaves them)", f.Bridge, strings.Join(drop, ", "))
	if f.Blocked() {
		return s + ": kloud could not accept the bridge's own traffic in FORWARD (" + strings.Join(bad, "; ") + "); machines on it cannot reach each other: add `iptables -I FORWARD -i " + f.Bridge + " -o " + f.Bridge + " -j ACCEPT` or turn bridge-nf-call-iptables off"
	}
	return s + ": kloud accepts traffic within the bridge at the top of FORWARD (" + strings.Join(ok, ", ") + ", rule \"" + forwardComment(f.Bridge) + "\"); kloud's nftables table still decides which machine reaches which"
}

// HostForward reports what the host's iptables do to frames within the table's bridge, without
// changing anything.
func (t *Table) HostForward(ctx context.Context) Forward {
	return hostForward(ctx, t.Bridge, false)
}

// AllowHostForward adds kloud's rule for the bridge to the host's iptables FORWARD chains where
// it is missing and reports (Apply does it too; call it when the bridge is made).
func (t *Table) AllowHostForward(ctx context.Context) Forward {
	return hostForward(ctx, t.Bridge, true)
}

func forwardComment(bridge string) string { return "kloud bridge " + bridge }

// forwardRule is kloud's rule for bridge (after the chain name).
func forwardRule(bridge string) []string {
	return []string{"-i", bridge, "-o", bridge, "-m", "comment", "--comment", forwardComment(bridge), "-j", "ACCEPT"}
}

func hostForward(ctx context.Context, bridge string, add bool) Forward {
	f := Forward{Bridge: bridge}
	if b, err := os.ReadFile("/proc/sys/net/bridge/bridge-nf-call-iptables"); err == nil {
		f.BridgeNF = strings.TrimSpace(string(b)) == "1"
	}
	if bridge == "" {
		return f
	}
	for _, name := range iptablesVariants() {
		v := ForwardVariant{Name: name}
		v.Policy, v.Err = forwardPolicy(ctx, name)
		if v.Err == nil {
			v.Accepts = iptables(ctx, name, append([]string{"-C", "FORWARD"}, forwardRule(bridge)...)...) == nil
			if !v.Accepts && add {
				if v.Err = iptables(ctx, name, append([]string{"-I", "FORWARD", "1"}, forwardRule(bridge)...)...); v.Err == nil {
					v.Accepts = true
				}
			}
		}
		f.Variants = append(f.Variants, v)
	}
	return f
}

// removeHostForward deletes kloud's rule for the bridge from every variant (every copy: two
// klouds racing may have added it twice).
func removeHostForward(ctx context.Context, bridge string) error {
	if bridge == "" {
		return nil
	}
	var errs []error
	for _, name := range iptablesVariants() {
		for i := 0; i < 16 && iptables(ctx, name, append([]string{"-C", "FORWARD"}, forwardRule(bridge)...)...) == nil; i++ {
			if err := iptables(ctx, name, append([]string{"-D", "FORWARD"}, forwardRule(bridge)...)...); err != nil {
				errs = append(errs, err)
				break
			}
		}
	}
	return errors.Join(errs...)
}

// iptablesVariants lists the iptables commands whose filter table exists in this network
// namespace: iptables-legacy (/proc/net/ip_tables_names lists filter) and iptables-nft (an
// nftables table "filter" of family ip). A host with neither command but iptables asks it.
func iptablesVariants() []string {
	var out []string
	legacy := func() bool {
		b, err := os.ReadFile("/proc/net/ip_tables_names")
		return err == nil && slices.Contains(strings.Fields(string(b)), "filter")
	}
	nft := func() bool {
		c, err := nftables.New()
		if err != nil {
			return false
		}
		defer c.CloseLasting()
		ts, err := c.ListTablesOfFamily(nftables.TableFamilyIPv4)
		return err == nil && slices.ContainsFunc(ts, func(t *nftables.Table) bool { return t.Name == "filter" })
	}
	_, errL := exec.LookPath("iptables-legacy")
	_, errN := exec.LookPath("iptables-nft")
	if errL == nil && legacy() {
		out = append(out, "iptables-legacy")
	}
	if errN == nil && nft() {
		out = append(out, "iptables-nft")
	}
	if errL != nil && errN != nil {
		if _, err := exec.LookPath("iptables"); err == nil {
			if b, err := exec.Command("iptables", "--version").Output(); err == nil {
				if (bytes.Contains(b, []byte("nf_tables")) && nft()) || (!bytes.Contains(b, []byte("nf_tables")) && legacy()) {
					out = append(out, "iptables")
				}
			}
		}
	}
	return out
}

// forwardPolicy reads FORWARD's policy of the filter table.
func forwardPolicy(ctx context.Context, name string) (string, error) {
	cmd := exec.CommandContext(ctx, name, "-w", "5", "-t", "filter", "-S", "FORWARD")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s -S FORWARD: %s: %w", name, strings.TrimSpace(stderr.String()), err)
	}
	for line := range strings.Lines(stdout.String()) {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "-P" && f[1] == "FORWARD" {
			return f[2], nil
		}
	}
	return "", fmt.Errorf("%s -S FORWARD: no policy in %q", name, stdout.String())
}

func iptables(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, append([]string{"-w", "5", "-t", "filter"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %s: %w", name, strings.Join(args[:2], " "), strings.TrimSpace(stderr.String()), err)
	}
	return nil
}
