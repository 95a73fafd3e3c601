package webterm

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// account is the machine owner's entry in the machine's /etc/passwd.
type account struct {
	Name       string
	UID, GID   uint32
	Home       string
	Shell      string
	Groups     []uint32 // supplementary groups from /etc/group
	Credential *syscall.Credential
}

// errNoAccount says the owner has no entry in passwd.
var errNoAccount = errors.New("no such account")

// lookupAccount finds name in root/etc/passwd (and its groups in root/etc/group) and decides
// how to run a shell as that user: as its uid/gid when klient is root, as klient itself when
// klient already runs as that user. Anything else is an error that says why.
func lookupAccount(root, name string) (*account, error) {
	a, err := readPasswd(filepath.Join(root, "etc/passwd"), name)
	euid := os.Geteuid()
	switch {
	case errors.Is(err, errNoAccount) && euid != 0:
		// Not root and not in the machine's passwd: if the owner is who klient runs as, use
		// klient's own account.
		if u, uerr := user.Current(); uerr == nil && u.Username == name {
			shell := os.Getenv("SHELL")
			if shell == "" {
				shell = "/bin/sh"
			}
			return &account{Name: name, UID: uint32(euid), GID: uint32(os.Getegid()), Home: u.HomeDir, Shell: shell}, nil
		}
		return nil, fmt.Errorf("owner %q has no entry in %s/etc/passwd", name, strings.TrimSuffix(root, "/"))
	case err != nil:
		return nil, fmt.Errorf("owner %q: %w", name, err)
	}
	if a.Shell == "" {
		a.Shell = "/bin/sh"
	}
	switch {
	case euid == 0:
		a.Groups, err = readGroups(filepath.Join(root, "etc/group"), name, a.GID)
		if err != nil {
			return nil, fmt.Errorf("owner %q: %w", name, err)
		}
		if a.UID != 0 {
			a.Credential = &syscall.Credential{Uid: a.UID, Gid: a.GID, Groups: a.Groups}
		}
	case int(a.UID) == euid:
		// klient runs as the owner: the shell does too.
	default:
		return nil, fmt.Errorf("owner %q is uid %d, but klient runs as uid %d without root: it cannot start a shell as another user", name, a.UID, euid)
	}
	return a, nil
}

func readPasswd(path, name string) (*account, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, errNoAccount
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Split(sc.Text(), ":")
		if len(fs) < 7 || fs[0] != name {
			continue
		}
		uid, err1 := strconv.ParseUint(fs[2], 10, 32)
		gid, err2 := strconv.ParseUint(fs[3], 10, 32)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%s: bad uid or gid in the entry of %q", path, name)
		}
		return &account{Name: name, UID: uint32(uid), GID: uint32(gid), Home: fs[5], Shell: fs[6]}, nil
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return nil, errNoAccount
}

// readGroups returns the gids of the groups that list name as a member (and gid itself).
func readGroups(path, name string, gid uint32) ([]uint32, error) {
	out := []uint32{gid}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Split(sc.Text(), ":")
		if len(fs) < 4 || !slices.Contains(strings.Split(fs[3], ","), name) {
			continue
		}
		if g, err := strconv.ParseUint(fs[2], 10, 32); err == nil && !slices.Contains(out, uint32(g)) {
			out = append(out, uint32(g))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return out, nil
}

// env is the environment of a login shell of a.
func (a *account) env(session string) []string {
	path := "/usr/local/bin:/usr/bin:/bin"
	if a.UID == 0 {
		path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	env := []string{
		"TERM=xterm-256color", "COLORTERM=truecolor",
		"HOME=" + a.Home, "USER=" + a.Name, "LOGNAME=" + a.Name, "SHELL=" + a.Shell,
		"PATH=" + path, "KLOUD_SESSION=" + session,
	}
	for _, k := range []string{"LANG", "LC_ALL", "TZ"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}
