// Package storerace checks that a MongoDB-protocol server keeps single-document updates
// atomic with several writers: the guarantee kloud's store relies on when several kloud
// replicas share one database (kloud/store/doc.go). It is the check of `kloud doctor
// --mongo-url` and of the store server's race test (kloud/store/storeserve).
//
// Start with [Prepare], [Run] and [Check]: Prepare makes, in a scratch database, one claim
// document {_id, owner: null} and one compare-and-swap document {_id, v: 0} per round and one
// counter; Run (in as many processes and clients as wanted, at once) has each of its workers
// go through the rounds, each round (a) claiming the round's document ({_id, owner: null} →
// $set owner), (b) swapping its v from 0 to 1 ({_id, v: 0} → $set v: 1) and (c) incrementing
// the counter, and reports what it won; Check adds the reports up: a round claimed or swapped
// by more than one worker, and increments acknowledged but missing from the counter, are
// violations. On MongoDB or `kloud store serve` there are none; on FerretDB v1 with several
// connections there are many (docs/deployment.md, "The store").
package storerace

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// The scratch collections: the claim and compare-and-swap documents of roundsPerColl rounds
// per collection (raceClaims000, raceCas000, …): FerretDB v1 reads every document of a
// collection for a filter that is more than {_id}, so one collection of all rounds would make
// the race quadratic in its rounds.
const (
	collClaims    = "raceClaims"
	collCAS       = "raceCas"
	collCounter   = "raceCounter"
	roundsPerColl = 100
)

// roundColl is the collection (prefix collClaims or collCAS) holding round r.
func roundColl(db *mongo.Database, prefix string, r int) *mongo.Collection {
	return db.Collection(fmt.Sprintf("%s%03d", prefix, r/roundsPerColl))
}

// Options configure [Run].
type Options struct {
	// Rounds is the number of rounds ([Prepare]'s). Default 200.
	Rounds int
	// Workers is the number of goroutines of this Run. Default 4.
	Workers int
	// Name tells this Run's workers apart in the report (e.g. "p1"). Default "w".
	Name string
}

// Tally is what one [Run] won: the rounds its workers claimed and swapped (a round once per
// worker that won it), the increments acknowledged and the operations that failed.
type Tally struct {
	Claims     []int `json:"claims"`
	CAS        []int `json:"cas"`
	Increments int   `json:"increments"`
	Errors     int   `json:"errors"`
	// FirstError is the first failure's message, if any.
	FirstError string `json:"firstError,omitempty"`
}

// Result is the verdict over every Tally of one race.
type Result struct {
	Rounds int `json:"rounds"`
	// DoubleClaims and DoubleCAS are the rounds won by more than one worker.
	DoubleClaims int `json:"doubleClaims"`
	DoubleCAS    int `json:"doubleCas"`
	// Increments were acknowledged; Counter is the counter's final value; LostIncrements is
	// how many acknowledged increments it lacks.
	Increments     int `json:"increments"`
	Counter        int `json:"counter"`
	LostIncrements int `json:"lostIncrements"`
	// Errors are operations that failed (they count as not won and not incremented).
	Errors int `json:"errors"`
}

// OK reports whether the race found no violation and no error.
func (r Result) OK() bool {
	return r.DoubleClaims == 0 && r.DoubleCAS == 0 && r.LostIncrements == 0 && r.Errors == 0
}

// String is the result in one line.
func (r Result) String() string {
	return fmt.Sprintf("%d rounds: %d double claims, %d double compare-and-swap wins, %d of %d increments lost, %d errors",
		r.Rounds, r.DoubleClaims, r.DoubleCAS, r.LostIncrements, r.Increments, r.Errors)
}

func roundID(r int) string { return fmt.Sprintf("r%06d", r) } // string ids: FerretDB finds them without a scan

// Prepare empties db's race collections and creates the documents of rounds rounds.
func Prepare(ctx context.Context, db *mongo.Database, rounds int) error {
	if rounds <= 0 {
		return errors.New("store race: rounds must be positive")
	}
	names, err := db.ListCollectionNames(ctx, bson.D{})
	if err != nil {
		return fmt.Errorf("store race: %w", err)
	}
	for _, n := range names {
		if strings.HasPrefix(n, "race") {
			if err := db.Collection(n).Drop(ctx); err != nil {
				return fmt.Errorf("store race: drop %s: %w", n, err)
			}
		}
	}
	for from := 0; from < rounds; from += roundsPerColl {
		var claims, cas []any
		for r := from; r < min(from+roundsPerColl, rounds); r++ {
			claims = append(claims, bson.D{{Key: "_id", Value: roundID(r)}, {Key: "owner", Value: nil}})
			cas = append(cas, bson.D{{Key: "_id", Value: roundID(r)}, {Key: "v", Value: 0}})
		}
		if _, err := roundColl(db, collClaims, from).InsertMany(ctx, claims); err != nil {
			return fmt.Errorf("store race: prepare claims: %w", err)
		}
		if _, err := roundColl(db, collCAS, from).InsertMany(ctx, cas); err != nil {
			return fmt.Errorf("store race: prepare compare-and-swap: %w", err)
		}
	}
	if _, err := db.Collection(collCounter).InsertOne(ctx, bson.D{{Key: "_id", Value: "n"}, {Key: "n", Value: 0}}); err != nil {
		return fmt.Errorf("store race: prepare counter: %w", err)
	}
	return nil
}

