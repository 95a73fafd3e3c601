package webterm

import (
	"slices"
	"strings"
	"syscall"
)

// Account is a machine account as klient runs processes for it (klient/sshserver's commands):
// found as a shell for it would be (root/etc/passwd and /etc/group, or klient's own account when
// klient runs as it).
type Account struct {
	Name, Home, Shell string
	UID, GID          uint32
	// Credential is what a process started for the account runs with (nil: as klient, when
	// klient runs as the account, or the account is root).
	Credential *syscall.Credential
	// Env is the environment of a login shell of the account (TERM, HOME, USER, LOGNAME,
	// SHELL, PATH, and klient's LANG, LC_ALL, TZ).
	Env []string
}

// LookupAccount returns machine account name under root ("/" on a machine).
func LookupAccount(root, name string) (Account, error) {
	a, err := lookupAccount(root, name)
	if err != nil {
		return Account{}, err
	}
	env := slices.DeleteFunc(a.env(""), func(kv string) bool { return strings.HasPrefix(kv, "KLOUD_SESSION=") })
	return Account{Name: a.Name, Home: a.Home, Shell: a.Shell, UID: a.UID, GID: a.GID, Credential: a.Credential, Env: env}, nil
}
