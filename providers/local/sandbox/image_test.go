package sandbox

import (
	"context"
	"slices"
	"strings"
	"testing"
)

func TestParseAptSources(t *testing.T) {
	deb822 := `Types: deb
URIs: http://mirror.invalid/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.invalid/debian-security
Suites: bookworm-security
Components: main

Enabled: no
Types: deb-src
URIs: http://src.invalid/debian
Suites: bookworm
Components: main
`
	es := parseDeb822([]byte(deb822))
	if len(es) != 3 {
		t.Fatalf("parsed %d stanzas: %+v", len(es), es)
	}
	if es[0].uris[0] != "http://mirror.invalid/debian" || !slices.Equal(es[0].suites, []string{"bookworm", "bookworm-updates"}) || !es[0].enabled {
		t.Errorf("first stanza: %+v", es[0])
	}
	if es[2].enabled || es[2].types[0] != "deb-src" {
		t.Errorf("third stanza: %+v", es[2])
	}
	one := parseOneLine([]byte("# comment\ndeb [arch=amd64 signed-by=/k.gpg] http://one.invalid/debian bookworm main contrib\ndeb http://two.invalid/debian-security bookworm-security main\n"))
	if len(one) != 2 || one[0].uris[0] != "http://one.invalid/debian" || one[0].suites[0] != "bookworm" ||
		!slices.Equal(one[0].components, []string{"main", "contrib"}) {
		t.Errorf("one-line: %+v", one)
	}
}

func TestEnsureBaseImageWithoutMmdebstrap(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := EnsureBaseImage(context.Background(), t.TempDir(), nil)
	if err == nil || !strings.Contains(err.Error(), "mmdebstrap is not installed") {
		t.Fatalf("err = %v", err)
	}
}

func TestImageHashStable(t *testing.T) {
	if imageHash() != imageHash() || len(imageHash()) != 16 {
		t.Fatal("image hash is not stable")
	}
}
