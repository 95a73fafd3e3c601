package cli

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/kloud-dev/kloud/kloud/store/storeserve"
)

func storeCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "store", Short: "Serve kloud's store to several kloud replicas (small deployments)"}
	cmd.AddCommand(storeServeCmd(g))
	return cmd
}

func storeServeCmd(g *globals) *cobra.Command {
	var sock, tcp, cert, key, clientCA, logLevel string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the embedded store (FerretDB on SQLite) over the MongoDB protocol to several kloud replicas",
		Long: `Serve the store in --data-dir (DATA_DIR/db/, the embedded store's layout and lock: a kloud's
own data directory can be served once that kloud is stopped) over the MongoDB wire protocol, for
several kloud replicas started with --mongo-url. The commands of all clients are executed one at
a time per database: FerretDB v1 is not atomic across connections, and this is what makes a
conditional single-document update atomic for all of them (docs/deployment.md, "The store").
A MongoDB replica set is the production store; this is the small-deployment one.

It listens on a unix socket (--socket, default DATA_DIR/store.sock, mode 0600: only this user
connects) and, with --listen HOST:PORT, on TCP with TLS that requires client certificates
signed by --tls-client-ca (--tls-cert and --tls-key are the server's): there is no TCP without
them. The first line on stdout is the mongodb:// URL of the socket once it accepts clients. It
stops on SIGTERM or SIGINT (commands in flight finish first).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := storeLogger(g, logLevel)
			if err != nil {
				return err
			}
			opts := storeserve.Options{DataDir: g.dataDir, Socket: sock, TCP: tcp, Logger: log}
			if tcp != "" || cert != "" || key != "" || clientCA != "" {
				if tcp == "" || cert == "" || key == "" || clientCA == "" {
					return errors.New("TCP needs all of --listen, --tls-cert, --tls-key and --tls-client-ca (the unix socket needs none)")
				}
				if opts.TLS, err = storeTLS(cert, key, clientCA); err != nil {
					return err
				}
			}
			srv, err := storeserve.New(opts)
			if err != nil {
				return err
			}
			fmt.Fprintln(g.stdout, srv.URL())
			if a := srv.TCPAddr(); a != nil {
				log.Info("store serve: TCP with client certificates", "addr", a.String())
			}
			log.Info("store serve: ready", "url", srv.URL(), "dataDir", g.dataDir)
			return srv.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&sock, "socket", "", "unix socket to serve (default DATA_DIR/store.sock; mode 0600)")
	f.StringVar(&tcp, "listen", "", "also serve TCP on HOST:PORT, TLS with client certificates only")
	f.StringVar(&cert, "tls-cert", "", "PEM certificate of the TCP listener")
	f.StringVar(&key, "tls-key", "", "PEM key of the TCP listener")
	f.StringVar(&clientCA, "tls-client-ca", "", "PEM CA that signs the clients' certificates (required with --listen)")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error (logs go to stderr)")
	return cmd
}

func storeLogger(g *globals, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	return slog.New(slog.NewTextHandler(g.stderr, &slog.HandlerOptions{Level: l})), nil
}

// storeTLS is the TCP listener's TLS: its certificate, and client certificates required and
// verified against clientCA.
func storeTLS(certFile, keyFile, caFile string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("--tls-client-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--tls-client-ca: no certificate in %s", caFile)
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
		MinVersion:   tls.VersionTLS12,
	}, nil
}
