package storeserve_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kloud/store/storeserve"
)

// testCA is a CA of the test's own that signs certificates in memory.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert, key, pool}
}

// issue signs a certificate for 127.0.0.1 with usage u.
func (ca *testCA) issue(t *testing.T, u x509.ExtKeyUsage) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{u},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// Over TCP, a client with a certificate of the clients' CA is served; one without a
// certificate, or with one of another CA, is not.
func TestServeTCPRequiresAClientCertificate(t *testing.T) {
	serverCA, clientCA, otherCA := newTestCA(t, "server CA"), newTestCA(t, "client CA"), newTestCA(t, "other CA")
	srv, err := storeserve.New(storeserve.Options{
		DataDir: t.TempDir(), TCP: "127.0.0.1:0", Logger: testutil.Logger(t),
		TLS: &tls.Config{Certificates: []tls.Certificate{serverCA.issue(t, x509.ExtKeyUsageServerAuth)},
			ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: clientCA.pool},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})

	connect := func(certs []tls.Certificate) error {
		c, err := mongo.Connect(options.Client().ApplyURI("mongodb://" + srv.TCPAddr().String() + "/?tls=true&serverSelectionTimeoutMS=5000").
			SetTLSConfig(&tls.Config{RootCAs: serverCA.pool, Certificates: certs, MinVersion: tls.VersionTLS12}))
		if err != nil {
			return err
		}
		defer c.Disconnect(context.Background())
		_, err = c.Database("tcp").Collection("docs").InsertOne(ctx, bson.M{"_id": time.Now().String()})
		return err
	}
	if err := connect([]tls.Certificate{clientCA.issue(t, x509.ExtKeyUsageClientAuth)}); err != nil {
		t.Errorf("with a client certificate: %v", err)
	}
	if err := connect(nil); err == nil {
		t.Error("without a client certificate: served")
	}
	if err := connect([]tls.Certificate{otherCA.issue(t, x509.ExtKeyUsageClientAuth)}); err == nil {
		t.Error("with a certificate of another CA: served")
	}
}
