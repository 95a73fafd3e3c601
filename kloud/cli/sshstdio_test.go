package cli

import (
	"strings"
	"testing"
)

// TestReplaceSSHBlock: config-ssh's block goes in, is replaced and is removed, and the user's
// lines around it stay byte for byte.
func TestReplaceSSHBlock(t *testing.T) {
	block := sshBlockStart + "\nHost kloud--dev.0\n  User alice\n" + sshBlockEnd + "\n"
	block2 := sshBlockStart + "\nHost kloud--web.0\n  User alice\n" + sshBlockEnd + "\n"
	for _, mine := range []string{"", "Host a\n  User b\n", "Host a\n  User b", "# only a comment\n\n\n", "Host *\r\n  ServerAliveInterval 5\r\n"} {
		with, err := replaceSSHBlock(mine, block)
		if err != nil {
			t.Fatalf("%q: %v", mine, err)
		}
		if !strings.HasPrefix(with, mine) || !strings.HasSuffix(with, block) {
			t.Errorf("%q: with the block: %q", mine, with)
		}
		if again, _ := replaceSSHBlock(with, block); again != with {
			t.Errorf("%q: the same block again changed the file: %q", mine, again)
		}
		updated, _ := replaceSSHBlock(with, block2)
		if strings.Contains(updated, "dev.0") || !strings.Contains(updated, "web.0") || strings.Count(updated, sshBlockStart) != 1 {
			t.Errorf("%q: updated: %q", mine, updated)
		}
		removed, _ := replaceSSHBlock(updated, "")
		want := mine
		if mine != "" && !strings.HasSuffix(mine, "\n") {
			want += "\n" // the newline added before the block stays
		}
		if removed != want {
			t.Errorf("removed from %q: %q", mine, removed)
		}
	}
	// The block in the middle of the file: the lines after it stay too.
	mid := "Host a\n" + block + "Host b\n"
	if got, _ := replaceSSHBlock(mid, ""); got != "Host a\nHost b\n" {
		t.Errorf("removed from the middle: %q", got)
	}
	for _, broken := range []string{sshBlockStart + "\nHost x\n", "Host x\n" + sshBlockEnd + "\n"} {
		if _, err := replaceSSHBlock(broken, block); err == nil {
			t.Errorf("%q: one marker without the other was not refused", broken)
		}
	}
	if d := lineDiff("f", "a\nb\nc\n", "a\nB\nc\n"); !strings.Contains(d, "-b\n+B\n") || strings.Contains(d, "-a") {
		t.Errorf("lineDiff: %q", d)
	}
	if d := lineDiff("f", "a\n", "a\n"); d != "" {
		t.Errorf("lineDiff of equal texts: %q", d)
	}
}
