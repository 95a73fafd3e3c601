package cli

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kloud-dev/kloud/kloud"
)

// serveSSO is kloud serve's single sign-on flags (kloud/login).
type serveSSO struct {
	secretFile string
	scopes     []string
}

func (f *serveSSO) flags(cmd *cobra.Command, o *kloud.SSOOptions) {
	fl := cmd.Flags()
	fl.StringVar(&o.Issuer, "oidc-issuer", "", "OpenID Connect provider's issuer URL: the login page offers \"Sign in with SSO\" beside passwords (register <public URL>"+kloud.SSOCallbackPath+" as its redirect URI)")
	fl.StringVar(&o.ClientID, "oidc-client-id", "", "kloud's client id at the OpenID provider")
	fl.StringVar(&f.secretFile, "oidc-client-secret-file", "", "file whose first line is kloud's client secret at the OpenID provider")
	fl.StringVar(&o.GroupsClaim, "oidc-groups-claim", kloud.DefaultSSOGroupsClaim, "ID token or userinfo claim listing the user's groups: a group naming a kloud team makes the user a member")
	fl.StringSliceVar(&f.scopes, "oidc-scopes", kloud.DefaultSSOScopes(), "scopes to request (openid is always added; add groups for providers that want it)")
}

// apply checks the flags and reads the secret into o.
func (f *serveSSO) apply(o *kloud.SSOOptions) error {
	if o.Issuer == "" {
		if o.ClientID != "" || f.secretFile != "" {
			return errors.New("--oidc-client-id and --oidc-client-secret-file need --oidc-issuer")
		}
		return nil
	}
	if o.ClientID == "" {
		return errors.New("--oidc-issuer needs --oidc-client-id (and --oidc-client-secret-file)")
	}
	if f.secretFile == "" {
		return errors.New("--oidc-issuer needs --oidc-client-secret-file: a file holding kloud's client secret at the provider")
	}
	b, err := os.ReadFile(f.secretFile)
	if err != nil {
		return fmt.Errorf("--oidc-client-secret-file: %w", err)
	}
	secret, _, _ := strings.Cut(string(b), "\n")
	if o.ClientSecret = strings.TrimSpace(secret); o.ClientSecret == "" {
		return fmt.Errorf("--oidc-client-secret-file %s: the first line is empty", f.secretFile)
	}
	o.Scopes = f.scopes
	return nil
}
