package webterm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kloud-dev/kloud/internal/atomicfile"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/userdata"
)

// account is a machine account's entry in the machine's /etc/passwd (the owner's, or a shared
// user's own).
type account struct {
	Name       string
	UID, GID   uint32
	Gecos      string
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
		return nil, fmt.Errorf("account %q has no entry in %s/etc/passwd", name, strings.TrimSuffix(root, "/"))
	case err != nil:
		return nil, fmt.Errorf("account %q: %w", name, err)
	}
	if a.Shell == "" {
		a.Shell = "/bin/sh"
	}
	switch {
	case euid == 0:
		a.Groups, err = readGroups(filepath.Join(root, "etc/group"), name, a.GID)
		if err != nil {
			return nil, fmt.Errorf("account %q: %w", name, err)
		}
		if a.UID != 0 {
			a.Credential = &syscall.Credential{Uid: a.UID, Gid: a.GID, Groups: a.Groups}
		}
	case int(a.UID) == euid:
		// klient runs as the owner: the shell does too.
	default:
		return nil, fmt.Errorf("account %q is uid %d, but klient runs as uid %d without root: it cannot start a shell as another user", name, a.UID, euid)
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
		return &account{Name: name, UID: uint32(uid), GID: uint32(gid), Gecos: fs[4], Home: fs[5], Shell: fs[6]}, nil
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

// Shared users' accounts. A user a machine is shared with by a terminal grant gets shells as
// their own account on the machine, never the owner's: created on demand by klient (useradd,
// home under /home, bash, locked password, no supplementary groups, so no sudo), named after the
// kloud user. klient marks the accounts it made in the GECOS field and never hands out an
// account it did not make: if the name is taken (a system account, the owner, anything the
// machine's image or user data created), the shell is refused with the reason.

// SharedAccountGecos starts the GECOS field of the accounts klient creates for shared users.
const SharedAccountGecos = "kloud shared user"

// minSharedUID is the lowest uid a shared user's account may have (Debian's UID_MIN): system
// accounts and root are below it.
const minSharedUID = 1000

// SharedAccountName is the machine account of the kloud user user: the username itself, which
// kloud restricts to [a-z][a-z0-9-]{1,31} (valid for useradd, no ':' or '/'). Other names are
// refused.
func SharedAccountName(user string) (string, error) {
	if !klientapi.AccountName.MatchString(user) {
		return "", fmt.Errorf("user %q cannot have an account on this machine: want 1-32 of a-z, 0-9 and '-', starting with a letter: %w", user, kite.ErrInvalidParams)
	}
	return user, nil
}

// SharedAccount returns the machine account for the shared kloud user user, creating it if
// needed (klient must be root). root is the machine's root ("/" on a machine; tests pass a
// directory and the account is made there with useradd --prefix). It refuses an existing
// account klient did not create, or one with a system uid.
func SharedAccount(ctx context.Context, root, user string) (string, error) {
	name, err := SharedAccountName(user)
	if err != nil {
		return "", err
	}
	if root == "" {
		root = "/"
	}
	check := func() (bool, error) {
		a, err := readPasswd(filepath.Join(root, "etc/passwd"), name)
		switch {
		case errors.Is(err, errNoAccount):
			return false, nil
		case err != nil:
			return false, fmt.Errorf("account %q: %w: %w", name, err, kite.ErrState)
		case !strings.HasPrefix(a.Gecos, SharedAccountGecos) || a.UID < minSharedUID:
			return false, fmt.Errorf("this machine already has an account %q that kloud did not create for a shared user (uid %d, %q); klient will not give %s a shell as it: %w",
				name, a.UID, a.Gecos, user, kite.ErrPermission)
		}
		return true, nil
	}
	if ok, err := check(); err != nil {
		return "", err
	} else if ok {
		if os.Geteuid() == 0 {
			if err := unexpire(ctx, root, name); err != nil { // revoked before, shared again
				return "", fmt.Errorf("account %q: %w: %w", name, err, kite.ErrState)
			}
		}
		return name, nil
	}
	if os.Geteuid() != 0 {
		return "", fmt.Errorf("%s needs an account of their own on this machine, and klient is not root, so it cannot create one: %w", user, kite.ErrState)
	}
	sharedAccountMu.Lock()
	defer sharedAccountMu.Unlock()
	if ok, err := check(); ok || err != nil { // made by a concurrent call
		return name, err
	}
	args := []string{"--create-home", "--shell", "/bin/bash", "--comment", SharedAccountGecos + " " + user,
		"--user-group", "--key", "UID_MIN=" + strconv.Itoa(minSharedUID), "--key", "HOME_MODE=0750"}
	if filepath.Clean(root) != "/" {
		args = append(args, "--prefix", root)
	}
	args = append(args, "--", name)
	out, err := exec.CommandContext(ctx, "useradd", args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("create account %q for %s: useradd: %w: %s: %w", name, user, err, strings.TrimSpace(string(out)), kite.ErrState)
	}
	if ok, err := check(); !ok || err != nil {
		return "", fmt.Errorf("create account %q for %s: useradd succeeded but the account is not there (%v): %w", name, user, err, kite.ErrState)
	}
	return name, nil
}

var sharedAccountMu sync.Mutex

// RevokeSharedAccount ends what the shared kloud user user left running as their own account
// on the machine (every process of its uid) and expires the account, so nothing logs in as it
// (not even with an ssh key they added) until SharedAccount is asked for them again. It does
// nothing to an account klient did not create, or if there is none. It returns how many
// processes it killed.
func RevokeSharedAccount(ctx context.Context, root, user string) (int, error) {
	name, err := SharedAccountName(user)
	if err != nil {
		return 0, nil // never had an account
	}
	if root == "" {
		root = "/"
	}
	a, err := readPasswd(filepath.Join(root, "etc/passwd"), name)
	switch {
	case errors.Is(err, errNoAccount):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("revoke account %q: %w", name, err)
	case !strings.HasPrefix(a.Gecos, SharedAccountGecos) || a.UID < minSharedUID:
		return 0, nil
	case os.Geteuid() != 0:
		return 0, fmt.Errorf("revoke account %q: klient is not root", name)
	}
	sharedAccountMu.Lock()
	defer sharedAccountMu.Unlock()
	if err := usermod(ctx, root, name, "--expiredate", "1"); err != nil {
		return 0, err
	}
	killed, err := killAll(a.UID)
	if err != nil {
		return killed, fmt.Errorf("revoke account %q: %w", name, err)
	}
	return killed, nil
}

// unexpire lifts RevokeSharedAccount's expiry of name, if the account is expired.
func unexpire(ctx context.Context, root, name string) error {
	b, err := os.ReadFile(filepath.Join(root, "etc/shadow"))
	if err != nil {
		return nil // no shadow file: nothing expired there
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Split(l, ":"); len(f) >= 8 && f[0] == name && f[7] != "" {
			return usermod(ctx, root, name, "--expiredate", "")
		}
	}
	return nil
}

func usermod(ctx context.Context, root, name string, args ...string) error {
	return shadowTool(ctx, "usermod", root, name, args...)
}

// shadowTool runs tool (usermod, groupmod) with args on account or group name of the machine at
// root (--prefix unless root is "/").
func shadowTool(ctx context.Context, tool, root, name string, args ...string) error {
	if filepath.Clean(root) != "/" {
		args = append(args, "--prefix", root)
	}
	args = append(args, "--", name)
	if out, err := exec.CommandContext(ctx, tool, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", tool, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// processesOf lists the live (not zombie) processes whose real, effective, saved or filesystem uid is uid.
func processesOf(uid uint32) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	want := strconv.FormatUint(uint64(uid), 10)
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		zombie := false
		for _, l := range strings.Split(string(b), "\n") {
			if rest, ok := strings.CutPrefix(l, "State:"); ok {
				zombie = strings.HasPrefix(strings.TrimSpace(rest), "Z") // dead, waiting to be reaped
			}
			if rest, ok := strings.CutPrefix(l, "Uid:"); ok {
				if !zombie && slices.Contains(strings.Fields(rest), want) {
					out = append(out, pid)
				}
				break
			}
		}
	}
	return out
}

// AccountHome returns the home directory, uid and gid of machine account name, found as a
// shell for it would be (root/etc/passwd, or klient's own account when klient runs as name):
// where klient writes files for the account (klient.setBuckets).
func AccountHome(root, name string) (home string, uid, gid int, err error) {
	a, err := lookupAccount(root, name)
	if err != nil {
		return "", 0, 0, err
	}
	return a.Home, int(a.UID), int(a.GID), nil
}

// The owner's account when a machine changes hands (klient.adopt: a prebuilt stack claimed).

// RenameOwnerAccount renames the machine owner's account oldName, as kloud's user data made it
// (GECOS userdata.OwnerGecos), to newName: its login and user group, its home /home/<old> moved
// to /home/<new> (a home elsewhere stays where it is), and its sudo rule in cloud-init's
// sudoers file. The uid stays, so everything the account owns stays its own. On a machine's
// own root ("/") every process of the account is killed first (usermod refuses to rename an
// account in use; what the template's user data started as the old owner ends). It reports
// "renamed"; "already" if newName is the owner's account and oldName is gone (renamed before);
// "none" if neither exists (a klient whose machine has no owner account). It refuses to touch an
// account kloud's user data did not make, or to rename onto an existing account.
func RenameOwnerAccount(ctx context.Context, root, oldName, newName string) (string, error) {
	if root == "" {
		root = "/"
	}
	if _, err := SharedAccountName(newName); err != nil {
		return "", err
	}
	passwd := filepath.Join(root, "etc/passwd")
	oldA, oldErr := readPasswd(passwd, oldName)
	newA, newErr := readPasswd(passwd, newName)
	for _, err := range []error{oldErr, newErr} {
		if err != nil && !errors.Is(err, errNoAccount) {
			return "", fmt.Errorf("owner account: %w: %w", err, kite.ErrState)
		}
	}
	switch {
	case oldErr != nil && newErr != nil:
		return "none", nil
	case oldErr != nil && strings.HasPrefix(newA.Gecos, userdata.OwnerGecos):
		return "already", nil
	case newErr == nil:
		return "", fmt.Errorf("this machine already has an account %q (uid %d, %q): the owner's account %q cannot take its name: %w",
			newName, newA.UID, newA.Gecos, oldName, kite.ErrState)
	case !strings.HasPrefix(oldA.Gecos, userdata.OwnerGecos):
		return "", fmt.Errorf("account %q is not the owner account kloud's user data made (%q): klient will not rename it: %w", oldName, oldA.Gecos, kite.ErrState)
	case os.Geteuid() != 0:
		return "", fmt.Errorf("klient is not root: it cannot rename the owner's account %q: %w", oldName, kite.ErrState)
	}
	ownerAccountMu.Lock()
	defer ownerAccountMu.Unlock()
	if filepath.Clean(root) == "/" {
		if _, err := killAll(oldA.UID); err != nil {
			return "", fmt.Errorf("owner account %q: %w: %w", oldName, err, kite.ErrState)
		}
	}
	args := []string{"--login", newName}
	if oldA.Home == "/home/"+oldName {
		args = append(args, "--home", "/home/"+newName, "--move-home")
	}
	if err := usermod(ctx, root, oldName, args...); err != nil {
		return "", fmt.Errorf("rename the owner's account: %w: %w", err, kite.ErrState)
	}
	if hasGroup(root, oldName) {
		if err := shadowTool(ctx, "groupmod", root, oldName, "--new-name", newName); err != nil {
			return "", fmt.Errorf("rename the owner's group: %w: %w", err, kite.ErrState)
		}
	}
	if err := renameSudoRule(filepath.Join(root, cloudInitSudoers), oldName, newName); err != nil {
		return "", fmt.Errorf("rename the owner's sudo rule: %w: %w", err, kite.ErrState)
	}
	return "renamed", nil
}

var ownerAccountMu sync.Mutex

// cloudInitSudoers is where cloud-init writes the sudo rules of the users it creates.
const cloudInitSudoers = "etc/sudoers.d/90-cloud-init-users"

// killAll kills every process of uid until none is left (a process may fork while we look) and
// returns how many it killed.
func killAll(uid uint32) (int, error) {
	killed := 0
	for range 20 {
		pids := processesOf(uid)
		if len(pids) == 0 {
			return killed, nil
		}
		for _, pid := range pids {
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				killed++
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return killed, fmt.Errorf("processes of uid %d keep appearing", uid)
}

// hasGroup reports whether root/etc/group has a group name.
func hasGroup(root, name string) bool {
	b, err := os.ReadFile(filepath.Join(root, "etc/group"))
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if n, _, ok := strings.Cut(l, ":"); ok && n == name {
			return true
		}
	}
	return false
}

// renameSudoRule rewrites old's rule in a sudoers file ("old ALL=(ALL) NOPASSWD:ALL", and
// cloud-init's "# User rules for old" above it) for new, keeping its mode; no file: nothing to do.
func renameSudoRule(path, oldName, newName string) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	lines := strings.Split(string(b), "\n")
	for i, l := range lines {
		if rest, ok := strings.CutPrefix(l, oldName+" "); ok {
			lines[i] = newName + " " + rest
		} else if l == "# User rules for "+oldName {
			lines[i] = "# User rules for " + newName
		}
	}
	return atomicfile.WriteFile(path, []byte(strings.Join(lines, "\n")), fi.Mode().Perm())
}
