// Command klient is the Kloud agent; see package klient.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/kloud-dev/kloud/internal/logfmt"
	"github.com/kloud-dev/kloud/internal/tlsconf"
	"github.com/kloud-dev/kloud/internal/version"
	"github.com/kloud-dev/kloud/klient"
	"github.com/kloud-dev/kloud/klient/sshserver"
	"github.com/kloud-dev/kloud/klient/webterm"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == webterm.HolderArg { // a terminal session's holder
		os.Exit(webterm.HolderMain())
	}
	if len(os.Args) == 2 && os.Args[1] == klient.SFTPServerArg { // re-executed as an account (klient/ssh.go)
		if err := sshserver.ServeSFTP(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "klient sftp-server:", err)
			os.Exit(1)
		}
		return
	}
	var o klient.Options
	flag.StringVar(&o.KiteKeyFile, "kite-key", "/etc/kloud/kite.key", "kite key file (written by cloud-init)")
	flag.StringVar(&o.KontrolURL, "kontrol-url", "", "kontrol kite URL (default: from the kite key)")
	flag.StringVar(&o.Owner, "owner", "", "the machine owner's username (default: the agent key's owner claim; must match it)")
	flag.StringVar(&o.Environment, "environment", "default", "kite environment")
	flag.StringVar(&o.Region, "region", "default", "kite region")
	flag.StringVar(&o.Listen, "listen", "", "also accept direct kite connections on this address (e.g. :56789)")
	flag.StringVar(&o.Root, "root", "/", "directory the machine's files live under (for machines that are a directory of a host)")
	flag.StringVar(&o.StateDir, "state-dir", "", "directory for what klient keeps across restarts (default <root>/var/lib/kloud/klient)")
	flag.IntVar(&o.Terminal.Scrollback, "webterm-scrollback", webterm.DefaultScrollback, "bytes of recent output a terminal session replays on attach")
	flag.DurationVar(&o.Terminal.IdleTimeout, "webterm-idle-timeout", webterm.DefaultIdleTimeout, "end a terminal session that has had no viewer for this long")
	flag.IntVar(&o.Terminal.MaxSessionsPerUser, "webterm-max-sessions", webterm.DefaultMaxSessionsPerUser, "terminal sessions one user may have at once")
	flag.StringVar(&o.Terminal.SessionDir, "session-dir", klient.SessionDirAuto, "directory of the terminal sessions' holder sockets: shells live in holder processes there and survive klient's restarts and upgrades (\"auto\": "+klient.DefaultSessionDir+" when klient runs as root with --root /, else shells end with klient; \"\": off)")
	vagrantHost := flag.Bool("vagrant", false, "be the owner's vagrant host: serve vagrant.* (kloud's vagrant provider builds machines here with the host's Vagrant); needs the owner's kite key")
	var vo klient.VagrantOptions
	flag.StringVar(&vo.Home, "vagrant-home", "", "with --vagrant: where machines and Vagrant's data live (default <state-dir>/vagrant)")
	flag.StringVar(&vo.Binary, "vagrant-bin", "vagrant", "with --vagrant: the vagrant command")
	caCert := flag.String("ca-cert", os.Getenv(tlsconf.EnvCACert), "PEM file of a CA to trust beside the system's when kloud's URL is https/wss (env "+tlsconf.EnvCACert+"; cloud-init writes /etc/kloud/ca.pem when kloud needs it)")
	logFormat := flag.String("log-format", logfmt.Text, logfmt.Usage)
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println("klient", version.Version)
		return
	}
	if *vagrantHost {
		o.Vagrant = &vo
	}
	var err error
	if o.Logger, err = logfmt.New(os.Stderr, *logFormat, slog.LevelInfo); err != nil {
		fmt.Fprintln(os.Stderr, "klient:", err)
		os.Exit(2)
	}
	if *caCert != "" {
		cfg, err := tlsconf.Client(*caCert)
		if err != nil {
			fmt.Fprintln(os.Stderr, "klient:", err)
			os.Exit(2)
		}
		o.TLSConfig = cfg
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	kl, err := klient.New(o)
	if err == nil {
		err = kl.Run(ctx)
	}
	if bin, ok := klient.IsRestart(err); ok { // upgraded: become the new binary, same pid
		stop()
		err = syscall.Exec(bin, append([]string{bin}, os.Args[1:]...), os.Environ())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "klient:", err)
		os.Exit(1)
	}
}
