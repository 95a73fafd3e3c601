package kite_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/kloud-dev/kloud/kite"
)

// TestLogHandler: a line logged with a call's ctx carries requestId, user and method; a line
// with a user of its own keeps it; a line without such a ctx gets none.
func TestLogHandler(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(kite.LogHandler(slog.NewJSONHandler(&buf, nil))).With("kite", "kloud")
	ctx := kite.WithRequestInfo(context.Background(), kite.RequestInfo{ID: kite.NewRequestID(), Method: "user.add", User: "admin"})
	log.InfoContext(ctx, "one")
	log.InfoContext(ctx, "user added", "user", "bob")
	log.Info("no call")
	var lines []map[string]any
	dec := json.NewDecoder(&buf)
	for dec.More() {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, m)
	}
	if len(lines) != 3 {
		t.Fatalf("%d lines: %v", len(lines), lines)
	}
	id, _ := lines[0]["requestId"].(string)
	if len(id) != 16 || lines[0]["user"] != "admin" || lines[0]["method"] != "user.add" || lines[0]["kite"] != "kloud" {
		t.Errorf("line of a call: %v", lines[0])
	}
	if lines[1]["requestId"] != id || lines[1]["user"] != "bob" {
		t.Errorf("line with its own user: %v", lines[1])
	}
	if _, ok := lines[2]["requestId"]; ok {
		t.Errorf("line without a call: %v", lines[2])
	}
}
