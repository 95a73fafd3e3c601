// Package tlsconf is how kloud's processes set up TLS, the one way: a server's certificate and
// key (Server), and what a client trusts (Client): the system's roots plus, optionally, one
// more CA file, for a deployment whose certificate no public CA signed. kloud, terraformer,
// klient and the kloud CLI all take that file as --ca-cert or the environment variable EnvCACert.
//
// Start with Client and Server; HSTS is the header value kloud and terraformer send with TLS.
package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"
)

// EnvCACert names a PEM file of CA certificates to trust beside the system's (what --ca-cert
// defaults to in kloud, terraformer and klient).
const EnvCACert = "KLOUD_CA_CERT"

// HSTS is the Strict-Transport-Security value served over TLS: a year, subdomains (machines'
// web apps live under kloud's apps host) not included, since that may be another domain.
const HSTS = "max-age=31536000"

// Client returns the TLS configuration of a client that trusts the system's roots and, when
// caFile is not empty, the certificates of that PEM file. It fails when the file cannot be
// read or holds no certificate.
func Client(caFile string) (*tls.Config, error) {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("--ca-cert: %w", err)
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--ca-cert %s: no PEM certificate in it", caFile)
		}
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// ReadCA returns the PEM content of caFile after checking it holds a certificate ("" for "").
func ReadCA(caFile string) (string, error) {
	if caFile == "" {
		return "", nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return "", fmt.Errorf("--ca-cert: %w", err)
	}
	if !x509.NewCertPool().AppendCertsFromPEM(pem) {
		return "", fmt.Errorf("--ca-cert %s: no PEM certificate in it", caFile)
	}
	return string(pem), nil
}

// HTTPClient is an HTTP client with cfg's trust (nil cfg: Go's defaults) and the timeout.
func HTTPClient(cfg *tls.Config, timeout time.Duration) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	if cfg != nil {
		t.TLSClientConfig = cfg.Clone()
	}
	return &http.Client{Transport: t, Timeout: timeout}
}

// Server loads a server's certificate (chain) and key, both PEM files. Neither or both must
// be given: (nil, nil) for neither.
func Server(certFile, keyFile string) (*tls.Config, error) {
	switch {
	case certFile == "" && keyFile == "":
		return nil, nil
	case certFile == "" || keyFile == "":
		return nil, errors.New("--tls-cert and --tls-key go together: give both, or neither")
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert %s / --tls-key %s: %w", certFile, keyFile, err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}, nil
}
