// Package logfmt makes the logger of kloud serve, terraformer and klient from their --log-format
// and --log-level flags: slog's text handler (default) or its JSON handler (one object a line),
// wrapped in kite.LogHandler so that each served call's lines carry requestId, user and method.
package logfmt

import (
	"fmt"
	"io"
	"log/slog"

	"github.com/kloud-dev/kloud/kite"
)

// Formats are the values --log-format takes.
const (
	Text = "text"
	JSON = "json"
)

// Usage is the --log-format flag's help.
const Usage = "log format: text (key=value lines) or json (one JSON object a line; each call's lines carry requestId, user and method)"

// New returns a logger writing to w in format (Text or JSON; "" is Text) at level and above.
func New(w io.Writer, format string, level slog.Level) (*slog.Logger, error) {
	o := &slog.HandlerOptions{Level: level}
	var h slog.Handler
	switch format {
	case Text, "":
		h = slog.NewTextHandler(w, o)
	case JSON:
		h = slog.NewJSONHandler(w, o)
	default:
		return nil, fmt.Errorf("--log-format %q: want text or json", format)
	}
	return slog.New(kite.LogHandler(h)), nil
}