// Run races opts.Workers goroutines through the rounds on db and reports what they won. Run
// the same race from other processes or clients at the same time, then [Check] all tallies.
func Run(ctx context.Context, db *mongo.Database, opts Options) Tally {
	if opts.Rounds <= 0 {
		opts.Rounds = 200
	}
	if opts.Workers <= 0 {
		opts.Workers = 4
	}
	if opts.Name == "" {
		opts.Name = "w"
	}
	counter := db.Collection(collCounter)
	var mu sync.Mutex
	var t Tally
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		t.Errors++
		if t.FirstError == "" {
			t.FirstError = err.Error()
		}
	}
	var wg sync.WaitGroup
	for w := range opts.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			me := fmt.Sprintf("%s.%d", opts.Name, w)
			var won, swapped []int
			incs := 0
			for r := 0; r < opts.Rounds && ctx.Err() == nil; r++ {
				id := roundID(r)
				res, err := roundColl(db, collClaims, r).UpdateOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "owner", Value: nil}}, bson.D{{Key: "$set", Value: bson.D{{Key: "owner", Value: me}}}})
				switch {
				case err != nil:
					fail(fmt.Errorf("claim: %w", err))
				case res.ModifiedCount == 1:
					won = append(won, r)
				}
				res, err = roundColl(db, collCAS, r).UpdateOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "v", Value: 0}}, bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: 1}}}})
				switch {
				case err != nil:
					fail(fmt.Errorf("compare-and-swap: %w", err))
				case res.ModifiedCount == 1:
					swapped = append(swapped, r)
				}
				if _, err = counter.UpdateOne(ctx, bson.D{{Key: "_id", Value: "n"}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}}); err != nil {
					fail(fmt.Errorf("increment: %w", err))
				} else {
					incs++
				}
			}
			mu.Lock()
			defer mu.Unlock()
			t.Claims = append(t.Claims, won...)
			t.CAS = append(t.CAS, swapped...)
			t.Increments += incs
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		fail(fmt.Errorf("store race: %w", err))
	}
	return t
}

// Check adds up the tallies of one race over rounds rounds and reads the counter.
func Check(ctx context.Context, db *mongo.Database, rounds int, tallies ...Tally) (Result, error) {
	res := Result{Rounds: rounds}
	claims, cas := map[int]int{}, map[int]int{}
	for _, t := range tallies {
		for _, r := range t.Claims {
			claims[r]++
		}
		for _, r := range t.CAS {
			cas[r]++
		}
		res.Increments += t.Increments
		res.Errors += t.Errors
	}
	for _, n := range claims {
		if n > 1 {
			res.DoubleClaims++
		}
	}
	for _, n := range cas {
		if n > 1 {
			res.DoubleCAS++
		}
	}
	var c struct {
		N int `bson:"n"`
	}
	if err := db.Collection(collCounter).FindOne(ctx, bson.D{{Key: "_id", Value: "n"}}).Decode(&c); err != nil {
		return res, fmt.Errorf("store race: read counter: %w", err)
	}
	res.Counter = c.N
	res.LostIncrements = max(0, res.Increments-c.N)
	return res, nil
}

// Race is the whole check from one process: it prepares database dbName through a, races
// opts.Workers goroutines on each of clients (separate clients: separate connections, as
// separate kloud replicas), checks and drops the database. Its error is about the check
// itself (the server could not be used); violations are in the Result.
func Race(ctx context.Context, dbName string, opts Options, clients ...*mongo.Client) (Result, error) {
	if len(clients) == 0 {
		return Result{}, errors.New("store race: no client")
	}
	if opts.Rounds <= 0 {
		opts.Rounds = 200
	}
	db := clients[0].Database(dbName)
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_ = db.Drop(dctx)
	}()
	if err := Prepare(ctx, db, opts.Rounds); err != nil {
		return Result{}, err
	}
	tallies := make([]Tally, len(clients))
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := opts
			o.Name = fmt.Sprintf("c%d", i)
			tallies[i] = Run(ctx, c.Database(dbName), o)
		}()
	}
	wg.Wait()
	return Check(ctx, db, opts.Rounds, tallies...)
}

// RaceURL is [Race] against the server at mongoURL with clients separate clients of
// opts.Workers connections each (whatever pool size mongoURL names: the point is several
// writers), in a scratch database kloud_race_<random> it drops afterwards.
func RaceURL(ctx context.Context, mongoURL string, clients int, opts Options) (Result, error) {
	if clients <= 0 {
		return Result{}, errors.New("store race: clients must be positive")
	}
	if opts.Workers <= 0 {
		opts.Workers = 4
	}
	var cs []*mongo.Client
	defer func() {
		for _, c := range cs {
			_ = c.Disconnect(context.WithoutCancel(ctx))
		}
	}()
	for range clients {
		c, err := mongo.Connect(options.Client().ApplyURI(mongoURL).SetMaxPoolSize(uint64(opts.Workers)))
		if err != nil {
			return Result{}, fmt.Errorf("store race: connect: %w", err)
		}
		cs = append(cs, c)
	}
	return Race(ctx, "kloud_race_"+bson.NewObjectID().Hex(), opts, cs...)
}
