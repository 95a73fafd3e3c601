package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
)

// `kloud provider list` and `kloud provider install`: providers in-tree and out of process
// (provider plugins, kloud/pluginhost); `kloud key create --provider` is in cli.go.

func providerListCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List every provider: built in or plugin, version, where it runs, connected, capabilities, last error",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := call0(cmd.Context(), g, (*api.Client).ProviderList)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(res.Providers)
			}
			tw := newTable(g.stdout, "NAME", "KIND", "VERSION", "WHERE", "CONNECTED", "CAPABILITIES", "LAST-ERROR")
			for _, p := range res.Providers {
				tw.row(p.Name, p.Kind, p.Version, p.Where, yesNo(p.Connected), strings.Join(p.Capabilities, ","), p.LastError)
			}
			return tw.flush()
		},
	}
}

func providerInstallCmd(g *globals) *cobra.Command {
	var (
		name, dir string
		wait      time.Duration
	)
	cmd := &cobra.Command{
		Use:   "install PATH [--name NAME] [--plugin-dir DIR]",
		Short: "Install a provider plugin binary into kloud's plugin directory; the running kloud starts it",
		Long: `Copy a provider plugin binary into the plugin directory of the kloud on this host, as
kloud-provider-NAME (mode 0755). NAME is --name, or taken from the file's name, which must then
be kloud-provider-NAME. The running kloud reads its plugin directory every few seconds: it starts
a new plugin (sandboxed: an unprivileged user, its own pid and mount namespaces, none of kloud's
files), and restarts one whose binary was replaced. This command then waits (--wait) until the
plugin is connected, and prints its line of ` + "`kloud provider list`" + `.

--plugin-dir must be the directory the kloud was started with (default <data dir>/plugins).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			src := args[0]
			if name == "" {
				n, ok := strings.CutPrefix(filepath.Base(src), kloud.PluginPrefix)
				if !ok {
					return fmt.Errorf("%s: a plugin binary is named %sNAME; pass --name NAME to install it under another name", src, kloud.PluginPrefix)
				}
				name = n
			}
			if err := kitekey.ValidProviderName(name); err != nil {
				return err
			}
			if dir == "" {
				dir = filepath.Join(g.dataDir, "plugins")
			}
			dst, err := installPlugin(src, dir, name)
			if err != nil {
				return err
			}
			if !g.json {
				fmt.Fprintf(g.stdout, "installed %s\n", dst)
			}
			if wait <= 0 {
				return nil
			}
			st, err := waitPlugin(cmd.Context(), g, name, dst, wait)
			if g.json {
				if st == nil {
					st = &api.ProviderStatus{Name: name}
				}
				if perr := g.printJSON(st); perr != nil {
					return perr
				}
			} else if st != nil {
				fmt.Fprintf(g.stdout, "provider %s: %s, version %s, %s, capabilities %s\n", st.Name, map[bool]string{true: "connected", false: "not connected"}[st.Connected],
					orDash(st.Version), st.Where, strings.Join(st.Capabilities, ","))
			}
			return err
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "provider name (default: from the file name kloud-provider-NAME)")
	cmd.Flags().StringVar(&dir, "plugin-dir", "", "kloud's plugin directory (default <data dir>/plugins)")
	cmd.Flags().DurationVar(&wait, "wait", 30*time.Second, "wait this long for the running kloud to start the plugin and for it to connect (0: do not wait)")
	return cmd
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// installPlugin copies src to dir/kloud-provider-NAME, mode 0755, through a temporary name and a
// rename, so kloud never starts a half-written binary.
func installPlugin(src, dir, name string) (string, error) {
	in, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file", src)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("plugin directory: %w", err)
	}
	dst := filepath.Join(dir, kloud.PluginPrefix+name)
	tmp, err := os.CreateTemp(dir, ".install-"+name+"-")
	if err != nil {
		return "", fmt.Errorf("plugin directory: %w", err)
	}
	defer os.Remove(tmp.Name()) // gone after the rename
	if _, err := io.Copy(tmp, in); err != nil {
		tmp.Close()
		return "", fmt.Errorf("copy %s: %w", src, err)
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", fmt.Errorf("install %s: %w", dst, err)
	}
	return dst, nil
}

// waitPlugin waits until provider.list shows name connected (launched after dst was
// installed), and returns its status.
func waitPlugin(ctx context.Context, g *globals, name, dst string, wait time.Duration) (*api.ProviderStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	installed := time.Now()
	var last *api.ProviderStatus
	for {
		res, err := call0(ctx, g, (*api.Client).ProviderList)
		if err != nil && ctx.Err() == nil {
			return nil, fmt.Errorf("installed %s, but cannot ask kloud whether it started it: %w", dst, err)
		}
		for _, p := range res.Providers {
			if p.Name == name {
				last = &p
			}
		}
		if last != nil && last.Connected && last.ConnectedAt != nil && last.ConnectedAt.After(installed) {
			return last, nil
		}
		select {
		case <-ctx.Done():
			why := "kloud did not list it yet (is it running, with this plugin directory?)"
			if last != nil && last.LastError != "" {
				why = "last error: " + last.LastError
			} else if last != nil {
				why = "it is listed but not connected (" + last.Where + ")"
			}
			return last, errors.New("installed " + dst + ", but the plugin did not connect within " + wait.String() + ": " + why)
		case <-time.After(300 * time.Millisecond):
		}
	}
}
