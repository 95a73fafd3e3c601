package kite

import (
	"fmt"
	"strings"
)

// Identity names a kite. Its string form runs from general to specific:
// /username/environment/name/version/region/hostname/id.
type Identity struct {
	Username    string `json:"username"`
	Environment string `json:"environment"`
	Name        string `json:"name"`
	Version     string `json:"version"`
	Region      string `json:"region"`
	Hostname    string `json:"hostname"`
	ID          string `json:"id"`
}

// String returns the 7-part form. Empty fields stay empty, so a query for an id alone reads
// "///////<id>".
func (i Identity) String() string {
	return "/" + strings.Join(i.fields(), "/")
}

func (i Identity) fields() []string {
	return []string{i.Username, i.Environment, i.Name, i.Version, i.Region, i.Hostname, i.ID}
}

// Fields returns the identity as a map of its JSON field names to values, leaving out empty
// fields. It is the form kontrol queries use.
func (i Identity) Fields() map[string]string {
	names := []string{"username", "environment", "name", "version", "region", "hostname", "id"}
	m := map[string]string{}
	for n, v := range i.fields() {
		if v != "" {
			m[names[n]] = v
		}
	}
	return m
}

// Validate checks that no field contains a slash and, if complete is set, that every field is
// set (what kontrol requires of a registering kite).
func (i Identity) Validate(complete bool) error {
	names := []string{"username", "environment", "name", "version", "region", "hostname", "id"}
	for n, v := range i.fields() {
		if strings.Contains(v, "/") {
			return fmt.Errorf("kite identity: %s %q contains '/'", names[n], v)
		}
		if len(v) > 256 {
			return fmt.Errorf("kite identity: %s is longer than 256 bytes", names[n])
		}
		if complete && v == "" {
			return fmt.Errorf("kite identity: %s is empty", names[n])
		}
	}
	return nil
}

// Matches reports whether i matches query q: every non-empty field of q must equal i's.
func (i Identity) Matches(q Identity) bool {
	qf, f := q.fields(), i.fields()
	for n := range qf {
		if qf[n] != "" && qf[n] != f[n] {
			return false
		}
	}
	return true
}
