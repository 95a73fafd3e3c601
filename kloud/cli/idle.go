package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
)

// Idle stop (kloud/idle.go): `kloud machine set`, the flags of `kloud template update`, and how
// machine list and info show it.

// idleFlags adds --idle-timeout and --always-on to cmd; whose names what they apply to.
func idleFlags(cmd *cobra.Command, timeout *string, always *bool, whose string) {
	cmd.Flags().StringVar(timeout, "idle-timeout", "", "stop "+whose+" after this long without activity (30m, 1h; 0: never; default: inherit)")
	cmd.Flags().BoolVar(always, "always-on", false, "never stop "+whose+" for being idle (--always-on=false undoes it)")
}

func machineSetCmd(g *globals) *cobra.Command {
	var stack, timeout, autostart, tz string
	var always, inherit bool
	c := &cobra.Command{
		Use:   "set MACHINE [--idle-timeout D] [--always-on[=false]] [--inherit-always-on]",
		Short: "Change a machine's idle stop: its idle timeout, or always on",
		Long: `Change a machine's own idle stop settings (its owner and team admins).

kloud stops a Running machine that had no activity for its idle timeout: no terminal attached or
typed into (web terminals and kloud ssh), no port-forward or web-app traffic, no CPU used by what
runs in its terminals (kloud serve --idle-cpu-threshold). Attached terminals
get a warning line a few minutes before; typing anything cancels the countdown. The machine
keeps its disk; kloud machine start brings it back.

  --idle-timeout 30m    stop it after 30 minutes idle (whole seconds; 0: never)
  --idle-timeout default  drop the machine's own timeout: its template's, else kloud's
  --always-on           never stop it for being idle (--always-on=false undoes a template's)
  --inherit-always-on   drop the machine's own always-on choice: its template's again
  --autostart "mon-fri 09:00" [--timezone Europe/Berlin]
                        start it (if stopped) on this schedule: DAYS is daily, weekdays, a day
                        (mon), a range (mon-fri) or a list (sat,sun); default time zone UTC
  --autostart off       no schedule

kloud machine list and info show the countdown ("idle stop in 12m") and why a machine stopped
("stopped: idle for 30m").`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p := api.MachineSetParams{IdleTimeout: timeout, ResetAlwaysOn: inherit, Autostart: autostart, Timezone: tz}
			if cmd.Flags().Changed("always-on") {
				p.AlwaysOn = &always
			}
			if p.IdleTimeout == "" && p.AlwaysOn == nil && !p.ResetAlwaysOn && p.Autostart == "" {
				return fmt.Errorf("say what to change: --idle-timeout, --always-on, --inherit-always-on or --autostart")
			}
			var m model.Machine
			err := g.onMachine(cmd.Context(), args[0], stack, func(conn *kite.Conn, id string) error {
				p.MachineID = id
				var err error
				m, err = api.NewClient(conn).MachineSet(cmd.Context(), p)
				return err
			})
			if err != nil {
				return explain(err)
			}
			if g.json {
				return g.printJSON(m)
			}
			fmt.Fprintf(g.stdout, "machine %s (%s): idle %s\n", m.ID, m.Label, idleText(m, time.Now()))
			if m.Autostart != nil {
				fmt.Fprintf(g.stdout, "autostart: %s\n", autostartText(m.Autostart))
			}
			return nil
		},
	}
	c.Flags().StringVar(&stack, "stack", "", "the machine's stack (when labels repeat)")
	idleFlags(c, &timeout, &always, "the machine")
	c.Flags().BoolVar(&inherit, "inherit-always-on", false, "drop the machine's own --always-on: its template's again")
	c.Flags().StringVar(&autostart, "autostart", "", `start the machine, if stopped, on a schedule: "mon-fri 09:00", "daily 08:30"; off: none`)
	c.Flags().StringVar(&tz, "timezone", "", "the autostart schedule's time zone (IANA, e.g. Europe/Berlin; default UTC)")
	return c
}

// idleText says what the idle stop does to m at now: why it stopped, the countdown, or the
// settings in force.
func idleText(m model.Machine, now time.Time) string {
	switch {
	case m.State == provider.Stopped && strings.HasPrefix(m.Reason, kloud.IdleReasonPrefix):
		return "stopped: " + m.Reason
	case m.Idle.EffectiveAlwaysOn:
		return "always on"
	case m.Idle.EffectiveTimeoutSeconds == 0:
		return "never stopped"
	case m.State == provider.Running && !m.Idle.Deadline.IsZero():
		left := m.Idle.Deadline.Sub(now)
		if left < 0 {
			left = 0
		}
		return fmt.Sprintf("idle stop in %s (after %s idle)", kloud.ShortDuration(left), kloud.ShortDuration(time.Duration(m.Idle.EffectiveTimeoutSeconds)*time.Second))
	}
	return fmt.Sprintf("stops after %s idle", kloud.ShortDuration(time.Duration(m.Idle.EffectiveTimeoutSeconds)*time.Second))
}

// templateIdleText describes a template's idle settings.
func templateIdleText(s model.IdleSettings) string {
	var parts []string
	switch {
	case s.TimeoutSeconds == nil:
		parts = append(parts, "kloud's idle timeout")
	case *s.TimeoutSeconds == 0:
		parts = append(parts, "never stopped")
	default:
		parts = append(parts, "stopped after "+kloud.ShortDuration(time.Duration(*s.TimeoutSeconds)*time.Second)+" idle")
	}
	if s.AlwaysOn != nil && *s.AlwaysOn {
		parts = append(parts, "always on")
	}
	return strings.Join(parts, ", ")
}

// autostartText describes a machine's start schedule and its next start.
func autostartText(a *model.Autostart) string {
	next := a.Next
	if loc, err := time.LoadLocation(a.TZ); err == nil {
		next = next.In(loc)
	}
	return fmt.Sprintf("%s %s (next start %s)", a.Schedule, a.TZ, next.Format("Mon 2006-01-02 15:04 MST"))
}
