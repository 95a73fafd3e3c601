package cli

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestServeS3Flags: kloud serve refuses S3 settings that cannot work, before it starts anything,
// and without a weed binary it runs with buckets off (and says so).
func TestServeS3Flags(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	secret := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secret, []byte("s3cr3t\n"), 0o600)
	for _, c := range []struct {
		s3   serveS3
		want string
	}{
		{serveS3{mode: "bogus"}, `--s3 "bogus": want auto or off`},
		{serveS3{mode: "off", url: "http://10.0.0.5:8333"}, "--s3 off and --s3-url: choose one"},
		{serveS3{mode: "auto", url: "http://10.0.0.5:8333"}, "--s3-url needs --s3-master"},
		{serveS3{mode: "auto", url: "http://10.0.0.5:8333", master: "10.0.0.5:9333.19333", access: "AK", secretF: filepath.Join(t.TempDir(), "none")}, "--s3-secret-key-file"},
		{serveS3{mode: "auto", url: "http://10.0.0.5:8333", master: "10.0.0.5:9333.19333", access: "AK", secretF: secret, weedBin: ""}, "pass --weed-bin"},
	} {
		t.Setenv(EnvWeed, "")
		f := &serveFlags{}
		f.o.Addr, f.o.DataDir = "127.0.0.1:0", t.TempDir()
		err := c.s3.start(t.Context(), f, log, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error saying %q", c.s3, err, c.want)
		}
	}
	// An external SeaweedFS: the provisioner is set up (nothing started), with the secret read.
	t.Setenv(EnvWeed, "/usr/local/bin/weed")
	ext := serveS3{mode: "auto", url: "http://10.0.0.5:8333", master: "10.0.0.5:9333.19333", access: "AK", secretF: secret}
	if err := ext.start(t.Context(), &serveFlags{}, log, io.Discard); err != nil || ext.srv != nil || ext.popts == nil || ext.popts.AdminSecretKey != "s3cr3t" {
		t.Fatalf("external: %v, server %v, options %+v", err, ext.srv, ext.popts)
	}
	if p := ext.provisioner("inst", func(string) string { return "http://elsewhere" }, log); p == nil {
		t.Error("external: no provisioner")
	}
	// No weed: kloud runs, buckets off.
	t.Setenv(EnvWeed, "")
	none := serveS3{mode: "auto", weedBin: filepath.Join(t.TempDir(), "weed")}
	f := &serveFlags{}
	f.o.Addr, f.o.DataDir = "127.0.0.1:0", t.TempDir()
	if err := none.start(t.Context(), f, log, io.Discard); err != nil || none.provisioner("inst", nil, log) != nil {
		t.Errorf("without weed: %v; want buckets off and no error", err)
	}
}
