package cli

import (
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/kloud-dev/kloud/kloud"
)

// kloud serve's --gc-interval and --gc-grace: defaults, durations, and 0 for "off" / "none"
// (kloud.GCOptions' negative), never its zero (which would mean "the default").
func TestGCServeFlags(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args     []string
		interval time.Duration
		grace    time.Duration
	}{
		{nil, kloud.DefaultGCInterval, kloud.DefaultGCGrace},
		{[]string{"--gc-interval", "1m", "--gc-grace", "30s"}, time.Minute, 30 * time.Second},
		{[]string{"--gc-interval", "0", "--gc-grace", "0s"}, -1, -1},
	} {
		var o kloud.GCOptions
		fl := pflag.NewFlagSet("serve", pflag.ContinueOnError)
		gcServeFlags(fl, &o)
		if err := fl.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		if o.Interval != c.interval || o.Grace != c.grace {
			t.Errorf("%v: interval %v grace %v, want %v %v", c.args, o.Interval, o.Grace, c.interval, c.grace)
		}
	}
	fl := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	gcServeFlags(fl, &kloud.GCOptions{})
	if err := fl.Parse([]string{"--gc-interval", "-5m"}); err == nil {
		t.Error("--gc-interval -5m: no error")
	}
	if def := fl.Lookup("gc-grace").DefValue; def != kloud.DefaultGCGrace.String() {
		t.Errorf("--gc-grace default shown as %q", def)
	}
}
