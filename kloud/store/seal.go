package store

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// KeySize is the length of the secret key: AES-256.
const KeySize = 32

// sealVersion is the first byte of every sealed value, so the format (or key) can change later.
const sealVersion = 1

// Seal encrypts plaintext with AES-256-GCM under the store's secret key. The result is
// version byte ‖ 12-byte random nonce ‖ ciphertext+tag. aad is authenticated but not stored:
// pass what binds the secret to its document (e.g. "credentials/<id>"), so a ciphertext copied
// into another document does not open there.
func (s *Store) Seal(plaintext, aad []byte) ([]byte, error) {
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	out := make([]byte, 0, 1+len(nonce)+len(plaintext)+s.aead.Overhead())
	out = append(out, sealVersion)
	out = append(out, nonce...)
	return s.aead.Seal(out, nonce, plaintext, aad), nil
}

// Open decrypts a value made by [Store.Seal] with the same aad. It fails if the value was
// altered, sealed for another aad, or sealed under another key.
func (s *Store) Open(ciphertext, aad []byte) ([]byte, error) {
	ns := s.aead.NonceSize()
	if len(ciphertext) < 1+ns+s.aead.Overhead() {
		return nil, errors.New("open sealed value: too short")
	}
	if ciphertext[0] != sealVersion {
		return nil, fmt.Errorf("open sealed value: unknown format version %d", ciphertext[0])
	}
	pt, err := s.aead.Open(nil, ciphertext[1:1+ns], ciphertext[1+ns:], aad)
	if err != nil {
		return nil, fmt.Errorf("open sealed value: %w", err)
	}
	return pt, nil
}

func newAEAD(key []byte) (cipher.AEAD, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("secret key: %d bytes, want %d", len(key), KeySize)
	}
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("secret key: %w", err)
	}
	return cipher.NewGCM(b)
}

// loadOrCreateKey reads dataDir/secret.key, creating it with 32 random bytes (mode 0600) if
// it does not exist. Creation is exclusive, so two processes starting at once agree on one key.
func loadOrCreateKey(dataDir string) ([]byte, error) {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("secret key: %w", err)
	}
	path := filepath.Join(dataDir, SecretKeyFile)
	for range 2 {
		key, err := os.ReadFile(path)
		if err == nil {
			if len(key) != KeySize {
				return nil, fmt.Errorf("secret key %s: %d bytes, want %d", path, len(key), KeySize)
			}
			return key, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("secret key: %w", err)
		}
		key = make([]byte, KeySize)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("secret key: %w", err)
		}
		// Write to a temporary file and link it into place: the key appears whole or not at all.
		tmp, err := os.CreateTemp(dataDir, ".secret.key-*")
		if err != nil {
			return nil, fmt.Errorf("secret key: %w", err)
		}
		_, werr := tmp.Write(key)
		if werr == nil {
			werr = tmp.Sync()
		}
		if cerr := tmp.Close(); werr == nil {
			werr = cerr
		}
		if werr == nil {
			werr = os.Link(tmp.Name(), path)
		}
		_ = os.Remove(tmp.Name())
		if werr == nil {
			return key, nil
		}
		if !errors.Is(werr, os.ErrExist) {
			return nil, fmt.Errorf("secret key: %w", werr)
		}
		// Someone else created it first: read theirs.
	}
	return nil, fmt.Errorf("secret key %s: could not read or create it", path)
}

const keyCheckID = "secretKeyCheck"

var keyCheckPlain = []byte("kloud secret key check")

// checkKey makes sure the secret key is the one this database's secrets were sealed with,
// recording a sealed check value on first use. Opening with another key would otherwise make
// every stored secret unreadable, silently and only later.
func (s *Store) checkKey(ctx context.Context) error {
	aad := []byte(CollMeta + "/" + keyCheckID)
	coll := s.Collection(CollMeta)
	for range 2 {
		var doc struct {
			Sealed []byte `bson:"sealed"`
		}
		err := coll.FindOne(ctx, bson.M{"_id": keyCheckID}).Decode(&doc)
		if err == nil {
			pt, err := s.Open(doc.Sealed, aad)
			if err != nil || !bytes.Equal(pt, keyCheckPlain) {
				return errors.New("secret key does not match the key this database was created with " +
					"(replicas must share one key; check --data-dir or the configured key)")
			}
			return nil
		}
		if !errors.Is(err, mongo.ErrNoDocuments) {
			return fmt.Errorf("secret key check: %w", err)
		}
		sealed, err := s.Seal(keyCheckPlain, aad)
		if err != nil {
			return err
		}
		_, err = coll.InsertOne(ctx, bson.M{"_id": keyCheckID, "sealed": sealed, "createdAt": s.Now()})
		if err == nil {
			return nil
		}
		if !IsDuplicateKey(err) {
			return fmt.Errorf("secret key check: %w", err)
		}
		// Another replica recorded it first: verify against theirs.
	}
	return errors.New("secret key check: could not read or record the check value")
}
