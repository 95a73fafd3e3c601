package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// CollPlugins holds the presence record of each provider plugin connected to a kloud replica
// (pluginpresence.go).
const CollPlugins = "plugins"

// PluginRecord says which kloud replica holds a provider plugin's connection, so that the other
// replicas forward the plugin's calls there (kloud/mesh.go): the provider's name, the replica,
// the connection's session (a random id: a record is removed only by the connection that wrote
// it), and what the plugin registered with (its manifest as JSON, its version and plugin API
// version, where it runs).
type PluginRecord struct {
	Name        string    `bson:"_id" json:"name"`
	Replica     string    `bson:"replica" json:"replica"`
	Session     string    `bson:"session" json:"session"`
	Manifest    string    `bson:"manifest" json:"manifest"`
	Version     string    `bson:"version" json:"version"`
	APIVersion  int       `bson:"apiVersion" json:"apiVersion"`
	Where       string    `bson:"where" json:"where"`
	ConnectedAt time.Time `bson:"connectedAt" json:"connectedAt"`
}

// Plugins stores plugin presence records (_id = provider name).
type Plugins struct{ s *Store }

// Plugins returns the plugin presence API.
func (s *Store) Plugins() *Plugins { return &Plugins{s} }

func (p *Plugins) coll() *mongo.Collection { return p.s.Collection(CollPlugins) }

// Set writes the record of a plugin that registered (one replace by name: the newest
// registration, on whichever replica, is the one its calls go to).
func (p *Plugins) Set(ctx context.Context, r PluginRecord) error {
	if r.Name == "" || r.Replica == "" || r.Session == "" {
		return errors.New("plugin presence: a name, a replica and a session are required")
	}
	if r.ConnectedAt.IsZero() {
		r.ConnectedAt = p.s.Now()
	}
	r.ConnectedAt = r.ConnectedAt.UTC()
	if _, err := p.coll().ReplaceOne(ctx, bson.M{"_id": r.Name}, r, options.Replace().SetUpsert(true)); err != nil {
		return fmt.Errorf("plugin presence %q: %w", r.Name, err)
	}
	return nil
}

// Remove deletes name's record if the connection session still owns it (the plugin may have
// registered again, here or on another replica, meanwhile) and reports whether it did.
func (p *Plugins) Remove(ctx context.Context, name, session string) (bool, error) {
	res, err := p.coll().DeleteOne(ctx, bson.M{"_id": name, "session": session})
	if err != nil {
		return false, fmt.Errorf("remove plugin presence %q: %w", name, err)
	}
	return res.DeletedCount == 1, nil
}

// Get returns name's record, or an error wrapping [ErrNotFound].
func (p *Plugins) Get(ctx context.Context, name string) (PluginRecord, error) {
	return findOne[PluginRecord](ctx, p.coll(), "plugin presence", name, bson.M{"_id": name})
}

// List returns every record, sorted by name.
func (p *Plugins) List(ctx context.Context) ([]PluginRecord, error) {
	out, err := findAll[PluginRecord](ctx, p.coll(), bson.M{}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("list plugin presence: %w", err)
	}
	return out, nil
}

// RemoveReplica deletes the records replica holds (it died, or leaves) and returns how many.
func (p *Plugins) RemoveReplica(ctx context.Context, replica string) (int64, error) {
	res, err := p.coll().DeleteMany(ctx, bson.M{"replica": replica})
	if err != nil {
		return 0, fmt.Errorf("remove replica %q's plugin presence: %w", replica, err)
	}
	return res.DeletedCount, nil
}
