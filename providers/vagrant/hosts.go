package vagrant

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kontrol"
	"github.com/kloud-dev/kloud/kontrol/kontrolapi"
)

// hostTokenTTL is the life of the token kloud sends with a vagrant.* call (one call).
const hostTokenTTL = 15 * time.Minute

// KontrolHosts finds vagrant hosts among the kites registered with k (kloud's own kontrol): a
// kite named kontrolapi.VagrantHostName of the owner, registered with a kite key (kontrol refuses
// the name to agent keys; an agent's kite id is refused here too).
func KontrolHosts(k *kontrol.Kontrol) Hosts { return kontrolHosts{k} }

type kontrolHosts struct{ k *kontrol.Kontrol }

func (h kontrolHosts) Host(ctx context.Context, owner, want string) (*Host, error) {
	found := h.k.Lookup(kite.Identity{Username: owner, Name: kontrolapi.VagrantHostName, ID: want})
	for _, ki := range found {
		if strings.HasPrefix(ki.Kite.ID, kitekey.AgentIDPrefix) {
			continue
		}
		c := h.k.Conn(ki.Kite.ID)
		if c == nil {
			continue
		}
		tok, err := h.k.Signer().Token(owner, ki.Kite.ID, hostTokenTTL)
		if err != nil {
			return nil, fmt.Errorf("token for vagrant host %s: %w", ki.Kite.ID, err)
		}
		return &Host{KiteID: ki.Kite.ID, Conn: c, Token: tok}, nil
	}
	if want != "" {
		return nil, fmt.Errorf("the vagrant host %s of %s is not connected: start `klient --vagrant` there again: %w", want, owner, kite.ErrUnavailable)
	}
	return nil, fmt.Errorf("%s has no vagrant host connected: run `klient --vagrant --kite-key KEY` on a host with Vagrant (KEY: `kloud key create --username %s`): %w", owner, owner, kite.ErrUnavailable)
}
