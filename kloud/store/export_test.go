package store

import "context"

// EmbeddedURI returns the embedded FerretDB's URI, so a test can connect a second store to it
// the way another process would.
func EmbeddedURI(s *Store) string { return s.embedded.uri }

// Migration is a test-visible schema step.
type Migration = migration

// NewMigration builds a schema step.
func NewMigration(version int, name string, up func(ctx context.Context, s *Store) error) Migration {
	return migration{version: version, name: name, up: up}
}

// Migrate runs steps as Open runs the built-in ones.
func Migrate(ctx context.Context, s *Store, steps []Migration) error { return s.migrate(ctx, steps) }

// BuiltinMigrations returns the built-in steps.
func BuiltinMigrations() []Migration { return migrations }
